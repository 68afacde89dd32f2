// AVX-512 kernels. The file is compiled with AVX-512 F/BW/VL/DQ (+FMA/F16C); the functions
// marked VNNI_BF16 also use AVX512-VNNI/BF16 and run only when matmul_avx512 gets vnni_bf16.
//
// Decode (m <= max_decode_m): each weight row is streamed once and dotted with all m inputs.
// Prefill: a blocked GEMM. Weight rows are packed (dequantized) into panels Bp: [kc][64] that
// stay in cache, and a 6x64 register-blocked microkernel broadcasts x and FMAs 4 zmm per x
// row. bf16 (and q8_0) weights use the same structure with vdpbf16ps, which does twice the
// multiply-adds per instruction; x is then rounded to bf16 (relative error <= 2^-9 per term).
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "kernels/cpu/matmul_impl.h"

#define VNNI_BF16 __attribute__((target("avx512vnni,avx512bf16")))

namespace tandem::kernels::cpu::detail {
namespace {

inline __mmask16 tail_mask(int64_t n) { return n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1); }

// Weights c..c+15 of a row as f32 (lanes outside `mask` read as 0 and touch no memory).
template <dtype T>
inline __m512 load16(const uint8_t* row, int64_t c, __mmask16 mask = 0xffff) {
  if constexpr (T == dtype::f32) {
    return _mm512_maskz_loadu_ps(mask, reinterpret_cast<const float*>(row) + c);
  } else {
    const __m256i h = _mm256_maskz_loadu_epi16(mask, row + 2 * c);
    if constexpr (T == dtype::f16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));  // bf16
  }
}

// ---------------------------------------------------------------- decode

// Rows [r0, r1) of f32/f16/bf16 W against M inputs. x: [M, k], y: [M, n] (n = w.rows).
// bf16 weights widen exactly to f32 (shift), so there is no activation rounding here: measured
// as fast as vdpbf16ps at these m, since decode waits on memory either way.
template <dtype T, int M>
void decode_float(const weight_view& w, const float* x, float* y, int64_t r0, int64_t r1) {
  constexpr int U = std::max(1, 8 / M);  // M*U independent FMA chains hide the FMA latency
  const int64_t k = w.cols, n = w.rows;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = row_ptr(w, r);
    __m512 acc[M][U];
    for (auto& a : acc)
      for (auto& v : a) v = _mm512_setzero_ps();
    int64_t c = 0;
    for (; c + 16 * U <= k; c += 16 * U)
      for (int u = 0; u < U; ++u) {
        const __m512 wv = load16<T>(row, c + 16 * u);
        for (int i = 0; i < M; ++i)
          acc[i][u] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + i * k + c + 16 * u), acc[i][u]);
      }
    for (; c < k; c += 16) {  // remaining vectors, the last one masked
      const __mmask16 mk = tail_mask(k - c);
      const __m512 wv = load16<T>(row, c, mk);
      for (int i = 0; i < M; ++i)
        acc[i][0] = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(mk, x + i * k + c), acc[i][0]);
    }
    for (int i = 0; i < M; ++i) {
      for (int u = 1; u < U; ++u) acc[i][0] = _mm512_add_ps(acc[i][0], acc[i][u]);
      y[i * n + r] = _mm512_reduce_add_ps(acc[i][0]);
    }
  }
}

// x quantized for the VNNI q8_0 kernel, per input row, in pairs of blocks (one zmm each):
//   q: [np][64] int8, zero past the last block; bias: [np][16] int32, lane 0 (8) = -128 * sum of
//   block 2p (2p+1); d: [np][16] f32, lanes 0-7 (8-15) = scale of block 2p (2p+1).
struct q8_pairs {
  int64_t np;
  int8_t* q;
  int32_t* bias;
  float* d;
  static size_t bytes(int64_t m, int64_t k) { return size_t(m * ((k / 32 + 1) / 2) * 192); }
  q8_pairs(void* buf, int64_t i, int64_t k) : np((k / q8_0_block + 1) / 2) {
    auto* base = static_cast<uint8_t*>(buf) + i * np * 192;
    q = reinterpret_cast<int8_t*>(base);
    bias = reinterpret_cast<int32_t*>(base + np * 64);
    d = reinterpret_cast<float*>(base + np * 128);
  }
};

