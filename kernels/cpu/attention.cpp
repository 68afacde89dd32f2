#include "kernels/cpu/attention.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/simd.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <stdexcept>
#include <vector>

namespace tandem::kernels::cpu {
namespace {

inline float dot(const float* a, const float* b, int32_t n) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int32_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

inline void axpy(float a, const float* x, float* y, int32_t n) {
#pragma omp simd
  for (int32_t i = 0; i < n; ++i) y[i] += a * x[i];
}

// A per-thread, 64-byte aligned buffer of at least `bytes` (contents not kept across growth).
float* thread_buffer(size_t bytes) {
  struct holder {
    void* p = nullptr;
    size_t cap = 0;
    ~holder() { std::free(p); }
  };
  thread_local holder h;
  if (h.cap < bytes) {
    std::free(h.p);
    h.cap = (std::max(bytes, size_t(4096)) + 63) & ~size_t(63);
    h.p = std::aligned_alloc(64, h.cap);
    if (!h.p) {
      h.cap = 0;
      throw std::bad_alloc();
    }
  }
  return static_cast<float*>(h.p);
}

bool have_avx512() { return detail::cpu_has(detail::isa::avx512); }

constexpr int32_t kMaxTileRows = 48;  // query rows (tokens x heads) per tile
constexpr int32_t kMaxFastHeadDim = 256;

}  // namespace

void attention_paged(const float* q, int32_t n_q, const float* const* k_blocks, const float* const* v_blocks,
                     int32_t block_size, int32_t n_tokens, int32_t head_dim, float scale, float* scores, float* out,
                     int32_t first) {
  // scores[h][t - first] = q_h · k_t * scale, for the keys t in [first, n_tokens)
  const int32_t n = n_tokens - first;
  for (int32_t t = first; t < n_tokens; ++t) {
    const float* k = k_blocks[t / block_size] + int64_t(t % block_size) * head_dim;
    for (int32_t h = 0; h < n_q; ++h)
      scores[int64_t(h) * n + t - first] = dot(q + int64_t(h) * head_dim, k, head_dim) * scale;
  }
  for (int32_t h = 0; h < n_q; ++h) {
    float* s = scores + int64_t(h) * n;
    const float mx = *std::max_element(s, s + n);
    float sum = 0.0f;
    for (int32_t t = 0; t < n; ++t) {
      s[t] = std::exp(s[t] - mx);
      sum += s[t];
    }
    const float inv = 1.0f / sum;
    for (int32_t t = 0; t < n; ++t) s[t] *= inv;
  }
  std::memset(out, 0, sizeof(float) * size_t(n_q) * size_t(head_dim));
  for (int32_t t = first; t < n_tokens; ++t) {
    const float* v = v_blocks[t / block_size] + int64_t(t % block_size) * head_dim;
    for (int32_t h = 0; h < n_q; ++h)
      axpy(scores[int64_t(h) * n + t - first], v, out + int64_t(h) * head_dim, head_dim);
  }
}

void attention_causal_reference(const float* q, int64_t q_stride, int32_t n_tok, int32_t n_rep, int32_t pos0,
                                const float* const* k_blocks, const float* const* v_blocks, int32_t block_size,
                                int32_t head_dim, float scale, float* out, int64_t out_stride, int32_t window) {
  if (n_tok <= 0) return;
  float* scores = thread_buffer(sizeof(float) * size_t(n_rep) * size_t(pos0 + n_tok));
  for (int32_t i = 0; i < n_tok; ++i) {
    const int32_t p = pos0 + i;
    attention_paged(q + i * q_stride, n_rep, k_blocks, v_blocks, block_size, p + 1, head_dim, scale, scores,
                    out + i * out_stride, window > 0 ? std::max(0, p - window + 1) : 0);
  }
}

namespace {
int64_t dim_major_elem_bytes(dtype t) {
  if (t == dtype::f32) return 4;
  if (t == dtype::f16 || t == dtype::bf16) return 2;
  throw std::invalid_argument("attention: a dim-major K needs f32, f16 or bf16 elements");
}

// A head_dim-row scratch for the scatter and gather of dim-major rows (typed: 4 bytes an
// element at most).
uint8_t* row_scratch(int32_t head_dim) {
  thread_local std::vector<uint8_t> buf;
  if (buf.size() < size_t(head_dim) * 4) buf.resize(size_t(head_dim) * 4);
  return buf.data();
}
}  // namespace

void store_k_row(dtype t, k_order o, const float* k, void* block, int32_t slot, int32_t block_size, int32_t head_dim) {
  auto* base = static_cast<uint8_t*>(block);
  if (o == k_order::position_major) {
    quantize_row(t, k, base + int64_t(slot) * row_bytes(t, head_dim), head_dim);
    return;
  }
  const int64_t es = dim_major_elem_bytes(t);
  uint8_t* row = row_scratch(head_dim);
  quantize_row(t, k, row, head_dim);  // elementwise rounding: the same values a row store keeps
  for (int32_t d = 0; d < head_dim; ++d)
    std::memcpy(base + (int64_t(d) * block_size + slot) * es, row + d * es, size_t(es));
}

void store_k_row_roped(dtype t, k_order o, rope_style style, const float* k, const float* cs, void* block, int32_t slot,
                       int32_t block_size, int32_t head_dim) {
  thread_local std::vector<float> buf;
  if (buf.size() < size_t(head_dim)) buf.resize(size_t(head_dim));
  std::copy(k, k + head_dim, buf.data());
  switch (style) {
    case rope_style::normal: rope_apply(buf.data(), cs, 1, 1, head_dim); break;
    case rope_style::neox: rope_apply_neox(buf.data(), cs, 1, 1, head_dim); break;
  }
  store_k_row(t, o, buf.data(), block, slot, block_size, head_dim);
}

void load_k_row(dtype t, k_order o, const void* block, int32_t slot, int32_t block_size, int32_t head_dim, float* k) {
  const auto* base = static_cast<const uint8_t*>(block);
  if (o == k_order::position_major) {
    dequantize_row(t, base + int64_t(slot) * row_bytes(t, head_dim), k, head_dim);
    return;
  }
  const int64_t es = dim_major_elem_bytes(t);
  uint8_t* row = row_scratch(head_dim);
  for (int32_t d = 0; d < head_dim; ++d)
    std::memcpy(row + d * es, base + (int64_t(d) * block_size + slot) * es, size_t(es));
  dequantize_row(t, row, k, head_dim);
}

void attention_causal_reference(const float* q, int64_t q_stride, int32_t n_tok, int32_t n_rep, int32_t pos0,
                                const void* const* k_blocks, const void* const* v_blocks, dtype kv_type, k_order ko,
                                int32_t block_size, int32_t head_dim, float scale, float* out, int64_t out_stride,
                                int32_t window) {
  if (n_tok <= 0) return;
  // Every block widened to f32 rows ([block_size][head_dim]), then the f32 reference.
  const int32_t nb = (pos0 + n_tok + block_size - 1) / block_size;
  const int64_t be = int64_t(block_size) * head_dim;
  std::vector<float> buf(size_t(2 * nb * be));
  std::vector<const float*> kf(static_cast<size_t>(nb)), vf(static_cast<size_t>(nb));
  for (int32_t b = 0; b < nb; ++b) {
    float* kb = buf.data() + b * be;
    float* vb = buf.data() + (nb + b) * be;
    for (int32_t slot = 0; slot < block_size; ++slot)
      load_k_row(kv_type, ko, k_blocks[b], slot, block_size, head_dim, kb + int64_t(slot) * head_dim);
    dequantize_row(kv_type, v_blocks[b], vb, be);
    kf[size_t(b)] = kb;
    vf[size_t(b)] = vb;
  }
  attention_causal_reference(q, q_stride, n_tok, n_rep, pos0, kf.data(), vf.data(), block_size, head_dim, scale, out,
                             out_stride, window);
}

int32_t attention_tile_tokens(int32_t n_rep) { return std::max<int32_t>(1, kMaxTileRows / std::max(1, n_rep)); }

// ------------------------------------------------------------------ AVX-512 tiled kernel
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")
namespace {

constexpr int32_t KC = 64;  // keys per chunk: 4 zmm of scores per query row

// 16 K/V elements of type T from element e (a multiple of 16) of a row, as f32 (f16 and bf16
// widen exactly; q8_0: q * d of e's 32-block).
template <dtype T>
constexpr int64_t kElemBytes = T == dtype::f32 ? 4 : 2;  // f32, f16, bf16

template <dtype T>
inline __m512 load16(const void* row, int64_t e) {
  if constexpr (T == dtype::f32) {
    return _mm512_loadu_ps(static_cast<const float*>(row) + e);
  } else if constexpr (T == dtype::q8_0) {
    const auto* b = static_cast<const block_q8_0*>(row) + e / 32;
    const __m512 q =
        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b->qs + e % 32))));
    return _mm512_mul_ps(q, _mm512_set1_ps(_cvtsh_ss(b->d)));
  } else {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(row) + e));
    if constexpr (T == dtype::f16) return _mm512_cvtph_ps(h);
    else return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

