// `tandem generate`: load a model, prefill the prompt, stream the continuation to stdout.
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <chrono>
#include <fstream>
#include <iostream>
#include <random>
#include <thread>

#include <CLI/CLI.hpp>

#include "actors/pipeline.h"
#include "runtime/engine/engine.h"
#include "runtime/structured/json_schema.h"
#include "runtime/engine/sampler.h"
#include "tools/commands.h"

namespace tandem::cli {
namespace {

struct generate_opts {
  std::string model, prompt, matmul = "batch-invariant", kv_dtype = "f16";
  int n_predict = 64;
  float temperature = sampling_params{}.temperature, top_p = sampling_params{}.top_p;  // the one set of defaults
  int top_k = sampling_params{}.top_k;
  int64_t seed = -1;
  int threads = 0;
  int chunk = 256;
  bool json = false, ignore_eos = false, no_bos = false, no_parse_special = false;
  // Through the actor runtime instead of one engine:
  std::string mode;  // "", "disaggregated" or "colocated"
  int prefill_workers = 1, decode_workers = 1, colocated_workers = 1;
  int concurrency = 1;
  std::string prompts_file;
  int32_t kv_blocks = 0;
  int32_t token_budget = 512;
  std::string kv_transport = "local";
  bool no_stream_kv = false, no_prefix_cache = false;
  std::string grammar_file, json_schema_file;  // constrained decoding (docs/protocol.md)
};

using clock_type = std::chrono::steady_clock;
double ms_since(clock_type::time_point t0) {
  return std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
}

void check(const status& st) {
  if (!st.ok()) throw failure(st.code(), st.message());
}

// The sampling parameters of the flags, with --grammar / --json-schema compiled in.
sampling_params sampling_of(const generate_opts& o) {
  sampling_params sp{o.temperature, o.top_k, o.top_p,
                     o.seed >= 0 ? uint64_t(o.seed) : uint64_t(std::random_device{}())};
  check(sp.validate());
  const std::string& file = o.grammar_file.empty() ? o.json_schema_file : o.grammar_file;
  if (file.empty()) return sp;
  std::ifstream in(file, std::ios::binary);
  if (!in) throw failure(errc::io_error, "cannot read '" + file + "'");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!o.grammar_file.empty()) {
    check(sp.set_grammar(text));
  } else {
    const auto schema = nlohmann::ordered_json::parse(text, nullptr, false);
    if (schema.is_discarded()) throw failure(errc::invalid_argument, "'" + file + "' is not JSON");
    check(sp.set_grammar(json_schema_to_gbnf(schema)));
  }
  return sp;
}

// A prompt as the runtime takes it: the model file's specials (BOS where its metadata asks for
// it) and the control tokens written in it, as llama-completion reads a prompt.
generation_request request_of(const generate_opts& o, const std::string& prompt) {
  generation_request r;
  r.prompt = prompt;
  if (o.no_bos) r.add_bos = false;
  r.parse_special = !o.no_parse_special;
  r.max_tokens = o.n_predict;
  r.ignore_eos = o.ignore_eos;
  return r;
}

int run_generate(const generate_opts& o) {
  const sampling_params sp = sampling_of(o);
  const int threads = o.threads > 0 ? o.threads : int(std::max(1u, std::thread::hardware_concurrency()));

  const auto t_load = clock_type::now();
  auto m = model::load(resolve_model_path(o.model));
  const auto& c = m->config();
  spdlog::info("loaded {} ({:.1f} M params, {}) in {:.0f} ms; {} threads", c.name, double(c.n_params) / 1e6,
               kernels::to_string(m->weight_type()), ms_since(t_load), threads);

  const std::vector<token_id> prompt = prompt_ids(m->tok(), request_of(o, o.prompt));
  if (prompt.empty()) throw failure(errc::invalid_argument, "the prompt is empty (and no BOS token was added)");
  // The server's rule (one rule, issue 22): a prompt longer than the context is refused; a
  // generation that reaches the end of the context stops there ("length"), its last token
  // sampled from the last position, so prompt + generated <= n_ctx + 1.
  if (int(prompt.size()) > c.n_ctx)
    throw failure(errc::context_overflow, "prompt has " + std::to_string(prompt.size()) +
                                              " tokens, more than the context length " + std::to_string(c.n_ctx));
  engine_options eo;
  eo.n_threads = threads;
  eo.matmul = parse_matmul_mode(o.matmul);
  eo.kv_dtype = parse_kv_dtype(o.kv_dtype);
  eo.n_kv_blocks = std::min<int32_t>(int32_t(prompt.size()) + o.n_predict, c.n_ctx) / eo.block_size + 2;
  engine eng(m, eo);
  const seq_id s = eng.create_sequence();

  // Prefill in chunks: the same path a prefill worker uses for long prompts.
  std::vector<float> logits;
  const auto t_prefill = clock_type::now();
  for (size_t i = 0; i < prompt.size(); i += size_t(o.chunk)) {
    const size_t n = std::min(prompt.size() - i, size_t(o.chunk));
    check(eng.prefill(s, std::span(prompt).subspan(i, n), logits));
  }
  const double prefill_ms = ms_since(t_prefill);

  std::vector<token_id> out;
  std::string text;
  stream_decoder dec(m->tok());
  finish_reason finish = finish_reason::length;
  request_spec rule;  // what the workers' stop rule reads
  rule.prompt = prompt;
  rule.max_tokens = o.n_predict;
  std::vector<float> constrained;
  const auto t_decode = clock_type::now();
  for (int i = 0; i < o.n_predict; ++i) {
    const token_id t = sample(constrained_logits(logits, sp, out, m->tok(), constrained), sp, uint64_t(i));
    const finish_reason end = finish_after(rule, i + 1, ends_generation(sp, o.ignore_eos, m->tok(), t), c.n_ctx);
    if (end == finish_reason::stop) {
      finish = end;
      break;
    }
    out.push_back(t);
    const std::string piece = dec.push(t);
    text += piece;
    if (!o.json && !piece.empty()) std::cout << piece << std::flush;
    if (end == finish_reason::length) break;  // the last token needs no forward pass
    check(eng.decode(std::span(&s, 1), std::span(&t, 1), logits));
  }
  const double decode_ms = ms_since(t_decode);
  const std::string tail = dec.flush();
  text += tail;
  // Decode steps run = tokens after the first (the first comes from prefill's logits).
  const double per_token = out.size() > 1 ? decode_ms / double(out.size() - 1) : 0.0;
  if (o.json) {
    nlohmann::json j = {{"prompt_token_ids", prompt},
                        {"token_ids", out},
                        {"text", text},
                        {"finish_reason", std::string(to_string(finish))},
                        {"seed", sp.seed},
                        {"timings",
                         {{"prefill_ms", prefill_ms},
                          {"prefill_tokens_per_s", double(prompt.size()) / (prefill_ms / 1000.0)},
                          {"decode_ms_per_token", per_token},
                          {"decode_tokens_per_s", per_token > 0 ? 1000.0 / per_token : 0.0},
                          {"threads", threads}}}};
    std::cout << j.dump() << "\n";
  } else {
    std::cout << tail << std::endl;
  }
  spdlog::info(
      "prompt {} tokens in {:.1f} ms ({:.0f} tok/s); {} tokens generated, {:.2f} ms/token ({:.1f} tok/s); finish: {}",
      prompt.size(), prefill_ms, double(prompt.size()) / (prefill_ms / 1000.0), out.size(), per_token,
      per_token > 0 ? 1000.0 / per_token : 0.0, to_string(finish));
  return 0;
}

nlohmann::json timings_json(const metrics::request_timings& t) {
  return {{"queue_prefill_ms", t.queue_prefill_ms},
          {"queue_decode_ms", t.queue_decode_ms},
          {"prefill_ms", t.prefill_ms},
          {"ttft_ms", t.ttft_ms},
          {"tpot_ms", t.tpot_ms},
          {"decode_ms", t.decode_ms},
          {"kv_bytes", t.kv_bytes},
          {"kv_transfer_ms", t.kv_transfer_ms},
          {"handoff_ms", t.handoff_ms},
          {"e2e_ms", t.e2e_ms},
          {"prompt_tokens", t.prompt_tokens},
          {"output_tokens", t.output_tokens}};
}

// Many requests at once through the chosen topology: each result with its timings.
int run_pipeline(const generate_opts& o) {
  std::vector<std::string> prompts;
  if (!o.prompts_file.empty()) {
    std::ifstream in(o.prompts_file);
    if (!in) throw failure(errc::io_error, "cannot read prompts file '" + o.prompts_file + "'");
    for (std::string line; std::getline(in, line);)
      if (!line.empty()) prompts.push_back(line);
    if (prompts.empty()) throw failure(errc::invalid_argument, "prompts file '" + o.prompts_file + "' has no prompts");
  } else {
    prompts.assign(size_t(o.concurrency), o.prompt);
  }
  const sampling_params sp = sampling_of(o);
  serving_config cfg;
  cfg.model.path = resolve_model_path(o.model);
  cfg.pools.mode = parse_serving_mode(o.mode).value_or(serving_mode::disaggregated);
  cfg.pools.prefill_workers = o.prefill_workers;
  cfg.pools.decode_workers = o.decode_workers;
  cfg.pools.colocated_workers = o.colocated_workers;
  cfg.pools.threads_per_worker = o.threads > 0 ? o.threads : 1;
  cfg.steps.matmul = parse_matmul_mode(o.matmul);
  cfg.kv.dtype = parse_kv_dtype(o.kv_dtype);
  cfg.pools.kv_blocks_per_worker = o.kv_blocks;
  cfg.steps.chunk_size = o.chunk;
  cfg.steps.prefill_token_budget = o.token_budget;
  cfg.steps.colocated_token_budget = o.token_budget;
  cfg.kv.transport = parse_kv_transport_kind(o.kv_transport).value_or(kv_transport_kind::local);
  cfg.kv.stream = !o.no_stream_kv;
  cfg.kv.prefix_cache = !o.no_prefix_cache;
  const auto t0 = clock_type::now();
  pipeline p(cfg);
  spdlog::info("{} pipeline: {} workers x {} thread(s); {} requests", o.mode,
               cfg.pools.mode == serving_mode::colocated
                   ? std::to_string(cfg.pools.colocated_workers)
                   : fmt::format("{} prefill + {} decode", cfg.pools.prefill_workers, cfg.pools.decode_workers),
               cfg.pools.threads_per_worker, prompts.size());
  std::vector<request_handle> hs;
  for (const auto& pr : prompts) {
    generation_request r = request_of(o, pr);
    r.sampling = sp;
    hs.push_back(p.submit(std::move(r)));
  }
  nlohmann::json results = nlohmann::json::array();
  int failed = 0;
  for (size_t i = 0; i < hs.size(); ++i) {
    const auto r = hs[i].wait();
    failed += r.error != errc::ok;
    if (o.json) {
      nlohmann::json j = {{"prompt", prompts[i]},
                          {"token_ids", r.tokens},
                          {"text", r.text},
                          {"finish_reason", std::string(to_string(r.finish_reason))},
                          {"timings", timings_json(r.timings)}};
      if (r.error != errc::ok) j["error"] = {{"code", std::string(to_string(r.error))}, {"message", r.message}};
      results.push_back(std::move(j));
      continue;
    }
    const auto& t = r.timings;
    std::cout
        << "--- request " << i << (r.error != errc::ok ? " failed: " + r.message : "") << "\n"
        << r.text << "\n"
        << fmt::format(
               "[queue {:.1f}+{:.1f} ms, prefill {:.1f} ms, ttft {:.1f} ms, tpot {:.2f} ms, kv {} B in {:.2f} ms, "
               "{} tokens, {}]",
               t.queue_prefill_ms, t.queue_decode_ms, t.prefill_ms, t.ttft_ms, t.tpot_ms, t.kv_bytes, t.kv_transfer_ms,
               t.output_tokens,
               r.finish_reason == finish_reason::none ? std::string("error") : std::string(to_string(r.finish_reason)))
        << std::endl;
  }
  const double wall = ms_since(t0);
  if (o.json)
    std::cout << nlohmann::json{{"mode", o.mode},
                                {"results", results},
                                {"wall_ms", wall},
                                {"metrics", nlohmann::json::parse(p.metrics().to_json())}}
                     .dump()
              << "\n";
  spdlog::info("{} requests in {:.0f} ms ({} failed)", hs.size(), wall, failed);
  return failed == 0 ? 0 : 3;
}

}  // namespace

