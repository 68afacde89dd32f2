#pragma once
// Synthetic models: random weights in a standard GGUF file (`{arch}.*` keys, standard tensor
// names, a gpt2-style byte-level vocabulary), loadable by any GGUF reader (llama.cpp among
// them). They exercise the engine at real shapes, and each architecture's forward pass against
// llama.cpp's, without shipping trained weights.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kernels/tensor_types.h"
#include "runtime/model/architecture.h"
#include "runtime/tokenizer/tokenizer.h"

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

struct synth_options {
  architecture arch = architecture::llama;
  // Multiplies the output head's weights: > 1 makes the random model's choices "peaky" (large
  // top-2 margins), so that comparisons with another implementation are decided by margins
  // well above rounding.
  float output_scale = 1.0f;
  // A real vocabulary (vocab_from_tokenizer_json) instead of the built-in byte-level one; its
  // size replaces the preset's n_vocab.
  std::optional<vocab_spec> vocab;
  std::string chat_template;  // written as tokenizer.chat_template when not empty
  std::string name;  // general.name when not empty (else "tandem-synth-PRESET[-ARCH]")
  // The built-in vocabulary's byte tokens that are not printable text on their own (0x80..0xFF,
  // which are half a UTF-8 character, and the ASCII control bytes but tab, newline and return)
  // respelled as two printable ASCII characters: a random model then writes only printable
  // UTF-8 (llama-server's parser refuses the rest). Text with those bytes no longer tokenizes
  // losslessly (llama.cpp drops what it cannot spell), so tests of the tokenizer keep it off.
  bool printable = false;
};

// What `printable` does to a vocabulary (the bytes a merge uses are kept).
void respell_unprintable_bytes(vocab_spec& v);

// Writes the model to `path` (atomically). Same (preset, dtype, seed, options) → same bytes.
// The architecture's parts (Qwen 2's q/k/v biases, Qwen 3's and Gemma 3's q/k norms and wider
// heads, Gemma 3's post-norms and sliding window, Phi-3's fused matrices) are all written;
// Phi-3 never ties its output head (llama.cpp requires output.weight), the rest follow the
// preset. Architectures other than llama end the vocab with their chat control tokens.
void synthesize_model(const synth_preset& p, kernels::dtype type, const std::string& path, uint64_t seed = 42,
                      const synth_options& opts = {});

// The model `generate` and `serve` use when no --model is given: the built-in stories260K
// (runtime/model/default_model.h), written on first use to the cache directory
// ($TANDEM_CACHE_DIR, else $XDG_CACHE_HOME/tandem, else ~/.cache/tandem) and reused after.
std::string default_model_path();
// That cache directory (created if missing); synthetic models for benchmarks live there too.
std::string cache_dir();
// A cached synthetic model of the given preset and dtype (printable vocabulary), made on first use.
std::string cached_synth_model(const std::string& preset, kernels::dtype type);
// The model benchmarks run when given none (bench compare): a 76 M-parameter synthetic Llama,
// big enough for their traces' contexts and for timings that mean something.
constexpr const char* bench_model_preset = "bench-76m";
constexpr kernels::dtype bench_model_dtype = kernels::dtype::q8_0;
std::string bench_model_path();

}  // namespace tandem