inline __mmask16 lanes_below(int32_t n) {
  return n >= 16 ? __mmask16(0xffff) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1);
}

// 2^t for t <= 0 (clamped at -126): 2^round(t) * p(t - round(t)), p a degree-7 Taylor
// polynomial of 2^f on [-1/2, 1/2] (relative error < 2e-7).
inline __m512 exp2_ps(__m512 t) {
  t = _mm512_max_ps(t, _mm512_set1_ps(-126.0f));
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, n);
  __m512 p = _mm512_set1_ps(1.5252733804059840e-5f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.5403530393381609e-4f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3333558146428443e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291076284772e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504108664821580e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022650695910071e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718055994531e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

// dst[c * ld + r] = src[r][e + c] for 16 rows of 16 elements of type T, as f32 (an
// in-register transpose).
template <dtype T>
inline void transpose16x16(const void* const* src, int64_t e, float* dst, int64_t ld) {
  __m512 r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = load16<T>(src[i], e);
  // t[2k], t[2k+1]: rows 2k, 2k+1 interleaved (columns 4L, 4L+1 and 4L+2, 4L+3 of each lane L)
  for (int k = 0; k < 8; ++k) {
    t[2 * k] = _mm512_unpacklo_ps(r[2 * k], r[2 * k + 1]);
    t[2 * k + 1] = _mm512_unpackhi_ps(r[2 * k], r[2 * k + 1]);
  }
  // r[4k + c], lane L: column 4L + c of rows 4k .. 4k+3
  for (int k = 0; k < 4; ++k) {
    const __m512d lo0 = _mm512_castps_pd(t[4 * k]), lo1 = _mm512_castps_pd(t[4 * k + 2]);
    const __m512d hi0 = _mm512_castps_pd(t[4 * k + 1]), hi1 = _mm512_castps_pd(t[4 * k + 3]);
    r[4 * k + 0] = _mm512_castpd_ps(_mm512_unpacklo_pd(lo0, lo1));
    r[4 * k + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(lo0, lo1));
    r[4 * k + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(hi0, hi1));
    r[4 * k + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(hi0, hi1));
  }
  // Column 4L + c = lanes L of r[c], r[4 + c], r[8 + c], r[12 + c].
  for (int c = 0; c < 4; ++c) {
    const __m512 a0 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x88);
    const __m512 a1 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xdd);
    const __m512 b0 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x88);
    const __m512 b1 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xdd);
    _mm512_storeu_ps(dst + (0 + c) * ld, _mm512_shuffle_f32x4(a0, b0, 0x88));
    _mm512_storeu_ps(dst + (8 + c) * ld, _mm512_shuffle_f32x4(a0, b0, 0xdd));
    _mm512_storeu_ps(dst + (4 + c) * ld, _mm512_shuffle_f32x4(a1, b1, 0x88));
    _mm512_storeu_ps(dst + (12 + c) * ld, _mm512_shuffle_f32x4(a1, b1, 0xdd));
  }
}

