// `tandem generate`: load a model, prefill the prompt, stream the continuation to stdout.
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <chrono>
#include <iostream>
#include <random>
#include <thread>

#include "runtime/engine.h"
#include "runtime/sampler.h"
#include "tools/commands.h"

namespace tandem::cli {
namespace {

struct generate_opts {
  std::string model, prompt;
  int n_predict = 64;
  float temperature = 0.8f, top_p = 0.95f;
  int top_k = 40;
  int64_t seed = -1;
  int threads = 0;
  int chunk = 256;
  bool json = false, ignore_eos = false, no_bos = false;
};

using clock_type = std::chrono::steady_clock;
double ms_since(clock_type::time_point t0) {
  return std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
}

void check(const status& st) {
  if (!st.ok()) throw failure(st.code(), st.message());
}

int run_generate(const generate_opts& o) {
  sampling_params sp{o.temperature, o.top_k, o.top_p,
                     o.seed >= 0 ? uint64_t(o.seed) : uint64_t(std::random_device{}())};
  check(sp.validate());
  const int threads = o.threads > 0 ? o.threads : int(std::max(1u, std::thread::hardware_concurrency()));

  const auto t_load = clock_type::now();
  auto m = model::load(resolve_model_path(o.model));
  const auto& c = m->config();
  spdlog::info("loaded {} ({:.1f} M params, {}) in {:.0f} ms; {} threads", c.name, double(c.n_params) / 1e6,
               kernels::to_string(m->weight_type()), ms_since(t_load), threads);

  const std::vector<token_id> prompt = m->tok().encode(o.prompt, !o.no_bos);
  if (prompt.empty()) throw failure(errc::invalid_argument, "the prompt is empty (and no BOS token was added)");
  if (int(prompt.size()) + o.n_predict > c.n_ctx)
    throw failure(errc::context_overflow, "prompt (" + std::to_string(prompt.size()) + " tokens) plus -n " +
                                              std::to_string(o.n_predict) + " exceeds the context length " +
                                              std::to_string(c.n_ctx));
  engine_options eo;
  eo.n_threads = threads;
  eo.n_kv_blocks = (int32_t(prompt.size()) + o.n_predict) / eo.block_size + 2;
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
  std::string finish = "length";
  const auto t_decode = clock_type::now();
  for (int i = 0; i < o.n_predict; ++i) {
    const token_id t = sample(logits, sp, uint64_t(i));
    if (!o.ignore_eos && m->tok().is_eog(t)) {
      finish = "stop";
      break;
    }
    out.push_back(t);
    const std::string piece = dec.push(t);
    text += piece;
    if (!o.json && !piece.empty()) std::cout << piece << std::flush;
    if (i + 1 == o.n_predict) break;  // the last token needs no forward pass
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
                        {"finish_reason", finish},
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
  spdlog::info("prompt {} tokens in {:.1f} ms ({:.0f} tok/s); {} tokens generated, {:.2f} ms/token ({:.1f} tok/s); finish: {}",
               prompt.size(), prefill_ms, double(prompt.size()) / (prefill_ms / 1000.0), out.size(), per_token,
               per_token > 0 ? 1000.0 / per_token : 0.0, finish);
  return 0;
}

}  // namespace

void add_generate(CLI::App& app) {
  auto o = std::make_shared<generate_opts>();
  auto* cmd = app.add_subcommand("generate", "Generate a continuation of a prompt; text streams to stdout");
  cmd->add_option("-m,--model", o->model, "GGUF model file (default: the built-in synthetic model)");
  cmd->add_option("-p,--prompt", o->prompt, "Prompt text")->required();
  cmd->add_option("-n,--n-predict", o->n_predict, "Tokens to generate")->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--temperature,--temp", o->temperature, "Sampling temperature; 0 is greedy")
      ->check(CLI::Range(0.0f, 100.0f));
  cmd->add_option("--top-k", o->top_k, "Keep the k most likely tokens; 0 disables")->check(CLI::Range(0, 1 << 24));
  cmd->add_option("--top-p", o->top_p, "Nucleus sampling mass in (0, 1]; 1 disables")
      ->check(CLI::Range(0.000001f, 1.0f));
  cmd->add_option("--seed", o->seed, "Sampling seed (default: random; printed with --json)");
  cmd->add_option("-t,--threads", o->threads, "Compute threads (default: all cores)")->check(CLI::Range(0, 1024));
  cmd->add_option("--chunk", o->chunk, "Prefill chunk size in tokens")->check(CLI::Range(1, 1 << 20));
  cmd->add_flag("--json", o->json, "Print one JSON object (ids, text, timings) instead of streaming text");
  cmd->add_flag("--ignore-eos", o->ignore_eos, "Keep generating past end-of-sequence tokens");
  cmd->add_flag("--no-bos", o->no_bos, "Do not prepend the BOS token");
  cmd->callback([o] {
    const int rc = run_generate(*o);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace tandem::cli
