// `tandem model synth` and `tandem model inspect` (pull, list and rm: cmd_model_pull.cpp).
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>

#include <CLI/CLI.hpp>

#include "runtime/errors.h"
#include "runtime/model/model.h"
#include "runtime/tokenizer/vocab_gguf.h"
#include "runtime/tokenizer/vocab_hf.h"
#include "runtime/model/synth.h"
#include "runtime/model/default_model.h"
#include "tools/commands.h"

namespace tandem::cli {

std::string resolve_model_path(const std::string& flag) {
  // synth:PRESET[:DTYPE]: a synthetic model by name (the benchmarks' bench-76m), made once in
  // the cache directory.
  if (flag.rfind("synth:", 0) == 0) {
    const std::string rest = flag.substr(6);
    const size_t colon = rest.find(':');
    const std::string preset = rest.substr(0, colon);
    const std::string dtype = colon == std::string::npos ? "q8_0" : rest.substr(colon + 1);
    const auto dt = kernels::dtype_from_name(dtype);
    if (!dt) throw failure(errc::invalid_argument, "--model '" + flag + "': unknown weight type '" + dtype + "'");
    (void)find_synth_preset(preset);  // throws naming the presets
    return cached_synth_model(preset, *dt);
  }
  // hf:OWNER/NAME[:QUANT]: a GGUF from a Hugging Face repository, from the cache when it is there.
  if (flag.rfind("hf:", 0) == 0) return resolve_hf_model(flag.substr(3));
  // The built-in default by its name (the id it is served as), unless a file of that name is here.
  if (flag == default_model_name && !std::filesystem::exists(flag)) return default_model_path();
  if (!flag.empty()) return flag;
  const auto t0 = std::chrono::steady_clock::now();
  const std::string path = default_model_path();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (s > 0.05) spdlog::info("made the built-in default model {} in {:.1f} s", path, s);
  return path;
}

CLI::Option* add_matmul_option(CLI::App* cmd, std::string& value) {
  return cmd
      ->add_option("--matmul", value,
                   "batch-invariant: a token's logits do not depend on its batch, so recovery by re-prefill is "
                   "exact; fastest: the same kernels on CPUs with AVX-512 VNNI/BF16, elsewhere a GEMM prefill "
                   "(faster prefill, recovered outputs may differ at near-ties)")
      ->check(CLI::IsMember({"batch-invariant", "fastest"}))
      ->capture_default_str();
}

CLI::Option* add_kv_dtype_option(CLI::App* cmd, std::string& value) {
  return cmd
      ->add_option("--kv-dtype", value,
                   "Element type of the KV cache: f16 (half of f32's bytes per decode step, per KV transfer and in "
                   "the host store), bf16, q8_0 (a quarter of f32's plus a scale per 32; head_dim a multiple of 32) "
                   "or f32 (exact activations, twice f16's bytes)")
      ->check(CLI::IsMember({"f32", "f16", "bf16", "q8_0"}))
      ->capture_default_str();
}

kernels::dtype parse_kv_dtype(const std::string& value) {
  return kernels::dtype_from_name(value).value_or(kernels::dtype::f16);
}

kernels::cpu::matmul_mode parse_matmul_mode(const std::string& value) {
  return value == "fastest" ? kernels::cpu::matmul_mode::fastest : kernels::cpu::matmul_mode::batch_invariant;
}

namespace {

// What tandem makes of each part of a GGUF file, read even when tandem cannot serve it.
struct support_report {
  nlohmann::json j;
  std::vector<std::string> lacks;  // one line per missing capability
};

support_report check_support(const std::string& path) {
  support_report r;
  const auto f = gguf::file::open(path, /*skip_unsupported_types=*/true);
  const std::string arch = f.get_string("general.architecture", "(none)");
  const bool arch_ok = find_architecture(arch).has_value();
  r.j["architecture"] = {{"name", arch}, {"supported", arch_ok}};
  if (!arch_ok)
    r.lacks.push_back("architecture '" + arch + "' (tandem runs " + std::string(architecture_names()) + ")");
  std::map<std::string, std::pair<int, uint64_t>> by_type;  // type -> (tensors, bytes)
  for (const auto& t : f.tensors()) {
    auto& e = by_type[std::string(kernels::to_string(t.type))];
    ++e.first;
    e.second += t.size_bytes;
  }
  for (auto& [t, e] : by_type)
    r.j["tensor_types"][t] = {{"tensors", e.first}, {"bytes", e.second}, {"supported", true}};
  for (const auto& u : f.unsupported_tensors()) {
    r.j["unsupported_tensors"].push_back(u);
    if (r.lacks.size() < 20) r.lacks.push_back("tensor " + u);
  }
  nlohmann::json tok = {{"model", f.get_string("tokenizer.ggml.model", "(none)")},
                        {"pre", f.get_string("tokenizer.ggml.pre", "(none)")}};
  try {
    const tokenizer t(vocab_from_gguf(f));
    tok["supported"] = true;
    tok["n_vocab"] = t.n_vocab();
  } catch (const failure& e) {
    tok["supported"] = false;
    tok["error"] = e.what();
    r.lacks.push_back(std::string("tokenizer: ") + e.what());
  }
  r.j["tokenizer"] = tok;
  const std::string tmpl = f.get_string("tokenizer.chat_template", "");
  r.j["chat_template"] = {{"present", !tmpl.empty()}, {"bytes", tmpl.size()}};
  return r;
}

void inspect(const std::string& path, bool json) {
  support_report r = check_support(path);
  std::shared_ptr<const model> m;
  try {
    m = model::load(path);
  } catch (const failure& e) {
    // The parts above may all be fine and the file still not load (a tensor missing, a key
    // out of range, a feature like YaRN): the loader's own message says which.
    if (r.lacks.empty()) r.lacks.push_back(e.what());
  }
  r.j["path"] = path;
  r.j["loads"] = m != nullptr;
  r.j["lacks"] = r.lacks;
  const double mib = 1024.0 * 1024.0;
  if (!m) {
    if (json) {
      std::cout << r.j.dump(2) << "\n";
      return;
    }
    std::printf("file           %s\n", path.c_str());
    std::printf("architecture   %s (%s)\n", r.j["architecture"]["name"].get<std::string>().c_str(),
                r.j["architecture"]["supported"].get<bool>() ? "supported" : "not supported");
    for (auto& [t, e] : r.j["tensor_types"].items())
      std::printf("tensors %-6s %d tensors, %.2f MiB (supported)\n", t.c_str(), e["tensors"].get<int>(),
                  double(e["bytes"].get<uint64_t>()) / mib);
    std::printf("tokenizer      %s / pre %s (%s)\n", r.j["tokenizer"]["model"].get<std::string>().c_str(),
                r.j["tokenizer"]["pre"].get<std::string>().c_str(),
                r.j["tokenizer"]["supported"].get<bool>() ? "supported" : "not supported");
    std::printf("chat template  %s\n", r.j["chat_template"]["present"].get<bool>() ? "present" : "none");
    std::printf("tandem cannot serve this file; it lacks:\n");
    for (const auto& l : r.lacks) std::printf("  - %s\n", l.c_str());
    return;
  }
  const auto& c = m->config();
  // Memory for serving: the weights plus the KV cache of one full context (f32 KV).
  const uint64_t kv_per_token = uint64_t(c.n_layer) * 2 * c.n_kv_head * c.head_dim * sizeof(float);
  nlohmann::json& j = r.j;
  j.update({
      {"name", c.name},
      {"n_params", c.n_params},
      {"n_vocab", c.n_vocab},
      {"dim", c.dim},
      {"n_layer", c.n_layer},
      {"n_head", c.n_head},
      {"n_kv_head", c.n_kv_head},
      {"head_dim", c.head_dim},
      {"ffn_dim", c.ffn_dim},
      {"n_ctx", c.n_ctx},
      {"rms_eps", c.rms_eps},
      {"rope_freq_base", c.rope_freq_base},
      {"sliding_window", c.sliding_window},
      {"tied_output", c.tied_output},
      {"weight_bytes", m->weight_bytes()},
      {"kv_bytes_per_token", kv_per_token},
      {"kv_bytes_full_context", kv_per_token * uint64_t(c.n_ctx)},
      {"identity", fmt::format("{:016x}", m->identity())},
  });
  if (json) {
    std::cout << j.dump(2) << "\n";
    return;
  }
  std::printf("model          %s (%s)\n", c.name.c_str(), path.c_str());
  std::printf("architecture   %s, %.2f M parameters (supported)\n", std::string(to_string(c.arch)).c_str(),
              double(c.n_params) / 1e6);
  std::printf("shape          dim %d, %d layers, %d heads (%d KV, head %d), FFN %d\n", c.dim, c.n_layer, c.n_head,
              c.n_kv_head, c.head_dim, c.ffn_dim);
  std::printf("vocab          %d (%s tokenizer, pre %s), context %d, output head %s\n", c.n_vocab,
              m->tok().spec().model.c_str(), j["tokenizer"]["pre"].get<std::string>().c_str(), c.n_ctx,
              c.tied_output ? "tied" : "separate");
  std::printf("rope / norm    freq base %g, rms eps %g%s\n", double(c.rope_freq_base), double(c.rms_eps),
              c.sliding_window > 0 ? fmt::format(", sliding window {}", c.sliding_window).c_str() : "");
  for (auto& [t, e] : j["tensor_types"].items())
    std::printf("tensors %-6s %d tensors, %.2f MiB\n", t.c_str(), e["tensors"].get<int>(),
                double(e["bytes"].get<uint64_t>()) / mib);
  std::printf("chat template  %s\n", j["chat_template"]["present"].get<bool>() ? "present" : "none (ChatML is used)");
  std::printf("memory         weights %.2f MiB; KV %.1f KiB/token, %.2f MiB for a full context\n",
              double(m->weight_bytes()) / mib, double(kv_per_token) / 1024.0,
              double(kv_per_token * uint64_t(c.n_ctx)) / mib);
}

}  // namespace

void add_model(CLI::App& app) {
  auto* model_cmd = app.add_subcommand("model", "Get, create and inspect model files");
  model_cmd->require_subcommand(1);

  std::string presets;
  for (const auto& p : synth_presets()) presets += "\n  " + p.name + ": " + p.description;
  auto* synth = model_cmd->add_subcommand(
      "synth",
      "Write a random-weight GGUF (standard keys, byte-level vocab) of any supported architecture. Presets:" + presets);
  struct synth_opts {
    std::string preset = "tiny", dtype = "f32", out, arch = "llama", vocab_from, pre, name;
    bool printable = false;
    uint64_t seed = 42;
    float output_scale = 1.0f;
  };
  auto so = std::make_shared<synth_opts>();
  synth->add_option("--preset", so->preset, "Model shape")->check(CLI::IsMember([] {
    std::vector<std::string> n;
    for (const auto& p : synth_presets()) n.push_back(p.name);
    return n;
  }()));
  synth->add_option("--dtype", so->dtype, "Weight type")
      ->check(CLI::IsMember({"f32", "f16", "bf16", "q8_0", "q4_0", "q4_k", "q5_k", "q6_k"}));
  synth->add_option("--out", so->out, "Output .gguf path")->required();
  synth->add_option("--seed", so->seed, "Random seed for the weights");
  synth->add_option("--arch", so->arch, "Architecture (general.architecture)")->check(CLI::IsMember([] {
    std::vector<std::string> n;
    for (const auto& a : architectures()) n.emplace_back(a.name);
    return n;
  }()));
  synth
      ->add_option("--output-scale", so->output_scale,
                   "Gain of the output head's weights: > 1 makes the model's choices peaky (large top-2 margins)")
      ->check(CLI::PositiveNumber);
  synth
      ->add_option("--vocab-from", so->vocab_from,
                   "A Hugging Face tokenizer.json (byte-level BPE: Llama 3, Qwen 2/3, ...) whose vocabulary the model "
                   "gets instead of the built-in one (tokenizer_config.json beside it gives BOS/EOS, add_bos_token, "
                   "add_eos_token "
                   "and the chat template, as convert_hf_to_gguf.py reads them)")
      ->check(CLI::ExistingFile);
  synth->add_option(
      "--pre", so->pre,
      "tokenizer.ggml.pre for --vocab-from when its pre-tokenizer is not recognised (llama-bpe, qwen2, gpt-2)");
  synth->add_option("--name", so->name,
                    "general.name (llama.cpp reads some of a file's tokenizer rules from it: Phi-3's)");
  synth->add_flag("--printable", so->printable,
                  "Respell the built-in vocabulary's byte tokens that are not printable alone (0x80..0xFF, control "
                  "bytes) as printable pairs, so that the model writes only printable UTF-8 (what --model synth:NAME "
                  "models have; llama-server refuses the rest)");
  synth->callback([so] {
    const auto t0 = std::chrono::steady_clock::now();
    synth_options opts{*find_architecture(so->arch), so->output_scale, std::nullopt, "", so->name, so->printable};
    if (so->printable && !so->vocab_from.empty())
      throw CLI::ValidationError("--printable", "is for the built-in vocabulary");
    if (!so->vocab_from.empty()) {
      opts.vocab = vocab_from_tokenizer_json(so->vocab_from, so->pre);
      opts.chat_template = chat_template_beside(so->vocab_from);
    } else if (!so->pre.empty()) throw CLI::ValidationError("--pre", "needs --vocab-from");
    synthesize_model(find_synth_preset(so->preset), *kernels::dtype_from_name(so->dtype), so->out, so->seed, opts);
    spdlog::info("wrote {} ({} {}) in {:.2f} s", so->out, so->preset, so->dtype,
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  });

  auto* insp = model_cmd->add_subcommand(
      "inspect",
      "What tandem supports of any GGUF file (architecture, each tensor type, tokenizer, template) and what "
      "it lacks; for a file it serves also the shape, parameter count and memory");
  auto path = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  insp->add_option("file", *path, "GGUF model file (default: the built-in default model)");
  insp->add_flag("--json", *json, "Print one JSON object");
  insp->callback([path, json] { inspect(resolve_model_path(*path), *json); });
  add_model_hub(model_cmd);
}

}  // namespace tandem::cli
