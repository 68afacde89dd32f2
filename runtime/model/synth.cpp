#include "runtime/model/synth.h"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <string_view>

#include "runtime/atomic_file.h"
#include "runtime/model/default_model.h"
#include "runtime/errors.h"
#include "runtime/gguf/gguf.h"
#include "runtime/tokenizer/tokenizer.h"

namespace tandem {

const std::vector<synth_preset>& synth_presets() {
  static const std::vector<synth_preset> presets = {
      {"tiny", 64, 192, 2, 4, 2, 300, 256, true, "2 layers, dim 64, GQA 4/2, tied head: fast tests"},
      {"arch", 64, 128, 2, 4, 2, 320, 256, false,
       "2 layers, dim 64, FFN 128, GQA 4/2, untied head: each architecture against llama.cpp"},
      {"arch-kquant", 256, 256, 1, 4, 2, 320, 256, false,
       "1 layer, dim 256, FFN 256, GQA 4/2: the architectures in llama-quantize's k-quant presets"},
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

void synthesize_model(const synth_preset& p, kernels::dtype type, const std::string& path, uint64_t seed,
                      const synth_options& opts) {
  const int64_t be = kernels::block_elems(type);
  const architecture_traits& at = traits(opts.arch);
  // Qwen 3 and Gemma 3 have heads wider than dim / n_head (Qwen3-0.6B: 128 for 1024 / 16): so here.
  const int64_t hd = p.dim / p.n_head * (at.qk_norm ? 2 : 1);
  const int64_t q_dim = p.n_head * hd, kv_dim = p.n_kv_head * hd;
  const int32_t n_vocab = opts.vocab ? int32_t(opts.vocab->tokens.size()) : p.n_vocab;
  if (p.dim % be != 0 || p.ffn_dim % be != 0 || q_dim % be != 0)
    throw failure(errc::invalid_argument, std::string(kernels::to_string(type)) +
                                              " needs widths that are multiples of " + std::to_string(be) +
                                              " (preset '" + p.name + "': dim " + std::to_string(p.dim) + ", FFN " +
                                              std::to_string(p.ffn_dim) + ")");
  const bool tied = opts.arch == architecture::phi3 ? false : p.tied_output;  // llama.cpp's phi3 needs output.weight
  const std::string K = std::string(at.name) + ".";
  gguf::writer w;
  w.set_string("general.architecture", std::string(at.name));
  std::string name = "tandem-synth-" + p.name;
  if (opts.arch != architecture::llama) name.append("-").append(at.name);
  w.set_string("general.name", opts.name.empty() ? name : opts.name);
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
  w.set_u32(K + "context_length", uint32_t(p.n_ctx));
  w.set_u32(K + "embedding_length", uint32_t(p.dim));
  w.set_u32(K + "block_count", uint32_t(p.n_layer));
  w.set_u32(K + "feed_forward_length", uint32_t(p.ffn_dim));
  w.set_u32(K + "attention.head_count", uint32_t(p.n_head));
  w.set_u32(K + "attention.head_count_kv", uint32_t(p.n_kv_head));
  if (at.qk_norm) {
    w.set_u32(K + "attention.key_length", uint32_t(hd));
    w.set_u32(K + "attention.value_length", uint32_t(hd));
  }
  w.set_u32(K + "rope.dimension_count", uint32_t(hd));
  w.set_f32(K + "rope.freq_base", opts.arch == architecture::llama ? 10000.0f : 1000000.0f);
  w.set_f32(K + "attention.layer_norm_rms_epsilon", opts.arch == architecture::gemma3 ? 1e-6f : 1e-5f);
  // A window shorter than the test prompts plus their continuations, so that it matters.
  if (at.swa_period > 0) w.set_u32(K + "attention.sliding_window", 8);
  w.set_u32(K + "vocab_size", uint32_t(n_vocab));

  // The architecture's chat control tokens end the built-in vocab, as in the real files
  // (llama.cpp looks some up by text: it refuses a phi3 vocab without them).
  std::vector<std::string> controls;
  switch (opts.arch) {
    case architecture::llama: break;
    case architecture::qwen2:
    case architecture::qwen3: controls = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}; break;
    case architecture::gemma3: controls = {"<start_of_turn>", "<end_of_turn>"}; break;
    case architecture::phi3: controls = {"<|endoftext|>", "<|end|>", "<|user|>", "<|assistant|>", "<|system|>"}; break;
  }
  vocab_spec v;
  if (opts.vocab) {
    v = *opts.vocab;
  } else {
    v = make_byte_level_vocab(p.n_vocab - int32_t(controls.size()));
    v.pre = "gpt-2";
    if (opts.printable) respell_unprintable_bytes(v);
    for (auto& t : controls) {
      v.tokens.push_back(t);
      v.token_types.push_back(3);  // control
    }
  }
  w.set_string("tokenizer.ggml.model", v.model);
  w.set_string("tokenizer.ggml.pre", v.pre);
  w.set_strings("tokenizer.ggml.tokens", v.tokens);
  if (!v.token_types.empty()) w.set_i32s("tokenizer.ggml.token_type", v.token_types);
  if (!v.scores.empty()) w.set_f32s("tokenizer.ggml.scores", v.scores);
  if (v.model == "gpt2" || !v.merges.empty()) w.set_strings("tokenizer.ggml.merges", v.merges);
  auto set_id = [&](const char* key, token_id id) {
    if (id >= 0) w.set_u32(key, uint32_t(id));
  };
  set_id("tokenizer.ggml.bos_token_id", v.bos_id);
  set_id("tokenizer.ggml.eos_token_id", v.eos_id);
  set_id("tokenizer.ggml.unknown_token_id", v.unk_id);
  set_id("tokenizer.ggml.padding_token_id", v.pad_id);
  set_id("tokenizer.ggml.eot_token_id", v.eot_id);
  set_id("tokenizer.ggml.eom_token_id", v.eom_id);
  w.set_bool("tokenizer.ggml.add_bos_token", v.add_bos);
  if (v.add_eos) w.set_bool("tokenizer.ggml.add_eos_token", true);  // absent: false, as llama.cpp reads it
  if (v.model == "llama") w.set_bool("tokenizer.ggml.add_space_prefix", v.add_space_prefix);
  if (!opts.chat_template.empty()) w.set_string("tokenizer.chat_template", opts.chat_template);

  rng r(seed);
  // Uniform weights with variance 1/fan_in keep activations of order one through the layers.
  auto values = [&](int64_t n, float a) {
    std::vector<float> xs(static_cast<size_t>(n));
    for (auto& x : xs) x = r.uniform() * a;
    return xs;
  };
  auto matrix = [&](const std::string& name, int64_t rows, int64_t cols, kernels::dtype t, float gain = 1.0f) {
    w.add_tensor(name, {cols, rows}, t, encode(t, values(rows * cols, gain * std::sqrt(3.0f / float(cols))), cols));
  };
  auto f32_vector = [&](const std::string& name, std::vector<float> xs) {
    const int64_t n = int64_t(xs.size());
    w.add_tensor(name, {n}, kernels::dtype::f32, encode(kernels::dtype::f32, xs, n));
  };
  auto norm = [&](const std::string& name, int64_t n) {
    std::vector<float> xs = values(n, 0.1f);
    for (auto& x : xs) x += 1.0f;
    f32_vector(name, std::move(xs));
  };
  // The embedding keeps a unit scale per element so the first RMSNorm sees a normal input; a
  // tied head takes output_scale here.
  w.add_tensor("token_embd.weight", {p.dim, n_vocab}, type,
               encode(type, values(int64_t(n_vocab) * p.dim, tied ? opts.output_scale : 1.0f), p.dim));
  norm("output_norm.weight", p.dim);
  if (!tied) matrix("output.weight", n_vocab, p.dim, type, opts.output_scale);
  for (int32_t l = 0; l < p.n_layer; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    norm(b + "attn_norm.weight", p.dim);
    if (at.fused_qkv_allowed) {
      matrix(b + "attn_qkv.weight", q_dim + 2 * kv_dim, p.dim, type);
    } else {
      matrix(b + "attn_q.weight", q_dim, p.dim, type);
      matrix(b + "attn_k.weight", kv_dim, p.dim, type);
      matrix(b + "attn_v.weight", kv_dim, p.dim, type);
    }
    if (at.qkv_bias) {
      f32_vector(b + "attn_q.bias", values(q_dim, 0.5f));
      f32_vector(b + "attn_k.bias", values(kv_dim, 0.5f));
      f32_vector(b + "attn_v.bias", values(kv_dim, 0.5f));
    }
    if (at.qk_norm) {
      norm(b + "attn_q_norm.weight", hd);
      norm(b + "attn_k_norm.weight", hd);
    }
    matrix(b + "attn_output.weight", p.dim, q_dim, type);
    if (at.post_norms) norm(b + "post_attention_norm.weight", p.dim);
    norm(b + "ffn_norm.weight", p.dim);
    if (at.fused_gate_up) {
      matrix(b + "ffn_up.weight", 2 * int64_t(p.ffn_dim), p.dim, type);
    } else {
      matrix(b + "ffn_gate.weight", p.ffn_dim, p.dim, type);
      matrix(b + "ffn_up.weight", p.ffn_dim, p.dim, type);
    }
    matrix(b + "ffn_down.weight", p.dim, p.ffn_dim, type);
    if (at.post_norms) norm(b + "post_ffw_norm.weight", p.dim);
  }
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (!dir.empty()) std::filesystem::create_directories(dir);
  w.write(path);
}

void respell_unprintable_bytes(vocab_spec& v) {
  std::set<std::string> taken(v.tokens.begin(), v.tokens.end());
  std::set<std::string> in_merges;
  for (const std::string& m : v.merges) {
    const size_t sp = m.find(' ');
    in_merges.insert(m.substr(0, sp));
    if (sp != std::string::npos) in_merges.insert(m.substr(sp + 1));
  }
  // Fresh two-character spellings: "~A", "~B", ... then "^A", ... (none is a merge's part: merges
  // join what the training text holds, and these pairs are never built).
  static constexpr std::string_view firsts = "~^`|",
                                    seconds = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  size_t next = 0;
  auto fresh = [&] {
    for (; next < firsts.size() * seconds.size(); ++next) {
      std::string s{firsts[next / seconds.size()], seconds[next % seconds.size()]};
      if (!taken.count(s)) {
        ++next;
        return s;
      }
    }
    throw failure(errc::invalid_argument, "no printable spellings left");
  };
  for (int b = 0; b < 256; ++b) {
    const bool unprintable = b >= 0x80 || b == 0x7F || (b < 0x20 && b != '\t' && b != '\n' && b != '\r');
    if (!unprintable) continue;
    // The byte tokens follow <unk>, <s>, </s> in make_byte_level_vocab.
    std::string& t = v.tokens.at(size_t(3 + b));
    if (in_merges.count(t)) continue;
    t = fresh();
    taken.insert(t);
  }
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
  // "-p": the printable vocabulary (the files before it had raw byte tokens).
  const auto path = std::filesystem::path(cache_dir()) /
                    ("synth-" + p.name + "-" + std::string(kernels::to_string(type)) + "-p.gguf");
  // The writer renames into place, so an existing file is always complete.
  synth_options opts;
  opts.printable = true;
  if (!std::filesystem::exists(path)) synthesize_model(p, type, path.string(), 42, opts);
  return path.string();
}

std::string bench_model_path() { return cached_synth_model(bench_model_preset, bench_model_dtype); }

std::string default_model_path() {
  const auto path = std::filesystem::path(cache_dir()) / (std::string(default_model_name) + ".gguf");
  const auto bytes = default_model_bytes();
  std::error_code ec;
  // Written again when the size differs (a file another build left); a file is never found half
  // written (write_file_atomically).
  if (std::filesystem::file_size(path, ec) == bytes.size() && !ec) return path.string();
  write_file_atomically(path.string(), [&](std::ostream& out) {
    out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  });
  return path.string();
}

}  // namespace tandem
