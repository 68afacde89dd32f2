#pragma once
// One benchmark run against a serving endpoint: a trace replayed at its arrival times through
// an OpenAI-compatible or tandem WebSocket client, the per-request outcomes, and what the
// server's /metrics and the machine (RAPL) say about the same interval. `tandem bench serve`
// prints it; `tandem bench compare` runs it per mode and rate.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tools/bench/stats.h"
#include "tools/bench/trace.h"

namespace tandem::bench {

struct serve_options {
  std::string url = "http://127.0.0.1:8080";
  std::string api = "openai";  // openai | ws
  std::string model;  // OpenAI model id; empty: the first /v1/models lists
  std::string api_key;
  int32_t vocab = 256;  // synthetic prompts draw token ids from [3, 3 + vocab)
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
  nlohmann::json server;  // from /metrics: KV moved, transfer, queue, weights
  nlohmann::json energy;  // RAPL joules and watts, or "not available"
  int64_t arrivals_late = 0;  // sends delayed past their arrival by the concurrency cap
  double trace_shared_share = 0;  // shared_prefix_share of the trace run: the cache's best case
  nlohmann::json to_json() const;
};

// What the server at `url` says about itself: model id and context length (from /v1/models).
struct served_info {
  std::string model;
  int32_t context_length = 0;
};
served_info query_server(const serve_options& o);

// A synthetic prompt's token ids for trace entry `index` (exactly e.prompt_tokens of them, from
// [3, 3 + vocab)): with a prefix group, the first e.prefix_tokens come from (seed, group) and so
// are the same in every request of the group; the rest come from (seed, index), the request's own.
std::vector<int32_t> synthetic_prompt(const trace_entry& e, size_t index, const serve_options& o);
// Turn k > 0 of a conversation (entry `index`): turn k-1's prompt, the token ids it produced,
// then e.new_tokens ids of its own from (seed, index).
std::vector<int32_t> next_turn_prompt(const std::vector<int32_t>& previous_prompt,
                                      const std::vector<int32_t>& previous_output, const trace_entry& e, size_t index,
                                      const serve_options& o);

// Runs the trace: each entry sent at its arrival, a conversation's turn k not before turn k-1
// has finished (its prompt is built then; a failed turn fails the rest of its conversation
// unsent). Throws std::invalid_argument for a trace the chosen API cannot run (turns after a
// first need --api ws, the one that returns token ids) or whose turns are out of order.
serve_report run_serve_bench(const serve_options& o, const std::vector<trace_entry>& trace);
void print_report(const serve_report& r, const serve_options& o);

}  // namespace tandem::bench
