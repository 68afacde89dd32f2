#include "tools/bench/trace.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <cstdio>
#include <map>
#include <set>
#include <random>
#include <stdexcept>

namespace tandem::bench {
namespace {

// mt19937_64's sequence is fixed by the standard; the transforms below are ours, so a seed
// gives the same trace with any standard library.
class rng {
 public:
  explicit rng(uint64_t seed) : g_(seed) {}
  double uniform() { return double(g_() >> 11) * 0x1.0p-53; }  // [0, 1)
  int32_t between(int32_t lo, int32_t hi) { return lo + int32_t(uniform() * double(hi - lo + 1)); }
  double exponential(double rate) { return -std::log1p(-uniform()) / rate; }
  double normal() {  // Box-Muller
    const double u1 = 1.0 - uniform(), u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
  }
  double gamma(double shape) {  // Marsaglia-Tsang; shape < 1 through the boost u^(1/shape)
    if (shape < 1.0) return gamma(shape + 1.0) * std::pow(1.0 - uniform(), 1.0 / shape);
    const double d = shape - 1.0 / 3.0, c = 1.0 / std::sqrt(9.0 * d);
    for (;;) {
      double x, v;
      do {
        x = normal();
        v = 1.0 + c * x;
      } while (v <= 0);
      v = v * v * v;
      const double u = 1.0 - uniform();
      if (std::log(u) < 0.5 * x * x + d - d * v + d * std::log(v)) return d * v;
    }
  }

 private:
  std::mt19937_64 g_;
};

}  // namespace

bool parse_workload(const std::string& s, workload& out) {
  if (s == "short") out = workload::short_prompts;
  else if (s == "long") out = workload::long_prompts;
  else if (s == "mixed") out = workload::mixed;
  else if (s == "system-prompt") out = workload::shared_prefix;
  else if (s == "multiturn") out = workload::multiturn;
  else return false;
  return true;
}

namespace {

// By arrival; ties by turn, so that a conversation's turns arriving together stay in turn order
// (the runner sends turn k only after turn k-1). Stable: other ties keep the file's order.
void sort_by_arrival(std::vector<trace_entry>& t, std::vector<int>* lines = nullptr) {
  std::vector<size_t> order(t.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return t[a].arrival_s < t[b].arrival_s || (t[a].arrival_s == t[b].arrival_s && t[a].turn < t[b].turn);
  });
  std::vector<trace_entry> sorted;
  sorted.reserve(t.size());
  std::vector<int> sorted_lines;
  for (size_t i : order) {
    sorted.push_back(std::move(t[i]));
    if (lines) sorted_lines.push_back((*lines)[i]);
  }
  t = std::move(sorted);
  if (lines) *lines = std::move(sorted_lines);
}

// Shrinks `parts` (each >= 1) until their sum is at most `budget` (>= parts.size()): scaled
// together, so that the trace keeps its proportions, then the largest trimmed by the rounding.
void fit_within(std::vector<int32_t>& parts, int64_t budget) {
  int64_t sum = 0;
  for (int32_t p : parts) sum += p;
  if (sum <= budget) return;
  const double k = double(budget) / double(sum);
  sum = 0;
  for (auto& p : parts) {
    p = std::max(1, int32_t(double(p) * k));
    sum += p;
  }
  while (sum > budget) {  // at most parts.size() rounds: only the max(1, ...) can overshoot
    --*std::max_element(parts.begin(), parts.end());
    --sum;
  }
}

std::vector<trace_entry> make_shared_prefix(const trace_options& o, rng& r, const std::function<double()>& gap) {
  if (o.prefix_tokens < 1) throw std::invalid_argument("a system-prompt trace needs prefix_tokens >= 1");
  if (o.prefix_groups < 1) throw std::invalid_argument("a system-prompt trace needs prefix_groups >= 1");
  int32_t prefix = o.prefix_tokens, suffix_lo = 64, suffix_hi = 192, out_lo = 16, out_hi = 48;
  if (o.max_context > 0) {
    // The output gives way first, as in the other traces; then prefix and question shrink
    // together, the same for every request (a group keeps one prefix) and keeping the share.
    out_hi = std::min(out_hi, std::max(1, o.max_context / 4));
    out_lo = std::min(out_lo, out_hi);
    const int64_t budget = int64_t(o.max_context) - out_hi - 1;  // prompt tokens that always fit
    if (budget < 2)
      throw std::invalid_argument("a context of " + std::to_string(o.max_context) +
                                  " tokens is too small for a system-prompt trace");
    std::vector<int32_t> parts = {prefix, suffix_hi};
    fit_within(parts, budget);
    if (parts[1] < suffix_hi) suffix_lo = std::max(1, int32_t(int64_t(suffix_lo) * parts[1] / suffix_hi));
    prefix = parts[0];
    suffix_hi = parts[1];
  }
  std::vector<trace_entry> t;
  double at = 0;
  for (int32_t i = 0; i < o.requests; ++i) {
    trace_entry e;
    if (i > 0) at += gap();
    e.arrival_s = at;
    e.prefix_group = r.between(0, o.prefix_groups - 1);  // drawn even for one group: same stream
    e.prefix_tokens = prefix;
    e.prompt_tokens = prefix + r.between(suffix_lo, suffix_hi);
    e.output_tokens = r.between(out_lo, out_hi);
    t.push_back(std::move(e));
  }
  return t;
}

std::vector<trace_entry> make_multiturn(const trace_options& o, rng& r, const std::function<double()>& gap) {
  if (o.conversations < 1 || o.turns < 1)
    throw std::invalid_argument("a multiturn trace needs conversations >= 1 and turns >= 1");
  if (int64_t(o.conversations) * o.turns > 10'000'000)
    throw std::invalid_argument("a multiturn trace of more than 10 million turns");
  // The last turn holds the whole conversation: opening, every output and every new message.
  // The smallest one (a token each) must fit, prompt + output below the context as elsewhere.
  if (o.max_context > 0 && int64_t(o.max_context) - 1 < 2 * int64_t(o.turns))
    throw std::invalid_argument("a context of " + std::to_string(o.max_context) + " tokens cannot hold " +
                                std::to_string(o.turns) + " turns (a conversation's last turn carries all of them)");
  std::vector<trace_entry> t;
  t.reserve(size_t(o.conversations) * size_t(o.turns));
  double start = 0;
  for (int32_t c = 0; c < o.conversations; ++c) {
    if (c > 0) start += gap();  // first turns follow the arrival process
    // parts: opening, then each turn's output, then each later turn's new message.
    std::vector<int32_t> parts;
    parts.push_back(r.between(256, 512));
    for (int32_t k = 0; k < o.turns; ++k) parts.push_back(r.between(16, 48));
    for (int32_t k = 1; k < o.turns; ++k) parts.push_back(r.between(32, 96));
    // Assuming each turn produced at most its output_tokens, the last turn then fits.
    if (o.max_context > 0) fit_within(parts, int64_t(o.max_context) - 1);
    double at = start;
    int32_t prompt = 0, prev_out = 0;
    for (int32_t k = 0; k < o.turns; ++k) {
      trace_entry e;
      if (k > 0) at += gap();  // think time, drawn like the gaps: mean 1/rate
      e.arrival_s = at;
      e.conversation = c;
      e.turn = k;
      e.new_tokens = k == 0 ? parts[0] : parts[size_t(o.turns + k)];
      prompt += prev_out + e.new_tokens;
      e.prompt_tokens = prompt;
      e.output_tokens = prev_out = parts[size_t(1 + k)];
      t.push_back(std::move(e));
    }
  }
  sort_by_arrival(t);
  return t;
}

}  // namespace