// s[RR][KC] = qs[RR][D] . K[D][KC] for dim-major K: the 16 keys of group g are elements
// kg[g] + d * ld for each d (16 consecutive positions of one block), read in place.
template <dtype T, int RR>
inline void qk_block_dim_major(const float* qs, int32_t D, const void* const* kg, int64_t ld, float* s) {
  __m512 acc[RR][4];
  for (int i = 0; i < RR; ++i)
    for (int v = 0; v < 4; ++v) acc[i][v] = _mm512_setzero_ps();
  for (int32_t d = 0; d < D; ++d) {
    const int64_t e = int64_t(d) * ld;
    const __m512 k0 = load16<T>(kg[0], e), k1 = load16<T>(kg[1], e), k2 = load16<T>(kg[2], e), k3 = load16<T>(kg[3], e);
    for (int i = 0; i < RR; ++i) {
      const __m512 b = _mm512_set1_ps(qs[int64_t(i) * D + d]);
      acc[i][0] = _mm512_fmadd_ps(b, k0, acc[i][0]);
      acc[i][1] = _mm512_fmadd_ps(b, k1, acc[i][1]);
      acc[i][2] = _mm512_fmadd_ps(b, k2, acc[i][2]);
      acc[i][3] = _mm512_fmadd_ps(b, k3, acc[i][3]);
    }
  }
  for (int i = 0; i < RR; ++i)
    for (int v = 0; v < 4; ++v) _mm512_store_ps(s + i * KC + 16 * v, acc[i][v]);
}

