// The engine against a plain double-precision Llama written here, plus the properties the
// serving layers rely on: chunked prefill, batched decode, KV export/import, block accounting.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>

#include <cmath>
#include <filesystem>
#include <thread>

#include "runtime/engine/engine.h"
#include "runtime/gguf/gguf.h"
#include "runtime/engine/sampler.h"
#include "runtime/model/synth.h"

using namespace tandem;
namespace fs = std::filesystem;

namespace {

std::string synth_file(const std::string& preset, kernels::dtype t) {
  const auto dir = fs::temp_directory_path() / "tandem-test-models";
  fs::create_directories(dir);
  const auto path = dir / (preset + "-" + std::string(kernels::to_string(t)) + ".gguf");
  if (!fs::exists(path)) synthesize_model(find_synth_preset(preset), t, path.string(), 7);
  return path.string();
}

// ---- the double-precision reference ----
using dvec = std::vector<double>;

dvec row_of(const kernels::weight_view& w, int64_t r) {
  std::vector<float> f(size_t(w.cols));
  kernels::dequantize_row(w.type, static_cast<const uint8_t*>(w.data) + r * kernels::row_bytes(w.type, w.cols),
                          f.data(), w.cols);
  return dvec(f.begin(), f.end());
}

dvec matvec(const kernels::weight_view& w, const dvec& x) {
  dvec y(size_t(w.rows));
  for (int64_t r = 0; r < w.rows; ++r) {
    const dvec row = row_of(w, r);
    double s = 0;
    for (int64_t i = 0; i < w.cols; ++i) s += row[size_t(i)] * x[size_t(i)];
    y[size_t(r)] = s;
  }
  return y;
}

dvec rmsnorm(const dvec& x, const std::vector<float>& w, double eps) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double k = 1.0 / std::sqrt(ss / double(x.size()) + eps);
  dvec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * k * w[i];
  return y;
}

void rope(dvec& x, int n_heads, int hd, int pos, double base) {
  for (int h = 0; h < n_heads; ++h)
    for (int i = 0; i < hd / 2; ++i) {
      const double th = pos * std::pow(base, -2.0 * i / hd);
      double& a = x[size_t(h * hd + 2 * i)];
      double& b = x[size_t(h * hd + 2 * i + 1)];
      const double a0 = a, b0 = b;
      a = a0 * std::cos(th) - b0 * std::sin(th);
      b = a0 * std::sin(th) + b0 * std::cos(th);
    }
}

// Logits after each token of `tokens`, computed token by token with a growing K/V history.
std::vector<dvec> reference_logits(const model& m, const std::vector<token_id>& tokens) {
  const auto& c = m.config();
  const int hd = c.head_dim, rep = c.n_head / c.n_kv_head;
  std::vector<std::vector<dvec>> K(size_t(c.n_layer)), V(size_t(c.n_layer));
  std::vector<dvec> out;
  for (size_t p = 0; p < tokens.size(); ++p) {
    dvec x = row_of(m.tok_embd(), tokens[p]);
    for (int l = 0; l < c.n_layer; ++l) {
      const auto& w = m.layers()[size_t(l)];
      dvec xn = rmsnorm(x, w.attn_norm, c.rms_eps);
      dvec q = matvec(w.wq, xn), k = matvec(w.wk, xn), v = matvec(w.wv, xn);
      rope(q, c.n_head, hd, int(p), c.rope_freq_base);
      rope(k, c.n_kv_head, hd, int(p), c.rope_freq_base);
      K[size_t(l)].push_back(k);
      V[size_t(l)].push_back(v);
      dvec att(size_t(c.n_head * hd), 0.0);
      for (int h = 0; h < c.n_head; ++h) {
        const int g = h / rep;
        std::vector<double> s(p + 1);
        double mx = -1e300;
        for (size_t t = 0; t <= p; ++t) {
          double d = 0;
          for (int i = 0; i < hd; ++i) d += q[size_t(h * hd + i)] * K[size_t(l)][t][size_t(g * hd + i)];
          s[t] = d / std::sqrt(double(hd));
          mx = std::max(mx, s[t]);
        }
        double sum = 0;
        for (auto& e : s) sum += (e = std::exp(e - mx));
        for (size_t t = 0; t <= p; ++t)
          for (int i = 0; i < hd; ++i) att[size_t(h * hd + i)] += s[t] / sum * V[size_t(l)][t][size_t(g * hd + i)];
      }
      dvec o = matvec(w.wo, att);
      for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];
      xn = rmsnorm(x, w.ffn_norm, c.rms_eps);
      dvec g = matvec(w.w_gate, xn), u = matvec(w.w_up, xn);
      for (size_t i = 0; i < g.size(); ++i) g[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
      dvec d = matvec(w.w_down, g);
      for (size_t i = 0; i < x.size(); ++i) x[i] += d[i];
    }
    out.push_back(matvec(m.output(), rmsnorm(x, m.output_norm(), c.rms_eps)));
  }
  return out;
}