std::vector<trace_entry> make_trace(const trace_options& o) {
  if (o.requests < 0 || !(o.rate > 0) || !(o.burstiness > 0))
    throw std::invalid_argument("a trace needs requests >= 0, rate > 0 and burstiness > 0");
  rng r(o.seed);
  // A gap between arrivals with mean 1/rate.
  const std::function<double()> gap = [&] {
    return o.arrival == arrival_kind::poisson ? r.exponential(o.rate) : r.gamma(o.burstiness) / (o.rate * o.burstiness);
  };
  if (o.kind == workload::shared_prefix) return make_shared_prefix(o, r, gap);
  if (o.kind == workload::multiturn) return make_multiturn(o, r, gap);
  std::vector<trace_entry> t;
  double at = 0;
  for (int32_t i = 0; i < o.requests; ++i) {
    trace_entry e;
    // The first request arrives at 0.
    if (i > 0) at += gap();
    e.arrival_s = at;
    const bool long_one = o.kind == workload::long_prompts || (o.kind == workload::mixed && r.uniform() < 0.25);
    if (long_one) {
      e.prompt_tokens = r.between(1000, 4000);
      e.output_tokens = r.between(30, 100);
    } else {
      e.prompt_tokens = r.between(100, 300);
      e.output_tokens = r.between(100, 200);
    }
    if (o.max_context > 0) {  // bounded by the model's context: the prompt gives way
      e.output_tokens = std::min(e.output_tokens, std::max(1, o.max_context / 4));
      e.prompt_tokens = std::max(1, std::min(e.prompt_tokens, o.max_context - e.output_tokens - 1));
    }
    t.push_back(std::move(e));
  }
  return t;
}

