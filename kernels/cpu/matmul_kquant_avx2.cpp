// Integer matmul for Q4_0 and the k-quants (Q4_K, Q5_K, Q6_K) with AVX2, for CPUs without
// AVX-512 VNNI (which have their panel kernels, matmul_panels.cpp).
//
// x is quantized once per call to int8 as llama.cpp does (Q8_0 for Q4_0, Q8_K for the
// k-quants; a scale per 32-block either way, repeated for Q8_K's per 256) and
// each weight row is unpacked once into signed int8 values with their integer sub-block scales
// (per 16 elements), a float factor and a float "min" term per 32:
//   value[e] = fd[g] * isc[e / 16] * q[e] - mn[g],  g = e / 32
// (Q4_0: fd = d, isc = 1, q - 8; Q4_K/Q5_K: fd = d, isc = 6-bit scale, mn = dmin * m;
// Q6_K: fd = d, isc = the int8 scale, q - 32), so that a row·x dot is, per group of 32,
//   dx[g] * fd[g] * Σ isc · q · xq  -  dx[g] * mn[g] * Σ xq
// with the integer sums exact (maddubs + madd) and one FMA chain per (row, token) in group
// order. Nothing depends on m or on how rows are split over threads: batch-invariant.
// The unpacking is SIMD too, and paid once per row and call: a decode step stays near the
// weights' bytes (about a fifth of f32's for Q4_K).
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/avx2_util.h"
#include "kernels/cpu/matmul_impl.h"

namespace tandem::kernels::cpu::detail {
namespace {

struct unpacked_row {
  int8_t* q;     // [k]
  int16_t* isc;  // [k / 16]
  float* fd;     // [k / 32]
  float* mn;     // [k / 32]
  __m256i* sv;   // [k / 32]: isc of the group's halves as madd's 16 lanes (filled by finish())
  bool has_min;  // Q4_K, Q5_K
};

// The per-group scale vectors, once per row rather than once per (row, token).
void finish(const unpacked_row& u, int64_t ng) {
  for (int64_t g = 0; g < ng; ++g)
    u.sv[g] = _mm256_set_m128i(_mm_set1_epi16(u.isc[2 * g + 1]), _mm_set1_epi16(u.isc[2 * g]));
}

inline __m256i nibbles_lo(__m256i v) { return _mm256_and_si256(v, _mm256_set1_epi8(0x0F)); }
inline __m256i nibbles_hi(__m256i v) { return _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0F)); }
// Bit b of each byte of v, moved to bit `to` (b, to < 8; 16-bit shifts keep bytes apart after the mask).
inline __m256i bit_to(__m256i v, int b, int to) {
  const __m256i one = _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(b)), _mm256_set1_epi8(1));
  return _mm256_sll_epi16(one, _mm_cvtsi32_si128(to));
}

void unpack_q4_0(const block_q4_0* b, int64_t nb, const unpacked_row& u) {
  for (int64_t i = 0; i < nb; ++i) {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b[i].qs));
    // Elements 0..15: low nibbles; 16..31: high nibbles.
    const __m256i v = _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(u.q + i * 32), _mm256_sub_epi8(nibbles_lo(v), _mm256_set1_epi8(8)));
    u.isc[2 * i] = u.isc[2 * i + 1] = 1;
    u.fd[i] = f16_to_f32(b[i].d);
    u.mn[i] = 0.0f;
  }
}

