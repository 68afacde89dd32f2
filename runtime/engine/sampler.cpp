#include "runtime/engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "runtime/structured/grammar.h"

namespace tandem {

status sampling_params::set_grammar(std::string text) {
  constraint.reset();
  grammar = std::move(text);
  if (grammar.empty()) return {};
  try {
    constraint = std::make_shared<grammar_constraint>(grammar::cached(grammar));
  } catch (const failure& e) {
    grammar.clear();
    return {e.code(), e.what()};
  }
  return {};
}

std::span<const float> constrained_logits(std::span<const float> logits, const sampling_params& p,
                                          std::span<const token_id> output, const tokenizer& tok,
                                          std::vector<float>& buf) {
  if (p.grammar.empty()) return logits;
  std::shared_ptr<grammar_constraint> c = p.constraint;
  std::shared_ptr<const token_mask> mask;
  try {
    // Parameters that arrived without their compiled form (unusual: the wire attaches it)
    // compile here and replay the output; the text was checked where the request came in.
    if (!c) c = std::make_shared<grammar_constraint>(grammar::cached(p.grammar));
    mask = c->mask_after(output, tok.vocab_trie());
  } catch (const failure&) {
    mask = tok.vocab_trie()->end_only;  // a grammar that cannot compile allows nothing: the output ends
  }
  if (logits.data() != buf.data()) buf.assign(logits.begin(), logits.end());
  const float ban = -std::numeric_limits<float>::infinity();
  bool any = false;
  for (size_t t = 0; t < buf.size(); ++t) {
    if (!mask_allows(*mask, token_id(t))) buf[t] = ban;
    else any = any || buf[t] != ban;
  }
  if (!any)
    for (size_t t = 0; t < buf.size(); ++t)
      if (mask_allows(*mask, token_id(t))) buf[t] = 0.0f;
  return buf;
}

status sampling_params::validate(int32_t n_vocab) const {
  if (bias_tokens.size() != bias_values.size()) return {errc::invalid_argument, "logit_bias needs one value per token"};
  for (float b : bias_values)
    if (!std::isfinite(b) || b < -100.0f || b > 100.0f)
      return {errc::invalid_argument, "logit_bias values must be numbers in [-100, 100]"};
  if (min_tokens < 0) return {errc::invalid_argument, "min_tokens must be >= 0"};
  if (logprobs < -1 || logprobs > 20) return {errc::invalid_argument, "logprobs must be in [0, 20] (or -1: none)"};
  if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f))
    return {errc::invalid_argument, "presence_penalty must be in [-2, 2]"};
  if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f))
    return {errc::invalid_argument, "frequency_penalty must be in [-2, 2]"};
  if (!(repetition_penalty > 0.0f && repetition_penalty <= 2.0f))
    return {errc::invalid_argument, "repetition_penalty must be in (0, 2]"};
  if (n_vocab > 0) {
    for (token_id t : bias_tokens)
      if (t < 0 || t >= n_vocab)
        return {errc::invalid_argument, "logit_bias token " + std::to_string(t) + " is outside the vocabulary"};
    for (token_id t : stop_tokens)
      if (t < 0 || t >= n_vocab)
        return {errc::invalid_argument, "stop_token_ids: token " + std::to_string(t) + " is outside the vocabulary"};
  }
  if (!std::isfinite(temperature) || temperature < 0.0f)
    return {errc::invalid_argument, "temperature must be a finite number >= 0"};
  if (!(top_p > 0.0f && top_p <= 1.0f)) return {errc::invalid_argument, "top_p must be in (0, 1]"};
  if (top_k < 0) return {errc::invalid_argument, "top_k must be >= 0 (0 disables it)"};
  return {};
}

