#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace tandem {

status sampling_params::validate() const {
  if (!std::isfinite(temperature) || temperature < 0.0f)
    return {errc::invalid_argument, "temperature must be a finite number >= 0"};
  if (!(top_p > 0.0f && top_p <= 1.0f)) return {errc::invalid_argument, "top_p must be in (0, 1]"};
  if (top_k < 0) return {errc::invalid_argument, "top_k must be >= 0 (0 disables it)"};
  return {};
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
  if (p.temperature <= 0.0f)
    return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());

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
