#include "runtime/model/model.h"

#include <algorithm>
#include <cmath>
#include <xxhash.h>

#include <filesystem>
#include <set>

#include "runtime/errors.h"
#include "runtime/tokenizer/vocab_gguf.h"

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
    throw failure(errc::malformed_file,
                  "tensor '" + name + "' has shape " + shape_str(t.shape) + ", expected " + shape_str({cols, rows}));
  return {t.type, t.data, rows, cols};
}

// Rows [r0, r1) of a matrix as stored (before packing): its rows are contiguous in any type.
kernels::weight_view rows_of(const kernels::weight_view& w, int64_t r0, int64_t r1) {
  return {w.type, static_cast<const uint8_t*>(w.data) + r0 * kernels::row_bytes(w.type, w.cols), r1 - r0, w.cols};
}

// Norm weights are small: keep them as f32 whatever their stored type.
std::vector<float> vector_f32(const gguf::file& f, const std::string& name, int64_t n) {
  const auto& t = need_tensor(f, name);
  if (t.shape.size() != 1 || t.shape[0] != n)
    throw failure(errc::malformed_file,
                  "tensor '" + name + "' has shape " + shape_str(t.shape) + ", expected " + shape_str({n}));
  std::vector<float> out(static_cast<size_t>(n));
  kernels::dequantize_row(t.type, t.data, out.data(), n);
  return out;
}

int32_t positive(const gguf::file& f, const std::string& key, uint64_t value) {
  if (value == 0 || value > (1u << 24))
    throw failure(errc::malformed_file, "metadata key '" + key + "' = " + std::to_string(value) + " is out of range");
  (void)f;
  return int32_t(value);
}

}  // namespace

