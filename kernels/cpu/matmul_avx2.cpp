// AVX2 + FMA + F16C kernels (compiled with -mavx2 -mfma -mf16c; called only after the CPU check).
// Decode: hand-written GEMV over 8-float vectors. Prefill: dequantized panels through OpenBLAS,
// whose Haswell sgemm kernel is already near the 256-bit FMA peak.

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "kernels/cpu/simd.h"
#include "kernels/cpu/avx2_util.h"
#include "kernels/cpu/matmul_impl.h"

namespace tandem::kernels::cpu::detail {
namespace {

// Weights c..c+7 of a row as f32.
template <dtype T>
inline __m256 load8(const uint8_t* row, int64_t c) {
  if constexpr (T == dtype::f32) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + c);
  } else {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * c));
    if constexpr (T == dtype::f16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));  // bf16
  }
}

template <dtype T>
inline float load1(const uint8_t* row, int64_t c) {
  if constexpr (T == dtype::f32) {
    float f;
    std::memcpy(&f, row + 4 * c, 4);
    return f;
  } else {
    uint16_t h;
    std::memcpy(&h, row + 2 * c, 2);
    return T == dtype::f16 ? _cvtsh_ss(h) : bf16_to_f32(h);
  }
}

// Rows [r0, r1) of f32/f16/bf16 W against M input rows. x: [M, k], y: [M, n] (n = w.rows).
template <dtype T, int M>
void decode_float(const weight_view& w, const float* x, float* y, int64_t r0, int64_t r1) {
  // Two FMA chains per input whatever M is: a row's sum is then computed in the same order in
  // a batch of any size (matmul_mode::batch_invariant); M*2 chains hide the FMA latency from
  // M = 2 on, and M = 1 waits on memory anyway.
  constexpr int U = 2;
  const int64_t k = w.cols, n = w.rows;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = row_ptr(w, r);
    __m256 acc[M][U];
    TANDEM_UNROLL for (auto& a : acc) TANDEM_UNROLL for (auto& v : a) v = _mm256_setzero_ps();
    int64_t c = 0;
    for (; c + 8 * U <= k; c += 8 * U) TANDEM_UNROLL for (int u = 0; u < U; ++u) {
        const __m256 wv = load8<T>(row, c + 8 * u);
        TANDEM_UNROLL for (int i = 0; i < M; ++i) acc[i][u] =
            _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + i * k + c + 8 * u), acc[i][u]);
      }
    for (; c + 8 <= k; c += 8) {
      const __m256 wv = load8<T>(row, c);
      TANDEM_UNROLL for (int i = 0; i < M; ++i) acc[i][0] =
          _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + i * k + c), acc[i][0]);
    }
    TANDEM_UNROLL for (int i = 0; i < M; ++i) {
      TANDEM_UNROLL for (int u = 1; u < U; ++u) acc[i][0] = _mm256_add_ps(acc[i][0], acc[i][u]);
      float s = hsum(acc[i][0]);
      for (int64_t t = c; t < k; ++t) s += load1<T>(row, t) * x[i * k + t];  // cols % 8 tail
      y[i * n + r] = s;
    }
  }
}

// q8_0 rows [r0, r1) against M quantized inputs. xq: [M, k] int8, xd: [M, k/32], y: [M, n].
template <int M>
void decode_q8(const weight_view& w, const int8_t* xq, const float* xd, float* y, int64_t r0, int64_t r1) {
  const int64_t k = w.cols, nb = k / q8_0_block, n = w.rows;
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t r = r0; r < r1; ++r) {
    const auto* wb = reinterpret_cast<const block_q8_0*>(row_ptr(w, r));
    __m256 acc[M][2];  // two chains per input: alternate blocks
    TANDEM_UNROLL for (auto& a : acc) a[0] = a[1] = _mm256_setzero_ps();
    auto block = [&](int64_t b, int chain) {
      const __m256i wq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb[b].qs));
      const __m256 dw = _mm256_set1_ps(_cvtsh_ss(wb[b].d));
      TANDEM_UNROLL for (int i = 0; i < M; ++i) {
        const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + i * k + b * q8_0_block));
        // maddubs wants u8 x s8: |x| times w carrying x's sign. Pair sums <= 2*127*128 fit s16.
        const __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(xv, xv), _mm256_sign_epi8(wq, xv));
        const __m256 p = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, ones));
        const __m256 s = _mm256_mul_ps(dw, _mm256_set1_ps(xd[i * nb + b]));
        acc[i][chain] = _mm256_fmadd_ps(p, s, acc[i][chain]);
      }
    };
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) {
      block(b, 0);
      block(b + 1, 1);
    }
    if (b < nb) block(b, 0);
    TANDEM_UNROLL for (int i = 0; i < M; ++i) y[i * n + r] = hsum(_mm256_add_ps(acc[i][0], acc[i][1]));
  }
}

