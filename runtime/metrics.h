#pragma once
// The process's metrics: counters, gauges and histograms kept in one registry, read by
// `tandem generate --json` (to_json) and by the /metrics endpoint (to_prometheus).
//
// Workers on different threads update series concurrently. Updates are lock-free atomics on a
// series the caller already holds; the registry's mutex guards only creating and looking up
// series and exporting them. Hot paths should look a series up once and keep the reference:
// references stay valid for the registry's life.
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace tandem::metrics {

// Label pairs (name, value). Order does not matter: {{a,1},{b,2}} and {{b,2},{a,1}} are one series.
using labels = std::vector<std::pair<std::string, std::string>>;

// Monotonic: a negative or NaN increment throws std::invalid_argument (it would make rate() lie).
class counter {
 public:
  void inc(double v = 1);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

class gauge {
 public:
  void set(double v) { value_.store(v, std::memory_order_relaxed); }
  void add(double v) { value_.fetch_add(v, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

// Fixed buckets with Prometheus `le` semantics: an observation v lands in the first bucket whose
// upper bound is >= v, or in the implicit +Inf bucket past the last bound.
class histogram {
 public:
  // Bounds must be finite and strictly increasing (may be empty); +Inf is implicit.
  explicit histogram(std::vector<double> bounds);

  // NaN is dropped: it would turn the sum into NaN for the rest of the process.
  void observe(double v);
  uint64_t count() const;
  double sum() const { return sum_.load(std::memory_order_relaxed); }
  // Estimate from the buckets, interpolating linearly inside the bucket that holds rank q*count
  // (as Prometheus's histogram_quantile does: the first bucket starts at 0 when its bound is
  // positive; a rank in the +Inf bucket answers the highest finite bound). NaN when empty;
  // q outside [0,1] throws std::invalid_argument.
  double quantile(double q) const;
  const std::vector<double>& bounds() const { return bounds_; }
  // Per-bucket (not cumulative) counts, bounds().size() + 1 entries; the last is the +Inf bucket.
  std::vector<uint64_t> bucket_counts() const;

 private:
  std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;  // bounds_.size() + 1, fixed at construction
  std::atomic<double> sum_{0};
};

class registry {
 public:
  registry();
  ~registry();
  registry(const registry&) = delete;
  registry& operator=(const registry&) = delete;

  // Families are created on first use; the same (name, labels) returns the same series. A name
  // outside [a-zA-Z_:][a-zA-Z0-9_:]*, a bad label name, a name already used by another metric
  // type, or histogram bounds differing from the family's throw std::invalid_argument. The help
  // text of the first call that gives one wins (a reader may look a metric up with "").
  counter& get_counter(const std::string& name, const std::string& help, const labels& l = {});
  gauge& get_gauge(const std::string& name, const std::string& help, const labels& l = {});
  histogram& get_histogram(const std::string& name, const std::string& help, const std::vector<double>& bounds,
                           const labels& l = {});

  // Prometheus text exposition format 0.0.4, families sorted by name, series by labels.
  std::string to_prometheus() const;
  // {"counters":{name:[{"labels":{..},"value":x}]}, "gauges":{..same..},
  //  "histograms":{name:[{"labels":{..},"count":n,"sum":s,"p50":..,"p90":..,"p99":..,"mean":..}]}}
  // Quantiles and mean are null for an empty histogram.
  std::string to_json() const;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

// `count` bounds start, start*factor, ...; start > 0, factor > 1, count >= 1 or invalid_argument.
std::vector<double> exponential_buckets(double start, double factor, int count);
// `count` bounds start, start+width, ...; width > 0, count >= 1 or invalid_argument.
std::vector<double> linear_buckets(double start, double width, int count);
// Default latency buckets in milliseconds: 1, 1.5, 2, 3, 5, 7.5 per decade from 0.1 ms to 75 s,
// so an interpolated quantile is off by at most a bucket about 1.5x wide.
const std::vector<double>& latency_seconds_buckets();  // 100 µs .. 75 s, for exported latencies

// This process's resident memory and open file descriptors, read from /proc/self (statm, fd);
// -1 where /proc cannot be read.
struct process_stats {
  int64_t resident_bytes = -1, open_fds = -1;
};
process_stats read_process_stats();
// Sets process_resident_memory_bytes and process_open_fds (the names Prometheus's client
// libraries give them) to read_process_stats(): called at each scrape, so they are never stale.
void update_process_metrics(registry& r);

// One finished request's timings; the request actor fills it and records it in one call.
struct request_timings {
  double queue_prefill_ms = 0, queue_decode_ms = 0, prefill_ms = 0, ttft_ms = 0, tpot_ms = 0, kv_transfer_ms = 0,
         decode_ms = 0, e2e_ms = 0;
  // First token to decode start (disaggregated): what KV streaming during prefill shortens.
  double handoff_ms = 0;
  uint64_t kv_bytes = 0;
  int32_t prompt_tokens = 0, output_tokens = 0;
  int32_t cached_tokens = 0;  // of prompt_tokens, taken from the prefix cache
  std::string prefill_worker, decode_worker;  // where it ran last ("prefill-0"; empty: not there)
};

// Counts the request in tandem_requests_total{outcome} and its work in tandem_kv_bytes_total,
// tandem_prompt_tokens_total and tandem_output_tokens_total. Latencies go to the histograms
// tandem_request_{queue_prefill,queue_decode,prefill,ttft,tpot,kv_transfer,handoff,decode,e2e}_seconds only for
// "finished" requests, so rejections (~0 ms) and failures do not drag the quantiles; tpot only with
// >= 2 output tokens and kv_transfer only when KV bytes moved, for the same reason. outcome must be
// "finished", "failed", "cancelled" or "rejected" (invalid_argument otherwise: a typo would
// otherwise become a new series).
void record_request(registry& r, const request_timings& t, const std::string& outcome);

}  // namespace tandem::metrics
