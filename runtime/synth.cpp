#include "runtime/synth.h"

#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "runtime/errors.h"
#include "runtime/gguf.h"
#include "runtime/tokenizer.h"

namespace tandem {

const std::vector<synth_preset>& synth_presets() {
  static const std::vector<synth_preset> presets = {
      {"tiny", 64, 192, 2, 4, 2, 300, 256, true, "2 layers, dim 64, GQA 4/2, tied head: fast tests"},
      {"small", 256, 704, 4, 8, 4, 512, 1024, false, "4 layers, dim 256, GQA 8/4: quick end-to-end runs"},
      {"kquant", 256, 512, 1, 4, 2, 512, 512, false,
       "1 layer, dim 256, FFN 512, GQA 4/2: every row a multiple of 256, for the k-quant tests"},
      {"llama-1b", 2048, 8192, 16, 32, 8, 128256, 2048, true,
       "Llama-3.2-1B's shape (dim 2048, FFN 8192, 16 layers, GQA 32/8, vocab 128256, tied): speed at a real size"},
      {"bench-76m", 768, 2048, 12, 12, 4, 512, 2048, false,
       "12 layers, dim 768, FFN 2048, GQA 12/4, vocab 512: the benchmark shape"},
  };
  return presets;
}

const synth_preset& find_synth_preset(const std::string& name) {
  std::string names;
  for (const auto& p : synth_presets()) {
    if (p.name == name) return p;
    names += (names.empty() ? "" : ", ") + p.name;
  }
  throw failure(errc::invalid_argument, "unknown preset '" + name + "' (available: " + names + ")");
}

namespace {

// xoshiro-style generator: fast and identical on every platform (std distributions are not).
struct rng {
  uint64_t s;
  explicit rng(uint64_t seed) : s(seed * 0x9e3779b97f4a7c15ull + 1) {}
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  float uniform() { return float(next() >> 40) * 0x1.0p-24f * 2.0f - 1.0f; }  // [-1, 1)
};

std::vector<uint8_t> encode(kernels::dtype t, const std::vector<float>& xs, int64_t row) {
  std::vector<uint8_t> out(size_t(int64_t(xs.size()) / row * kernels::row_bytes(t, row)));
  const int64_t rb = kernels::row_bytes(t, row);
  for (int64_t r = 0; r < int64_t(xs.size()) / row; ++r)
    kernels::quantize_row(t, xs.data() + r * row, out.data() + r * rb, row);
  return out;
}

}  // namespace

void synthesize_model(const synth_preset& p, kernels::dtype type, const std::string& path, uint64_t seed) {
  const int64_t be = kernels::block_elems(type);
  if (p.dim % be != 0 || p.ffn_dim % be != 0)
    throw failure(errc::invalid_argument, std::string(kernels::to_string(type)) + " needs widths that are multiples of " +
                                              std::to_string(be) + " (preset '" + p.name + "': dim " +
                                              std::to_string(p.dim) + ", FFN " + std::to_string(p.ffn_dim) + ")");
  gguf::writer w;
  w.set_string("general.architecture", "llama");
  w.set_string("general.name", "tandem-synth-" + p.name);
  w.set_u32("general.file_type", [type]() -> uint32_t {  // llama_ftype: the "mostly" type (K types: _S)
    switch (type) {
      case kernels::dtype::f32: return 0;
      case kernels::dtype::f16: return 1;
      case kernels::dtype::q4_0: return 2;
      case kernels::dtype::q8_0: return 7;
      case kernels::dtype::q4_k: return 14;
      case kernels::dtype::q5_k: return 16;
      case kernels::dtype::q6_k: return 18;
      case kernels::dtype::bf16: return 32;
    }
    return 0;
  }());
  w.set_u32("llama.context_length", uint32_t(p.n_ctx));
  w.set_u32("llama.embedding_length", uint32_t(p.dim));
  w.set_u32("llama.block_count", uint32_t(p.n_layer));
  w.set_u32("llama.feed_forward_length", uint32_t(p.ffn_dim));
  w.set_u32("llama.attention.head_count", uint32_t(p.n_head));
  w.set_u32("llama.attention.head_count_kv", uint32_t(p.n_kv_head));
  w.set_u32("llama.rope.dimension_count", uint32_t(p.dim / p.n_head));
  w.set_f32("llama.rope.freq_base", 10000.0f);
  w.set_f32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  w.set_u32("llama.vocab_size", uint32_t(p.n_vocab));

  const vocab_spec v = make_byte_level_vocab(p.n_vocab);
  w.set_string("tokenizer.ggml.model", v.model);
  w.set_string("tokenizer.ggml.pre", "gpt-2");
  w.set_strings("tokenizer.ggml.tokens", v.tokens);
  if (!v.token_types.empty()) w.set_i32s("tokenizer.ggml.token_type", v.token_types);
  w.set_strings("tokenizer.ggml.merges", v.merges);
  w.set_u32("tokenizer.ggml.bos_token_id", uint32_t(v.bos_id));
  w.set_u32("tokenizer.ggml.eos_token_id", uint32_t(v.eos_id));
  w.set_u32("tokenizer.ggml.unknown_token_id", uint32_t(v.unk_id));
  w.set_bool("tokenizer.ggml.add_bos_token", true);

  rng r(seed);
  // Uniform weights with variance 1/fan_in keep activations of order one through the layers.
  auto matrix = [&](const std::string& name, int64_t rows, int64_t cols, kernels::dtype t) {
    std::vector<float> xs(size_t(rows * cols));
    const float a = std::sqrt(3.0f / float(cols));
    for (auto& x : xs) x = r.uniform() * a;
    w.add_tensor(name, {cols, rows}, t, encode(t, xs, cols));
  };
  auto norm = [&](const std::string& name, int64_t n) {
    std::vector<float> xs(static_cast<size_t>(n));
    for (auto& x : xs) x = 1.0f + 0.1f * r.uniform();
    w.add_tensor(name, {n}, kernels::dtype::f32, encode(kernels::dtype::f32, xs, n));
  };
  const int64_t hd = p.dim / p.n_head;
  // The embedding keeps a unit scale per element so the first RMSNorm sees a normal input.
  {
    std::vector<float> xs(size_t(int64_t(p.n_vocab) * p.dim));
    for (auto& x : xs) x = r.uniform();
    w.add_tensor("token_embd.weight", {p.dim, p.n_vocab}, type, encode(type, xs, p.dim));
  }
  norm("output_norm.weight", p.dim);
  if (!p.tied_output) matrix("output.weight", p.n_vocab, p.dim, type);
  for (int32_t l = 0; l < p.n_layer; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    norm(b + "attn_norm.weight", p.dim);
    matrix(b + "attn_q.weight", p.n_head * hd, p.dim, type);
    matrix(b + "attn_k.weight", p.n_kv_head * hd, p.dim, type);
    matrix(b + "attn_v.weight", p.n_kv_head * hd, p.dim, type);
    matrix(b + "attn_output.weight", p.dim, p.n_head * hd, type);
    norm(b + "ffn_norm.weight", p.dim);
    matrix(b + "ffn_gate.weight", p.ffn_dim, p.dim, type);
    matrix(b + "ffn_up.weight", p.ffn_dim, p.dim, type);
    matrix(b + "ffn_down.weight", p.dim, p.ffn_dim, type);
  }
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (!dir.empty()) std::filesystem::create_directories(dir);
  w.write(path);
}

std::string cache_dir() {
  std::filesystem::path dir;
  if (const char* d = std::getenv("TANDEM_CACHE_DIR"); d && *d) dir = d;
  else if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) dir = std::filesystem::path(x) / "tandem";
  else if (const char* h = std::getenv("HOME"); h && *h) dir = std::filesystem::path(h) / ".cache" / "tandem";
  else dir = std::filesystem::temp_directory_path() / "tandem";
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw failure(errc::io_error, "cannot create cache directory '" + dir.string() + "': " + ec.message());
  return dir.string();
}

std::string cached_synth_model(const std::string& preset, kernels::dtype type) {
  const synth_preset& p = find_synth_preset(preset);
  const auto path = std::filesystem::path(cache_dir()) /
                    ("synth-" + p.name + "-" + std::string(kernels::to_string(type)) + ".gguf");
  // The writer renames into place, so an existing file is always complete.
  if (!std::filesystem::exists(path)) synthesize_model(p, type, path.string());
  return path.string();
}

std::string default_model_path() { return cached_synth_model(default_model_preset, default_model_dtype); }

}  // namespace tandem