// s[RR][KC] = qs[RR][D] · kt[D][KC] (K transposed into a scratch tile of f32).
template <int RR>
inline void qk_block(const float* qs, int32_t D, const float* kt, float* s) {
  const void* kg[4] = {kt, kt + 16, kt + 32, kt + 48};
  qk_block_dim_major<dtype::f32, RR>(qs, D, kg, KC, s);
}

// One element e of a row of type T (f32, f16, bf16) as f32.
template <dtype T>
inline float load1(const void* row, int64_t e) {
  if constexpr (T == dtype::f32) {
    return static_cast<const float*>(row)[e];
  } else {
    const uint16_t h = static_cast<const uint16_t*>(row)[e];
    if constexpr (T == dtype::f16) return _cvtsh_ss(h);
    else return std::bit_cast<float>(uint32_t(h) << 16);
  }
}

// o[RR][col0 .. col0 + 16 CV) = alpha[i] * o + p[RR][0..n) · V rows vp[0..n) (of type T)
template <dtype T, int RR, int CV>
inline void pv_block(const float* p, int32_t n, const void* const* vp, int32_t col0, const float* alpha, float* o,
                     int32_t D) {
  __m512 acc[RR][CV];
  for (int i = 0; i < RR; ++i) {
    const __m512 a = _mm512_set1_ps(alpha[i]);
    for (int v = 0; v < CV; ++v) acc[i][v] = _mm512_mul_ps(a, _mm512_load_ps(o + int64_t(i) * D + col0 + 16 * v));
  }
  for (int32_t j = 0; j < n; ++j) {
    __m512 vv[CV];
    for (int v = 0; v < CV; ++v) vv[v] = load16<T>(vp[j], col0 + 16 * v);
    for (int i = 0; i < RR; ++i) {
      const __m512 b = _mm512_set1_ps(p[i * KC + j]);
      for (int v = 0; v < CV; ++v) acc[i][v] = _mm512_fmadd_ps(b, vv[v], acc[i][v]);
    }
  }
  for (int i = 0; i < RR; ++i)
    for (int v = 0; v < CV; ++v) _mm512_store_ps(o + int64_t(i) * D + col0 + 16 * v, acc[i][v]);
}

template <dtype T, int RR>
inline void pv_rows(const float* p, int32_t n, const void* const* vp, const float* alpha, float* o, int32_t D) {
  for (int32_t col = 0; col < D; col += 64) {
    switch (std::min<int32_t>(4, (D - col) / 16)) {
      case 1: pv_block<T, RR, 1>(p, n, vp, col, alpha, o, D); break;
      case 2: pv_block<T, RR, 2>(p, n, vp, col, alpha, o, D); break;
      case 3: pv_block<T, RR, 3>(p, n, vp, col, alpha, o, D); break;
      default: pv_block<T, RR, 4>(p, n, vp, col, alpha, o, D); break;
    }
  }
}

