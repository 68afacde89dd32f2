#include "runtime/model/architecture.h"

#include <string>

namespace tandem {

const std::vector<architecture_traits>& architectures() {
  using A = architecture;
  using R = rope_style;
  using F = ffn_activation;
  // arch, name, rope, activation, qkv_bias, qk_norm, post_norms, fused_qkv, fused_gate_up,
  // embedding_scaled, swa_period, swa_rope_freq_base
  static const std::vector<architecture_traits> table = {
      {A::llama, "llama", R::normal, F::silu, false, false, false, false, false, false, 0, 0.0f},
      {A::qwen2, "qwen2", R::neox, F::silu, true, false, false, false, false, false, 0, 0.0f},
      {A::qwen3, "qwen3", R::neox, F::silu, false, true, false, false, false, false, 0, 0.0f},
      // Gemma 3: 5 local layers (window, RoPE base 10000) then one global, as llama.cpp sets them.
      {A::gemma3, "gemma3", R::neox, F::gelu_tanh, false, true, true, false, false, true, 6, 10000.0f},
      {A::phi3, "phi3", R::neox, F::silu, false, false, false, true, true, false, 0, 0.0f},
  };
  return table;
}

const architecture_traits& traits(architecture a) {
  for (const auto& t : architectures())
    if (t.arch == a) return t;
  return architectures().front();  // unreachable: every enumerator has a row
}

std::optional<architecture> find_architecture(std::string_view name) {
  for (const auto& t : architectures())
    if (t.name == name) return t.arch;
  return std::nullopt;
}

std::string_view architecture_names() {
  static const std::string names = [] {
    std::string s;
    for (const auto& t : architectures()) s += (s.empty() ? "" : ", ") + std::string(t.name);
    return s;
  }();
  return names;
}

}  // namespace tandem