// Quantizes one row of x (as ggml's quantize_row_q8_0, but the scale stays f32).
void quantize_x_pairs(const float* x, int64_t k, q8_pairs out) {
  const int64_t nb = k / q8_0_block;
  std::memset(out.q, 0, size_t(out.np) * 64);
  std::memset(out.bias, 0, size_t(out.np) * 64);
  std::memset(out.d, 0, size_t(out.np) * 64);
  for (int64_t b = 0; b < nb; ++b) {
    const __m512 v0 = _mm512_loadu_ps(x + b * 32), v1 = _mm512_loadu_ps(x + b * 32 + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
    const float scale = amax / 127.0f;
    const __m512 inv = _mm512_set1_ps(scale != 0.0f ? 1.0f / scale : 0.0f);
    const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, inv));  // round to nearest even
    const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, inv));
    const int64_t p = b / 2, half = b % 2;
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out.q + p * 64 + half * 32), _mm512_cvtsepi32_epi8(q0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out.q + p * 64 + half * 32 + 16), _mm512_cvtsepi32_epi8(q1));
    out.bias[p * 16 + half * 8] = -128 * _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
    for (int j = 0; j < 8; ++j) out.d[p * 16 + half * 8 + j] = scale;
  }
}

// q8_0 rows [r0, r1) against M inputs with vpdpbusd (u8 x s8): the weights are offset to u8
// by xor 0x80 (w + 128), and the bias lanes subtract 128 * sum(x) again, so each block's int32
// dot product is exact. Two blocks per zmm; y: [M, n].
template <int M>
VNNI_BF16 void decode_q8_vnni(const weight_view& w, const q8_pairs* xs, float* y, int64_t r0,
                              int64_t r1) {
  const int64_t nb = w.cols / q8_0_block, n = w.rows;
  const __m512i flip = _mm512_set1_epi8(char(0x80));
  for (int64_t r = r0; r < r1; ++r) {
    const auto* wb = reinterpret_cast<const block_q8_0*>(row_ptr(w, r));
    __m512 acc[M][2];  // two chains per input: alternate block pairs
    for (auto& a : acc) a[0] = a[1] = _mm512_setzero_ps();
    auto pair = [&](int64_t p, int chain) {
      const int64_t b = 2 * p;
      const bool both = b + 1 < nb;
      __m512i wq = _mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb[b].qs)));
      if (both)
        wq = _mm512_inserti64x4(wq, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb[b + 1].qs)), 1);
      wq = _mm512_xor_si512(wq, flip);  // a missing second block reads as 128 * x(=0) = 0
      const __m512 dw = _mm512_insertf32x8(_mm512_set1_ps(_cvtsh_ss(wb[b].d)),
                                           _mm256_set1_ps(both ? _cvtsh_ss(wb[b + 1].d) : 0.0f), 1);
      for (int i = 0; i < M; ++i) {
        const __m512i s = _mm512_dpbusd_epi32(_mm512_loadu_si512(xs[i].bias + p * 16), wq,
                                              _mm512_loadu_si512(xs[i].q + p * 64));
        const __m512 scale = _mm512_mul_ps(dw, _mm512_loadu_ps(xs[i].d + p * 16));
        acc[i][chain] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), scale, acc[i][chain]);
      }
    };
    const int64_t np = xs[0].np;
    int64_t p = 0;
    for (; p + 2 <= np; p += 2) {
      pair(p, 0);
      pair(p + 1, 1);
    }
    if (p < np) pair(p, 0);
    for (int i = 0; i < M; ++i) y[i * n + r] = _mm512_reduce_add_ps(_mm512_add_ps(acc[i][0], acc[i][1]));
  }
}

