// `tandem bench kernels`: engine throughput on a synthetic model next to this machine's
// measured peaks, so every figure comes with the ceiling it should be judged against.
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <cstdio>
#include <iostream>

#include <CLI/CLI.hpp>

#include "kernels/cpu/matmul.h"
#include "kernels/cpu/peak.h"
#include "runtime/engine/engine.h"
#include "runtime/model/synth.h"
#include "tools/bench/llama_bench.h"
#include "tools/bench/stats.h"
#include "tools/commands.h"

namespace tandem::cli {
namespace {

using bench::median;

struct bench_opts {
  std::string preset = "bench-76m", model;
  std::vector<std::string> dtypes = {"f32", "bf16", "q8_0"};
  std::vector<int> threads = {1, 2};
  std::vector<std::string> matmul = {"batch-invariant", "fastest"};
  std::string kv_dtype = "f16";
  int prompt_tokens = 512, decode_tokens = 128, repeats = 2;
  bool json = false;
  // Side by side with the reference llama.cpp (run_against_llama).
  std::string llama_dir;
  std::vector<int> contexts;  // positions in the sequence when decode starts
  int rounds = 3;
};

using clock_type = std::chrono::steady_clock;
double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

// FLOPs and bytes of one token's matmuls (weights of all layers, plus the output head).
struct token_cost {
  double matmul_flops = 0;  // excluding the output head
  double head_flops = 0;
  double weight_bytes = 0;  // excluding the output head
  double head_bytes = 0;
};

token_cost cost_of(const model& m) {
  token_cost tc;
  auto add = [&](const kernels::weight_view& w, bool head) {
    const double f = 2.0 * double(w.rows) * double(w.cols);
    const double b = double(w.rows) * double(kernels::row_bytes(w.type, w.cols));
    (head ? tc.head_flops : tc.matmul_flops) += f;
    (head ? tc.head_bytes : tc.weight_bytes) += b;
  };
  for (const auto& l : m.layers())
    for (const auto* w : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) add(*w, false);
  add(m.output(), true);
  return tc;
}

// Attention FLOPs (QKᵀ and PV) for one query at context length n.
double attn_flops(const llama_config& c, double n) { return 4.0 * c.n_layer * c.n_head * c.head_dim * n; }

// Microseconds per empty run_on_all (every thread must take part): the pool's dispatch cost,
// which bounds how small a parallel decode matmul can usefully be.
double dispatch_us(kernels::thread_pool& pool) {
  const int n = 2000;
  pool.run_on_all([](int) {});
  const auto t0 = clock_type::now();
  for (int i = 0; i < n; ++i) pool.run_on_all([](int) {});
  return seconds_since(t0) / n * 1e6;
}

void check(const status& st) {
  if (!st.ok()) throw failure(st.code(), st.message());
}

// One timed run on a fresh sequence: `context - prompt` tokens prefilled untimed, then the
// timed prefill of `prompt` tokens, then `decode` timed greedy steps (from position `context`).
// First an untimed warm-up, as llama-bench's (a prefill of `prompt` tokens and a decode step on
// a sequence freed after): a new engine's first forward pays the page faults of its scratch and
// KV memory and its threads' start, which llama-bench's timed runs do not.
struct timing {
  double prefill_s, decode_s;
};
timing time_engine(engine& eng, const llama_config& c, int context, int prompt, int decode) {
  std::vector<float> logits;
  {
    std::vector<token_id> warm(static_cast<size_t>(prompt));
    for (size_t i = 0; i < warm.size(); ++i) warm[i] = token_id((i * 104729 + 7) % size_t(c.n_vocab));
    const seq_id w = eng.create_sequence();
    check(eng.prefill(w, warm, logits));
    const token_id t = warm.front();
    check(eng.decode(std::span(&w, 1), std::span(&t, 1), logits));
    check(eng.free_sequence(w));
  }
  std::vector<token_id> tokens(static_cast<size_t>(context));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = token_id((i * 7919 + 13) % size_t(c.n_vocab));
  const seq_id s = eng.create_sequence();
  if (context > prompt) check(eng.prefill(s, std::span(tokens).first(size_t(context - prompt)), logits));
  const auto t0 = clock_type::now();
  check(eng.prefill(s, std::span(tokens).last(size_t(prompt)), logits));
  timing t{seconds_since(t0), 0};
  token_id tok = token_id(std::max_element(logits.begin(), logits.end()) - logits.begin());
  const auto t1 = clock_type::now();
  for (int i = 0; i < decode; ++i) {
    check(eng.decode(std::span(&s, 1), std::span(&tok, 1), logits));
    tok = token_id(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
  t.decode_s = seconds_since(t1);
  check(eng.free_sequence(s));
  return t;
}

// tandem and llama-bench on the same GGUF files, the same thread counts and the same
// positions, in interleaved rounds (each round runs every configuration once on each side),
// reported as medians and as ratios tandem / llama.cpp. Prefill: `prompt_tokens` after
// `context - prompt_tokens` tokens (llama-bench -p P -d context-P); decode: `decode_tokens`
// from position `context` (-n D -d context).
// What to run: each --dtypes value on the preset's cached synthetic model, or the one --model
// file, labelled by its dominant weight type.
struct bench_target {
  std::string label, path;
};
std::vector<bench_target> bench_targets(const bench_opts& o) {
  if (!o.model.empty()) return {{std::string(kernels::to_string(model::load(o.model)->weight_type())), o.model}};
  std::vector<bench_target> out;
  for (const auto& dt_name : o.dtypes) {
    const auto dt = kernels::dtype_from_name(dt_name);
    if (!dt) throw failure(errc::invalid_argument, "unknown dtype '" + dt_name + "'");
    out.push_back({dt_name, cached_synth_model(o.preset, *dt)});
  }
  return out;
}

int run_against_llama(const bench_opts& o) {
  bench::llama_bench ref(o.llama_dir);
  const std::vector<int> contexts = o.contexts.empty() ? std::vector<int>{o.prompt_tokens} : o.contexts;
  struct row {
    std::string dtype, path, mode;
    int threads, context;
    std::vector<double> ours_pp, ours_tg, ref_pp, ref_tg;
  };
  std::vector<row> rows;
  std::map<std::string, std::shared_ptr<const model>> models;
  for (const auto& [dt_name, path] : bench_targets(o)) {
    auto m = model::load(path);
    for (int ctx : contexts) {
      if (ctx < o.prompt_tokens || ctx + o.decode_tokens > m->config().n_ctx)
        throw failure(errc::invalid_argument, "context " + std::to_string(ctx) + " must be at least the prompt (" +
                                                  std::to_string(o.prompt_tokens) + ") and leave room for " +
                                                  std::to_string(o.decode_tokens) + " decode tokens in " +
                                                  std::to_string(m->config().n_ctx));
      for (int t : o.threads)
        for (const auto& mode : o.matmul) rows.push_back({dt_name, path, mode, t, ctx, {}, {}, {}, {}});
    }
    models[path] = std::move(m);
  }
  for (int r = 0; r < o.rounds; ++r)
    for (auto& w : rows) {
      const auto& m = models.at(w.path);
      engine_options eo;
      eo.n_threads = w.threads;
      eo.matmul = parse_matmul_mode(w.mode);
      eo.kv_dtype = parse_kv_dtype(o.kv_dtype);
      eo.n_kv_blocks = (w.context + o.decode_tokens) / eo.block_size + 2;
      {
        engine eng(m, eo);
        const timing t = time_engine(eng, m->config(), w.context, o.prompt_tokens, o.decode_tokens);
        w.ours_pp.push_back(o.prompt_tokens / t.prefill_s);
        w.ours_tg.push_back(o.decode_tokens / t.decode_s);
      }
      w.ref_pp.push_back(ref.prefill_tps(w.path, w.threads, o.prompt_tokens, w.context - o.prompt_tokens));
      w.ref_tg.push_back(ref.decode_tps(w.path, w.threads, o.decode_tokens, w.context));
      spdlog::info("round {}: {} x{} ctx {} {}: prefill {:.0f} vs {:.0f} tok/s, decode {:.1f} vs {:.1f} tok/s", r + 1,
                   w.dtype, w.threads, w.context, w.mode, w.ours_pp.back(), w.ref_pp.back(), w.ours_tg.back(),
                   w.ref_tg.back());
    }
  // Prefill scaling: each round's N-thread prefill over its 1-thread one of the same file,
  // context and mode (run close together, so the VM's slower drifts cancel), median over rounds.
  auto scaling = [&](const row& w, auto member) -> std::optional<double> {
    if (w.threads == 1) return std::nullopt;
    for (const auto& one : rows)
      if (one.threads == 1 && one.path == w.path && one.context == w.context && one.mode == w.mode)
        return bench::median_ratio(w.*member, one.*member);
    return std::nullopt;
  };
  nlohmann::json results = nlohmann::json::array();
  for (const auto& w : rows) {
    results.push_back({{"dtype", w.dtype},
                       {"threads", w.threads},
                       {"context", w.context},
                       {"matmul", w.mode},
                       {"prompt_tokens", o.prompt_tokens},
                       {"decode_tokens", o.decode_tokens},
                       {"rounds", o.rounds},
                       {"tandem_prefill_tps", median(w.ours_pp)},
                       {"llama_prefill_tps", median(w.ref_pp)},
                       {"prefill_ratio", median(w.ours_pp) / median(w.ref_pp)},
                       {"tandem_decode_tps", median(w.ours_tg)},
                       {"llama_decode_tps", median(w.ref_tg)},
                       {"decode_ratio", median(w.ours_tg) / median(w.ref_tg)},
                       {"isa", kernels::cpu::isa_name()}});
    if (const auto ours = scaling(w, &row::ours_pp), ref = scaling(w, &row::ref_pp); ours && ref) {
      results.back()["tandem_prefill_scaling"] = *ours;
      results.back()["llama_prefill_scaling"] = *ref;
    }
  }
  if (o.json) {
    std::cout << results.dump(2) << "\n";
    return 0;
  }
  std::printf("\nmedians of %d interleaved rounds; prefill %d tokens ending at the context, decode %d tokens from it\n",
              o.rounds, o.prompt_tokens, o.decode_tokens);
  std::printf("%-6s %3s %5s %-15s | %10s %10s %6s | %9s %9s %6s\n", "dtype", "thr", "ctx", "matmul", "pp tandem",
              "pp llama", "ratio", "tg tandem", "tg llama", "ratio");
  for (const auto& r : results)
    std::printf("%-6s %3d %5d %-15s | %10.1f %10.1f %5.2fx | %9.1f %9.1f %5.2fx\n", std::string(r["dtype"]).c_str(),
                int(r["threads"]), int(r["context"]), std::string(r["matmul"]).c_str(), double(r["tandem_prefill_tps"]),
                double(r["llama_prefill_tps"]), double(r["prefill_ratio"]), double(r["tandem_decode_tps"]),
                double(r["llama_decode_tps"]), double(r["decode_ratio"]));
  bool scaled = false;
  for (const auto& r : results) {
    if (!r.contains("tandem_prefill_scaling")) continue;
    if (!scaled)
      std::printf(
          "\nprefill at N threads / at 1 thread: median over rounds of each round's pair\n%-6s %3s %5s %-15s | %7s "
          "%7s\n",
          "dtype", "thr", "ctx", "matmul", "tandem", "llama");
    scaled = true;
    std::printf("%-6s %3d %5d %-15s | %6.2fx %6.2fx\n", std::string(r["dtype"]).c_str(), int(r["threads"]),
                int(r["context"]), std::string(r["matmul"]).c_str(), double(r["tandem_prefill_scaling"]),
                double(r["llama_prefill_scaling"]));
  }
  return 0;
}

int run_bench(const bench_opts& o) {
  if (!o.llama_dir.empty()) return run_against_llama(o);
  nlohmann::json results = nlohmann::json::array();
  nlohmann::json peaks = nlohmann::json::object();
  std::map<int, std::pair<double, double>> peak;  // threads -> (GFLOP/s, GB/s)
  std::map<int, double> dispatch;  // threads -> us per pool dispatch
  for (int t : o.threads) {
    kernels::thread_pool pool(t);
    const double gf = kernels::cpu::measure_fma_gflops(pool);
    const double bw = kernels::cpu::measure_read_bandwidth_gbs(pool);
    peak[t] = {gf, bw};
    dispatch[t] = dispatch_us(pool);
    peaks[std::to_string(t)] = {{"fma_gflops", gf}, {"read_gbs", bw}, {"dispatch_us", dispatch[t]}};
    spdlog::info("peak with {} thread(s): {:.1f} GFLOP/s FMA ({}), {:.1f} GB/s read; pool dispatch {:.2f} us", t, gf,
                 kernels::cpu::isa_name(), bw, dispatch[t]);
  }

  for (const auto& [dt_name, path] : bench_targets(o)) {
    auto m = model::load(path);
    const auto& c = m->config();
    const token_cost tc = cost_of(*m);
    if (o.prompt_tokens + o.decode_tokens > c.n_ctx)
      throw failure(errc::invalid_argument, "prompt + decode tokens exceed the model's context");
    std::vector<token_id> prompt(size_t(o.prompt_tokens));
    for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = token_id((i * 7919 + 13) % size_t(c.n_vocab));

    for (int t : o.threads)
      for (const auto& mode : o.matmul) {
        engine_options eo;
        eo.n_threads = t;
        eo.matmul = parse_matmul_mode(mode);
        eo.kv_dtype = parse_kv_dtype(o.kv_dtype);
        eo.n_kv_blocks = (o.prompt_tokens + o.decode_tokens) / eo.block_size + 2;
        engine eng(m, eo);
        double best_prefill = 1e30, best_decode = 1e30;
        std::vector<float> logits;
        for (int r = 0; r < o.repeats; ++r) {
          const seq_id s = eng.create_sequence();
          const auto t0 = clock_type::now();
          check(eng.prefill(s, prompt, logits));
          best_prefill = std::min(best_prefill, seconds_since(t0));
          token_id tok = token_id(std::max_element(logits.begin(), logits.end()) - logits.begin());
          const auto t1 = clock_type::now();
          for (int i = 0; i < o.decode_tokens; ++i) {
            check(eng.decode(std::span(&s, 1), std::span(&tok, 1), logits));
            tok = token_id(std::max_element(logits.begin(), logits.end()) - logits.begin());
          }
          best_decode = std::min(best_decode, seconds_since(t1));
          check(eng.free_sequence(s));
        }
        const double P = o.prompt_tokens, D = o.decode_tokens;
        const double kv_token_bytes =
            double(c.n_layer) * 2 * c.n_kv_head * double(kernels::row_bytes(eo.kv_dtype, c.head_dim));
        const double prefill_flops = P * tc.matmul_flops + tc.head_flops + attn_flops(c, (P + 1) / 2) * P;
        const double mean_ctx = P + (D + 1) / 2;
        const double decode_flops = D * (tc.matmul_flops + tc.head_flops + attn_flops(c, mean_ctx));
        const double decode_bytes = D * (tc.weight_bytes + tc.head_bytes + kv_token_bytes * mean_ctx);
        nlohmann::json r = {{"model", c.name},
                            {"dtype", dt_name},
                            {"threads", t},
                            {"matmul", mode},
                            {"isa", kernels::cpu::isa_name()},
                            {"prompt_tokens", o.prompt_tokens},
                            {"decode_tokens", o.decode_tokens},
                            {"prefill_tokens_per_s", P / best_prefill},
                            {"prefill_gflops", prefill_flops / best_prefill / 1e9},
                            {"prefill_pct_of_fma_peak", 100.0 * prefill_flops / best_prefill / 1e9 / peak[t].first},
                            {"decode_tokens_per_s", D / best_decode},
                            {"decode_gflops", decode_flops / best_decode / 1e9},
                            {"decode_gbs", decode_bytes / best_decode / 1e9},
                            {"decode_pct_of_read_bw", 100.0 * decode_bytes / best_decode / 1e9 / peak[t].second},
                            {"weight_bytes", m->weight_bytes()}};
        results.push_back(r);
        spdlog::info("{} x{} {}: prefill {:.0f} tok/s ({:.1f} GFLOP/s), decode {:.1f} tok/s ({:.1f} GB/s)", dt_name, t,
                     mode, double(r["prefill_tokens_per_s"]), double(r["prefill_gflops"]),
                     double(r["decode_tokens_per_s"]), double(r["decode_gbs"]));
      }
  }
  if (o.json) {
    std::cout << nlohmann::json{{"peaks", peaks}, {"results", results}}.dump(2) << "\n";
    return 0;
  }
  std::printf("\n%-6s %3s %-15s | %12s %9s %7s | %11s %9s %8s %7s\n", "dtype", "thr", "matmul", "prefill t/s",
              "GFLOP/s", "%peak", "decode t/s", "GFLOP/s", "GB/s", "%bw");
  for (const auto& r : results)
    std::printf("%-6s %3d %-15s | %12.1f %9.1f %6.1f%% | %11.1f %9.2f %8.2f %6.1f%%\n", std::string(r["dtype"]).c_str(),
                int(r["threads"]), std::string(r["matmul"]).c_str(), double(r["prefill_tokens_per_s"]),
                double(r["prefill_gflops"]), double(r["prefill_pct_of_fma_peak"]), double(r["decode_tokens_per_s"]),
                double(r["decode_gflops"]), double(r["decode_gbs"]), double(r["decode_pct_of_read_bw"]));
  for (auto& [t, p] : peak)
    std::printf("peak, %d thread(s): %.1f GFLOP/s FMA (%s), %.1f GB/s read; pool dispatch %.2f us\n", t, p.first,
                kernels::cpu::isa_name(), p.second, dispatch[t]);
  return 0;
}

}  // namespace

void add_bench(CLI::App& app) {
  auto* bench = app.add_subcommand("bench", std::string(bench_description));
  bench->require_subcommand(1);
  add_bench_serve(bench);
  add_bench_compare(bench);
  add_bench_transport(bench);
  add_bench_grammar(bench);
  auto o = std::make_shared<bench_opts>();
  auto* k =
      bench->add_subcommand("kernels",
                            "Prefill and decode throughput of the engine on a synthetic model, with this machine's "
                            "measured FMA peak and read bandwidth");
  k->add_option("--preset", o->preset, "Synthetic model preset")->check(CLI::IsMember([] {
    std::vector<std::string> n;
    for (const auto& p : synth_presets()) n.push_back(p.name);
    return n;
  }()));
  auto* model_opt = k->add_option(
      "--model", o->model, "Use this GGUF file instead of a synthetic preset (rows labelled by its weight type)");
  k->add_option("--dtypes", o->dtypes, "Weight types to run (synthetic models of --preset)")
      ->excludes(model_opt)
      ->delimiter(',')
      ->check(CLI::IsMember({"f32", "f16", "bf16", "q8_0", "q4_0", "q4_k", "q5_k", "q6_k"}));
  k->add_option("--threads", o->threads, "Thread counts to run")->delimiter(',')->check(CLI::Range(1, 1024));
  k->add_option("--prompt-tokens", o->prompt_tokens, "Prefill prompt length")->check(CLI::Range(1, 1 << 20));
  k->add_option("--decode-tokens", o->decode_tokens, "Decode steps for one sequence")->check(CLI::Range(1, 1 << 20));
  k->add_option("--repeats", o->repeats, "Runs per configuration; the best is reported")->check(CLI::Range(1, 100));
  k->add_option("--matmul", o->matmul,
                "Matmul modes to run: batch-invariant (the default: exact recovery) and/or fastest (GEMM prefill)")
      ->delimiter(',')
      ->check(CLI::IsMember({"batch-invariant", "fastest"}));
  k->add_flag("--json", o->json, "Print results as JSON");
  add_kv_dtype_option(k, o->kv_dtype);
  k->add_option("--against-llama-bench", o->llama_dir,
                "Folder holding the reference llama.cpp's llama-bench: run it beside tandem on the same GGUF files "
                "in interleaved rounds and print medians, ratios and each side's prefill scaling with threads");
  k->add_option("--context", o->contexts,
                "With --against-llama-bench: positions in the sequence when decode starts (the timed prefill ends "
                "there); default: the prompt length")
      ->delimiter(',')
      ->check(CLI::Range(1, 1 << 20));
  k->add_option("--rounds", o->rounds, "With --against-llama-bench: interleaved rounds (medians reported)")
      ->check(CLI::Range(1, 100));
  k->callback([o] { run_bench(*o); });
}

}  // namespace tandem::cli