void add_generate(CLI::App& app) {
  auto o = std::make_shared<generate_opts>();
  auto* cmd = app.add_subcommand("generate", "Generate a continuation of a prompt; text streams to stdout");
  cmd->add_option("-m,--model", o->model,
                  "GGUF model file, hf:OWNER/NAME[:QUANT] for a GGUF from Hugging Face (pulled into the cache on first "
                  "use: tandem model pull), or synth:PRESET[:DTYPE] for a synthetic one (synth:bench-76m, the "
                  "benchmarks' model) (default: the built-in stories260K)");
  auto* prompt_opt = cmd->add_option("-p,--prompt", o->prompt, "Prompt text");
  cmd->add_option("-n,--n-predict", o->n_predict, "Tokens to generate")->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--temperature,--temp", o->temperature,
                  "Sampling temperature; 0 is greedy (the server's default too)")
      ->check(CLI::Range(0.0f, 100.0f))
      ->capture_default_str();
  cmd->add_option("--top-k", o->top_k, "Keep the k most likely tokens; 0 disables (the server's default too)")
      ->check(CLI::Range(0, 1 << 24))
      ->capture_default_str();
  cmd->add_option("--top-p", o->top_p, "Nucleus sampling mass in (0, 1]; 1 disables (the server's default too)")
      ->check(CLI::Range(0.000001f, 1.0f))
      ->capture_default_str();
  cmd->add_option("--seed", o->seed, "Sampling seed (default: random; printed with --json)");
  auto* grammar_opt = cmd->add_option("--grammar", o->grammar_file, "GBNF grammar file the output must match");
  cmd->add_option("--json-schema", o->json_schema_file, "JSON Schema file the output must match (as JSON)")
      ->excludes(grammar_opt);
  cmd->add_option("-t,--threads", o->threads, "Compute threads (default: all cores)")->check(CLI::Range(0, 1024));
  add_matmul_option(cmd, o->matmul);
  add_kv_dtype_option(cmd, o->kv_dtype);
  cmd->add_option("--chunk", o->chunk, "Prefill chunk size in tokens")->check(CLI::Range(1, 1 << 20));
  cmd->add_flag("--json", o->json, "Print one JSON object (ids, text, timings) instead of streaming text");
  cmd->add_flag("--ignore-eos", o->ignore_eos, "Keep generating past end-of-sequence tokens");
  cmd->add_flag("--no-bos", o->no_bos,
                "Never prepend BOS (default: as the file's tokenizer.ggml.add_bos_token says, like llama.cpp)");
  cmd->add_flag("--no-parse-special", o->no_parse_special,
                "Keep control-token text in the prompt (<|im_start|>) as characters (default: they are the tokens, "
                "as llama.cpp reads a prompt)");
  cmd->add_option("--mode", o->mode, "Run through the actor runtime: disaggregated or colocated")
      ->check(CLI::IsMember({"disaggregated", "colocated"}));
  cmd->add_option("--prefill-workers", o->prefill_workers, "Prefill workers (disaggregated)")
      ->check(CLI::Range(1, 256));
  cmd->add_option("--decode-workers", o->decode_workers, "Decode workers (disaggregated)")->check(CLI::Range(1, 256));
  cmd->add_option("--colocated-workers", o->colocated_workers, "Workers (colocated)")->check(CLI::Range(1, 256));
  cmd->add_option("--concurrency", o->concurrency, "Copies of the prompt run at once (with --mode)")
      ->check(CLI::Range(1, 100000));
  auto* file_opt =
      cmd->add_option("--prompts-file", o->prompts_file, "One prompt per line, all run at once (with --mode)");
  cmd->add_option("--kv-blocks", o->kv_blocks, "KV blocks per worker (with --mode; default: 256 MiB worth)")
      ->check(CLI::Range(0, 1 << 24));
  cmd->add_option("--token-budget", o->token_budget, "Tokens per worker step (with --mode)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_flag("--no-prefix-cache", o->no_prefix_cache,
                "Compute every prompt in full (with --mode; default: reuse blocks of prompts that start alike)");
  cmd->add_flag("--no-stream-kv", o->no_stream_kv,
                "Send each prompt's KV after its prefill instead of layer group by layer group during it");
  cmd->add_option("--kv-transport", o->kv_transport, "KV link path (with --mode disaggregated)")
      ->check(CLI::IsMember({"handoff", "local", "shm"}));
  prompt_opt->excludes(file_opt);
  cmd->callback([o, prompt_opt, file_opt] {
    if (prompt_opt->count() == 0 && file_opt->count() == 0)
      throw CLI::RequiredError("--prompt (or --prompts-file with --mode)");
    if (o->mode.empty() && (o->concurrency > 1 || !o->prompts_file.empty()))
      throw failure(errc::invalid_argument, "--concurrency and --prompts-file need --mode disaggregated|colocated");
    const int rc = o->mode.empty() ? run_generate(*o) : run_pipeline(*o);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace tandem::cli