std::shared_ptr<const model> model::load(const std::string& path) {
  std::shared_ptr<model> m(new model());
  m->file_ = std::make_unique<gguf::file>(gguf::file::open(path));
  const gguf::file& f = *m->file_;
  try {
    const std::string arch_name = f.get_string("general.architecture");
    const auto arch = find_architecture(arch_name);
    if (!arch)
      throw failure(errc::unsupported,
                    "architecture '" + arch_name + "' is not supported (" + std::string(architecture_names()) + ")");
    const architecture_traits& at = traits(*arch);
    // Every hyperparameter key is `{arch}.name`, as llama.cpp's LLM_KV names them.
    const std::string K = arch_name + ".";
    auto need_uint = [&](const std::string& key) { return positive(f, K + key, f.get_uint(K + key)); };
    llama_config& c = m->cfg_;
    c.arch = *arch;
    c.name = f.get_string("general.name", std::filesystem::path(path).stem().string());
    c.dim = need_uint("embedding_length");
    c.n_layer = need_uint("block_count");
    c.n_head = need_uint("attention.head_count");
    c.n_kv_head =
        positive(f, K + "attention.head_count_kv", f.get_uint(K + "attention.head_count_kv", uint64_t(c.n_head)));
    c.ffn_dim = need_uint("feed_forward_length");
    c.n_ctx = need_uint("context_length");
    // llama files of old converters may lack the epsilon (llama.cpp's default then); the
    // newer architectures always carry it.
    const std::string eps_key = K + "attention.layer_norm_rms_epsilon";
    c.rms_eps = float(*arch == architecture::llama ? f.get_float(eps_key, 1e-5) : f.get_float(eps_key));
    if (!(std::isfinite(c.rms_eps) && c.rms_eps > 0))  // NaN, infinite, zero or negative: every norm is garbage
      throw failure(errc::malformed_file,
                    eps_key + " is " + std::to_string(c.rms_eps) + ": it must be a positive number");
    c.rope_freq_base = float(f.get_float(K + "rope.freq_base", 10000.0));
    if (!(std::isfinite(c.rope_freq_base) && c.rope_freq_base > 0))
      throw failure(errc::malformed_file,
                    K + "rope.freq_base is " + std::to_string(c.rope_freq_base) + ": it must be a positive number");
    if (c.n_head % c.n_kv_head != 0)
      throw failure(errc::malformed_file, std::to_string(c.n_head) + " query heads do not divide into " +
                                              std::to_string(c.n_kv_head) + " KV heads");
    // The head size: explicit in Qwen 3 and Gemma (where n_head * head_dim != dim), else dim / n_head.
    if (f.find(K + "attention.key_length")) {
      c.head_dim = need_uint("attention.key_length");
    } else {
      if (c.dim % c.n_head != 0)
        throw failure(errc::malformed_file, std::to_string(c.n_head) + " heads do not divide width " +
                                                std::to_string(c.dim) + " and " + K + "attention.key_length is absent");
      c.head_dim = c.dim / c.n_head;
    }
    if (const uint64_t vl = f.get_uint(K + "attention.value_length", uint64_t(c.head_dim)); vl != uint64_t(c.head_dim))
      throw failure(errc::unsupported, "value heads of size " + std::to_string(vl) + " differ from key heads of size " +
                                           std::to_string(c.head_dim));
    const uint64_t rope_dims = f.get_uint(K + "rope.dimension_count", uint64_t(c.head_dim));
    if (rope_dims != uint64_t(c.head_dim) || c.head_dim % 2 != 0)
      throw failure(errc::unsupported, "partial or odd rotary dimensions (" + std::to_string(rope_dims) +
                                           " of head size " + std::to_string(c.head_dim) + ")");
    // llama.cpp's choice for Gemma 3 (query_pre_attn_scalar): 1/sqrt(dim/n_head) for the 62-layer
    // 27B, 1/sqrt(head_dim) for the rest, as for every other architecture here.
    c.attn_scale =
        1.0f / std::sqrt(float(*arch == architecture::gemma3 && c.n_layer == 62 ? c.dim / c.n_head : c.head_dim));
    c.embedding_scale = at.embedding_scaled ? std::sqrt(float(c.dim)) : 1.0f;
    c.final_logit_softcap = float(f.get_float(K + "final_logit_softcapping", 0.0));
    if (c.final_logit_softcap < 0) throw failure(errc::malformed_file, K + "final_logit_softcapping is negative");
    if (at.swa_period > 0) c.sliding_window = need_uint("attention.sliding_window");

    // RoPE scaling. Linear: positions scaled (older long-context Llamas; Gemma 3 4B+ on its
    // global layers); Llama 3.1+ ships its per-frequency factors as the rope_freqs.weight
    // tensor. YaRN and the rest: refused, named.
    const std::string scaling = f.get_string(K + "rope.scaling.type", "none");
    if (scaling == "linear") {
      const double factor = f.get_float(K + "rope.scaling.factor");
      if (!(factor > 0)) throw failure(errc::malformed_file, K + "rope.scaling.factor must be positive");
      c.rope_freq_scale = float(1.0 / factor);
    } else if (scaling != "none") {
      throw failure(errc::unsupported, K + "rope.scaling.type '" + scaling + "' is not supported (none, linear)");
    }
    if (const double old = f.get_float(K + "rope.scale_linear", 0.0); old > 0) c.rope_freq_scale = float(1.0 / old);
    if (f.find_tensor("rope_freqs.weight")) {
      c.rope_freq_factors = vector_f32(f, "rope_freqs.weight", c.head_dim / 2);
      for (float v : c.rope_freq_factors)
        if (!(v > 0) || !std::isfinite(v))
          throw failure(errc::malformed_file, "rope_freqs.weight holds a factor that is not positive and finite");
    }
    for (const char* t : {"rope_factors_long.weight", "rope_factors_short.weight"})
      if (f.find_tensor(t))
        throw failure(errc::unsupported,
                      std::string("tensor '") + t + "' (Phi-3 LongRoPE, the 128k-context variants) is not supported");

    m->tok_ = std::make_unique<tokenizer>(vocab_from_gguf(f));
    const auto& emb = need_tensor(f, "token_embd.weight");
    if (emb.shape.size() != 2 || emb.shape[0] != c.dim)
      throw failure(errc::malformed_file, "tensor 'token_embd.weight' has shape " + shape_str(emb.shape) +
                                              ", expected [" + std::to_string(c.dim) + ", n_vocab]");
    c.n_vocab = int32_t(emb.shape[1]);
    if (m->tok_->n_vocab() != c.n_vocab)
      throw failure(errc::malformed_file, "tokenizer has " + std::to_string(m->tok_->n_vocab()) +
                                              " tokens but token_embd.weight has " + std::to_string(c.n_vocab) +
                                              " rows");
    // Each tensor the forward pass uses is named here; any other in the file is refused below
    // rather than silently left out of the computation.
    std::set<std::string> used;
    auto mat = [&](const std::string& name, int64_t rows, int64_t cols) {
      used.insert(name);
      return matrix(f, name, rows, cols);
    };
    auto vec = [&](const std::string& name, int64_t n) {
      used.insert(name);
      return vector_f32(f, name, n);
    };
    auto opt_vec = [&](const std::string& name, int64_t n, bool required) {
      return required || f.find_tensor(name) ? vec(name, n) : std::vector<float>{};
    };
    if (f.find_tensor("rope_freqs.weight")) used.insert("rope_freqs.weight");
    m->tok_embd_ = mat("token_embd.weight", c.n_vocab, c.dim);
    m->output_norm_ = vec("output_norm.weight", c.dim);
    c.tied_output = f.find_tensor("output.weight") == nullptr;
    m->output_ = c.tied_output ? m->tok_embd_ : mat("output.weight", c.n_vocab, c.dim);

    const int64_t q_dim = int64_t(c.n_head) * c.head_dim, kv_dim = int64_t(c.n_kv_head) * c.head_dim;
    for (int32_t l = 0; l < c.n_layer; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      layer_weights w;
      w.attn_norm = vec(p + "attn_norm.weight", c.dim);
      if (at.fused_qkv_allowed && f.find_tensor(p + "attn_qkv.weight")) {
        // Phi-3: one [q; k; v] matrix; its row ranges are the three (rows are contiguous).
        const auto qkv = mat(p + "attn_qkv.weight", q_dim + 2 * kv_dim, c.dim);
        w.wq = rows_of(qkv, 0, q_dim);
        w.wk = rows_of(qkv, q_dim, q_dim + kv_dim);
        w.wv = rows_of(qkv, q_dim + kv_dim, q_dim + 2 * kv_dim);
      } else {
        w.wq = mat(p + "attn_q.weight", q_dim, c.dim);
        w.wk = mat(p + "attn_k.weight", kv_dim, c.dim);
        w.wv = mat(p + "attn_v.weight", kv_dim, c.dim);
      }
      // Biases: required by Qwen 2, taken where any other file has them (as llama.cpp does).
      w.bq = opt_vec(p + "attn_q.bias", q_dim, at.qkv_bias);
      w.bk = opt_vec(p + "attn_k.bias", kv_dim, at.qkv_bias);
      w.bv = opt_vec(p + "attn_v.bias", kv_dim, at.qkv_bias);
      w.q_norm = opt_vec(p + "attn_q_norm.weight", c.head_dim, at.qk_norm);
      w.k_norm = opt_vec(p + "attn_k_norm.weight", c.head_dim, at.qk_norm);
      w.wo = mat(p + "attn_output.weight", c.dim, q_dim);
      w.attn_post_norm = opt_vec(p + "post_attention_norm.weight", c.dim, at.post_norms);
      w.ffn_norm = vec(p + "ffn_norm.weight", c.dim);
      if (at.fused_gate_up) {
        // Phi-3: ffn_up holds [gate; up] (llama.cpp's SWIGLU split: the first half is gated).
        const auto gate_up = mat(p + "ffn_up.weight", 2 * int64_t(c.ffn_dim), c.dim);
        w.w_gate = rows_of(gate_up, 0, c.ffn_dim);
        w.w_up = rows_of(gate_up, c.ffn_dim, 2 * int64_t(c.ffn_dim));
      } else {
        w.w_gate = mat(p + "ffn_gate.weight", c.ffn_dim, c.dim);
        w.w_up = mat(p + "ffn_up.weight", c.ffn_dim, c.dim);
      }
      w.w_down = mat(p + "ffn_down.weight", c.dim, c.ffn_dim);
      w.ffn_post_norm = opt_vec(p + "post_ffw_norm.weight", c.dim, at.post_norms);
      w.sliding = at.swa_period > 0 && l % at.swa_period < at.swa_period - 1;
      const std::pair<float, float> rope =
          w.sliding ? std::pair{at.swa_rope_freq_base, 1.0f} : std::pair{c.rope_freq_base, c.rope_freq_scale};
      auto it = std::find(c.rope_variants.begin(), c.rope_variants.end(), rope);
      w.rope_variant = int32_t(it - c.rope_variants.begin());
      if (it == c.rope_variants.end()) c.rope_variants.push_back(rope);
      m->layers_.push_back(std::move(w));
    }
    std::string unused;
    int n_unused = 0;
    for (const auto& t : f.tensors())
      if (!used.count(t.name) && n_unused++ < 8) unused += (unused.empty() ? "'" : ", '") + t.name + "'";
    if (n_unused > 0)
      throw failure(errc::unsupported, std::to_string(n_unused) + " tensor(s) that tandem's " + arch_name +
                                           " does not use: " + unused + (n_unused > 8 ? ", ..." : ""));
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
