// `tandem bench serve`: a trace against any OpenAI-compatible streaming endpoint (or tandem's
// WebSocket protocol), with the serving figures and goodput under the given SLOs.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <fstream>
#include <iostream>

#include <filesystem>

#include <CLI/CLI.hpp>

#include "tools/bench/client.h"
#include "tools/bench/compare.h"
#include "tools/bench/serve.h"
#include "runtime/errors.h"
#include "runtime/model/synth.h"
#include "tools/commands.h"

namespace tandem::cli {
namespace {

struct serve_bench_opts {
  bench::serve_options so;
  std::string trace = "short", arrival = "poisson", out, save_trace;
  int32_t requests = 100, max_context = 0;
  double rate = 1.0, burstiness = 1.0, slo_ttft_ms = 0, slo_tpot_ms = 0;
  bool json = false, no_progress = false;
  CLI::Option* rate_given = nullptr;  // a file trace is rescaled to --rate only when it is given
  bench::trace_options shape;  // --prefix-tokens, --prefix-groups, --conversations, --turns
  std::vector<std::string> trace_args = {"short"};  // --trace KIND, or --trace mooncake FILE
  bench::mooncake_options mooncake;  // --scale-tokens, --speedup, --from, --count
  std::string scaling;  // what was done to a Mooncake trace, for the report
  CLI::Option *scale_given = nullptr, *speedup_given = nullptr, *from_given = nullptr, *count_given = nullptr;
  CLI::Option *requests_given = nullptr, *prefix_tokens_given = nullptr, *prefix_groups_given = nullptr,
              *conversations_given = nullptr, *turns_given = nullptr;
};

bool given(const CLI::Option* opt) { return opt && opt->count() > 0; }

// A flag that shapes one generated trace is an error with any other: it would be ignored.
void check_trace_flags(serve_bench_opts& o) {
  o.trace = o.trace_args.at(0);
  const bool mooncake = o.trace == "mooncake";
  if (mooncake != (o.trace_args.size() == 2))
    throw failure(errc::invalid_argument, mooncake ? "--trace mooncake needs the trace file: --trace mooncake FILE"
                                                   : "--trace takes one value (a kind or a file), or mooncake FILE");
  if (!mooncake && (given(o.scale_given) || given(o.speedup_given) || given(o.from_given) || given(o.count_given)))
    throw failure(errc::invalid_argument, "--scale-tokens, --speedup, --from and --count shape --trace mooncake only");
  if (mooncake && given(o.requests_given))
    throw failure(errc::invalid_argument,
                  "--trace mooncake replays --count entries from --from; --requests does not apply");
  if (mooncake && given(o.speedup_given) && given(o.rate_given))
    throw failure(errc::invalid_argument, "--speedup and --rate both set the replay's pace: give one");
  bench::workload w;
  const bool generated = bench::parse_workload(o.trace, w);
  const bool prefix = generated && w == bench::workload::shared_prefix,
             multiturn = generated && w == bench::workload::multiturn;
  if (!prefix && (given(o.prefix_tokens_given) || given(o.prefix_groups_given)))
    throw failure(errc::invalid_argument, "--prefix-tokens and --prefix-groups shape --trace system-prompt only");
  if (!multiturn && (given(o.conversations_given) || given(o.turns_given)))
    throw failure(errc::invalid_argument, "--conversations and --turns shape --trace multiturn only");
  if (multiturn && given(o.requests_given))
    throw failure(errc::invalid_argument,
                  "--trace multiturn sends --conversations x --turns requests; --requests does not apply");
  // The OpenAI API streams text: the next turn could not resend the exact tokens produced.
  if (multiturn && o.so.api != "ws")
    throw failure(
        errc::invalid_argument,
        "multiturn needs --api ws: the OpenAI streaming API returns text, not token ids, and each turn's prompt "
        "must carry the exact tokens the previous turn produced");
}

// The trace: generated (short, long, mixed, system-prompt, multiturn) for the server's context,
// or read from a file.
std::vector<bench::trace_entry> build_trace(serve_bench_opts& o, int32_t context) {
  if (o.trace == "mooncake") {
    auto m = o.mooncake;
    m.max_context = o.max_context > 0 ? o.max_context : context;
    try {
      auto t = bench::load_mooncake_trace(o.trace_args[1], m);
      o.scaling = t.scaling;
      return std::move(t.entries);
    } catch (const std::invalid_argument& e) {
      throw failure(errc::invalid_argument, e.what());
    }
  }
  bench::workload w;
  if (!bench::parse_workload(o.trace, w)) return bench::load_trace(o.trace);
  bench::trace_options t = o.shape;
  t.kind = w;
  t.requests = o.requests;
  t.rate = o.rate;
  t.arrival = o.arrival == "gamma" ? bench::arrival_kind::gamma : bench::arrival_kind::poisson;
  t.burstiness = o.burstiness;
  t.seed = o.so.seed;
  t.max_context = o.max_context > 0 ? o.max_context : context;
  try {
    return bench::make_trace(t);
  } catch (const std::invalid_argument& e) {  // e.g. a context too small for the turns asked
    throw failure(errc::invalid_argument, e.what());
  }
}

int run(serve_bench_opts o) {
  bench::parse_url(o.so.url);  // a bad URL or flag fails before anything runs
  check_trace_flags(o);
  const auto info = bench::query_server(o.so);
  if (o.so.model.empty()) o.so.model = info.model;
  if (o.slo_ttft_ms > 0) o.so.slos.ttft_s = o.slo_ttft_ms / 1e3;
  if (o.slo_tpot_ms > 0) o.so.slos.tpot_s = o.slo_tpot_ms / 1e3;
  o.so.progress = !o.no_progress && !o.json;
  auto trace = build_trace(o, info.context_length);
  bench::workload kind;
  const bool generated = bench::parse_workload(o.trace, kind);
  if (!generated && given(o.rate_given)) {
    trace = bench::at_rate(std::move(trace), o.rate);
    if (!o.scaling.empty()) o.scaling += "; then rescaled to " + std::to_string(o.rate) + " req/s";
  }
  if (!o.scaling.empty()) spdlog::info("trace: {}", o.scaling);
  if (!o.save_trace.empty()) bench::save_trace(trace, o.save_trace);
  if (trace.empty()) throw failure(errc::invalid_argument, "the trace has no request");
  spdlog::info("{} requests ({} trace, {}) against {} ({}, model '{}', context {})", trace.size(), o.trace,
               o.arrival == "gamma" ? "gamma arrivals, burstiness " + std::to_string(o.burstiness)
                                    : std::string("Poisson arrivals"),
               o.so.url, o.so.api, o.so.model, info.context_length);
  const auto rep = bench::run_serve_bench(o.so, trace);
  nlohmann::json j = rep.to_json();
  j["config"] = {{"url", o.so.url},
                 {"api", o.so.api},
                 {"model", o.so.model},
                 {"trace", o.trace},
                 {"rate", o.rate},
                 {"arrival", o.arrival},
                 {"burstiness", o.burstiness},
                 {"seed", o.so.seed},
                 {"slo_ttft_ms", o.slo_ttft_ms},
                 {"slo_tpot_ms", o.slo_tpot_ms}};
  if (!o.scaling.empty()) {
    j["config"]["trace_file"] = o.trace_args[1];
    j["config"]["scaling"] = o.scaling;
    j["config"]["scale_tokens"] = o.mooncake.scale_tokens;
    j["config"]["speedup"] = o.mooncake.speedup;
    j["config"]["from"] = o.mooncake.from;
    j["config"]["count"] = o.mooncake.count;
  }
  if (generated && kind == bench::workload::shared_prefix) {
    j["config"]["prefix_tokens"] = o.shape.prefix_tokens;
    j["config"]["prefix_groups"] = o.shape.prefix_groups;
  } else if (generated && kind == bench::workload::multiturn) {
    j["config"]["conversations"] = o.shape.conversations;
    j["config"]["turns"] = o.shape.turns;
  }
  if (!o.out.empty()) {
    std::ofstream f(o.out);
    if (!f) throw failure(errc::invalid_argument, "cannot write '" + o.out + "'");
    f << j.dump(2) << "\n";
  }
  if (o.json) std::cout << j.dump(2) << "\n";
  else {
    bench::print_report(rep, o.so);
    if (!o.scaling.empty()) std::printf("%-28s %s\n", "trace scaling", o.scaling.c_str());
  }
  return rep.figures.completed > 0 ? 0 : 1;
}

struct compare_opts {
  bench::compare_options co;
  std::vector<std::string> against_urls, against_cmds, against_names;
  std::vector<std::string> trace_args = {"mixed"};
  double slo_ttft_ms = 0, slo_tpot_ms = 0;
  std::string html, json_out, matmul;
  bool no_progress = false;
};

int run_compare_cmd(compare_opts o) {
  o.co.tandem_binary = sibling_binary("tandem").string();
  if (o.slo_ttft_ms > 0) o.co.slos.ttft_s = o.slo_ttft_ms / 1e3;
  if (o.slo_tpot_ms > 0) o.co.slos.tpot_s = o.slo_tpot_ms / 1e3;
  if (!o.co.slos.ttft_s && !o.co.slos.tpot_s)
    throw failure(errc::invalid_argument, "give --slo-ttft and/or --slo-tpot");
  if (!o.matmul.empty()) o.co.extra_serve_args = {"--matmul", o.matmul};
  o.co.progress = !o.no_progress;
  for (const auto& u : o.against_urls) o.co.against.push_back({"", u, ""});
  for (const auto& c : o.against_cmds) o.co.against.push_back({"", "", c});
  if (o.against_names.size() > o.co.against.size())
    throw failure(errc::invalid_argument, "--against-name: more names than --against/--against-cmd servers");
  for (size_t i = 0; i < o.against_names.size(); ++i) o.co.against[i].name = o.against_names[i];
  if (o.co.modes.empty() && o.co.against.empty()) throw failure(errc::invalid_argument, "--modes: nothing to run");
  if (o.co.rounds > 1 && o.co.rates.empty())
    throw failure(errc::invalid_argument, "--rounds needs --rates (the same rates every round)");
  if (o.co.rounds > 1 && o.co.with_chaos)
    throw failure(errc::invalid_argument, "--rounds and --with-chaos: run them apart");
  {
    auto names = bench::contender_names(o.co);
    std::sort(names.begin(), names.end());
    if (std::adjacent_find(names.begin(), names.end()) != names.end())
      throw failure(errc::invalid_argument, "two contenders have one name: give --against-name");
  }
  o.co.trace = o.trace_args.at(0);
  const bool mooncake = o.co.trace == "mooncake";
  if (mooncake != (o.trace_args.size() == 2))
    throw failure(errc::invalid_argument, mooncake ? "--trace mooncake needs the trace file: --trace mooncake FILE"
                                                   : "--trace takes one value (a kind or a file), or mooncake FILE");
  bench::workload w;
  // A bad file fails before any server starts.
  if (mooncake) {
    o.co.mooncake_file = o.trace_args[1];
    if (o.co.mooncake.count == 0)
      throw failure(errc::invalid_argument, "--trace mooncake in compare needs --count (requests per run)");
    (void)bench::load_mooncake_trace(o.co.mooncake_file, o.co.mooncake);
  } else if (!bench::parse_workload(o.co.trace, w)) {
    (void)bench::load_trace(o.co.trace);
  }
  // The benchmark model by name (the built-in default, stories260K, has a 512-token context
  // and no weight to time).
  o.co.model = o.co.model.empty() ? bench_model_path() : resolve_model_path(o.co.model);
  const auto r = bench::run_compare(o.co);
  bench::print_compare(r, o.co);
  const std::string html =
      o.html.empty() ? "bench-compare-" + std::filesystem::path(o.co.trace).stem().string() + ".html" : o.html;
  std::ofstream(html) << bench::html_report(r, o.co);
  std::printf("report: %s\n", html.c_str());
  if (!o.json_out.empty()) std::ofstream(o.json_out) << r.to_json(o.co).dump(2) << "\n";
  return 0;
}

}  // namespace

void add_bench_compare(CLI::App* bench) {
  auto o = std::make_shared<compare_opts>();
  auto* c = bench->add_subcommand(
      "compare",
      "Run one trace against tandem serve in several modes (colocated, disaggregated, shared cores) on the same "
      "cores, and against other OpenAI-compatible servers (--against), sweep the rate, find each one's highest "
      "rate holding the SLOs, write an HTML report and print a verdict");
  c->add_option(
       "--trace", o->trace_args,
       "short, long, mixed (generated), a JSON Lines trace file, or mooncake FILE (with --count; see bench serve)")
      ->expected(1, 2)
      ->capture_default_str();
  c->add_option("--scale-tokens", o->co.mooncake.scale_tokens,
                "mooncake: divide lengths and the 512-token block by this")
      ->check(CLI::Range(1, 512))
      ->capture_default_str();
  c->add_option("--from", o->co.mooncake.from, "mooncake: first entry of the window")->capture_default_str();
  c->add_option("--count", o->co.mooncake.count, "mooncake: entries per run (the window)")->capture_default_str();
  c->add_option("--requests", o->co.requests, "Requests per run")->check(CLI::Range(1, 100000))->capture_default_str();
  c->add_option("--rates", o->co.rates, "Rates to run, req/s (default: doubling from 0.25 until the SLOs are missed)")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  c->add_option("--threads", o->co.total_threads, "Compute threads in all, the same for every mode")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  c->add_option(
       "--modes", o->co.modes,
       "tandem's modes to run: colocated (one worker, all threads), colocated-slo (the same, steps sized to "
       "the TPOT SLO: --tpot-target-ms), disaggregated (a prefill and a decode worker, half each), shared "
       "(those two sharing the cores: --share-cores, decode paced under the TPOT SLO), auto (tandem serve --mode auto: "
       "shared cores, short prompts computed by their decode worker within the TPOT SLO's slack)")
      ->delimiter(',')
      ->check(CLI::IsMember({"colocated", "colocated-slo", "disaggregated", "shared", "auto"}))
      ->capture_default_str();
  c->add_option("--against", o->against_urls,
                "An OpenAI-compatible server already running (its base URL) to run the same trace against; every "
                "server is then measured over the OpenAI API (SSE)");
  c->add_option("--against-cmd", o->against_cmds,
                "A command that starts such a server ({port}: a free port it must listen on), e.g. "
                "'llama-server -m M.gguf -t 2 -np 4 -c 8192 --port {port}'; stopped after its runs");
  c->add_option("--against-name", o->against_names, "Names for the --against servers, then the --against-cmd ones");
  c->add_option("--max-context", o->co.max_context,
                "Keep prompt + output within this (default: the context the first server reports)")
      ->check(CLI::Range(16, 1 << 24));
  c->add_option("--slo-ttft", o->slo_ttft_ms, "TTFT SLO in ms")->check(CLI::NonNegativeNumber);
  c->add_option("--slo-tpot", o->slo_tpot_ms, "TPOT SLO in ms")->check(CLI::NonNegativeNumber);
  c->add_option("--attainment", o->co.attainment, "Fraction of requests that must meet the SLOs")
      ->check(CLI::Range(0.01, 1.0))
      ->capture_default_str();
  c->add_option("--model", o->co.model,
                "Model file for both servers, or synth:PRESET[:DTYPE] (default: synth:bench-76m, Q8_0, made once in "
                "the cache directory)");
  c->add_option("--seed", o->co.seed, "Trace seed")->capture_default_str();
  c->add_option("--matmul", o->matmul, "Passed to both servers' --matmul")
      ->check(CLI::IsMember({"batch-invariant", "fastest"}));
  c->add_flag("--with-chaos", o->co.with_chaos, "Repeat each mode's best rate while killing a worker every 3 s");
  c->add_option("--rounds", o->co.rounds,
                "Interleaved rounds (every contender at every rate, then again): the table gives each figure's median "
                "(needs --rates)")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  c->add_option("--html", o->html, "Report file (default: bench-compare-TRACE.html)");
  c->add_option("--json", o->json_out, "Also write every run's results as JSON to this file");
  c->add_flag("--no-progress", o->no_progress, "No progress bars");
  c->callback([o] {
    if (const int rc = run_compare_cmd(*o); rc != 0) throw CLI::RuntimeError(rc);
  });
}

void add_bench_serve(CLI::App* bench) {
  auto o = std::make_shared<serve_bench_opts>();
  auto* c = bench->add_subcommand(
      "serve",
      "Replay an arrival trace against a streaming endpoint (OpenAI-compatible or tandem's WebSocket) and "
      "report throughput, TTFT/TPOT/ITL/E2E, goodput under SLOs, KV movement and energy");
  c->add_option("--url", o->so.url, "Server base URL")->capture_default_str();
  c->add_option("--api", o->so.api, "openai (POST /v1/completions, streamed) or ws (tandem's /ws)")
      ->check(CLI::IsMember({"openai", "ws"}))
      ->capture_default_str();
  c->add_option("--model", o->so.model, "Model id to ask for (default: the first /v1/models lists)");
  c->add_option("--api-key", o->so.api_key, "Bearer token, if the server wants one");
  c->add_option(
       "--trace", o->trace_args,
       "short, long, mixed, system-prompt (a shared prefix), multiturn (conversations resending their history; "
       "--api ws) (generated), a JSON Lines trace file, or mooncake FILE (Moonshot AI's trace format: equal hash "
       "ids send equal token blocks)")
      ->expected(1, 2)
      ->capture_default_str();
  o->scale_given = c->add_option("--scale-tokens", o->mooncake.scale_tokens,
                                 "mooncake: divide lengths and the 512-token block by this (1..512)")
                       ->check(CLI::Range(1, 512))
                       ->capture_default_str();
  o->speedup_given = c->add_option("--speedup", o->mooncake.speedup, "mooncake: divide arrival times by this")
                         ->check(CLI::PositiveNumber)
                         ->capture_default_str();
  o->from_given = c->add_option("--from", o->mooncake.from, "mooncake: first entry of the window (file order)")
                      ->capture_default_str();
  o->count_given = c->add_option("--count", o->mooncake.count, "mooncake: entries in the window (0: to the end)")
                       ->capture_default_str();
  o->requests_given = c->add_option("--requests", o->requests, "Requests in a generated trace")
                          ->check(CLI::Range(1, 1000000))
                          ->capture_default_str();
  o->prefix_tokens_given =
      c->add_option("--prefix-tokens", o->shape.prefix_tokens,
                    "system-prompt: shared prefix length in tokens (a prefix cache reuses whole 16-token blocks)")
          ->check(CLI::Range(1, 1 << 24))
          ->capture_default_str();
  o->prefix_groups_given = c->add_option("--prefix-groups", o->shape.prefix_groups,
                                         "system-prompt: distinct shared prefixes, each request picks one")
                               ->check(CLI::Range(1, 1 << 20))
                               ->capture_default_str();
  o->conversations_given = c->add_option("--conversations", o->shape.conversations,
                                         "multiturn: conversations (first turns arrive at --rate)")
                               ->check(CLI::Range(1, 100000))
                               ->capture_default_str();
  o->turns_given = c->add_option("--turns", o->shape.turns, "multiturn: turns per conversation")
                       ->check(CLI::Range(1, 1000))
                       ->capture_default_str();
  o->rate_given =
      c->add_option("--rate", o->rate, "Mean arrival rate, requests per second (a trace file: rescaled to it)")
          ->check(CLI::PositiveNumber)
          ->capture_default_str();
  c->add_option("--arrival", o->arrival, "poisson, or gamma (with --burstiness)")
      ->check(CLI::IsMember({"poisson", "gamma"}))
      ->capture_default_str();
  c->add_option("--burstiness", o->burstiness, "Gamma shape: < 1 burstier than Poisson")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  c->add_option("--seed", o->so.seed, "Trace and prompt seed")->capture_default_str();
  c->add_option("--max-context", o->max_context, "Keep prompt + output within this (default: the server's context)")
      ->check(CLI::Range(0, 1 << 24));
  c->add_option("--vocab", o->so.vocab, "Synthetic prompts use token ids 3 .. 3+N-1")
      ->check(CLI::Range(1, 1 << 24))
      ->capture_default_str();
  c->add_option("--slo-ttft", o->slo_ttft_ms, "TTFT SLO in ms (0: none)")->check(CLI::NonNegativeNumber);
  c->add_option("--slo-tpot", o->slo_tpot_ms, "TPOT SLO in ms (0: none)")->check(CLI::NonNegativeNumber);
  c->add_option("--max-concurrency", o->so.max_concurrency, "OpenAI clients at once (later arrivals wait, counted)")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  c->add_option("--timeout", o->so.request_timeout_s, "Per-request timeout, seconds")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  c->add_option("--out", o->out, "Also write the JSON results to this file");
  c->add_option("--save-trace", o->save_trace, "Write the trace used as JSON Lines (replay it with --trace FILE)");
  c->add_flag("--json", o->json, "Print the results as JSON instead of a table");
  c->add_flag("--no-progress", o->no_progress, "No progress bar on stderr");
  c->callback([o] {
    if (const int rc = run(*o); rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace tandem::cli
