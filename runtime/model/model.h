#pragma once
// A decoder-only transformer read from a GGUF file: one of the architectures of
// runtime/model/architecture.h, hyperparameters from its `{arch}.*` metadata, weights referenced in
// place in the memory-mapped file, the matrices also repacked once into the panel layout of
// this CPU's batch-invariant kernels (engines in one process share both), and the tokenizer
// from tokenizer.ggml.*.
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/matmul.h"
#include "runtime/model/architecture.h"
#include "runtime/gguf/gguf.h"
#include "runtime/tokenizer/tokenizer.h"

namespace tandem {

struct llama_config {
  std::string name;  // general.name, or the file name
  architecture arch = architecture::llama;
  int32_t n_vocab = 0;
  int32_t dim = 0;  // embedding width
  int32_t n_layer = 0;
  int32_t n_head = 0;
  int32_t n_kv_head = 0;  // < n_head: grouped-query attention
  int32_t head_dim = 0;  // {arch}.attention.key_length, else dim / n_head
  int32_t ffn_dim = 0;
  int32_t n_ctx = 0;  // context length the model was trained for
  float rms_eps = 1e-5f;
  float rope_freq_base = 10000.0f;
  float rope_freq_scale = 1.0f;  // linear position scaling: 1 / llama.rope.scaling.factor
  std::vector<float> rope_freq_factors;  // rope_freqs.weight (Llama 3.1+ scaling): [head_dim / 2], or empty
  // The distinct (base, scale) pairs the layers rotate with: one for most models, two for
  // Gemma 3 (its local layers' own base); the engine makes one angle table per pair.
  std::vector<std::pair<float, float>> rope_variants;
  float attn_scale = 0.0f;  // on q·k: 1/sqrt(head_dim) (Gemma 3 27B: 1/sqrt(dim/n_head))
  float embedding_scale = 1.0f;  // sqrt(dim) for Gemma, else 1
  float final_logit_softcap = 0;  // {arch}.final_logit_softcapping: logits = c·tanh(logits/c); 0: none
  int32_t sliding_window = 0;  // tokens a sliding layer sees (itself included); 0: none
  bool tied_output = false;  // output head shares token_embd
  int64_t n_params = 0;
};

// Optional parts are empty vectors when the architecture has none.
struct layer_weights {
  std::vector<float> attn_norm;  // [dim]
  kernels::weight_view wq;  // [n_head*head_dim, dim]
  kernels::weight_view wk;  // [n_kv_head*head_dim, dim]
  kernels::weight_view wv;  // [n_kv_head*head_dim, dim]
  std::vector<float> bq, bk, bv;  // [n_head*head_dim], [n_kv_head*head_dim] x2 (Qwen 2)
  std::vector<float> q_norm, k_norm;  // [head_dim]: per-head RMSNorm before RoPE (Qwen 3, Gemma 3)
  kernels::weight_view wo;  // [dim, n_head*head_dim]
  std::vector<float> attn_post_norm;  // [dim] (Gemma 3)
  std::vector<float> ffn_norm;  // [dim]
  kernels::weight_view w_gate;  // [ffn_dim, dim]
  kernels::weight_view w_up;  // [ffn_dim, dim]
  kernels::weight_view w_down;  // [dim, ffn_dim]
  std::vector<float> ffn_post_norm;  // [dim] (Gemma 3)
  bool sliding = false;  // attends to the last sliding_window positions only
  int32_t rope_variant = 0;  // index into llama_config::rope_variants: this layer's RoPE
};

class model {
 public:
  // Throws tandem::failure (io_error, malformed_file, unsupported, missing_key) naming the problem.
  static std::shared_ptr<const model> load(const std::string& path);

  const llama_config& config() const { return cfg_; }
  const tokenizer& tok() const { return *tok_; }
  const gguf::file& file() const { return *file_; }
  // Identifies the exact weights: KV blocks are only exchanged between engines with equal ids.
  uint64_t identity() const { return identity_; }
  // Bytes of weights in the file.
  uint64_t weight_bytes() const { return weight_bytes_; }
  // The dominant weight type (that of the attention/FFN matrices).
  kernels::dtype weight_type() const { return layers_.front().wq.type; }

  const kernels::weight_view& tok_embd() const { return tok_embd_; }  // [n_vocab, dim]
  const std::vector<float>& output_norm() const { return output_norm_; }
  const kernels::weight_view& output() const { return output_; }  // [n_vocab, dim]
  const std::vector<layer_weights>& layers() const { return layers_; }

 private:
  model() = default;
  std::unique_ptr<gguf::file> file_;
  kernels::panel_memory panels_;  // the matrices repacked for this CPU's kernels (matmul.h)
  llama_config cfg_;
  std::unique_ptr<tokenizer> tok_;
  uint64_t identity_ = 0;
  uint64_t weight_bytes_ = 0;
  kernels::weight_view tok_embd_;
  std::vector<float> output_norm_;
  kernels::weight_view output_;
  std::vector<layer_weights> layers_;
};

}  // namespace tandem