double max_abs(const dvec& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

std::vector<token_id> some_tokens(int n, int vocab, int salt = 0) {
  std::vector<token_id> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[size_t(i)] = token_id((i * 37 + salt * 101 + 5) % vocab);
  return t;
}

token_id argmax(const float* x, int n) { return token_id(std::max_element(x, x + n) - x); }

}  // namespace

// Tolerance on each logit, relative to the largest reference logit. f32 and f16 weights keep
// f32 activations: only float accumulation differs from the double reference. bf16 and
// q8_0 kernels round (or quantize) the activations to the weight format for the dot products
// (as llama.cpp does), which costs about two decimal digits.
struct dtype_case {
  kernels::dtype type;
  double tol;
};
void PrintTo(const dtype_case& c, std::ostream* os) { *os << kernels::to_string(c.type) << " tol " << c.tol; }
class ForwardVsReference : public ::testing::TestWithParam<dtype_case> {};

TEST_P(ForwardVsReference, LogitsMatchDoublePrecision) {
  const auto [type, tol] = GetParam();
  for (const std::string preset : {"tiny", "small"}) {
    auto m = model::load(synth_file(preset, type));
    const auto& c = m->config();
    EXPECT_EQ(c.tied_output, preset == "tiny");
    const auto tokens = some_tokens(preset == "tiny" ? 20 : 6, c.n_vocab);
    const auto ref = reference_logits(*m, tokens);

    // An f32 KV cache: this test is about the weights (KV dtypes: KvDtypes below).
    engine eng(m, engine_options{.n_threads = 2, .block_size = 4, .n_kv_blocks = 64, .kv_dtype = kernels::dtype::f32});
    const seq_id s = eng.create_sequence();
    // Ask for logits at every position, so every row of the batch is checked.
    std::vector<batch_entry> batch;
    for (auto t : tokens) batch.push_back({s, t, true});
    std::vector<float> logits;
    ASSERT_TRUE(eng.forward(batch, logits).ok());
    ASSERT_EQ(logits.size(), tokens.size() * size_t(c.n_vocab));
    for (size_t p = 0; p < tokens.size(); ++p) {
      const double scale = std::max(1.0, max_abs(ref[p]));
      double worst = 0;
      for (int v = 0; v < c.n_vocab; ++v)
        worst = std::max(worst, std::fabs(double(logits[p * size_t(c.n_vocab) + size_t(v)]) - ref[p][size_t(v)]));
      EXPECT_LE(worst / scale, tol) << preset << " " << kernels::to_string(type) << " position " << p;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllWeightTypes, ForwardVsReference,
                         ::testing::Values(dtype_case{kernels::dtype::f32, 1e-4}, dtype_case{kernels::dtype::f16, 1e-4},
                                           dtype_case{kernels::dtype::bf16, 2e-2},
                                           dtype_case{kernels::dtype::q8_0, 3e-2}),
                         [](const auto& info) { return std::string(kernels::to_string(info.param.type)); });

TEST(Engine, ChunkedPrefillEqualsOneShot) {
  auto m = model::load(synth_file("tiny", kernels::dtype::f32));
  const int V = m->config().n_vocab;
  const auto prompt = some_tokens(150, V);
  engine eng(m, engine_options{.n_threads = 2, .n_kv_blocks = 128});
  std::vector<float> whole;
  const seq_id s0 = eng.create_sequence();
  ASSERT_TRUE(eng.prefill(s0, prompt, whole).ok());
  for (int chunk : {1, 7, 64}) {
    const seq_id s = eng.create_sequence();
    std::vector<float> logits;
    for (size_t i = 0; i < prompt.size(); i += size_t(chunk))
      ASSERT_TRUE(
          eng.prefill(s, std::span(prompt).subspan(i, std::min(size_t(chunk), prompt.size() - i)), logits).ok());
    ASSERT_EQ(logits.size(), whole.size());
    // Bitwise: the batch-invariant kernels give a row the same result in any batch.
    EXPECT_TRUE(logits == whole) << "chunk " << chunk;
    EXPECT_EQ(eng.sequence_length(s), 150);
  }
}

// A prefill of many rows on several threads runs the row-wise work of each layer as one job
// of row pieces (engine.cpp: run_layers); every row's logits and KV are bitwise those of one
// thread computing the whole batch, and of a chunked prefill, for each weight type, wherever
// the pieces are cut.
TEST(Engine, PrefillRowSharesAreBitwiseTheWholeBatch) {
  for (kernels::dtype t : {kernels::dtype::f32, kernels::dtype::bf16, kernels::dtype::q8_0, kernels::dtype::q4_k}) {
    SCOPED_TRACE(kernels::to_string(t));
    auto m = model::load(synth_file(t == kernels::dtype::q4_k ? "kquant" : "small", t));
    const auto prompt = some_tokens(300, m->config().n_vocab, 3);
    std::vector<std::vector<float>> all_logits;
    std::vector<std::vector<kv_block_export>> all_kv;
    for (int threads : {1, 2, 3}) {
      engine eng(m, engine_options{.n_threads = threads, .n_kv_blocks = 64});
      const seq_id s = eng.create_sequence();
      std::vector<batch_entry> batch;
      for (auto tok : prompt) batch.push_back({s, tok, true});
      std::vector<float> logits;
      ASSERT_TRUE(eng.forward(batch, logits).ok());
      all_logits.push_back(std::move(logits));
      all_kv.emplace_back();
      ASSERT_TRUE(eng.export_kv(s, all_kv.back()).ok());
      // Again on new sequences: the pieces are sized by the threads' speed in the jobs before
      // (runtime/engine/row_split.h), so these forwards cut the rows elsewhere.
      for (int again = 0; again < 3 && threads > 1; ++again) {
        const seq_id a = eng.create_sequence();
        for (auto& e : batch) e.seq = a;
        std::vector<float> again_logits;
        ASSERT_TRUE(eng.forward(batch, again_logits).ok());
        EXPECT_TRUE(again_logits == all_logits[0]) << threads << " threads, forward " << again + 2;
        ASSERT_TRUE(eng.free_sequence(a).ok());
      }
      if (threads == 2) {  // chunks of 7 rows: the batch-wide path
        const seq_id c = eng.create_sequence();
        std::vector<float> chunk_logits, last;
        for (size_t i = 0; i < prompt.size(); i += 7) {
          std::vector<batch_entry> part;
          for (size_t j = i; j < std::min(prompt.size(), i + 7); ++j) part.push_back({c, prompt[j], true});
          ASSERT_TRUE(eng.forward(part, last).ok());
          chunk_logits.insert(chunk_logits.end(), last.begin(), last.end());
        }
        EXPECT_TRUE(chunk_logits == all_logits[0]) << "chunked prefill";
      }
    }
    EXPECT_TRUE(all_logits[1] == all_logits[0]) << "2 threads";
    EXPECT_TRUE(all_logits[2] == all_logits[0]) << "3 threads";
    for (size_t i = 1; i < all_kv.size(); ++i) {
      ASSERT_EQ(all_kv[i].size(), all_kv[0].size());
      for (size_t b = 0; b < all_kv[0].size(); ++b) EXPECT_TRUE(all_kv[i][b].payload == all_kv[0][b].payload) << b;
    }
  }
}

TEST(Engine, BatchedDecodeEqualsEachAlone) {
  auto m = model::load(synth_file("tiny", kernels::dtype::q8_0));
  const int V = m->config().n_vocab;
  engine batched(m, engine_options{.n_threads = 2, .n_kv_blocks = 64});
  engine alone(m, engine_options{.n_threads = 2, .n_kv_blocks = 64});
  std::vector<seq_id> bs, as;
  std::vector<token_id> next;
  std::vector<float> logits;
  for (int i = 0; i < 3; ++i) {  // prompt lengths 5, 17, 40
    const auto prompt = some_tokens(i == 0 ? 5 : i == 1 ? 17 : 40, V, i);
    bs.push_back(batched.create_sequence());
    as.push_back(alone.create_sequence());
    ASSERT_TRUE(batched.prefill(bs.back(), prompt, logits).ok());
    ASSERT_TRUE(alone.prefill(as.back(), prompt, logits).ok());
    next.push_back(argmax(logits.data(), V));
  }
  std::vector<token_id> alone_next = next;
  for (int step = 0; step < 12; ++step) {
    std::vector<float> blog;
    ASSERT_TRUE(batched.decode(bs, next, blog).ok());
    for (size_t i = 0; i < as.size(); ++i) {
      std::vector<float> alog;
      ASSERT_TRUE(alone.decode(std::span(&as[i], 1), std::span(&alone_next[i], 1), alog).ok());
      for (int v = 0; v < V; ++v) ASSERT_NEAR(blog[i * size_t(V) + size_t(v)], alog[size_t(v)], 1e-4);
      alone_next[i] = argmax(alog.data(), V);
      next[i] = argmax(blog.data() + i * size_t(V), V);
      ASSERT_EQ(next[i], alone_next[i]);
    }
  }
}

// A half-size KV cache against the f32 one, same weights and tokens: each logit within
// `tol` of the f32-KV logits, relative to the largest of them. f16 keeps 11 significant bits
// of each K/V element (relative error 2^-11 per element), bf16 8 (2^-8); attention averages
// these errors over the context, and the random layers of the synthetic presets amplify
// them. Measured worst cases (f32 weights, 40 positions): f16 2.3e-4 (tiny) and 1.4e-3
// (small), bf16 2.0e-3 and 1.1e-2; the bounds leave 3.5-5x. q8_0 (8 bits and a scale per 32,
// small only: it needs head_dim % 32 == 0): 3.6e-2, 2.8x under its bound.
TEST(KvDtypes, LogitsStayCloseToTheF32Cache) {
  for (const std::string preset : {"tiny", "small"}) {
    auto m = model::load(synth_file(preset, kernels::dtype::f32));
    const int V = m->config().n_vocab;
    const auto tokens = some_tokens(40, V);
    auto logits_with = [&](kernels::dtype kv) {
      engine eng(m, engine_options{.n_threads = 2, .n_kv_blocks = 16, .kv_dtype = kv});
      const seq_id s = eng.create_sequence();
      std::vector<batch_entry> batch;
      for (auto t : tokens) batch.push_back({s, t, true});
      std::vector<float> logits;
      EXPECT_TRUE(eng.forward(batch, logits).ok());
      return logits;
    };
    const auto ref = logits_with(kernels::dtype::f32);
    const double scale = std::max(1.0, double(*std::max_element(ref.begin(), ref.end(), [](float a, float b) {
                                    return std::fabs(a) < std::fabs(b);
                                  })));
    for (auto [kv, tol] : {std::pair{kernels::dtype::f16, 5e-3}, std::pair{kernels::dtype::bf16, 5e-2},
                           std::pair{kernels::dtype::q8_0, 1e-1}}) {
      if (kv == kernels::dtype::q8_0 && m->config().head_dim % 32 != 0) continue;  // tiny's 16: refused below
      const auto got = logits_with(kv);
      ASSERT_EQ(got.size(), ref.size());
      double worst = 0;
      for (size_t i = 0; i < ref.size(); ++i) worst = std::max(worst, std::fabs(double(got[i]) - ref[i]));
      EXPECT_LE(worst / scale, tol) << preset << " kv " << kernels::to_string(kv);
      EXPECT_GT(worst, 0.0) << "the cache's dtype changed nothing: was it used?";
      std::printf("[ kv dtype ] %s kv %s: worst logit error %.2e of %.2f\n", preset.c_str(),
                  std::string(kernels::to_string(kv)).c_str(), worst, scale);
    }
  }
}

// A block of the f16 cache is half the bytes of an f32 one, round-trips exactly between two
// f16 engines, and an engine of another KV dtype refuses it, naming both dtypes.
TEST(KvDtypes, HalfTheBytesAndOtherDtypesAreRefused) {
  auto m = model::load(synth_file("tiny", kernels::dtype::q8_0));
  const int V = m->config().n_vocab;
  const auto prompt = some_tokens(37, V);
  auto exported = [&](kernels::dtype kv) {
    engine eng(m, engine_options{.n_kv_blocks = 8, .kv_dtype = kv});
    const seq_id s = eng.create_sequence();
    std::vector<float> logits;
    EXPECT_TRUE(eng.prefill(s, prompt, logits).ok());
    std::vector<kv_block_export> blocks;
    EXPECT_TRUE(eng.export_kv(s, blocks).ok());
    return blocks;
  };
  const auto f32 = exported(kernels::dtype::f32), f16 = exported(kernels::dtype::f16);
  ASSERT_EQ(f32.size(), f16.size());
  EXPECT_EQ(f16[0].dtype, kernels::dtype::f16);
  EXPECT_EQ(f16[0].payload.size() * 2, f32[0].payload.size());
  engine other(m, engine_options{.n_kv_blocks = 8, .kv_dtype = kernels::dtype::f32});
  const seq_id d = other.create_sequence();
  const status st = other.import_kv(d, f16);
  EXPECT_EQ(st.code(), errc::incompatible_kv);
  EXPECT_NE(st.message().find("f16"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("f32"), std::string::npos) << st.message();
  engine same(m, engine_options{.n_kv_blocks = 8, .kv_dtype = kernels::dtype::f16});
  const seq_id e = same.create_sequence();
  ASSERT_TRUE(same.import_kv(e, f16).ok());
  std::vector<kv_block_export> again;
  ASSERT_TRUE(same.export_kv(e, again).ok());
  ASSERT_EQ(again.size(), f16.size());
  for (size_t i = 0; i < again.size(); ++i)  // bytes: two f16 values need not make a float that equals itself
    EXPECT_EQ(std::memcmp(again[i].payload.data(), f16[i].payload.data(), f16[i].payload.size() * sizeof(float)), 0)
        << "block " << i;
  // q8_0 needs whole 32-blocks per row: this model's head_dim of 16 is refused, naming it.
  try {
    engine(m, engine_options{.n_kv_blocks = 8, .kv_dtype = kernels::dtype::q8_0});
    ADD_FAILURE() << "a q8_0 cache with head_dim 16";
  } catch (const failure& e) {
    EXPECT_NE(std::string(e.what()).find("head_dim"), std::string::npos) << e.what();
  }
}

// A q8_0 block (34 bytes per 32 elements) is 34/128 of an f32 one, round-trips exactly between
// two q8_0 engines and continues the sequence as the engine that made it would; an f16 engine
// refuses it.
TEST(KvDtypes, Q8CacheRoundTripsAndIsRefusedElsewhere) {
  auto m = model::load(synth_file("small", kernels::dtype::q8_0));
  ASSERT_EQ(m->config().head_dim % 32, 0);
  const auto prompt = some_tokens(37, m->config().n_vocab);
  engine a(m, engine_options{.n_kv_blocks = 8, .kv_dtype = kernels::dtype::q8_0});
  engine f32(m, engine_options{.n_kv_blocks = 8, .kv_dtype = kernels::dtype::f32});
  std::vector<float> la, lf;
  const seq_id sa = a.create_sequence(), sf = f32.create_sequence();
  ASSERT_TRUE(a.prefill(sa, prompt, la).ok());
  ASSERT_TRUE(f32.prefill(sf, prompt, lf).ok());
  std::vector<kv_block_export> qa, qf;
  ASSERT_TRUE(a.export_kv(sa, qa).ok());
  ASSERT_TRUE(f32.export_kv(sf, qf).ok());
  ASSERT_EQ(qa.size(), qf.size());
  EXPECT_EQ(qa[0].dtype, kernels::dtype::q8_0);
  EXPECT_EQ(qa[0].payload.size() * 128, qf[0].payload.size() * 34);
  engine b(m, engine_options{.n_kv_blocks = 8, .kv_dtype = kernels::dtype::q8_0});
  const seq_id sb = b.create_sequence();
  ASSERT_TRUE(b.import_kv(sb, qa).ok());
  std::vector<kv_block_export> again;
  ASSERT_TRUE(b.export_kv(sb, again).ok());
  // Bytes, not floats: a payload's words are not floats (a q8_0 word can be a NaN pattern).
  auto same_bytes = [](const kv_payload& x, const kv_payload& y) {
    return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
  };
  for (size_t i = 0; i < again.size(); ++i) EXPECT_TRUE(same_bytes(again[i].payload, qa[i].payload)) << "block " << i;
  const token_id next = 5;
  std::vector<float> da, db;
  ASSERT_TRUE(a.decode(std::span(&sa, 1), std::span(&next, 1), da).ok());
  ASSERT_TRUE(b.decode(std::span(&sb, 1), std::span(&next, 1), db).ok());
  EXPECT_EQ(da, db) << "the imported cache continues bit for bit";
  engine f16(m, engine_options{.n_kv_blocks = 8, .kv_dtype = kernels::dtype::f16});
  const seq_id s16 = f16.create_sequence();
  const status st = f16.import_kv(s16, qa);
  EXPECT_EQ(st.code(), errc::incompatible_kv);
  EXPECT_NE(st.message().find("q8_0"), std::string::npos) << st.message();
}

TEST(Engine, KvExportImportContinuesIdentically) {
  auto m = model::load(synth_file("tiny", kernels::dtype::f32));
  const int V = m->config().n_vocab;
  engine prefill_side(m, engine_options{.n_threads = 1, .n_kv_blocks = 32});
  engine decode_side(m, engine_options{.n_threads = 2, .n_kv_blocks = 32});
  const auto prompt = some_tokens(37, V);  // not a multiple of the block size: a partial last block
  const seq_id a = prefill_side.create_sequence();
  std::vector<float> logits;
  ASSERT_TRUE(prefill_side.prefill(a, prompt, logits).ok());
  const token_id first = argmax(logits.data(), V);

  std::vector<kv_block_export> blocks;
  ASSERT_TRUE(prefill_side.export_kv(a, blocks).ok());
  ASSERT_EQ(blocks.size(), 3u);  // 16 + 16 + 5
  EXPECT_EQ(blocks.back().pos_begin, 32);
  EXPECT_EQ(blocks.back().pos_end, 37);
  const seq_id b = decode_side.create_sequence();
  ASSERT_TRUE(decode_side.import_kv(b, blocks).ok());
  EXPECT_EQ(decode_side.sequence_length(b), 37);

  token_id ta = first, tb = first;
  for (int i = 0; i < 20; ++i) {
    std::vector<float> la, lb;
    ASSERT_TRUE(prefill_side.decode(std::span(&a, 1), std::span(&ta, 1), la).ok());
    ASSERT_TRUE(decode_side.decode(std::span(&b, 1), std::span(&tb, 1), lb).ok());
    ta = argmax(la.data(), V);
    tb = argmax(lb.data(), V);
    ASSERT_EQ(ta, tb) << "step " << i;
  }
}

// What a streaming prefill worker does: chunked prefill, and after each layer of each chunk
// the pieces (that layer, blocks from the chunk's first position) go out. Imported together,
// the pieces give the same sequence as a whole export; an incomplete set is refused.
TEST(Engine, KvStreamedByLayerAndChunkImportsIdentically) {
  auto m = model::load(synth_file("tiny", kernels::dtype::f32));
  const int V = m->config().n_vocab;
  const int32_t n_layer = m->config().n_layer;
  ASSERT_GE(n_layer, 2);
  engine src(m, engine_options{.n_threads = 2, .n_kv_blocks = 32});
  engine whole(m, engine_options{.n_kv_blocks = 32});
  engine dst(m, engine_options{.n_kv_blocks = 32});
  const auto prompt = some_tokens(37, V);
  const seq_id a = src.create_sequence();
  std::vector<kv_block_export> pieces;
  std::vector<float> logits;
  for (int32_t begin = 0; begin < 37; begin += 7) {
    const int32_t n = std::min(7, 37 - begin);
    std::vector<batch_entry> batch;
    for (int32_t i = 0; i < n; ++i) batch.push_back({a, prompt[size_t(begin + i)], begin + i == 36});
    ASSERT_TRUE(
        src.forward(batch, logits, [&](int32_t l) { ASSERT_TRUE(src.export_kv(a, l, l + 1, begin, pieces).ok()); })
            .ok());
  }
  EXPECT_GT(pieces.size(), size_t(3 * n_layer));  // blocks re-sent as they filled
  const token_id first = argmax(logits.data(), V);

  auto missing = pieces;  // the last layer of the last chunk never arrived
  missing.pop_back();
  const seq_id m1 = dst.create_sequence();
  EXPECT_EQ(dst.import_kv(m1, missing).code(), errc::incompatible_kv);
  EXPECT_EQ(dst.kv_pool().free_blocks(), 32);

  const seq_id b = dst.create_sequence();
  ASSERT_TRUE(dst.import_kv(b, pieces).ok());
  EXPECT_EQ(dst.sequence_length(b), 37);
  const seq_id w = whole.create_sequence();
  std::vector<float> wl;
  ASSERT_TRUE(whole.prefill(w, prompt, wl).ok());
  ASSERT_EQ(argmax(wl.data(), V), first);
  token_id tw = first, tb = first;
  for (int i = 0; i < 12; ++i) {
    std::vector<float> lw, lb;
    ASSERT_TRUE(whole.decode(std::span(&w, 1), std::span(&tw, 1), lw).ok());
    ASSERT_TRUE(dst.decode(std::span(&b, 1), std::span(&tb, 1), lb).ok());
    tw = argmax(lw.data(), V);
    tb = argmax(lb.data(), V);
    ASSERT_EQ(tw, tb) << "step " << i;
  }
}

TEST(Engine, CorruptedOrForeignKvBlockIsRefused) {
  auto m = model::load(synth_file("tiny", kernels::dtype::f32));
  auto other = model::load(synth_file("tiny", kernels::dtype::f16));
  engine src(m, engine_options{.n_kv_blocks = 16});
  engine dst(m, engine_options{.n_kv_blocks = 16});
  engine foreign(other, engine_options{.n_kv_blocks = 16});
  const seq_id s = src.create_sequence();
  std::vector<float> logits;
  ASSERT_TRUE(src.prefill(s, some_tokens(40, m->config().n_vocab), logits).ok());
  std::vector<kv_block_export> blocks;
  ASSERT_TRUE(src.export_kv(s, blocks).ok());

  auto bad = blocks;
  bad[1].payload[123] += 1e-3f;  // one value changed in flight
  const seq_id d = dst.create_sequence();
  const status st = dst.import_kv(d, bad);
  EXPECT_EQ(st.code(), errc::checksum_mismatch) << st.to_string();
  EXPECT_EQ(dst.sequence_length(d), 0);
  EXPECT_EQ(dst.kv_pool().free_blocks(), 16);  // nothing leaked

  auto gap = blocks;
  gap.erase(gap.begin() + 1);
  EXPECT_EQ(dst.import_kv(d, gap).code(), errc::incompatible_kv);

  const seq_id f = foreign.create_sequence();
  EXPECT_EQ(foreign.import_kv(f, blocks).code(), errc::incompatible_kv);
  EXPECT_TRUE(dst.import_kv(d, blocks).ok());
}

TEST(Engine, OutOfBlocksIsAStatusAndChangesNothing) {
  auto m = model::load(synth_file("tiny", kernels::dtype::f32));
  const int V = m->config().n_vocab;
  engine eng(m, engine_options{.block_size = 16, .n_kv_blocks = 4});  // 64 positions in all
  std::vector<float> logits;
  const seq_id a = eng.create_sequence();
  ASSERT_TRUE(eng.prefill(a, some_tokens(40, V), logits).ok());
  EXPECT_EQ(eng.kv_pool().free_blocks(), 1);
  const seq_id b = eng.create_sequence();
  const status st = eng.prefill(b, some_tokens(20, V), logits);
  EXPECT_EQ(st.code(), errc::out_of_kv_blocks);
  EXPECT_EQ(eng.sequence_length(b), 0);
  EXPECT_EQ(eng.kv_pool().free_blocks(), 1);
  ASSERT_TRUE(eng.free_sequence(a).ok());
  EXPECT_EQ(eng.kv_pool().free_blocks(), 4);
  EXPECT_TRUE(eng.prefill(b, some_tokens(20, V), logits).ok());
  EXPECT_EQ(eng.free_sequence(a).code(), errc::unknown_sequence);
}

TEST(Engine, ContextOverflowAndBadTokensAreRefused) {
  auto m = model::load(synth_file("tiny", kernels::dtype::f32));
  const auto& c = m->config();
  engine eng(m, engine_options{.n_kv_blocks = 64});
  std::vector<float> logits;
  const seq_id s = eng.create_sequence();
  EXPECT_EQ(eng.prefill(s, some_tokens(c.n_ctx + 1, c.n_vocab), logits).code(), errc::context_overflow);
  const token_id bad[] = {5, c.n_vocab};
  EXPECT_EQ(eng.prefill(s, bad, logits).code(), errc::invalid_argument);
  EXPECT_EQ(eng.sequence_length(s), 0);
  EXPECT_EQ(eng.kv_pool().free_blocks(), 64);
}

TEST(Engine, IndependentEnginesRunConcurrently) {
  auto m = model::load(synth_file("tiny", kernels::dtype::bf16));
  const int V = m->config().n_vocab;
  auto run = [&](std::vector<token_id>& out) {
    engine eng(m, engine_options{.n_threads = 1, .n_kv_blocks = 32});
    const seq_id s = eng.create_sequence();
    std::vector<float> logits;
    ASSERT_TRUE(eng.prefill(s, some_tokens(30, V), logits).ok());
    for (int i = 0; i < 30; ++i) {
      token_id t = argmax(logits.data(), V);
      out.push_back(t);
      ASSERT_TRUE(eng.decode(std::span(&s, 1), std::span(&t, 1), logits).ok());
    }
  };
  std::vector<token_id> a, b, c;
  std::thread t1([&] { run(a); }), t2([&] { run(b); });
  t1.join();
  t2.join();
  run(c);
  EXPECT_EQ(a, c);
  EXPECT_EQ(b, c);
}

TEST(Sampler, GreedyAndDeterministic) {
  std::vector<float> logits = {0.1f, 2.0f, -1.0f, 2.0f, 0.5f};
  EXPECT_EQ(sample(logits, sampling_params{.temperature = 0.0f}, 0), 1);  // tie → lowest id
  EXPECT_EQ(sample(logits, sampling_params{.temperature = 1.0f, .top_k = 1}, 3), 1);
  const sampling_params p{.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .seed = 99};
  for (uint64_t i = 0; i < 50; ++i) EXPECT_EQ(sample(logits, p, i), sample(logits, p, i));
  EXPECT_EQ(sampling_params{.temperature = -1.0f}.validate().code(), errc::invalid_argument);
  EXPECT_EQ(sampling_params{.top_p = 0.0f}.validate().code(), errc::invalid_argument);
}

TEST(Sampler, FrequenciesFollowTheDistribution) {
  // Softmax of these logits at temperature 1 is {0.0900, 0.2447, 0.6652}.
  const std::vector<float> logits = {0.0f, 1.0f, 2.0f};
  const sampling_params p{.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .seed = 7};
  int counts[3] = {};
  const int n = 20000;
  for (int i = 0; i < n; ++i) ++counts[sample(logits, p, uint64_t(i))];
  EXPECT_NEAR(counts[0] / double(n), 0.0900, 0.01);
  EXPECT_NEAR(counts[1] / double(n), 0.2447, 0.015);
  EXPECT_NEAR(counts[2] / double(n), 0.6652, 0.015);
  // top_p = 0.6 keeps only the most likely token (0.665 >= 0.6).
  const sampling_params nucleus{.temperature = 1.0f, .top_k = 0, .top_p = 0.6f, .seed = 7};
  for (int i = 0; i < 100; ++i) EXPECT_EQ(sample(logits, nucleus, uint64_t(i)), 2);
}

// What recovery relies on: a request moved to another worker is prefilled again with its
// prompt plus the tokens it already produced, and must go on exactly as if nothing happened.
// So a token's logits may not depend on the path that computed them (one prefill of many
// rows, or one decode step in a batch of any size): bitwise equal, not merely close.
class BatchInvariance : public ::testing::TestWithParam<kernels::dtype> {};

TEST_P(BatchInvariance, RePrefillEqualsDecodeBitwise) {
  auto m = model::load(synth_file("tiny", GetParam()));
  const int V = m->config().n_vocab;
  engine eng(m, engine_options{.n_threads = 2, .n_kv_blocks = 128});
  const auto prompt = some_tokens(200, V, 3);  // long enough that attention spans several key tiles
  // Decoded in a batch with other sequences, as a decode worker does.
  std::vector<seq_id> seqs;
  std::vector<token_id> next;
  std::vector<float> logits;
  for (int i = 0; i < 20; ++i) {
    seqs.push_back(eng.create_sequence());
    ASSERT_TRUE(eng.prefill(seqs.back(), i == 0 ? prompt : some_tokens(20 + i, V, 100 + i), logits).ok());
    next.push_back(argmax(logits.data(), V));
  }
  std::vector<token_id> generated = {next[0]};
  std::vector<std::vector<float>> decode_logits;
  for (int step = 0; step < 6; ++step) {
    const size_t batch = step % 2 == 0 ? seqs.size() : 3;  // above and below any kernel crossover
    std::vector<float> l;
    ASSERT_TRUE(eng.decode(std::span(seqs).first(batch), std::span(next).first(batch), l).ok());
    decode_logits.emplace_back(l.begin(), l.begin() + V);
    for (size_t i = 0; i < batch; ++i) next[i] = argmax(l.data() + i * size_t(V), V);
    generated.push_back(next[0]);
  }
  // Prefilled again with every token so far: the next token's logits are the decode step's.
  for (size_t n = 1; n <= decode_logits.size(); ++n) {
    std::vector<token_id> again = prompt;
    again.insert(again.end(), generated.begin(), generated.begin() + std::ptrdiff_t(n));
    for (size_t chunk : {again.size(), size_t(32), size_t(7)}) {  // whole, or chunked as a worker does
      const seq_id s = eng.create_sequence();
      std::vector<float> l;
      for (size_t i = 0; i < again.size(); i += chunk)
        ASSERT_TRUE(eng.prefill(s, std::span(again).subspan(i, std::min(chunk, again.size() - i)), l).ok());
      for (int v = 0; v < V; ++v)
        ASSERT_EQ(l[size_t(v)], decode_logits[n - 1][size_t(v)])
            << "after " << n << " tokens, chunk " << chunk << ", logit " << v;
      ASSERT_TRUE(eng.free_sequence(s).ok());
    }
  }
}

INSTANTIATE_TEST_SUITE_P(WeightTypes, BatchInvariance,
                         ::testing::Values(kernels::dtype::f32, kernels::dtype::f16, kernels::dtype::bf16,
                                           kernels::dtype::q8_0),
                         [](const auto& info) { return std::string(kernels::to_string(info.param)); });

// RoPE scaling as llama.cpp reads it: rope_freqs.weight (Llama 3.1+) divides pair i's
// frequency by its factor; llama.rope.scaling.type "linear" scales positions. Factors of 1
// change nothing (bitwise), factors of 2 everywhere equal linear scaling by 2 (bitwise: both
// halve the angle exactly), other factors change the logits, and YaRN is refused by name.
namespace {
std::string with_rope(const std::string& base, const std::string& name, const std::vector<float>* factors,
                      const char* scaling_type, float scaling_factor) {
  auto f = gguf::file::open(base);
  gguf::writer w;
  for (const auto& [k, v] : f.metadata()) w.set(k, v);
  if (scaling_type) {
    w.set_string("llama.rope.scaling.type", scaling_type);
    w.set_f32("llama.rope.scaling.factor", scaling_factor);
  }
  for (const auto& t : f.tensors()) {
    const auto* d = static_cast<const uint8_t*>(t.data);
    w.add_tensor(t.name, t.shape, t.type, std::vector<uint8_t>(d, d + t.size_bytes));
  }
  if (factors) {
    std::vector<uint8_t> bytes(factors->size() * 4);
    std::memcpy(bytes.data(), factors->data(), bytes.size());
    w.add_tensor("rope_freqs.weight", {int64_t(factors->size())}, kernels::dtype::f32, bytes);
  }
  const auto path = (fs::temp_directory_path() / "tandem-test-models" / name).string();
  w.write(path);
  return path;
}
std::vector<float> prompt_logits(const std::string& path) {
  auto m = model::load(path);
  engine eng(m, engine_options{.n_threads = 1, .n_kv_blocks = 32});
  const seq_id s = eng.create_sequence();
  std::vector<float> logits;
  EXPECT_TRUE(eng.prefill(s, some_tokens(40, m->config().n_vocab), logits).ok());
  return logits;
}
}  // namespace

TEST(RopeScaling, FreqFactorsAndLinearScalingAsLlamaCpp) {
  const std::string base = synth_file("tiny", kernels::dtype::f32);
  const int half = model::load(base)->config().head_dim / 2;
  const std::vector<float> ones(size_t(half), 1.0f), twos(size_t(half), 2.0f);
  std::vector<float> llama3(static_cast<size_t>(half));
  for (int i = 0; i < half; ++i) llama3[size_t(i)] = i < half / 2 ? 1.0f : 8.0f;  // low frequencies stretched
  const auto plain = prompt_logits(base);
  EXPECT_EQ(prompt_logits(with_rope(base, "rope-ones.gguf", &ones, nullptr, 0)), plain);
  const auto by_two = prompt_logits(with_rope(base, "rope-twos.gguf", &twos, nullptr, 0));
  EXPECT_EQ(prompt_logits(with_rope(base, "rope-linear2.gguf", nullptr, "linear", 2.0f)), by_two);
  EXPECT_NE(by_two, plain);
  EXPECT_NE(prompt_logits(with_rope(base, "rope-llama3.gguf", &llama3, nullptr, 0)), plain);
  try {
    model::load(with_rope(base, "rope-yarn.gguf", nullptr, "yarn", 4.0f));
    FAIL() << "yarn accepted";
  } catch (const failure& e) {
    EXPECT_EQ(e.code(), errc::unsupported);
    EXPECT_NE(std::string(e.what()).find("yarn"), std::string::npos) << e.what();
  }
  const std::vector<float> bad(size_t(half), 0.0f);
  EXPECT_THROW(model::load(with_rope(base, "rope-zero.gguf", &bad, nullptr, 0)), failure);
}
