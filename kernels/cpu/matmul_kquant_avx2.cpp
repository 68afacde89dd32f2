// Integer matmul for Q4_0 and the k-quants (Q4_K, Q5_K, Q6_K) with AVX2, for CPUs without
// AVX-512 VNNI (which have their panel kernels, matmul_panels.cpp).
//
// x is quantized once per call to int8 per 32 (quantize_x_q8_avx2, an f32 scale per 32) and
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
    for (int h = 0; h < 2; ++h) {
      uint8_t sc, m;
      k4_scale_min(2 * j + h, scales, sc, m);
      u.isc[2 * (g + h)] = u.isc[2 * (g + h) + 1] = int16_t(sc);
      u.fd[g + h] = d;
      u.mn[g + h] = dmin * float(m);
    }
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

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// One group of 32: acc += dx * fd * Σ isc · q · xq.
inline __m256 group_dot(const unpacked_row& u, int64_t g, const int8_t* xq, const float* dx, __m256 acc) {
  const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(u.q + g * 32));
  const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + g * 32));
  // |q| * (x with q's sign) = q * x, in pairs of int16 (|q| <= 32, |x| <= 127: no overflow).
  const __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(xv, q));
  // Elements 0-15 are the low 128 bits of p16, 16-31 the high: each half its own scale.
  const __m256i s32 = _mm256_madd_epi16(p16, u.sv[g]);
  return _mm256_fmadd_ps(_mm256_set1_ps(dx[g] * u.fd[g]), _mm256_cvtepi32_ps(s32), acc);
}

// One row (unpacked) · one token's quantized x. Four accumulators (groups g % 4) keep the FMA
// latency out of the way; the order is fixed, so the result is too.
float dot_row(const unpacked_row& u, int64_t ng, const int8_t* xq, const float* dx, const int32_t* sx) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t g = 0;
  for (; g + 4 <= ng; g += 4) {
    a0 = group_dot(u, g, xq, dx, a0);
    a1 = group_dot(u, g + 1, xq, dx, a1);
    a2 = group_dot(u, g + 2, xq, dx, a2);
    a3 = group_dot(u, g + 3, xq, dx, a3);
  }
  for (; g < ng; ++g) a0 = group_dot(u, g, xq, dx, a0);
  float sum = hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  if (u.has_min) {
    __m256 c = _mm256_setzero_ps();
    int64_t h = 0;
    for (; h + 8 <= ng; h += 8)
      c = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_loadu_ps(dx + h), _mm256_loadu_ps(u.mn + h)),
                          _mm256_cvtepi32_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sx + h))), c);
    float corr = hsum(c);
    for (; h < ng; ++h) corr += dx[h] * u.mn[h] * float(sx[h]);
    sum -= corr;
  }
  return sum;
}

}  // namespace

void matmul_kquant_avx2(const weight_view& w, const float* x, int64_t m, float* y, thread_pool& pool) {
  const int64_t k = w.cols, ng = k / 32;
  // x once per call: int8 per 32, its scales, and the sums the min terms need.
  auto* xq = static_cast<int8_t*>(thread_scratch(scratch_x, size_t(m * k) + size_t(m * ng) * 8));
  auto* dx = reinterpret_cast<float*>(xq + m * k);
  auto* sx = reinterpret_cast<int32_t*>(dx + m * ng);
  for (int64_t i = 0; i < m; ++i) {
    quantize_x_q8_avx2(x + i * k, k, xq + i * k, dx + i * ng);
    for (int64_t g = 0; g < ng; ++g) {
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
                         reinterpret_cast<__m256i*>(buf), w.type == dtype::q4_k || w.type == dtype::q5_k};
    for (int64_t r = r0; r < r1; ++r) {
      unpack(w, r, u);
      finish(u, ng);
      for (int64_t i = 0; i < m; ++i) y[i * w.rows + r] = dot_row(u, ng, xq + i * k, dx + i * ng, sx + i * ng);
    }
  });
}

}  // namespace tandem::kernels::cpu::detail
