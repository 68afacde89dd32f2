#pragma once
// Synthetic Llama models: random weights in a standard GGUF file (llama.* keys, standard
// tensor names, a gpt2-style byte-level vocabulary), loadable by any GGUF reader. They
// exercise the engine at real shapes without shipping trained weights.
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/tensor_types.h"

namespace tandem {

struct synth_preset {
  std::string name;
  int32_t dim, ffn_dim, n_layer, n_head, n_kv_head, n_vocab, n_ctx;
  bool tied_output;
  std::string description;
};

const std::vector<synth_preset>& synth_presets();
// Throws failure(invalid_argument) listing the presets when `name` is unknown.
const synth_preset& find_synth_preset(const std::string& name);

// Writes the model to `path` (atomically). Same (preset, dtype, seed) → same bytes.
void synthesize_model(const synth_preset& p, kernels::dtype type, const std::string& path,
                      uint64_t seed = 42);

// The model `generate` and `serve` use when no --model is given: the preset and dtype
// below, made on first use under the cache directory
// ($TANDEM_CACHE_DIR, else $XDG_CACHE_HOME/tandem, else ~/.cache/tandem) and reused after.
std::string default_model_path();
// That cache directory (created if missing); synthetic models for benchmarks live there too.
std::string cache_dir();
// A cached synthetic model of the given preset and dtype, made on first use.
std::string cached_synth_model(const std::string& preset, kernels::dtype type);
constexpr const char* default_model_preset = "bench-76m";
constexpr kernels::dtype default_model_dtype = kernels::dtype::q8_0;

}  // namespace tandem
