#include "runtime/model.h"

#include <cmath>
#include <xxhash.h>

#include <filesystem>

#include "runtime/errors.h"
#include "runtime/vocab_gguf.h"

namespace tandem {
namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

const gguf::tensor_info& need_tensor(const gguf::file& f, const std::string& name) {
  const auto* t = f.find_tensor(name);
  if (!t) throw failure(errc::missing_key, "tensor '" + name + "' is missing");
  return *t;
}

// A matrix [rows, cols] in our terms is ggml shape {cols, rows}.
kernels::weight_view matrix(const gguf::file& f, const std::string& name, int64_t rows, int64_t cols) {
  const auto& t = need_tensor(f, name);
  if (t.shape.size() != 2 || t.shape[0] != cols || t.shape[1] != rows)
    throw failure(errc::malformed_file, "tensor '" + name + "' has shape " + shape_str(t.shape) +
                                            ", expected " + shape_str({cols, rows}));
  return {t.type, t.data, rows, cols};
}

// Norm weights are small: keep them as f32 whatever their stored type.
std::vector<float> vector_f32(const gguf::file& f, const std::string& name, int64_t n) {
  const auto& t = need_tensor(f, name);
  if (t.shape.size() != 1 || t.shape[0] != n)
    throw failure(errc::malformed_file, "tensor '" + name + "' has shape " + shape_str(t.shape) +
                                            ", expected " + shape_str({n}));
  std::vector<float> out(static_cast<size_t>(n));
  kernels::dequantize_row(t.type, t.data, out.data(), n);
  return out;
}

int32_t positive(const gguf::file& f, const std::string& key, uint64_t value) {
  if (value == 0 || value > (1u << 24))
    throw failure(errc::malformed_file, "metadata key '" + key + "' = " + std::to_string(value) +
                                            " is out of range");
  (void)f;
  return int32_t(value);
}

}  // namespace

