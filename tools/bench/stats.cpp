#include "tools/bench/stats.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace tandem::bench {

double percentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const double rank = std::clamp(q, 0.0, 100.0) / 100.0 * double(sorted.size() - 1);
  const size_t lo = size_t(std::floor(rank)), hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - double(lo));
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n == 0 ? 0 : n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

double median_ratio(const std::vector<double>& num, const std::vector<double>& den) {
  std::vector<double> r;
  for (size_t i = 0; i < std::min(num.size(), den.size()); ++i) r.push_back(num[i] / den[i]);
  return median(std::move(r));
}

summary summarize(std::vector<double> values) {
  summary s;
  if (values.empty()) return s;
  std::sort(values.begin(), values.end());
  s.count = int64_t(values.size());
  s.mean = std::accumulate(values.begin(), values.end(), 0.0) / double(values.size());
  s.p50 = percentile(values, 50);
  s.p90 = percentile(values, 90);
  s.p99 = percentile(values, 99);
  s.min = values.front();
  s.max = values.back();
  return s;
}

std::optional<double> tpot_of(const request_outcome& r) {
  if (!r.ok || r.output_tokens < 2) return std::nullopt;
  return (r.e2e_s - r.ttft_s) / double(r.output_tokens - 1);
}

bool meets(const request_outcome& r, const slo& s) {
  if (!r.ok) return false;
  if (s.ttft_s && r.ttft_s > *s.ttft_s) return false;
  if (s.tpot_s)
    if (auto t = tpot_of(r); t && *t > *s.tpot_s) return false;
  return true;
}

run_figures compute_figures(const std::vector<request_outcome>& outcomes, double duration_s, const slo& s) {
  run_figures f;
  f.duration_s = duration_s;
  std::vector<double> ttft, tpot, itl, e2e;
  int64_t good = 0;
  for (const auto& r : outcomes) {
    ++f.sent;
    if (!r.ok) {
      ++f.failed;
      continue;
    }
    ++f.completed;
    f.prompt_tokens += r.prompt_tokens;
    f.output_tokens += r.output_tokens;
    ttft.push_back(r.ttft_s);
    e2e.push_back(r.e2e_s);
    if (auto t = tpot_of(r)) tpot.push_back(*t);
    itl.insert(itl.end(), r.itl_s.begin(), r.itl_s.end());
    if (meets(r, s)) ++good;
  }
  if (duration_s > 0) {
    f.request_throughput = double(f.completed) / duration_s;
    f.prompt_tokens_per_s = double(f.prompt_tokens) / duration_s;
    f.output_tokens_per_s = double(f.output_tokens) / duration_s;
    f.goodput = double(good) / duration_s;
  }
  f.slo_attainment = f.sent > 0 ? double(good) / double(f.sent) : 0;
  f.ttft_s = summarize(std::move(ttft));
  f.tpot_s = summarize(std::move(tpot));
  f.itl_s = summarize(std::move(itl));
  f.e2e_s = summarize(std::move(e2e));
  return f;
}

}  // namespace tandem::bench