template <dtype T>
void decode_float_rows(const weight_view& w, const float* x, int64_t m, float* y, int64_t r0, int64_t r1) {
  for_input_chunks<4>(m, [&](auto mc, int64_t i0) {
    decode_float<T, decltype(mc)::value>(w, x + i0 * w.cols, y + i0 * w.rows, r0, r1);
  });
}

// q8_0 rows [r0, r1) against m inputs quantized by quantize_x_q8_avx2: xq: [m, k], xd: [m, k/32].
void decode_q8_rows(const weight_view& w, const int8_t* xq, const float* xd, int64_t m, float* y, int64_t r0,
                    int64_t r1) {
  const int64_t k = w.cols, nb = k / q8_0_block;
  for_input_chunks<4>(m, [&](auto mc, int64_t i0) {
    decode_q8<decltype(mc)::value>(w, xq + i0 * k, xd + i0 * nb, y + i0 * w.rows, r0, r1);
  });
}

void dequant_avx2(dtype t, const void* src, float* dst, int64_t n) {
  const auto* s = static_cast<const uint8_t*>(src);
  int64_t c = 0;
  switch (t) {
    case dtype::f32: std::memcpy(dst, src, size_t(n) * 4); return;
    case dtype::q4_0:
    case dtype::q4_k:
    case dtype::q5_k:
    case dtype::q6_k: dequantize_row(t, src, dst, n); return;  // the scalar reference
    case dtype::f16:
      for (; c + 8 <= n; c += 8) _mm256_storeu_ps(dst + c, load8<dtype::f16>(s, c));
      for (; c < n; ++c) dst[c] = load1<dtype::f16>(s, c);
      return;
    case dtype::bf16:
      for (; c + 8 <= n; c += 8) _mm256_storeu_ps(dst + c, load8<dtype::bf16>(s, c));
      for (; c < n; ++c) dst[c] = load1<dtype::bf16>(s, c);
      return;
    case dtype::q8_0: {
      const auto* b = static_cast<const block_q8_0*>(src);
      for (int64_t i = 0; i < n / q8_0_block; ++i) {
        const __m256 d = _mm256_set1_ps(_cvtsh_ss(b[i].d));
        for (int j = 0; j < q8_0_block; j += 8) {
          const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b[i].qs + j));
          _mm256_storeu_ps(dst + i * q8_0_block + j, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q))));
        }
      }
      return;
    }
  }
}

}  // namespace

namespace {
// |x| of 8 floats.
inline __m256 abs8(__m256 v) { return _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff))); }
inline float hmax8(__m256 v) {
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  return _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
}
// q[0, 32) = nearest-even(x[0, 32) * inv), as int8 in element order.
inline void round_block32(const float* x, __m256 inv, int8_t* q) {
  __m256i i[4];
  for (int j = 0; j < 4; ++j) i[j] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * j), inv));
  // Packing interleaves 128-bit lanes; the permute restores element order.
  const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3]));
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), _mm256_permutevar8x32_epi32(p, order));
}
}  // namespace