template <class F>
inline void with_rows(int32_t rr, F&& f) {
  switch (rr) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 3: f(std::integral_constant<int, 3>{}); break;
    case 4: f(std::integral_constant<int, 4>{}); break;
    case 5: f(std::integral_constant<int, 5>{}); break;
    default: f(std::integral_constant<int, 6>{}); break;
  }
}

constexpr int32_t MR = 6;  // query rows per microkernel call

// One tile: R = n_tok * n_rep query rows (row r: token r / n_rep, head r % n_rep); K/V of
// type T, K in order KO.
template <dtype T, k_order KO>
void causal_tile_avx512(const float* q, int64_t q_stride, int32_t n_tok, int32_t n_rep, int32_t pos0,
                        const void* const* k_blocks, const void* const* v_blocks, int32_t bs, int32_t D, float scale,
                        float* out, int64_t out_stride, int32_t window) {
  const int32_t R = n_tok * n_rep;
  // Scratch: qs [R][D], o [R][D], p [R][KC], kt [D][KC], then per-row m, l, alpha.
  const size_t floats = size_t(R) * D * 2 + size_t(R) * KC + size_t(D) * KC + size_t(R) * 3;
  float* qs = thread_buffer(floats * sizeof(float));
  float* o = qs + int64_t(R) * D;
  float* p = o + int64_t(R) * D;
  float* kt = p + int64_t(R) * KC;
  float* m = kt + int64_t(D) * KC;
  float* l = m + R;
  float* alpha = l + R;
  alignas(64) static const float zero_row[kMaxFastHeadDim] = {};

  // Scores come out in log2 units: exp(x * scale) = 2^(x * scale * log2 e).
  const __m512 qscale = _mm512_set1_ps(scale * 1.4426950408889634f);
  for (int32_t r = 0; r < R; ++r) {
    const float* src = q + (r / n_rep) * q_stride + int64_t(r % n_rep) * D;
    for (int32_t c = 0; c < D; c += 16) {
      _mm512_store_ps(qs + int64_t(r) * D + c, _mm512_mul_ps(qscale, _mm512_loadu_ps(src + c)));
      _mm512_store_ps(o + int64_t(r) * D + c, _mm512_setzero_ps());
    }
    m[r] = -std::numeric_limits<float>::infinity();
    l[r] = 0.0f;
  }

  const int32_t n_keys = pos0 + n_tok;  // the last token sees positions [0, n_keys)
  // With a sliding window, row r's token (position p) sees [p - window + 1, p]: chunks wholly
  // before the first token's window are skipped.
  const int32_t first_key = window > 0 ? std::max(0, pos0 - window + 1) : 0;
  const int64_t rbytes = kernels::row_bytes(T, D);
  const uint8_t* kp[KC];
  const void* vp[KC];
  for (int32_t c0 = first_key / KC * KC; c0 < n_keys; c0 += KC) {
    const int32_t n = std::min(KC, n_keys - c0);
    for (int32_t j = 0; j < n; ++j) {
      const int32_t pos = c0 + j;
      vp[j] = static_cast<const uint8_t*>(v_blocks[pos / bs]) + int64_t(pos % bs) * rbytes;
    }
    // Lanes at or past n hold whatever the buffers hold (a block's unwritten slots, another
    // row's keys): the softmax masks them and P.V stops at n.
    if constexpr (KO == k_order::dim_major) {
      if (bs % 16 == 0) {  // each 16-key group lies in one block: read it in place
        const void* kg[4];
        for (int g = 0; g < 4; ++g) {
          const int32_t pos = std::min(c0 + 16 * g, c0 + (n - 1) / 16 * 16);  // past n: an earlier group
          kg[g] = static_cast<const uint8_t*>(k_blocks[pos / bs]) + int64_t(pos % bs) * kElemBytes<T>;
        }
        for (int32_t r0 = 0; r0 < R; r0 += MR)
          with_rows(std::min(MR, R - r0), [&](auto rr) {
            qk_block_dim_major<T, decltype(rr)::value>(qs + int64_t(r0) * D, D, kg, bs, p + int64_t(r0) * KC);
          });
      } else {  // groups straddle blocks: gather kt[d][j] = K[c0 + j][d]
        for (int32_t j = 0; j < KC; ++j) {
          const int32_t pos = c0 + std::min(j, n - 1);
          const void* blk = k_blocks[pos / bs];
          for (int32_t d = 0; d < D; ++d) kt[int64_t(d) * KC + j] = load1<T>(blk, int64_t(d) * bs + pos % bs);
        }
        for (int32_t r0 = 0; r0 < R; r0 += MR)
          with_rows(std::min(MR, R - r0),
                    [&](auto rr) { qk_block<decltype(rr)::value>(qs + int64_t(r0) * D, D, kt, p + int64_t(r0) * KC); });
      }
    } else {
      for (int32_t j = 0; j < KC; ++j) {
        const int32_t pos = c0 + j;
        kp[j] = j < n ? static_cast<const uint8_t*>(k_blocks[pos / bs]) + int64_t(pos % bs) * rbytes
                      : reinterpret_cast<const uint8_t*>(zero_row);  // zero bits: 0 in every type
      }
      // kt[d][j] = K[c0 + j][d]
      for (int32_t jg = 0; jg < KC; jg += 16)
        for (int32_t dg = 0; dg < D; dg += 16) {
          const void* rows[16];
          for (int i = 0; i < 16; ++i) rows[i] = kp[jg + i];  // zero_row: kMaxFastHeadDim zero floats' bytes
          transpose16x16<T>(rows, dg, kt + int64_t(dg) * KC + jg, KC);
        }
      for (int32_t r0 = 0; r0 < R; r0 += MR)
        with_rows(std::min(MR, R - r0),
                  [&](auto rr) { qk_block<decltype(rr)::value>(qs + int64_t(r0) * D, D, kt, p + int64_t(r0) * KC); });
    }
    // Online softmax: rescale each row's running sum and output by 2^(m_old - m_new).
    for (int32_t r = 0; r < R; ++r) {
      float* pr = p + int64_t(r) * KC;
      const int32_t p_row = pos0 + r / n_rep;
      const int32_t valid = std::min(n, p_row - c0 + 1);  // keys this row sees: lanes [low, valid)
      const int32_t low = window > 0 ? std::max(0, p_row - window + 1 - c0) : 0;
      if (valid <= low) {  // the whole chunk is in this row's future (or behind its window)
        alpha[r] = 1.0f;
        for (int v = 0; v < 4; ++v) _mm512_store_ps(pr + 16 * v, _mm512_setzero_ps());
        continue;
      }
      __m512 s[4];
      __mmask16 mk[4];
      __m512 mx = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
      for (int v = 0; v < 4; ++v) {
        mk[v] = __mmask16(lanes_below(valid - 16 * v) & ~lanes_below(low - 16 * v));
        s[v] = _mm512_load_ps(pr + 16 * v);
        mx = _mm512_mask_max_ps(mx, mk[v], mx, s[v]);
      }
      const float m_new = std::max(m[r], _mm512_reduce_max_ps(mx));
      alpha[r] = std::exp2(m[r] - m_new);  // 0 on the first chunk (m = -inf)
      const __m512 mv = _mm512_set1_ps(m_new);
      __m512 sum = _mm512_setzero_ps();
      for (int v = 0; v < 4; ++v) {
        const __m512 e = _mm512_maskz_mov_ps(mk[v], exp2_ps(_mm512_sub_ps(s[v], mv)));
        _mm512_store_ps(pr + 16 * v, e);
        sum = _mm512_add_ps(sum, e);
      }
      l[r] = l[r] * alpha[r] + _mm512_reduce_add_ps(sum);
      m[r] = m_new;
    }
    for (int32_t r0 = 0; r0 < R; r0 += MR)
      with_rows(std::min(MR, R - r0), [&](auto rr) {
        pv_rows<T, decltype(rr)::value>(p + int64_t(r0) * KC, n, vp, alpha + r0, o + int64_t(r0) * D, D);
      });
  }
  for (int32_t r = 0; r < R; ++r) {
    const __m512 inv = _mm512_set1_ps(1.0f / l[r]);
    float* dst = out + (r / n_rep) * out_stride + int64_t(r % n_rep) * D;
    for (int32_t c = 0; c < D; c += 16)
      _mm512_storeu_ps(dst + c, _mm512_mul_ps(inv, _mm512_load_ps(o + int64_t(r) * D + c)));
  }
}

}  // namespace
#pragma GCC pop_options