std::vector<trace_entry> load_trace(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read trace file '" + path + "'");
  std::vector<trace_entry> t;
  std::vector<int> lines;  // each entry's line, for the checks across entries below
  std::string line;
  constexpr int64_t too_big = int64_t(1) << 24;
  auto where_at = [&](int n, const std::string& what) { return path + ":" + std::to_string(n) + ": " + what; };
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto where = [&](const std::string& what) { return where_at(n, what); };
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) throw std::runtime_error(where("not a JSON object"));
    trace_entry e;
    if (!j.contains("arrival_s") || !j["arrival_s"].is_number() || !(j["arrival_s"].get<double>() >= 0))
      throw std::runtime_error(where("'arrival_s' (seconds >= 0) is required"));
    e.arrival_s = j["arrival_s"].get<double>();
    if (j.contains("prompt") && j["prompt"].is_string() && !j["prompt"].get<std::string>().empty()) {
      e.prompt_text = j["prompt"].get<std::string>();
    } else if (j.contains("prompt_tokens") && j["prompt_tokens"].is_number_integer() &&
               j["prompt_tokens"].get<int64_t>() > 0 && j["prompt_tokens"].get<int64_t>() < too_big) {
      e.prompt_tokens = int32_t(j["prompt_tokens"].get<int64_t>());
    } else {
      throw std::runtime_error(where("'prompt' (text) or 'prompt_tokens' (a positive integer) is required"));
    }
    if (!j.contains("output_tokens") || !j["output_tokens"].is_number_integer() ||
        j["output_tokens"].get<int64_t>() < 1 || j["output_tokens"].get<int64_t>() >= too_big)
      throw std::runtime_error(where("'output_tokens' (a positive integer) is required"));
    e.output_tokens = int32_t(j["output_tokens"].get<int64_t>());
    // The optional prefix-cache keys: absent (or null) keeps the default. Shared prefixes and
    // conversation histories are built from token ids, so they need prompt_tokens.
    if (!e.prompt_text.empty())
      for (const char* key : {"prefix_group", "prefix_tokens", "conversation", "turn", "new_tokens"})
        if (j.contains(key) && !j[key].is_null())
          throw std::runtime_error(
              where("'" + std::string(key) +
                    "' needs 'prompt_tokens', not 'prompt' text (shared prefixes and conversations are token ids)"));
    auto optional_int = [&](const char* key, int64_t lo, int64_t hi, int32_t& to) {
      if (!j.contains(key) || j[key].is_null()) return false;
      const auto& v = j[key];
      if (!v.is_number_integer() || v.get<int64_t>() < lo || v.get<int64_t>() > hi)
        throw std::runtime_error(where("'" + std::string(key) + "' must be an integer in " + std::to_string(lo) + ".." +
                                       std::to_string(hi)));
      to = int32_t(v.get<int64_t>());
      return true;
    };
    const bool group = optional_int("prefix_group", 0, too_big, e.prefix_group);
    const bool prefix = optional_int("prefix_tokens", 1, std::max(1, e.prompt_tokens), e.prefix_tokens);
    const bool conversation = optional_int("conversation", 0, too_big, e.conversation);
    const bool turn = optional_int("turn", 0, too_big, e.turn);
    const bool fresh = optional_int("new_tokens", 1, std::max(1, e.prompt_tokens), e.new_tokens);
    if (group != prefix) throw std::runtime_error(where("'prefix_group' and 'prefix_tokens' go together"));
    if ((turn || fresh) && !conversation)
      throw std::runtime_error(where("'turn' and 'new_tokens' need 'conversation'"));
    if (conversation) {
      if (e.turn == 0 && fresh && e.new_tokens != e.prompt_tokens)
        throw std::runtime_error(where("turn 0's 'new_tokens' must equal 'prompt_tokens' (its whole prompt is new)"));
      if (e.turn == 0) e.new_tokens = e.prompt_tokens;
      if (e.turn > 0 && !fresh) throw std::runtime_error(where("a turn after the first needs 'new_tokens'"));
      if (e.turn > 0 && group)
        throw std::runtime_error(where("'prefix_group' belongs on turn 0 (later turns start with its prompt)"));
    }
    // A block-structured prompt (as a Mooncake replay saves it): its ids must cover it exactly.
    const bool block_tokens = optional_int("block_tokens", 1, 1 << 20, e.block_tokens);
    if (j.contains("block_ids") && !j["block_ids"].is_null()) {
      if (!block_tokens || !e.prompt_text.empty() || group || conversation)
        throw std::runtime_error(
            where("'block_ids' go with 'block_tokens' and 'prompt_tokens', without prefix groups or conversations"));
      if (!j["block_ids"].is_array()) throw std::runtime_error(where("'block_ids' must be an array"));
      for (const auto& id : j["block_ids"]) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0)
          throw std::runtime_error(where("'block_ids' holds non-negative integers"));
        e.block_ids.push_back(id.get<int64_t>());
      }
      const int64_t n_blocks = int64_t(e.block_ids.size());
      if (e.prompt_tokens > n_blocks * e.block_tokens || e.prompt_tokens <= (n_blocks - 1) * e.block_tokens)
        throw std::runtime_error(
            where("'prompt_tokens' must fill its 'block_ids' of 'block_tokens' each (the last one partly)"));
    } else if (block_tokens) {
      throw std::runtime_error(where("'block_tokens' needs 'block_ids'"));
    }
    t.push_back(std::move(e));
    lines.push_back(n);
  }
  sort_by_arrival(t, &lines);
  // Each conversation's turns in order, each one's prompt its predecessor's history plus its
  // new tokens: the runner builds it so, and the context bound was checked on these lengths.
  std::map<int32_t, size_t> last;  // conversation -> its latest turn's entry
  for (size_t i = 0; i < t.size(); ++i) {
    const auto& e = t[i];
    if (e.conversation < 0) continue;
    const auto it = last.find(e.conversation);
    const int32_t expected = it == last.end() ? 0 : t[it->second].turn + 1;
    if (e.turn != expected)
      throw std::runtime_error(where_at(lines[i], "conversation " + std::to_string(e.conversation) + ": turn " +
                                                      std::to_string(e.turn) + " where turn " +
                                                      std::to_string(expected) +
                                                      " comes next by arrival (each turn follows the one before)"));
    if (e.turn > 0) {
      const auto& p = t[it->second];
      if (int64_t(p.prompt_tokens) + p.output_tokens + e.new_tokens != e.prompt_tokens)
        throw std::runtime_error(
            where_at(lines[i], "'prompt_tokens' must be turn " + std::to_string(p.turn) +
                                   "'s prompt_tokens + output_tokens + this turn's new_tokens (" +
                                   std::to_string(int64_t(p.prompt_tokens) + p.output_tokens + e.new_tokens) + ")"));
    }
    last[e.conversation] = i;
  }
  return t;
}

