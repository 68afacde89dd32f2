#pragma once
// `tandem bench compare`: one trace against tandem serve in several modes (colocated,
// disaggregated, shared: disaggregated with cores that follow the work) on the same machine and
// cores, and against any other OpenAI-compatible server (llama-server, vLLM: `--against`), a
// rate sweep for each, the highest rate at which each holds both SLOs (for the attainment
// target), a verdict that says why, and a self-contained HTML report.
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "tools/bench/serve.h"
#include "tools/bench/trace.h"

namespace tandem::bench {

// A server that is not tandem, on the same trace, rates and client: one already running (url),
// or one this run starts (command, run by /bin/sh; "{port}" in it is replaced by a free port).
struct external_server {
  std::string name;  // in the table and the verdict (default: the command's program, or "external")
  std::string url;
  std::string command;
};

struct compare_options {
  std::string tandem_binary;  // the `tandem` to run `serve` with
  std::string model;  // --model for both servers (empty: the built-in default)
  std::string trace = "mixed";  // short, long, mixed, a JSON Lines file, or mooncake (mooncake_file)
  std::string mooncake_file;  // --trace mooncake FILE: a window of it, scaled (its speedup unused: rates are swept)
  mooncake_options mooncake;
  int32_t requests = 40;  // per run
  std::vector<double> rates;  // empty: doubling from 0.25 req/s until both modes miss the SLOs
  int32_t total_threads = 2;  // colocated: one worker with all; disaggregated, shared: split in two
  // tandem's modes to run, in this order: colocated, colocated-slo (steps sized to the TPOT SLO),
  // disaggregated (fixed halves of the cores), shared (disaggregated, the cores shared:
  // --share-cores, decode paced under the TPOT SLO), auto (tandem serve's default).
  std::vector<std::string> modes = {"colocated", "disaggregated", "auto"};
  std::vector<external_server> against;  // other servers (all runs then use the OpenAI API)
  int32_t max_context = 0;  // prompt + output within this (0: what the first server reports)
  slo slos;
  double attainment = 0.9;
  uint64_t seed = 1;
  bool with_chaos = false;  // repeat each mode's best rate while killing a worker every 3 s
  // Rounds of every contender at every rate, interleaved (round 1 of each, then round 2, ...);
  // the table gives each figure's median over them. More than 1 needs `rates`.
  int32_t rounds = 1;
  std::vector<std::string> extra_serve_args;  // passed to both servers (e.g. --matmul fastest)
  bool progress = true;
};

struct mode_run {
  std::string mode;  // colocated | disaggregated | shared | an external server's name
  double rate = 0;
  serve_report report;
  bool held = false;  // the SLOs held for the attainment target
};

struct compare_result {
  std::vector<mode_run> runs;  // one per contender and rate (with rounds: the medians)
  std::vector<mode_run> round_runs;  // with rounds > 1: every round's run, in run order
  std::vector<mode_run> chaos_runs;
  // Every contender's highest rate holding the SLOs (0: none), in run order.
  std::vector<std::pair<std::string, double>> best;
  double best_rate(const std::string& contender) const;  // 0: none, or it did not run
  double explained_rate = 0;  // where the verdict's "why" and the report's CDFs are taken
  std::string verdict;
  nlohmann::json to_json(const compare_options& o) const;
};

compare_result run_compare(const compare_options& o);
// One contender at one rate over several rounds (not empty): the round whose goodput is the
// median (its outcomes feed the report's CDFs), with the table's figures (goodput, throughput,
// attainment, failed, TTFT and TPOT p50/p90, handoff) each replaced by its median over the
// rounds, and `held` judged on those.
mode_run median_of_rounds(const std::vector<const mode_run*>& rounds, const compare_options& o);
// The contenders' names in run order: tandem's modes, then the external servers.
std::vector<std::string> contender_names(const compare_options& o);
// The verdict's parts (each empty where its contenders did not run): colocated against
// disaggregated and why, shared cores against the better fixed split, and the external
// servers against tandem's best mode.
std::string modes_verdict(const compare_result& r, const compare_options& o);
std::string shared_verdict(const compare_result& r, const compare_options& o);
std::string auto_verdict(const compare_result& r, const compare_options& o);
std::string against_verdict(const compare_result& r, const compare_options& o);
// The lowest rate both modes ran at which exactly one holds the SLOs, else the highest both ran.
double explained_rate(const compare_result& r);
// The report: CDFs of TTFT and TPOT (at the highest rate both modes ran) and goodput vs rate.
std::string html_report(const compare_result& r, const compare_options& o);
void print_compare(const compare_result& r, const compare_options& o);

}  // namespace tandem::bench
