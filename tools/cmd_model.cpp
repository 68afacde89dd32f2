// `tandem model synth` and `tandem model inspect`.
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>

#include "runtime/model.h"
#include "runtime/synth.h"
#include "tools/commands.h"

namespace tandem::cli {

std::string resolve_model_path(const std::string& flag) {
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
                   "the host store), bf16 or f32 (exact activations, twice the bytes)")
      ->check(CLI::IsMember({"f32", "f16", "bf16"}))
      ->capture_default_str();
}

kernels::dtype parse_kv_dtype(const std::string& value) {
  return kernels::dtype_from_name(value).value_or(kernels::dtype::f16);
}

kernels::cpu::matmul_mode parse_matmul_mode(const std::string& value) {
  return value == "fastest" ? kernels::cpu::matmul_mode::fastest : kernels::cpu::matmul_mode::batch_invariant;
}

namespace {

void inspect(const std::string& path, bool json) {
  auto m = model::load(path);
  const auto& c = m->config();
  std::map<std::string, std::pair<int, uint64_t>> by_type;  // type -> (tensors, bytes)
  for (const auto& t : m->file().tensors()) {
    auto& e = by_type[std::string(kernels::to_string(t.type))];
    ++e.first;
    e.second += t.size_bytes;
  }
  // Memory for serving: the weights plus the KV cache of one full context (f32 KV).
  const uint64_t kv_per_token = uint64_t(c.n_layer) * 2 * c.n_kv_head * c.head_dim * sizeof(float);
  nlohmann::json j = {
      {"path", path},
      {"name", c.name},
      {"architecture", "llama"},
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
      {"tied_output", c.tied_output},
      {"tokenizer", m->tok().spec().model},
      {"weight_bytes", m->weight_bytes()},
      {"kv_bytes_per_token", kv_per_token},
      {"kv_bytes_full_context", kv_per_token * uint64_t(c.n_ctx)},
      {"identity", fmt::format("{:016x}", m->identity())},
  };
  for (auto& [t, e] : by_type) j["tensor_types"][t] = {{"tensors", e.first}, {"bytes", e.second}};
  if (json) {
    std::cout << j.dump(2) << "\n";
    return;
  }
  const double mib = 1024.0 * 1024.0;
  std::printf("model          %s (%s)\n", c.name.c_str(), path.c_str());
  std::printf("architecture   llama, %.2f M parameters\n", double(c.n_params) / 1e6);
  std::printf("shape          dim %d, %d layers, %d heads (%d KV, head %d), FFN %d\n", c.dim, c.n_layer,
              c.n_head, c.n_kv_head, c.head_dim, c.ffn_dim);
  std::printf("vocab          %d (%s tokenizer), context %d, output head %s\n", c.n_vocab,
              m->tok().spec().model.c_str(), c.n_ctx, c.tied_output ? "tied" : "separate");
  std::printf("rope / norm    freq base %g, rms eps %g\n", double(c.rope_freq_base), double(c.rms_eps));
  for (auto& [t, e] : by_type)
    std::printf("tensors %-6s %d tensors, %.2f MiB\n", t.c_str(), e.first, double(e.second) / mib);
  std::printf("memory         weights %.2f MiB; KV %.1f KiB/token, %.2f MiB for a full context\n",
              double(m->weight_bytes()) / mib, double(kv_per_token) / 1024.0,
              double(kv_per_token * uint64_t(c.n_ctx)) / mib);
}

}  // namespace

void add_model(CLI::App& app) {
  auto* model_cmd = app.add_subcommand("model", "Create and inspect model files");
  model_cmd->require_subcommand(1);

  std::string presets;
  for (const auto& p : synth_presets()) presets += "\n  " + p.name + ": " + p.description;
  auto* synth = model_cmd->add_subcommand(
      "synth", "Write a random-weight GGUF (standard keys, byte-level vocab) of any supported architecture. Presets:" +
                   presets);
  struct synth_opts {
    std::string preset = "tiny", dtype = "f32", out, arch = "llama";
    uint64_t seed = 42;
    float output_scale = 1.0f;
  };
  auto so = std::make_shared<synth_opts>();
  synth->add_option("--preset", so->preset, "Model shape")->check(CLI::IsMember([] {
    std::vector<std::string> n;
    for (const auto& p : synth_presets()) n.push_back(p.name);
    return n;
  }()));
  synth->add_option("--dtype", so->dtype, "Weight type")->check(CLI::IsMember({"f32", "f16", "bf16", "q8_0", "q4_0", "q4_k", "q5_k", "q6_k"}));
  synth->add_option("--out", so->out, "Output .gguf path")->required();
  synth->add_option("--seed", so->seed, "Random seed for the weights");
  synth->add_option("--arch", so->arch, "Architecture (general.architecture)")->check(CLI::IsMember([] {
    std::vector<std::string> n;
    for (const auto& a : architectures()) n.emplace_back(a.name);
    return n;
  }()));
  synth->add_option("--output-scale", so->output_scale,
                    "Gain of the output head's weights: > 1 makes the model's choices peaky (large top-2 margins)")
      ->check(CLI::PositiveNumber);
  synth->callback([so] {
    const auto t0 = std::chrono::steady_clock::now();
    synthesize_model(find_synth_preset(so->preset), *kernels::dtype_from_name(so->dtype), so->out, so->seed,
                     synth_options{*find_architecture(so->arch), so->output_scale});
    spdlog::info("wrote {} ({} {}) in {:.2f} s", so->out, so->preset, so->dtype,
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  });

  auto* insp = model_cmd->add_subcommand("inspect", "Architecture, parameter count, tensor types, memory");
  auto path = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  insp->add_option("file", *path, "GGUF model file (default: the built-in default model)");
  insp->add_flag("--json", *json, "Print one JSON object");
  insp->callback([path, json] { inspect(resolve_model_path(*path), *json); });
}

}  // namespace tandem::cli
