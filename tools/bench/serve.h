#pragma once
// One benchmark run against a serving endpoint: a trace replayed at its arrival times through
// an OpenAI-compatible or tandem WebSocket client, the per-request outcomes, and what the
// server's /metrics and the machine (RAPL) say about the same interval. `tandem bench serve`
// prints it; `tandem bench compare` runs it per mode and rate.
#include <nlohmann/json.hpp>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tools/bench/stats.h"
#include "tools/bench/trace.h"

namespace tandem::bench {

struct serve_options {
  std::string url = "http://127.0.0.1:8080";
  std::string api = "openai";  // openai | ws
  std::string model;           // OpenAI model id; empty: the first /v1/models lists
  std::string api_key;
  int32_t vocab = 256;         // synthetic prompts draw token ids from [3, 3 + vocab)
  int32_t max_concurrency = 256;
  double request_timeout_s = 600;
  slo slos;
  bool progress = true;
  uint64_t seed = 1;
};

struct serve_report {
  run_figures figures;
  std::vector<request_outcome> outcomes;
  std::map<std::string, int64_t> errors;  // first words of each error, counted
  nlohmann::json server;                  // from /metrics: KV moved, transfer, queue, weights
  nlohmann::json energy;                  // RAPL joules and watts, or "not available"
  int64_t arrivals_late = 0;              // sends delayed past their arrival by the concurrency cap
  nlohmann::json to_json() const;
};

// What the server at `url` says about itself: model id and context length (from /v1/models).
struct served_info {
  std::string model;
  int32_t context_length = 0;
};
served_info query_server(const serve_options& o);

serve_report run_serve_bench(const serve_options& o, const std::vector<trace_entry>& trace);
void print_report(const serve_report& r, const serve_options& o);

}  // namespace tandem::bench
