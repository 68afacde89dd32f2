#pragma once
// Serving-benchmark statistics, free of any client or server: per-request outcomes in, the
// figures `tandem bench serve` reports out (throughputs, latency summaries, SLO attainment and
// goodput). Definitions follow vLLM's benchmark_serving so that figures compare:
//   TTFT  first streamed token - send time
//   TPOT  (end - first token) / (output tokens - 1), per request (needs >= 2 tokens)
//   ITL   every gap between consecutive streamed tokens, over all requests
//   E2E   end - send time
//   goodput  completed requests per second that meet every given SLO
#include <cstdint>
#include <optional>
#include <vector>

namespace tandem::bench {

struct summary {
  int64_t count = 0;
  double mean = 0, p50 = 0, p90 = 0, p99 = 0, min = 0, max = 0;
};

// q in [0, 100] of sorted values, linearly interpolated between ranks (numpy's default).
double percentile(const std::vector<double>& sorted, double q);
summary summarize(std::vector<double> values);
// The middle value (the mean of the middle two for an even count); 0 when empty. Interleaved
// rounds report it (bench kernels, bench compare --rounds).
double median(std::vector<double> values);
// The median of num[i] / den[i] over the pairs (the shorter length): a ratio between two
// configurations measured in the same rounds, whose common drifts cancel pair by pair.
double median_ratio(const std::vector<double>& num, const std::vector<double>& den);

// Service-level objectives; an unset one does not constrain.
struct slo {
  std::optional<double> ttft_s;
  std::optional<double> tpot_s;
};

struct request_outcome {
  bool ok = false;  // finished (not an error, not lost)
  double send_s = 0;  // when it was sent, from the start of the run
  double ttft_s = 0;
  double e2e_s = 0;
  int32_t prompt_tokens = 0;
  int32_t output_tokens = 0;
  std::vector<double> itl_s;  // gaps between its streamed tokens
};

// TPOT of one request; nullopt with fewer than two output tokens.
std::optional<double> tpot_of(const request_outcome& r);
// A finished request that meets every set SLO (a one-token answer meets any TPOT).
bool meets(const request_outcome& r, const slo& s);

struct run_figures {
  double duration_s = 0;
  int64_t sent = 0, completed = 0, failed = 0;
  int64_t prompt_tokens = 0, output_tokens = 0;
  double request_throughput = 0;  // completed / s
  double prompt_tokens_per_s = 0, output_tokens_per_s = 0;
  summary ttft_s, tpot_s, itl_s, e2e_s;
  double slo_attainment = 0;  // fraction of sent requests that meet the SLOs
  double goodput = 0;  // requests / s that meet the SLOs
};

// `duration_s`: from the first send to the last completion (> 0).
run_figures compute_figures(const std::vector<request_outcome>& outcomes, double duration_s, const slo& s);

}  // namespace tandem::bench
