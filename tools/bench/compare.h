#pragma once
// `tandem bench compare`: one trace against a colocated and a disaggregated tandem serve on the
// same machine and cores, a rate sweep for each, the highest rate at which each holds both SLOs
// (for the attainment target), a verdict that says why, and a self-contained HTML report.
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "tools/bench/serve.h"
#include "tools/bench/trace.h"

namespace tandem::bench {

struct compare_options {
  std::string tandem_binary;   // the `tandem` to run `serve` with
  std::string model;           // --model for both servers (empty: the built-in default)
  std::string trace = "mixed"; // short, long, mixed, a JSON Lines file, or mooncake (mooncake_file)
  std::string mooncake_file;   // --trace mooncake FILE: a window of it, scaled (its speedup unused: rates are swept)
  mooncake_options mooncake;
  int32_t requests = 40;       // per run
  std::vector<double> rates;   // empty: doubling from 0.25 req/s until both modes miss the SLOs
  int32_t total_threads = 2;   // colocated: one worker with all; disaggregated: split in two
  slo slos;
  double attainment = 0.9;
  uint64_t seed = 1;
  bool with_chaos = false;     // repeat each mode's best rate while killing a worker every 3 s
  std::vector<std::string> extra_serve_args;  // passed to both servers (e.g. --matmul fastest)
  bool progress = true;
};

struct mode_run {
  std::string mode;  // colocated | disaggregated
  double rate = 0;
  serve_report report;
  bool held = false;  // the SLOs held for the attainment target
};

struct compare_result {
  std::vector<mode_run> runs;
  std::vector<mode_run> chaos_runs;
  double best_colocated = 0, best_disaggregated = 0;  // highest rate holding the SLOs (0: none)
  double explained_rate = 0;  // where the verdict's "why" and the report's CDFs are taken
  std::string verdict;
  nlohmann::json to_json(const compare_options& o) const;
};

compare_result run_compare(const compare_options& o);
// The lowest rate both modes ran at which exactly one holds the SLOs, else the highest both ran.
double explained_rate(const compare_result& r);
// The report: CDFs of TTFT and TPOT (at the highest rate both modes ran) and goodput vs rate.
std::string html_report(const compare_result& r, const compare_options& o);
void print_compare(const compare_result& r, const compare_options& o);

}  // namespace tandem::bench
