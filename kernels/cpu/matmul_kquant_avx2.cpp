// Integer matmul for Q4_0 and the k-quants (Q4_K, Q5_K, Q6_K) with AVX2, for CPUs without
// AVX-512 VNNI (which have their panel kernels, matmul_panels.cpp).
//
// x is quantized once per call as llama.cpp does for the weight type (Q8_0 for Q4_0, Q8_K for
// the k-quants: int8, a scale per 32 or per 256) with its sums per 32 (the k-quant mins) and per
// 16 (Q6_K's offset). Each weight row is read once in the file's own bytes for up to 4 tokens:
// the nibbles (and high bits) are unpacked in registers into u8 values, `maddubs` multiplies
// them by x's s8 values in pairs (no overflow: |q| <= 63, |x| <= 127), `madd` applies the
// integer sub-block scales, and a super-block's sum stays exact in int32:
//   Q4_K / Q5_K:  isum = Σ sc_j Σ q·x,  msum = Σ m_j Σ x    y = fma(isum, d·dx) - msum·dmin·dx
//   Q6_K:         isum = Σ sc_j Σ q·x - 32 Σ sc_j Σ x      y = fma(isum, d·dx)
// one scalar FMA chain per (row, token) over super-blocks in k order. Q4_0 (32-blocks): q - 8
// signed, the sign trick for `maddubs`, one 8-lane FMA chain per (row, token) over blocks.
// Nothing depends on m, on which tokens share a row, or on how rows are split over threads:
// batch-invariant. A prefill runs rows in tiles of 256 KiB (from L2 for all of its token
// groups); decode streams each row once.

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/simd.h"
#include "kernels/cpu/avx2_util.h"
#include "kernels/cpu/matmul_impl.h"

namespace tandem::kernels::cpu::detail {
namespace {

// x as the kernels read it: token t's q at q + t k, its scales (one per 32-block; Q8_K's per-256
// scale repeated) at d + t k/32, its sums per 32 at s32 + t k/32 and per 16 at s16 + t k/16.
struct x_rows {
  const int8_t* q;
  const float* d;
  const int16_t* s32;  // |Σ| <= 32 * 127: int16, as madd takes them
  const int16_t* s16;
  int64_t k;
};

inline int32_t hsum_i32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

inline __m256i load(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
inline __m256i low4(__m256i v) { return _mm256_and_si256(v, _mm256_set1_epi8(0x0F)); }
inline __m256i high4(__m256i v) { return _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0F)); }
// Bit b of each byte of v, moved to bit `to` (b, to < 8; 16-bit shifts keep bytes apart after the mask).
inline __m256i bit_to(__m256i v, int b, int to) {
  const __m256i one = _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(b)), _mm256_set1_epi8(1));
  return _mm256_sll_epi16(one, _mm_cvtsi32_si128(to));
}
// Bits b, b+1 of each byte of v at bits 4-5.
inline __m256i two_bits_to_4(__m256i v, int b) {
  return _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(b)), _mm256_set1_epi8(3)), 4);
}

// Q4_K/Q5_K sub-block scales and mins, 6 bits each, unpacked 32 bits at a time (k4_scale_min's
// layout: sub-blocks 0-3 in the low 6 bits of bytes 0-3 / 4-7, 4-7 in the nibbles of bytes
// 8-11 and the top two bits of bytes 0-3 / 4-7).
inline void k4_scales(const uint8_t* scales, uint8_t* sc, uint8_t* mn) {
  uint32_t w[3];
  std::memcpy(w, scales, sizeof w);
  const uint32_t six = 0x3f3f3f3fu, four = 0x0f0f0f0fu, two = 0x03030303u;
  const uint32_t sc_w[2] = {w[0] & six, (w[2] & four) | (((w[0] >> 6) & two) << 4)};
  const uint32_t m_w[2] = {w[1] & six, ((w[2] >> 4) & four) | (((w[1] >> 6) & two) << 4)};
  std::memcpy(sc, sc_w, 8);
  std::memcpy(mn, m_w, 8);
}