void quantize_x_q8_avx2(const float* x, int64_t n, int8_t* q, float* d) {
  for (int64_t b = 0; b < n / q8_0_block; ++b) {
    const float* xb = x + b * q8_0_block;
    __m256 amax = _mm256_setzero_ps();
    for (int j = 0; j < 4; ++j) amax = _mm256_max_ps(amax, abs8(_mm256_loadu_ps(xb + 8 * j)));
    // As ggml's quantize_row_q8_0: the multiplier is 127 / max (not 1 / scale), nearest-even.
    const float top = hmax8(amax);
    round_block32(xb, _mm256_set1_ps(top != 0.0f ? 127.0f / top : 0.0f), q + b * q8_0_block);
    d[b] = top / 127.0f;
  }
}

void quantize_x_q8k_avx2(const float* x, int64_t n, int8_t* q, float* d) {
  for (int64_t s = 0; s < n / qk_k; ++s) {
    const float* xs = x + s * qk_k;
    __m256 amax = _mm256_setzero_ps();
    for (int j = 0; j < qk_k / 8; ++j) amax = _mm256_max_ps(amax, abs8(_mm256_loadu_ps(xs + 8 * j)));
    // ggml's quantize_row_q8_K_ref: iscale = -127 / (the signed element of largest |x|), scale
    // 1 / iscale. Its sign only flips every q and the scale together, so 127 / max|x| gives the
    // same products; nearest-even, as its nearest_int.
    const float top = hmax8(amax);
    const float iscale = top != 0.0f ? 127.0f / top : 0.0f;
    const float scale = top != 0.0f ? 1.0f / iscale : 0.0f;
    for (int b = 0; b < qk_k / q8_0_block; ++b) {
      round_block32(xs + b * q8_0_block, _mm256_set1_ps(iscale), q + s * qk_k + b * q8_0_block);
      d[s * (qk_k / q8_0_block) + b] = scale;
    }
  }
}

void matmul_avx2(const weight_view& w, const float* x, int64_t m, float* y, thread_pool& pool, bool gemm) {
  if (gemm) {
    prefill_blas(w, x, m, y, pool, &dequant_avx2);
    return;
  }
  const int64_t k = w.cols, grain = decode_grain(w, pool.size());
  switch (w.type) {
    case dtype::f32:
      return pool.parallel_for(w.rows, grain, [&](int64_t r0, int64_t r1, int) {
        for_cache_tiles(w, r0, r1, [&](int64_t t0, int64_t t1) { decode_float_rows<dtype::f32>(w, x, m, y, t0, t1); });
      });
    case dtype::f16:
      return pool.parallel_for(w.rows, grain, [&](int64_t r0, int64_t r1, int) {
        for_cache_tiles(w, r0, r1, [&](int64_t t0, int64_t t1) { decode_float_rows<dtype::f16>(w, x, m, y, t0, t1); });
      });
    case dtype::bf16:
      return pool.parallel_for(w.rows, grain, [&](int64_t r0, int64_t r1, int) {
        for_cache_tiles(w, r0, r1, [&](int64_t t0, int64_t t1) { decode_float_rows<dtype::bf16>(w, x, m, y, t0, t1); });
      });
    case dtype::q8_0: {
      // x quantized once per call (the calling thread's scratch; workers only read it).
      const int64_t nb = k / q8_0_block;
      auto* buf = static_cast<uint8_t*>(thread_scratch(scratch_x, size_t(m * (k + 4 * nb))));
      auto* xd = reinterpret_cast<float*>(buf);  // [m, nb]
      auto* xq = reinterpret_cast<int8_t*>(buf + m * nb * 4);  // [m, k]
      for (int64_t i = 0; i < m; ++i) quantize_x_q8_avx2(x + i * k, k, xq + i * k, xd + i * nb);
      round_scales_f16(xd, m * nb);  // Q8_0 x Q8_0 as llama.cpp computes it
      return pool.parallel_for(w.rows, grain, [&](int64_t r0, int64_t r1, int) {
        for_cache_tiles(w, r0, r1, [&](int64_t t0, int64_t t1) { decode_q8_rows(w, xq, xd, m, y, t0, t1); });
      });
    }
    case dtype::q4_0:
    case dtype::q4_k:
    case dtype::q5_k:
    case dtype::q6_k:  // matmul_dequantized takes these before any ISA path
      throw std::logic_error("matmul_avx2: no direct path for " + std::string(to_string(w.type)));
  }
}

}  // namespace tandem::kernels::cpu::detail