// Calls kern(integral_constant<M>, i0) over the m inputs in chunks of at most 8.
template <class F>
void for_input_chunks(int64_t m, F&& kern) {
  for (int64_t i0 = 0; i0 < m;) {
    const int64_t c = std::min<int64_t>(8, m - i0);
    switch (c) {
      case 1: kern(std::integral_constant<int, 1>{}, i0); break;
      case 2: kern(std::integral_constant<int, 2>{}, i0); break;
      case 3: kern(std::integral_constant<int, 3>{}, i0); break;
      case 4: kern(std::integral_constant<int, 4>{}, i0); break;
      case 5: kern(std::integral_constant<int, 5>{}, i0); break;
      case 6: kern(std::integral_constant<int, 6>{}, i0); break;
      case 7: kern(std::integral_constant<int, 7>{}, i0); break;
      default: kern(std::integral_constant<int, 8>{}, i0); break;
    }
    i0 += c;
  }
}

template <dtype T>
void decode_float_rows(const weight_view& w, const float* x, int64_t m, float* y, int64_t r0,
                       int64_t r1) {
  for_input_chunks(m, [&](auto mc, int64_t i0) {
    decode_float<T, decltype(mc)::value>(w, x + i0 * w.cols, y + i0 * w.rows, r0, r1);
  });
}

VNNI_BF16 void decode_q8_rows(const weight_view& w, const q8_pairs* xs, int64_t m, float* y,
                              int64_t r0, int64_t r1) {
  for_input_chunks(m, [&](auto mc, int64_t i0) {
    decode_q8_vnni<decltype(mc)::value>(w, xs + i0, y + i0 * w.rows, r0, r1);
  });
}

void decode(const weight_view& w, const float* x, int64_t m, float* y, thread_pool& pool,
            bool vnni_bf16) {
  const int64_t k = w.cols, grain = decode_grain(w);
  auto rows = [&](auto&& fn) { pool.parallel_for(w.rows, grain, [&](int64_t r0, int64_t r1, int) { fn(r0, r1); }); };
  switch (w.type) {
    case dtype::f32: return rows([&](int64_t r0, int64_t r1) { decode_float_rows<dtype::f32>(w, x, m, y, r0, r1); });
    case dtype::f16: return rows([&](int64_t r0, int64_t r1) { decode_float_rows<dtype::f16>(w, x, m, y, r0, r1); });
    case dtype::bf16: return rows([&](int64_t r0, int64_t r1) { decode_float_rows<dtype::bf16>(w, x, m, y, r0, r1); });
    case dtype::q8_0: break;
  }
  // q8_0: x is quantized once per call into the calling thread's scratch; workers only read it.
  const int64_t nb = k / q8_0_block;
  if (!vnni_bf16) {  // AVX-512 without VNNI: the AVX2 integer kernel
    auto* buf = static_cast<uint8_t*>(thread_scratch(scratch_x, size_t(m * (k + 4 * nb))));
    auto* xd = reinterpret_cast<float*>(buf);                 // [m, nb]
    auto* xq = reinterpret_cast<int8_t*>(buf + m * nb * 4);  // [m, k]
    for (int64_t i = 0; i < m; ++i) quantize_x_q8_avx2(x + i * k, k, xq + i * k, xd + i * nb);
    return rows([&](int64_t r0, int64_t r1) { decode_q8_0_avx2(w, xq, xd, m, y, r0, r1); });
  }
  void* buf = thread_scratch(scratch_x, q8_pairs::bytes(m, k) + size_t(m) * sizeof(q8_pairs));
  auto* xs = reinterpret_cast<q8_pairs*>(static_cast<uint8_t*>(buf) + q8_pairs::bytes(m, k));
  for (int64_t i = 0; i < m; ++i) {
    xs[i] = q8_pairs(buf, i, k);
    quantize_x_pairs(x + i * k, k, xs[i]);
  }
  rows([&](int64_t r0, int64_t r1) { decode_q8_rows(w, xs, m, y, r0, r1); });
}

}  // namespace
}  // namespace tandem::kernels::cpu::detail

#include "kernels/cpu/matmul_avx512_gemm.inc"