void save_trace(const std::vector<trace_entry>& t, const std::string& path) {
  std::ofstream out(path);
  if (!out) throw std::runtime_error("cannot write trace file '" + path + "'");
  for (const auto& e : t) {
    nlohmann::json j = {{"arrival_s", e.arrival_s}, {"output_tokens", e.output_tokens}};
    if (e.prompt_text.empty()) j["prompt_tokens"] = e.prompt_tokens;
    else j["prompt"] = e.prompt_text;
    if (e.prefix_group >= 0) {
      j["prefix_group"] = e.prefix_group;
      j["prefix_tokens"] = e.prefix_tokens;
    }
    if (e.conversation >= 0) {
      j["conversation"] = e.conversation;
      j["turn"] = e.turn;
      j["new_tokens"] = e.new_tokens;
    }
    if (!e.block_ids.empty()) {
      j["block_ids"] = e.block_ids;
      j["block_tokens"] = e.block_tokens;
    }
    out << j.dump() << "\n";
  }
  if (!out) throw std::runtime_error("cannot write trace file '" + path + "'");
}

mooncake_trace load_mooncake_trace(const std::string& path, const mooncake_options& o) {
  if (o.scale_tokens < 1 || o.scale_tokens > 512) throw std::invalid_argument("--scale-tokens must be 1..512");
  if (!(o.speedup > 0) || !std::isfinite(o.speedup)) throw std::invalid_argument("--speedup must be positive");
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read trace file '" + path + "'");
  constexpr int32_t mooncake_block = 512;  // the tokens one hash id stands for in the file
  const int32_t block = std::max(1, mooncake_block / o.scale_tokens);
  mooncake_trace out;
  std::string line;
  double first_ms = 0;
  for (size_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const size_t index = out.file_entries++;
    if (index < o.from || (o.count > 0 && index >= o.from + o.count)) continue;  // outside the window: not read
    auto where = [&](const std::string& what) { return path + ":" + std::to_string(n) + ": " + what; };
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) throw std::runtime_error(where("not a JSON object"));
    auto integer = [&](const char* key, int64_t lo) {
      if (!j.contains(key) || !j[key].is_number_integer() || j[key].get<int64_t>() < lo ||
          j[key].get<int64_t>() > (int64_t(1) << 40))
        throw std::runtime_error(where("'" + std::string(key) + "' must be an integer >= " + std::to_string(lo)));
      return j[key].get<int64_t>();
    };
    const int64_t ts = integer("timestamp", 0), input = integer("input_length", 1),
                  output = integer("output_length", 1);
    if (!j.contains("hash_ids") || !j["hash_ids"].is_array() || j["hash_ids"].empty())
      throw std::runtime_error(where("'hash_ids' must be a non-empty array (one id per 512-token block)"));
    trace_entry e;
    for (const auto& id : j["hash_ids"]) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0)
        throw std::runtime_error(where("'hash_ids' holds non-negative integers"));
      e.block_ids.push_back(id.get<int64_t>());
    }
    const int64_t blocks = int64_t(e.block_ids.size());
    if (input > blocks * mooncake_block || input <= (blocks - 1) * mooncake_block)
      throw std::runtime_error(where("'input_length' " + std::to_string(input) + " does not fit " +
                                     std::to_string(blocks) + " blocks of 512 tokens"));
    if (out.entries.empty()) first_ms = double(ts);
    e.arrival_s = (double(ts) - first_ms) / 1000.0 / o.speedup;
    e.block_tokens = block;
    // Scaled, and still within its blocks: the last one holds at least one token.
    const int64_t scaled = (input + o.scale_tokens - 1) / o.scale_tokens;
    e.prompt_tokens = int32_t(std::clamp<int64_t>(scaled, (blocks - 1) * block + 1, blocks * block));
    e.output_tokens = int32_t(std::max<int64_t>(1, (output + o.scale_tokens - 1) / o.scale_tokens));
    if (o.max_context > 0 && e.prompt_tokens + e.output_tokens > o.max_context) {
      ++out.trimmed;
      e.output_tokens = std::max(1, std::min(e.output_tokens, o.max_context / 4));  // an answer, if short
      if (e.prompt_tokens + e.output_tokens > o.max_context) {
        e.prompt_tokens = std::max(1, o.max_context - e.output_tokens);  // cut at the end: its prefix stays
        e.block_ids.resize(size_t((e.prompt_tokens + block - 1) / block));
      }
    }
    out.entries.push_back(std::move(e));
  }
  sort_by_arrival(out.entries, nullptr);
  if (!out.entries.empty())  // (timestamps out of order in the file: the earliest is time 0)
    for (double t0 = out.entries.front().arrival_s; auto& e : out.entries) e.arrival_s -= t0;
  char buf[320];
  std::snprintf(
      buf, sizeof buf,
      "Mooncake trace entries %zu..%zu of %zu; lengths and 512-token blocks / %d (%d-token blocks); time / %g%s",
      o.from, o.from + out.entries.size(), out.file_entries, o.scale_tokens, block, o.speedup,
      out.trimmed ? (", " + std::to_string(out.trimmed) + " shortened to the context").c_str() : "");
  out.scaling = buf;
  return out;
}