void attention_causal(const float* q, int64_t q_stride, int32_t n_tok, int32_t n_rep, int32_t pos0,
                      const void* const* k_blocks, const void* const* v_blocks, dtype kv_type, k_order ko,
                      int32_t block_size, int32_t head_dim, float scale, float* out, int64_t out_stride,
                      int32_t window) {
  if (n_tok <= 0 || n_rep <= 0) return;
  if (kv_type != dtype::f32 && kv_type != dtype::f16 && kv_type != dtype::bf16 && kv_type != dtype::q8_0)
    throw std::invalid_argument("attention: K/V must be f32, f16, bf16 or q8_0");
  if (head_dim % block_elems(kv_type) != 0) throw std::invalid_argument("attention: q8_0 K/V need head_dim % 32 == 0");
  if (ko == k_order::dim_major && kv_type == dtype::q8_0)
    throw std::invalid_argument("attention: a q8_0 K is kept position-major");
  if (!have_avx512() || head_dim % 16 != 0 || head_dim <= 0 || head_dim > kMaxFastHeadDim) {
    attention_causal_reference(q, q_stride, n_tok, n_rep, pos0, k_blocks, v_blocks, kv_type, ko, block_size, head_dim,
                               scale, out, out_stride, window);
    return;
  }
  using tile_kernel = void (*)(const float*, int64_t, int32_t, int32_t, int32_t, const void* const*, const void* const*,
                               int32_t, int32_t, float, float*, int64_t, int32_t);
  tile_kernel tile_fn = nullptr;
  const bool dm = ko == k_order::dim_major;
  switch (kv_type) {
    case dtype::f32:
      tile_fn = dm ? &causal_tile_avx512<dtype::f32, k_order::dim_major>
                   : &causal_tile_avx512<dtype::f32, k_order::position_major>;
      break;
    case dtype::f16:
      tile_fn = dm ? &causal_tile_avx512<dtype::f16, k_order::dim_major>
                   : &causal_tile_avx512<dtype::f16, k_order::position_major>;
      break;
    case dtype::bf16:
      tile_fn = dm ? &causal_tile_avx512<dtype::bf16, k_order::dim_major>
                   : &causal_tile_avx512<dtype::bf16, k_order::position_major>;
      break;
    default: tile_fn = &causal_tile_avx512<dtype::q8_0, k_order::position_major>; break;  // checked above
  }
  const int32_t tile = attention_tile_tokens(n_rep);
  for (int32_t i = 0; i < n_tok; i += tile)
    tile_fn(q + i * q_stride, q_stride, std::min(tile, n_tok - i), n_rep, pos0 + i, k_blocks, v_blocks, block_size,
            head_dim, scale, out + i * out_stride, out_stride, window);
}

void attention_causal(const float* q, int64_t q_stride, int32_t n_tok, int32_t n_rep, int32_t pos0,
                      const float* const* k_blocks, const float* const* v_blocks, int32_t block_size, int32_t head_dim,
                      float scale, float* out, int64_t out_stride, int32_t window) {
  attention_causal(q, q_stride, n_tok, n_rep, pos0, reinterpret_cast<const void* const*>(k_blocks),
                   reinterpret_cast<const void* const*>(v_blocks), dtype::f32, k_order::position_major, block_size,
                   head_dim, scale, out, out_stride, window);
}

}  // namespace tandem::kernels::cpu