// Q4_K (qh null) and Q5_K: super-block s holds groups 8s .. 8s+7.
void unpack_k4(uint16_t dh, uint16_t dminh, const uint8_t* scales, const uint8_t* qs, const uint8_t* qh, int64_t s,
               const unpacked_row& u) {
  const float d = f16_to_f32(dh), dmin = f16_to_f32(dminh);
  const __m256i high = qh ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh)) : _mm256_setzero_si256();
  for (int j = 0; j < 4; ++j) {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * j));
    __m256i lo = nibbles_lo(raw), hi = nibbles_hi(raw);
    if (qh) {  // the fifth bit: bit 2j of qh[l] for the low group, 2j+1 for the high one
      lo = _mm256_or_si256(lo, bit_to(high, 2 * j, 4));
      hi = _mm256_or_si256(hi, bit_to(high, 2 * j + 1, 4));
    }
    const int64_t g = 8 * s + 2 * j;
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(u.q + g * 32), lo);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(u.q + (g + 1) * 32), hi);
  }
  // The eight 6-bit scales and mins at once, 32 bits at a time (k4_scale_min's layout: sub-blocks
  // 0-3 in the low 6 bits of bytes 0-3 / 4-7, 4-7 in the nibbles of bytes 8-11 and the top two
  // bits of bytes 0-3 / 4-7).
  uint32_t w[3];
  std::memcpy(w, scales, sizeof w);
  const uint32_t six = 0x3f3f3f3fu, four = 0x0f0f0f0fu, two = 0x03030303u;
  const uint32_t sc_w[2] = {w[0] & six, (w[2] & four) | (((w[0] >> 6) & two) << 4)};
  const uint32_t m_w[2] = {w[1] & six, ((w[2] >> 4) & four) | (((w[1] >> 6) & two) << 4)};
  uint8_t sc[8], m[8];
  std::memcpy(sc, sc_w, 8);
  std::memcpy(m, m_w, 8);
  for (int i = 0; i < 8; ++i) {
    const int64_t g = 8 * s + i;
    u.isc[2 * g] = u.isc[2 * g + 1] = int16_t(sc[i]);
    u.fd[g] = d;
    u.mn[g] = dmin * float(m[i]);
  }
}

void unpack_q6_k(const block_q6_k* b, int64_t nsb, const unpacked_row& u) {
  const __m256i m2 = _mm256_set1_epi8(3), off = _mm256_set1_epi8(32);
  for (int64_t s = 0; s < nsb; ++s) {
    const float d = f16_to_f32(b[s].d);
    for (int h = 0; h < 2; ++h) {
      const uint8_t* ql = b[s].ql + 64 * h;
      const __m256i l0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql));
      const __m256i l1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 32));
      const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b[s].qh + 32 * h));
      auto two = [&](int shift) {  // bits shift, shift+1 of qh, at bits 4-5
        return _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(hb, _mm_cvtsi32_si128(shift)), m2), 4);
      };
      const __m256i q[4] = {_mm256_or_si256(nibbles_lo(l0), two(0)), _mm256_or_si256(nibbles_lo(l1), two(2)),
                            _mm256_or_si256(nibbles_hi(l0), two(4)), _mm256_or_si256(nibbles_hi(l1), two(6))};
      for (int g = 0; g < 4; ++g) {
        const int64_t e = s * 256 + h * 128 + g * 32;
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(u.q + e), _mm256_sub_epi8(q[g], off));
        u.fd[e / 32] = d;
        u.mn[e / 32] = 0.0f;
      }
    }
    for (int i = 0; i < 16; ++i) u.isc[16 * s + i] = b[s].scales[i];
  }
}

void unpack(const weight_view& w, int64_t r, const unpacked_row& u) {
  const void* row = row_ptr(w, r);
  const int64_t k = w.cols;
  switch (w.type) {
    case dtype::q4_0: return unpack_q4_0(static_cast<const block_q4_0*>(row), k / 32, u);
    case dtype::q4_k: {
      auto b = static_cast<const block_q4_k*>(row);
      for (int64_t s = 0; s < k / qk_k; ++s) unpack_k4(b[s].d, b[s].dmin, b[s].scales, b[s].qs, nullptr, s, u);
      return;
    }
    case dtype::q5_k: {
      auto b = static_cast<const block_q5_k*>(row);
      for (int64_t s = 0; s < k / qk_k; ++s) unpack_k4(b[s].d, b[s].dmin, b[s].scales, b[s].qs, b[s].qh, s, u);
      return;
    }
    case dtype::q6_k: return unpack_q6_k(static_cast<const block_q6_k*>(row), k / qk_k, u);
    default: return;  // callers pass only the four types above
  }
}