// Per (row, token) accumulators of the k-quant rows: 8 float lanes for the scaled sums, 4 for
// the min terms (Q4_K, Q5_K), each lane one FMA chain over super-blocks in k order.
template <int T>
struct k_acc {
  __m256 main[T];
  __m128 mins[T];
  k_acc() {
    for (int t = 0; t < T; ++t) {
      main[t] = _mm256_setzero_ps();
      mins[t] = _mm_setzero_ps();
    }
  }
  float result(int t) const {
    __m128 m = _mm_add_ps(mins[t], _mm_movehl_ps(mins[t], mins[t]));
    m = _mm_add_ss(m, _mm_movehdup_ps(m));
    return hsum(main[t]) - _mm_cvtss_f32(m);
  }
};

// Super-block s of a Q4_K (qh null) or Q5_K row against T tokens from t0.
template <int T>
inline void k4_super(uint16_t dh, uint16_t dminh, const uint8_t* scales, const uint8_t* qs, const uint8_t* qh,
                     int64_t s, const x_rows& x, int64_t t0, k_acc<T>& acc) {
  uint8_t sc[8], mn[8];
  k4_scales(scales, sc, mn);
  __m256i isum[T];
  for (int t = 0; t < T; ++t) isum[t] = _mm256_setzero_si256();
  const __m256i high = qh ? load(qh) : _mm256_setzero_si256();
  for (int j = 0; j < 4; ++j) {  // elements 64j..64j+31: low nibbles (sub-block 2j), +32..: high (2j+1)
    const __m256i raw = load(qs + 32 * j);
    __m256i lo = low4(raw), hi = high4(raw);
    if (qh) {
      lo = _mm256_or_si256(lo, bit_to(high, 2 * j, 4));
      hi = _mm256_or_si256(hi, bit_to(high, 2 * j + 1, 4));
    }
    const __m256i slo = _mm256_set1_epi16(sc[2 * j]), shi = _mm256_set1_epi16(sc[2 * j + 1]);
    for (int t = 0; t < T; ++t) {
      const int8_t* xq = x.q + (t0 + t) * x.k + s * qk_k + 64 * j;
      const __m256i a = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, load(xq)), slo);
      const __m256i b = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, load(xq + 32)), shi);
      isum[t] = _mm256_add_epi32(isum[t], _mm256_add_epi32(a, b));
    }
  }
  const float d = f16_to_f32(dh), dmin = f16_to_f32(dminh);
  uint64_t m8;
  std::memcpy(&m8, mn, 8);
  const __m128i m16 = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(int64_t(m8)));
  for (int t = 0; t < T; ++t) {
    const int64_t xb = (t0 + t) * (x.k / 32) + s * 8;
    const __m128 dx = _mm_set1_ps(x.d[xb]);
    acc.main[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), _mm256_set1_ps(d * x.d[xb]), acc.main[t]);
    // Σ m_j Σ x over sub-block j, in 4 lanes of pairs (exact).
    const __m128i ms = _mm_madd_epi16(m16, _mm_loadu_si128(reinterpret_cast<const __m128i*>(x.s32 + xb)));
    acc.mins[t] = _mm_fmadd_ps(_mm_cvtepi32_ps(ms), _mm_mul_ps(_mm_set1_ps(dmin), dx), acc.mins[t]);
  }
}