std::span<const float> adjusted_logits(std::span<const float> logits, const sampling_params& p, uint64_t token_index,
                                       const tokenizer& tok, std::vector<float>& buf, std::span<const token_id> output,
                                       std::span<const token_id> prompt) {
  if (!p.adjusts(token_index)) return logits;
  buf.assign(logits.begin(), logits.end());
  const int32_t n = int32_t(buf.size());
  for (size_t i = 0; i < p.bias_tokens.size(); ++i)
    if (p.bias_tokens[i] >= 0 && p.bias_tokens[i] < n) buf[size_t(p.bias_tokens[i])] += p.bias_values[i];
  if (p.repeats()) {  // each token of prompt or output once
    std::vector<token_id> seen(prompt.begin(), prompt.end());
    seen.insert(seen.end(), output.begin(), output.end());
    std::sort(seen.begin(), seen.end());
    seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
    for (token_id t : seen)
      if (t >= 0 && t < n) {
        float& l = buf[size_t(t)];
        l = l > 0.0f ? l / p.repetition_penalty : l * p.repetition_penalty;
      }
  }
  if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
    // Counts in a sorted copy: the same sums in the same order whatever order they came in.
    std::vector<token_id> seen(output.begin(), output.end());
    std::sort(seen.begin(), seen.end());
    for (size_t i = 0; i < seen.size();) {
      size_t j = i;
      while (j < seen.size() && seen[j] == seen[i]) ++j;
      const token_id t = seen[i];
      if (t >= 0 && t < n) buf[size_t(t)] -= float(j - i) * p.frequency_penalty + p.presence_penalty;
      i = j;
    }
  }
  if (uint64_t(p.min_tokens) > token_index) {
    const float ban = -std::numeric_limits<float>::infinity();
    for (int32_t t = 0; t < n && t < tok.n_vocab(); ++t)
      if (tok.is_eog(t)) buf[size_t(t)] = ban;
    for (token_id t : p.stop_tokens)
      if (t >= 0 && t < n) buf[size_t(t)] = ban;
  }
  return buf;
}

token_logprobs logprobs_of(std::span<const float> logits, token_id chosen, int32_t top_n) {
  token_logprobs out;
  const int32_t n = int32_t(logits.size());
  if (n == 0) return out;
  double mx = logits[0];
  for (float l : logits) mx = std::max(mx, double(l));
  double sum = 0.0;
  for (float l : logits) sum += std::exp(double(l) - mx);
  const double lse = mx + std::log(sum);
  if (chosen >= 0 && chosen < n) out.logprob = float(double(logits[size_t(chosen)]) - lse);
  const int32_t k = std::clamp(top_n, 0, n);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  std::iota(ids.begin(), ids.end(), 0);
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [&](int32_t a, int32_t b) {
    return logits[size_t(a)] > logits[size_t(b)] || (logits[size_t(a)] == logits[size_t(b)] && a < b);
  });
  for (int32_t i = 0; i < k; ++i) {
    out.top_ids.push_back(ids[size_t(i)]);
    out.top_logprobs.push_back(float(double(logits[size_t(ids[size_t(i)])]) - lse));
  }
  return out;
}

bool ends_generation(const sampling_params& p, bool ignore_eos, const tokenizer& tok, token_id t) {
  if (!ignore_eos && tok.is_eog(t)) return true;
  return std::find(p.stop_tokens.begin(), p.stop_tokens.end(), t) != p.stop_tokens.end();
}

namespace {
uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
}  // namespace

double sample_uniform(uint64_t seed, uint64_t index) {
  const uint64_t r = splitmix64(splitmix64(seed) ^ splitmix64(index + 0x632be59bd9b4e019ull));
  return double(r >> 11) * 0x1.0p-53;
}

token_id sample(std::span<const float> logits, const sampling_params& p, uint64_t token_index) {
  const int32_t n = int32_t(logits.size());
  if (n == 0) return -1;
  if (p.temperature <= 0.0f) return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());

  // Candidates by logit, highest first; ties keep the lower id first so the order is total.
  std::vector<int32_t> ids(static_cast<size_t>(n));
  std::iota(ids.begin(), ids.end(), 0);
  const auto better = [&](int32_t a, int32_t b) {
    return logits[size_t(a)] > logits[size_t(b)] || (logits[size_t(a)] == logits[size_t(b)] && a < b);
  };
  int32_t k = n;
  if (p.top_k > 0 && p.top_k < n) {
    k = p.top_k;
    std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), better);
  } else {
    std::sort(ids.begin(), ids.end(), better);
  }
  std::vector<double> probs(static_cast<size_t>(k));
  const double mx = logits[size_t(ids[0])];
  double sum = 0.0;
  for (int32_t i = 0; i < k; ++i) {
    probs[size_t(i)] = std::exp((double(logits[size_t(ids[size_t(i)])]) - mx) / p.temperature);
    sum += probs[size_t(i)];
  }
  // Nucleus: the smallest prefix whose mass reaches top_p (at least one token).
  int32_t keep = k;
  if (p.top_p < 1.0f) {
    double cum = 0.0;
    for (int32_t i = 0; i < k; ++i) {
      cum += probs[size_t(i)] / sum;
      if (cum >= p.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  double kept = 0.0;
  for (int32_t i = 0; i < keep; ++i) kept += probs[size_t(i)];
  const double u = sample_uniform(p.seed, token_index) * kept;
  double acc = 0.0;
  for (int32_t i = 0; i < keep; ++i) {
    acc += probs[size_t(i)];
    if (u < acc) return ids[size_t(i)];
  }
  return ids[size_t(keep - 1)];
}

}  // namespace tandem
