#pragma once
// The model architectures tandem runs (GGUF `general.architecture`), as data: one forward pass
// (runtime/engine/engine.cpp) reads these traits instead of having a copy per architecture, as
// llama.cpp's graph builders differ only in a few places for these families.
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "kernels/cpu/ops.h"

namespace tandem {

enum class architecture : uint8_t { llama, qwen2, qwen3, gemma3, phi3 };

// Which elements of a head RoPE turns together (the kernels' enum).
using rope_style = kernels::cpu::rope_style;

// The gated FFN: act(gate) * up.
enum class ffn_activation : uint8_t { silu, gelu_tanh };

struct architecture_traits {
  architecture arch;
  std::string_view name;  // as in general.architecture and as the prefix of its keys
  rope_style rope;
  ffn_activation activation;
  bool qkv_bias;  // attn_{q,k,v}.bias (Qwen 2)
  bool qk_norm;  // per-head RMSNorm of q and k before RoPE (Qwen 3, Gemma 3)
  bool post_norms;  // RMSNorm of the attention and FFN outputs before the residual (Gemma 3)
  bool fused_qkv_allowed;  // attn_qkv.weight may replace attn_q/k/v (Phi-3)
  bool fused_gate_up;  // ffn_up.weight holds [gate; up] and there is no ffn_gate (Phi-3)
  bool embedding_scaled;  // embeddings times sqrt(dim) (Gemma)
  // Gemma 3: layers alternate sliding-window and global attention; every `swa_period`-th layer
  // is global, the others see `{arch}.attention.sliding_window` tokens and use their own RoPE base.
  int32_t swa_period;
  float swa_rope_freq_base;
};

// The supported architectures, in the order the README lists them.
const std::vector<architecture_traits>& architectures();
const architecture_traits& traits(architecture a);
std::optional<architecture> find_architecture(std::string_view name);
constexpr std::string_view to_string(architecture a) {
  switch (a) {
    case architecture::llama: return "llama";
    case architecture::qwen2: return "qwen2";
    case architecture::qwen3: return "qwen3";
    case architecture::gemma3: return "gemma3";
    case architecture::phi3: return "phi3";
  }
  return "?";
}
// "llama, qwen2, ..." for error messages.
std::string_view architecture_names();

}  // namespace tandem