template <int T>
inline void q6k_super(const block_q6_k& b, int64_t s, const x_rows& x, int64_t t0, k_acc<T>& acc) {
  __m256i isum[T];
  for (int t = 0; t < T; ++t) isum[t] = _mm256_setzero_si256();
  for (int h = 0; h < 2; ++h) {  // elements 128h + 32g + l, g = 0..3: q in 0..63
    const __m256i l0 = load(b.ql + 64 * h), l1 = load(b.ql + 64 * h + 32), hb = load(b.qh + 32 * h);
    const __m256i q[4] = {
        _mm256_or_si256(low4(l0), two_bits_to_4(hb, 0)), _mm256_or_si256(low4(l1), two_bits_to_4(hb, 2)),
        _mm256_or_si256(high4(l0), two_bits_to_4(hb, 4)), _mm256_or_si256(high4(l1), two_bits_to_4(hb, 6))};
    for (int g = 0; g < 4; ++g) {
      // 16-element sub-blocks 8h + 2g (elements l < 16: madd lanes 0-3) and 8h + 2g + 1 (lanes 4-7).
      const int j = 8 * h + 2 * g;
      const __m256i scv = _mm256_set_m128i(_mm_set1_epi16(b.scales[j + 1]), _mm_set1_epi16(b.scales[j]));
      for (int t = 0; t < T; ++t) {
        const int8_t* xq = x.q + (t0 + t) * x.k + s * qk_k + 128 * h + 32 * g;
        isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(_mm256_maddubs_epi16(q[g], load(xq)), scv));
      }
    }
  }
  // The q - 32 offset: 32 Σ sc_j Σ x over sub-block j, in 8 lanes of pairs (exact).
  const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales)));
  const float d = f16_to_f32(b.d);
  for (int t = 0; t < T; ++t) {
    const __m256i off = _mm256_madd_epi16(sc16, load(x.s16 + (t0 + t) * (x.k / 16) + s * 16));
    const __m256i exact = _mm256_sub_epi32(isum[t], _mm256_slli_epi32(off, 5));
    acc.main[t] =
        _mm256_fmadd_ps(_mm256_cvtepi32_ps(exact), _mm256_set1_ps(d * x.d[(t0 + t) * (x.k / 32) + s * 8]), acc.main[t]);
  }
}

// One Q4_0 row against T tokens: two 8-lane chains (blocks even / odd), in block order.
template <int T>
inline void q40_row(const block_q4_0* b, int64_t nb, const x_rows& x, int64_t t0, float* out, int64_t ldo) {
  __m256 acc[T][2];
  for (int t = 0; t < T; ++t) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t i = 0; i < nb; ++i) {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b[i].qs));
    // Elements 0..15: low nibbles, 16..31: high; q - 8 signed; |q| * (x with q's sign) = q * x.
    const __m256i q = _mm256_sub_epi8(low4(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw)), _mm256_set1_epi8(8));
    const __m256i aq = _mm256_sign_epi8(q, q);
    const float dw = f16_to_f32(b[i].d);
    for (int t = 0; t < T; ++t) {
      const __m256i xv = load(x.q + (t0 + t) * x.k + 32 * i);
      const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(aq, _mm256_sign_epi8(xv, q)), ones);
      acc[t][i & 1] =
          _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(dw * x.d[(t0 + t) * (x.k / 32) + i]), acc[t][i & 1]);
    }
  }
  for (int t = 0; t < T; ++t) out[t * ldo] = hsum(_mm256_add_ps(acc[t][0], acc[t][1]));
}

// Row r of w against T tokens from t0: y[t0 + t][r].
template <int T>
void row_dot(const weight_view& w, int64_t r, const x_rows& x, int64_t t0, float* y) {
  const void* row = row_ptr(w, r);
  const int64_t nsb = w.cols / qk_k;
  k_acc<T> sum;
  switch (w.type) {
    case dtype::q4_0:
      return q40_row<T>(static_cast<const block_q4_0*>(row), w.cols / 32, x, t0, y + t0 * w.rows + r, w.rows);
    case dtype::q4_k: {
      auto b = static_cast<const block_q4_k*>(row);
      for (int64_t s = 0; s < nsb; ++s) k4_super<T>(b[s].d, b[s].dmin, b[s].scales, b[s].qs, nullptr, s, x, t0, sum);
      break;
    }
    case dtype::q5_k: {
      auto b = static_cast<const block_q5_k*>(row);
      for (int64_t s = 0; s < nsb; ++s) k4_super<T>(b[s].d, b[s].dmin, b[s].scales, b[s].qs, b[s].qh, s, x, t0, sum);
      break;
    }
    case dtype::q6_k: {
      auto b = static_cast<const block_q6_k*>(row);
      for (int64_t s = 0; s < nsb; ++s) q6k_super<T>(b[s], s, x, t0, sum);
      break;
    }
    default: return;  // callers pass only the four types above
  }
  for (int t = 0; t < T; ++t) y[(t0 + t) * w.rows + r] = sum.result(t);
}