std::vector<trace_entry> at_rate(std::vector<trace_entry> t, double rate) {
  if (t.size() < 2 || !(rate > 0)) return t;
  const double span = t.back().arrival_s - t.front().arrival_s;
  if (!(span > 0)) return t;
  const double now = double(t.size() - 1) / span, k = now / rate, first = t.front().arrival_s;
  for (auto& e : t) e.arrival_s = (e.arrival_s - first) * k;
  return t;
}

double shared_prefix_share(const std::vector<trace_entry>& t) {
  double shared = 0, all = 0;
  std::set<int64_t> seen;  // block ids sent before
  for (const auto& e : t) {
    if (!e.prompt_text.empty()) continue;  // its token count is the server's to know
    all += e.prompt_tokens;
    if (!e.block_ids.empty()) {
      // A block is reusable only while every block before it was (its prefix chain).
      for (size_t k = 0; k < e.block_ids.size() && seen.count(e.block_ids[k]); ++k)
        shared += std::min<int64_t>(e.block_tokens, e.prompt_tokens - int64_t(k) * e.block_tokens);
      seen.insert(e.block_ids.begin(), e.block_ids.end());
    } else if (e.conversation >= 0 && e.turn > 0) {
      shared += e.prompt_tokens - e.new_tokens;  // the history
    } else if (e.prefix_group >= 0) {
      shared += e.prefix_tokens;
    }
  }
  return all > 0 ? shared / all : 0.0;
}

}  // namespace tandem::bench