std::shared_ptr<const model> model::load(const std::string& path) {
  std::shared_ptr<model> m(new model());
  m->file_ = std::make_unique<gguf::file>(gguf::file::open(path));
  const gguf::file& f = *m->file_;
  try {
    const std::string arch = f.get_string("general.architecture");
    if (arch != "llama")
      throw failure(errc::unsupported, "architecture '" + arch + "' is not supported (llama)");
    llama_config& c = m->cfg_;
    c.name = f.get_string("general.name", std::filesystem::path(path).stem().string());
    c.dim = positive(f, "llama.embedding_length", f.get_uint("llama.embedding_length"));
    c.n_layer = positive(f, "llama.block_count", f.get_uint("llama.block_count"));
    c.n_head = positive(f, "llama.attention.head_count", f.get_uint("llama.attention.head_count"));
    c.n_kv_head = positive(f, "llama.attention.head_count_kv",
                           f.get_uint("llama.attention.head_count_kv", uint64_t(c.n_head)));
    c.ffn_dim = positive(f, "llama.feed_forward_length", f.get_uint("llama.feed_forward_length"));
    c.n_ctx = positive(f, "llama.context_length", f.get_uint("llama.context_length"));
    c.rms_eps = float(f.get_float("llama.attention.layer_norm_rms_epsilon", 1e-5));
    c.rope_freq_base = float(f.get_float("llama.rope.freq_base", 10000.0));
    if (c.dim % c.n_head != 0 || c.n_head % c.n_kv_head != 0)
      throw failure(errc::malformed_file, "head counts (" + std::to_string(c.n_head) + " heads, " +
                                              std::to_string(c.n_kv_head) + " KV heads) do not divide width " +
                                              std::to_string(c.dim));
    c.head_dim = c.dim / c.n_head;
    const uint64_t rope_dims = f.get_uint("llama.rope.dimension_count", uint64_t(c.head_dim));
    if (rope_dims != uint64_t(c.head_dim) || c.head_dim % 2 != 0)
      throw failure(errc::unsupported, "partial or odd rotary dimensions (" + std::to_string(rope_dims) +
                                           " of head size " + std::to_string(c.head_dim) + ")");

    // RoPE scaling. Linear: positions scaled (older long-context Llamas); Llama 3.1+ ships its
    // per-frequency factors as the rope_freqs.weight tensor. YaRN and the rest: refused, named.
    const std::string scaling = f.get_string("llama.rope.scaling.type", "none");
    if (scaling == "linear") {
      const double factor = f.get_float("llama.rope.scaling.factor");
      if (!(factor > 0)) throw failure(errc::malformed_file, "llama.rope.scaling.factor must be positive");
      c.rope_freq_scale = float(1.0 / factor);
    } else if (scaling != "none") {
      throw failure(errc::unsupported, "llama.rope.scaling.type '" + scaling + "' is not supported (none, linear)");
    }
    if (const double old = f.get_float("llama.rope.scale_linear", 0.0); old > 0) c.rope_freq_scale = float(1.0 / old);
    if (f.find_tensor("rope_freqs.weight")) {
      c.rope_freq_factors = vector_f32(f, "rope_freqs.weight", c.head_dim / 2);
      for (float v : c.rope_freq_factors)
        if (!(v > 0) || !std::isfinite(v))
          throw failure(errc::malformed_file, "rope_freqs.weight holds a factor that is not positive and finite");
    }

    m->tok_ = std::make_unique<tokenizer>(vocab_from_gguf(f));
    const auto& emb = need_tensor(f, "token_embd.weight");
    if (emb.shape.size() != 2 || emb.shape[0] != c.dim)
      throw failure(errc::malformed_file, "tensor 'token_embd.weight' has shape " + shape_str(emb.shape) +
                                              ", expected [" + std::to_string(c.dim) + ", n_vocab]");
    c.n_vocab = int32_t(emb.shape[1]);
    if (m->tok_->n_vocab() != c.n_vocab)
      throw failure(errc::malformed_file, "tokenizer has " + std::to_string(m->tok_->n_vocab()) +
                                              " tokens but token_embd.weight has " + std::to_string(c.n_vocab) + " rows");
    m->tok_embd_ = matrix(f, "token_embd.weight", c.n_vocab, c.dim);
    m->output_norm_ = vector_f32(f, "output_norm.weight", c.dim);
    c.tied_output = f.find_tensor("output.weight") == nullptr;
    m->output_ = c.tied_output ? m->tok_embd_ : matrix(f, "output.weight", c.n_vocab, c.dim);

    const int64_t q_dim = int64_t(c.n_head) * c.head_dim, kv_dim = int64_t(c.n_kv_head) * c.head_dim;
    for (int32_t l = 0; l < c.n_layer; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      layer_weights w;
      w.attn_norm = vector_f32(f, p + "attn_norm.weight", c.dim);
      w.wq = matrix(f, p + "attn_q.weight", q_dim, c.dim);
      w.wk = matrix(f, p + "attn_k.weight", kv_dim, c.dim);
      w.wv = matrix(f, p + "attn_v.weight", kv_dim, c.dim);
      w.wo = matrix(f, p + "attn_output.weight", c.dim, q_dim);
      w.ffn_norm = vector_f32(f, p + "ffn_norm.weight", c.dim);
      w.w_gate = matrix(f, p + "ffn_gate.weight", c.ffn_dim, c.dim);
      w.w_up = matrix(f, p + "ffn_up.weight", c.ffn_dim, c.dim);
      w.w_down = matrix(f, p + "ffn_down.weight", c.dim, c.ffn_dim);
      m->layers_.push_back(std::move(w));
    }
  } catch (const failure& e) {
    throw failure(e.code(), "'" + path + "': " + e.what());
  }

  uint64_t bytes = 0;
  int64_t params = 0;
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  for (const auto& t : f.tensors()) {
    bytes += t.size_bytes;
    params += t.n_elements();
    // The identity covers names, shapes, types and every weight byte: equal ids mean the
    // same function, whatever the file is called.
    XXH3_64bits_update(st, t.name.data(), t.name.size());
    XXH3_64bits_update(st, t.shape.data(), t.shape.size() * sizeof(int64_t));
    XXH3_64bits_update(st, &t.type, sizeof(t.type));
    XXH3_64bits_update(st, t.data, t.size_bytes);
  }
  m->identity_ = XXH3_64bits_digest(st);
  // Repacked after the checks above, so a malformed file costs no packing. The embedding rows
  // are read as stored; a tied output head gets panels of its own.
  auto pack = [&](kernels::weight_view& w) { w = kernels::pack_for_matmul(w, m->panels_); };
  pack(m->output_);
  for (auto& w : m->layers_)
    for (auto* v : {&w.wq, &w.wk, &w.wv, &w.wo, &w.w_gate, &w.w_up, &w.w_down}) pack(*v);
  XXH3_freeState(st);
  m->weight_bytes_ = bytes;
  m->cfg_.n_params = params;
  return m;
}

}  // namespace tandem