constexpr int64_t tile_bytes = 256 << 10;  // weight rows kept in L2 across a prefill's token groups

}  // namespace

void matmul_kquant_avx2(const weight_view& w, const float* x, int64_t m, float* y, thread_pool& pool) {
  const int64_t k = w.cols, ng = k / 32;
  // x once per call (the calling thread's scratch; workers only read it).
  auto* buf =
      static_cast<uint8_t*>(thread_scratch(scratch_x, size_t(m * k) + size_t(m * ng) * 6 + size_t(m * k / 16) * 2));
  auto* xq = reinterpret_cast<int8_t*>(buf);
  auto* dx = reinterpret_cast<float*>(buf + m * k);
  auto* s32 = reinterpret_cast<int16_t*>(dx + m * ng);
  auto* s16 = s32 + m * ng;
  // Rows of x are independent: a prefill's are split over the pool (the same bytes either way).
  auto quantize_rows = [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      if (w.type == dtype::q4_0) {  // as llama.cpp: Q8_0 x for Q4_0, Q8_K for the k-quants
        quantize_x_q8_avx2(x + i * k, k, xq + i * k, dx + i * ng);
        round_scales_f16(dx + i * ng, ng);
      } else {
        quantize_x_q8k_avx2(x + i * k, k, xq + i * k, dx + i * ng);
      }
      for (int64_t h = 0; h < k / 16; ++h) {
        int s = 0;
        for (int e = 0; e < 16; ++e) s += xq[i * k + h * 16 + e];
        s16[i * (k / 16) + h] = int16_t(s);
      }
      for (int64_t g = 0; g < ng; ++g)
        s32[i * ng + g] = int16_t(s16[i * (k / 16) + 2 * g] + s16[i * (k / 16) + 2 * g + 1]);
    }
  };
  if (m * k < (int64_t(1) << 14) || pool.size() == 1) quantize_rows(0, m);
  else pool.parallel_for(m, 16, [&](int64_t i0, int64_t i1, int) { quantize_rows(i0, i1); });
  const x_rows xr{xq, dx, s32, s16, k};
  // Decode: rows in slices worth waking a thread for. Prefill: a slice per thread, in tiles of
  // rows that stay in L2 while every 4-token group of x (from L1) meets them.
  const int threads = pool.size();
  const int64_t grain = m <= 4 ? decode_grain(w, threads) : (w.rows + threads - 1) / threads;
  const int64_t tile = std::max<int64_t>(16, tile_bytes / row_bytes(w.type, k));
  pool.parallel_for(w.rows, grain, [&](int64_t r0, int64_t r1, int) {
    for (int64_t a = r0; a < r1; a += tile) {
      const int64_t b = std::min(r1, a + tile);
      for (int64_t t0 = 0; t0 < m; t0 += 4) {
        const int64_t t = std::min<int64_t>(4, m - t0);
        for (int64_t r = a; r < b; ++r) {
          switch (t) {
            case 1: row_dot<1>(w, r, xr, t0, y); break;
            case 2: row_dot<2>(w, r, xr, t0, y); break;
            case 3: row_dot<3>(w, r, xr, t0, y); break;
            default: row_dot<4>(w, r, xr, t0, y); break;
          }
        }
      }
    }
  });
}

}  // namespace tandem::kernels::cpu::detail