// One row (unpacked) · T tokens' quantized x (T = 1..4: the row's q and scale vectors are
// loaded once for all of them). Each token has two accumulators (groups g % 2) in group order,
// whatever T is, so its result does not depend on the tokens beside it.
template <int T>
void dot_rows(const unpacked_row& u, int64_t ng, int64_t k, const int8_t* xq, const float* dx, const int32_t* sx,
              float* out, int64_t out_stride) {
  __m256 acc[T][2];
  for (int t = 0; t < T; ++t) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
  for (int64_t g = 0; g < ng; ++g) {
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(u.q + g * 32));
    const __m256i aq = _mm256_sign_epi8(q, q);
    for (int t = 0; t < T; ++t) {
      const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + t * k + g * 32));
      // |q| * (x with q's sign) = q * x, in pairs of int16 (|q| <= 32, |x| <= 127: no overflow);
      // elements 0-15 are the low 128 bits, 16-31 the high: each half its own scale (sv).
      const __m256i s32 = _mm256_madd_epi16(_mm256_maddubs_epi16(aq, _mm256_sign_epi8(xv, q)), u.sv[g]);
      acc[t][g & 1] = _mm256_fmadd_ps(_mm256_set1_ps(dx[t * ng + g] * u.fd[g]), _mm256_cvtepi32_ps(s32), acc[t][g & 1]);
    }
  }
  for (int t = 0; t < T; ++t) {
    float sum = hsum(_mm256_add_ps(acc[t][0], acc[t][1]));
    if (u.has_min) {
      const float* d = dx + t * ng;
      const int32_t* s = sx + t * ng;
      __m256 c = _mm256_setzero_ps();
      int64_t h = 0;
      for (; h + 8 <= ng; h += 8)
        c = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_loadu_ps(d + h), _mm256_loadu_ps(u.mn + h)),
                            _mm256_cvtepi32_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + h))), c);
      float corr = hsum(c);
      for (; h < ng; ++h) corr += d[h] * u.mn[h] * float(s[h]);
      sum -= corr;
    }
    out[t * out_stride] = sum;
  }
}

}  // namespace

void matmul_kquant_avx2(const weight_view& w, const float* x, int64_t m, float* y, thread_pool& pool) {
  const int64_t k = w.cols, ng = k / 32;
  // x once per call: int8 per 32, its scales, and the sums the min terms need.
  auto* xq = static_cast<int8_t*>(thread_scratch(scratch_x, size_t(m * k) + size_t(m * ng) * 8));
  auto* dx = reinterpret_cast<float*>(xq + m * k);
  auto* sx = reinterpret_cast<int32_t*>(dx + m * ng);
  const bool has_min = w.type == dtype::q4_k || w.type == dtype::q5_k;  // only mins need x's sums
  for (int64_t i = 0; i < m; ++i) {
    if (w.type == dtype::q4_0) {  // as llama.cpp: Q8_0 x for Q4_0, Q8_K for the k-quants
      quantize_x_q8_avx2(x + i * k, k, xq + i * k, dx + i * ng);
      round_scales_f16(dx + i * ng, ng);
    } else {
      quantize_x_q8k_avx2(x + i * k, k, xq + i * k, dx + i * ng);
    }
    for (int64_t g = 0; has_min && g < ng; ++g) {
      int32_t s = 0;
      for (int e = 0; e < 32; ++e) s += xq[i * k + g * 32 + e];
      sx[i * ng + g] = s;
    }
  }
  pool.parallel_for(w.rows, decode_grain(w, pool.size()), [&](int64_t r0, int64_t r1, int) {
    // Per thread: one unpacked row (k bytes and a few floats per 32: it stays in L1).
    // The scale vectors first (32-byte aligned: the scratch is 64-byte aligned, k % 32 == 0).
    auto* buf = static_cast<uint8_t*>(thread_scratch(scratch_deq_rows, size_t(ng) * 32 + size_t(k) + size_t(ng) * 12));
    uint8_t* rest = buf + ng * 32;
    const unpacked_row u{reinterpret_cast<int8_t*>(rest), reinterpret_cast<int16_t*>(rest + k),
                         reinterpret_cast<float*>(rest + k + ng * 4), reinterpret_cast<float*>(rest + k + ng * 8),
                         reinterpret_cast<__m256i*>(buf), has_min};
    for (int64_t r = r0; r < r1; ++r) {
      unpack(w, r, u);
      finish(u, ng);
      for (int64_t i = 0; i < m;) {
        const int64_t t = std::min<int64_t>(4, m - i);
        const int8_t* xi = xq + i * k;
        float* yi = y + i * w.rows + r;
        switch (t) {
          case 1: dot_rows<1>(u, ng, k, xi, dx + i * ng, sx + i * ng, yi, w.rows); break;
          case 2: dot_rows<2>(u, ng, k, xi, dx + i * ng, sx + i * ng, yi, w.rows); break;
          case 3: dot_rows<3>(u, ng, k, xi, dx + i * ng, sx + i * ng, yi, w.rows); break;
          default: dot_rows<4>(u, ng, k, xi, dx + i * ng, sx + i * ng, yi, w.rows); break;
        }
        i += t;
      }
    }
  });
}

}  // namespace tandem::kernels::cpu::detail
