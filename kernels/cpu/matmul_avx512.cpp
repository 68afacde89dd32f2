// AVX-512 kernels. The file is compiled with AVX-512 F/BW/VL/DQ (+FMA/F16C); the functions
// marked VNNI_BF16 also use AVX512-VNNI/BF16 and run only when matmul_avx512 gets vnni_bf16.
//
// Decode (m <= decode_max_m): each weight row is streamed once and dotted with all m inputs.
// Prefill (matmul_mode::fastest only): a blocked GEMM. Weight rows are packed (dequantized to
// f32) into panels Bp: [kc][64] that stay in cache, and a 6x64 register-blocked microkernel
// broadcasts x and FMAs 4 zmm per x row. (On CPUs with VNNI/BF16, weights loaded by a model
// have panels and take matmul_panels.cpp instead, in both modes.)

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "kernels/cpu/simd.h"
#include "kernels/cpu/matmul_impl.h"

#define VNNI_BF16 __attribute__((target("avx512vnni,avx512bf16")))

namespace tandem::kernels::cpu::detail {
namespace {

inline __mmask16 tail_mask(int64_t n) { return n >= 16 ? 0xffff : __mmask16((1u << n) - 1); }

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
// bf16 weights widen exactly to f32 (shift) and meet x already rounded to bf16 (matmul_with_isa),
// so each product is exact as in vdpbf16ps: measured as fast as vdpbf16ps at these m, since
// decode waits on memory either way.
template <dtype T, int M>
void decode_float(const weight_view& w, const float* x, float* y, int64_t r0, int64_t r1) {
  // Two FMA chains per input whatever M is, so that a row's sum is computed in the same order
  // in a batch of any size (matmul_mode::batch_invariant).
  constexpr int U = 2;
  constexpr int64_t esize = T == dtype::f32 ? 4 : 2;
  const int64_t k = w.cols, n = w.rows;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = row_ptr(w, r);
    __m512 acc[M][U];
    TANDEM_UNROLL for (auto& a : acc) TANDEM_UNROLL for (auto& v : a) v = _mm512_setzero_ps();
    // A masked head (< 16 elements) first, so that the main loop's weight loads (16 elements)
    // are aligned to their size: loads straddling two cache lines cost ~30% of the DRAM
    // bandwidth here, and model files align tensors to 32 bytes only.
    const int64_t head = std::min<int64_t>(k, (-reinterpret_cast<uintptr_t>(row) & (16 * esize - 1)) / esize);
    if (head > 0) {
      const __mmask16 mk = tail_mask(head);
      const __m512 wv = load16<T>(row, 0, mk);
      TANDEM_UNROLL for (int i = 0; i < M; ++i) acc[i][0] =
          _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(mk, x + i * k), acc[i][0]);
    }
    int64_t c = head;
    for (; c + 16 * U <= k; c += 16 * U) TANDEM_UNROLL for (int u = 0; u < U; ++u) {
        const __m512 wv = load16<T>(row, c + 16 * u);
        TANDEM_UNROLL for (int i = 0; i < M; ++i) acc[i][u] =
            _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + i * k + c + 16 * u), acc[i][u]);
      }
    for (; c < k; c += 16) {  // remaining vectors, the last one masked
      const __mmask16 mk = tail_mask(k - c);
      const __m512 wv = load16<T>(row, c, mk);
      TANDEM_UNROLL for (int i = 0; i < M; ++i) acc[i][0] =
          _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(mk, x + i * k + c), acc[i][0]);
    }
    TANDEM_UNROLL for (int i = 0; i < M; ++i) {
      TANDEM_UNROLL for (int u = 1; u < U; ++u) acc[i][0] = _mm512_add_ps(acc[i][0], acc[i][u]);
      y[i * n + r] = _mm512_reduce_add_ps(acc[i][0]);
    }
  }
}

// x quantized for the VNNI q8_0 kernel, per input row, in pairs of blocks (one zmm each):
//   q: [np][64] int8, zero past the last block; bias: [np][16] int32, lane 0 (8) = -128 * sum of
//   block 2p (2p+1), other lanes 0; d: [np][16] f32, lanes 0-7 (8-15) = scale of block 2p (2p+1).
struct q8_pairs {
  int64_t np;
  int8_t* q;
  int32_t* bias;
  float* d;
  static size_t bytes(int64_t m, int64_t k) { return size_t(m * ((k / 32 + 1) / 2) * 192); }
  // Quantizes row i of x (k values) into buf (as ggml's quantize_row_q8_0, scales rounded to f16).
  q8_pairs(void* buf, int64_t i, const float* x, int64_t k) : np((k / q8_0_block + 1) / 2) {
    auto* base = static_cast<uint8_t*>(buf) + i * np * 192;
    q = reinterpret_cast<int8_t*>(base);
    bias = reinterpret_cast<int32_t*>(base + np * 64);
    d = reinterpret_cast<float*>(base + np * 128);
    std::memset(base, 0, size_t(np) * 192);
    quantize_x_q8_avx2(x, k, q, d);  // scales land in d[0, nb): spread them out, last first
    round_scales_f16(d, k / q8_0_block);  // Q8_0 x Q8_0 as llama.cpp computes it
    for (int64_t b = k / q8_0_block - 1; b >= 0; --b) {
      const float scale = d[b];
      std::fill(d + b / 2 * 16 + b % 2 * 8, d + b / 2 * 16 + b % 2 * 8 + 8, scale);
      int32_t sum = 0;
      for (int j = 0; j < q8_0_block; ++j) sum += q[b * q8_0_block + j];
      bias[b / 2 * 16 + b % 2 * 8] = -128 * sum;
    }
  }
};

// One pair of q8_0 blocks (p) of a weight row against M inputs, added to acc[M].
// vpdpbusd multiplies u8 x s8: the weights are offset to u8 by xor 0x80 (w + 128) and the bias
// lanes subtract 128 * sum(x) again, so each block's int32 dot product is exact.
template <int M>
VNNI_BF16 inline __attribute__((always_inline)) void q8_pair(const block_q8_0* wb, int64_t nb, const q8_pairs* xs,
                                                             int64_t p, __m512* acc) {
  const int64_t b = 2 * p;
  const bool both = b + 1 < nb;
  auto qs = [&](int64_t i) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb[i].qs)); };
  __m512i wq = _mm512_zextsi256_si512(qs(b));
  if (both) wq = _mm512_inserti64x4(wq, qs(b + 1), 1);
  wq = _mm512_xor_si512(wq, _mm512_set1_epi8(char(0x80)));  // a missing 2nd block: 128 * 0
  const __m512 dw =
      _mm512_insertf32x8(_mm512_set1_ps(_cvtsh_ss(wb[b].d)), _mm256_set1_ps(both ? _cvtsh_ss(wb[b + 1].d) : 0.0f), 1);
  TANDEM_UNROLL for (int i = 0; i < M; ++i) {
    const __m512i s =
        _mm512_dpbusd_epi32(_mm512_loadu_si512(xs[i].bias + p * 16), wq, _mm512_loadu_si512(xs[i].q + p * 64));
    const __m512 scale = _mm512_mul_ps(dw, _mm512_loadu_ps(xs[i].d + p * 16));
    acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), scale, acc[i]);
  }
}

// q8_0 rows [r0, r1) against M quantized inputs xs[M]; y: [M, n].
template <int M>
VNNI_BF16 void decode_q8_vnni(const weight_view& w, const q8_pairs* xs, float* y, int64_t r0, int64_t r1) {
  const int64_t nb = w.cols / q8_0_block, n = w.rows, np = xs[0].np;
  for (int64_t r = r0; r < r1; ++r) {
    const auto* wb = reinterpret_cast<const block_q8_0*>(row_ptr(w, r));
    __m512 acc0[M], acc1[M];  // two chains per input: alternate block pairs
    TANDEM_UNROLL for (int i = 0; i < M; ++i) acc0[i] = acc1[i] = _mm512_setzero_ps();
    int64_t p = 0;
    for (; p + 2 <= np; p += 2) {
      q8_pair<M>(wb, nb, xs, p, acc0);
      q8_pair<M>(wb, nb, xs, p + 1, acc1);
    }
    if (p < np) q8_pair<M>(wb, nb, xs, p, acc0);
    TANDEM_UNROLL for (int i = 0; i < M; ++i) y[i * n + r] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[i], acc1[i]));
  }
}

template <dtype T>
void decode_float_rows(const weight_view& w, const float* x, int64_t m, float* y, int64_t r0, int64_t r1) {
  for_input_chunks<8>(m, [&](auto mc, int64_t i0) {
    decode_float<T, decltype(mc)::value>(w, x + i0 * w.cols, y + i0 * w.rows, r0, r1);
  });
}

VNNI_BF16 void decode_q8_rows(const weight_view& w, const q8_pairs* xs, int64_t m, float* y, int64_t r0, int64_t r1) {
  for_input_chunks<8>(
      m, [&](auto mc, int64_t i0) { decode_q8_vnni<decltype(mc)::value>(w, xs + i0, y + i0 * w.rows, r0, r1); });
}

// The decode path; q8_0 weights need VNNI here.
void decode(const weight_view& w, const float* x, int64_t m, float* y, thread_pool& pool) {
  const int64_t k = w.cols, grain = decode_grain(w, pool.size());
  auto rows = [&](auto&& fn) { pool.parallel_for(w.rows, grain, [&](int64_t r0, int64_t r1, int) { fn(r0, r1); }); };
  if (w.type != dtype::q8_0) {
    const auto kern = w.type == dtype::f32   ? &decode_float_rows<dtype::f32>
                      : w.type == dtype::f16 ? &decode_float_rows<dtype::f16>
                                             : &decode_float_rows<dtype::bf16>;
    return rows([&](int64_t r0, int64_t r1) {
      for_cache_tiles(w, r0, r1, [&](int64_t t0, int64_t t1) { kern(w, x, m, y, t0, t1); });
    });
  }
  // q8_0: x is quantized once per call into the calling thread's scratch; workers only read it.
  void* buf = thread_scratch(scratch_x, q8_pairs::bytes(m, k) + size_t(m) * sizeof(q8_pairs));
  auto* xs = reinterpret_cast<q8_pairs*>(static_cast<uint8_t*>(buf) + q8_pairs::bytes(m, k));
  for (int64_t i = 0; i < m; ++i) xs[i] = q8_pairs(buf, i, x + i * k, k);
  rows([&](int64_t r0, int64_t r1) {
    for_cache_tiles(w, r0, r1, [&](int64_t t0, int64_t t1) { decode_q8_rows(w, xs, m, y, t0, t1); });
  });
}

// ---------------------------------------------------------------- prefill GEMM

constexpr int MR = 6;  // x rows per microkernel: 6 x 4 zmm accumulators + 4 weight vectors
constexpr int NR = 64;  // weight rows per microkernel (y columns)
constexpr int64_t NC = 256;  // weight rows per packed block (per thread)
// k per packed block: one [KC][64] f32 micro-panel is 64 KiB, streamed from L2 (measured
// faster than smaller panels that fit L1: fewer passes over y).
constexpr int64_t KC_F32 = 256;  // a multiple of 32 (q8_0 blocks)

// y[R, 64] (+)= a[R, kc] · b. a: rows at stride lda; b: [kc][64] packed; y: rows at stride
// ldy, its columns beyond `mask` neither read nor written.
template <int R>
void kernel_f32(const float* a, int64_t lda, const float* b, int64_t kc, float* y, int64_t ldy, const __mmask16* mask,
                bool accumulate) {
  __m512 c[R][4];
  TANDEM_UNROLL for (int i = 0; i < R; ++i) TANDEM_UNROLL for (int v = 0; v < 4; ++v) c[i][v] =
      accumulate ? _mm512_maskz_loadu_ps(mask[v], y + i * ldy + 16 * v) : _mm512_setzero_ps();
  for (int64_t p = 0; p < kc; ++p) {
    __m512 bv[4];
    TANDEM_UNROLL for (int v = 0; v < 4; ++v) bv[v] = _mm512_load_ps(b + p * 64 + 16 * v);
    TANDEM_UNROLL for (int i = 0; i < R; ++i) {
      const __m512 av = _mm512_set1_ps(a[i * lda + p]);
      TANDEM_UNROLL for (int v = 0; v < 4; ++v) c[i][v] = _mm512_fmadd_ps(av, bv[v], c[i][v]);
    }
  }
  TANDEM_UNROLL for (int i = 0; i < R; ++i) TANDEM_UNROLL for (int v = 0; v < 4; ++v)
      _mm512_mask_storeu_ps(y + i * ldy + 16 * v, mask[v], c[i][v]);
}

// Columns [p0, p0 + kc) of weight row r as f32 in tmp (or in place for f32). Needs p0 + kc <= k.
const float* row_f32(const weight_view& w, int64_t r, int64_t p0, int64_t kc, float* tmp) {
  const uint8_t* row = row_ptr(w, r);
  switch (w.type) {
    case dtype::f32: return reinterpret_cast<const float*>(row) + p0;
    case dtype::q4_0:
    case dtype::q4_k:
    case dtype::q5_k:
    case dtype::q6_k:  // matmul_dequantized takes these before any ISA path
      throw std::logic_error("row_f32: no direct path for " + std::string(to_string(w.type)));
    case dtype::f16:
      for (int64_t c = 0; c < kc; c += 16)
        _mm512_storeu_ps(tmp + c, load16<dtype::f16>(row, p0 + c, tail_mask(kc - c)));
      return tmp;
    case dtype::bf16:
      for (int64_t c = 0; c < kc; c += 16)
        _mm512_storeu_ps(tmp + c, load16<dtype::bf16>(row, p0 + c, tail_mask(kc - c)));
      return tmp;
    case dtype::q8_0: {  // p0 and kc are multiples of 32
      const auto* b = reinterpret_cast<const block_q8_0*>(row) + p0 / q8_0_block;
      for (int64_t i = 0; i < kc / q8_0_block; ++i) {
        const __m512 d = _mm512_set1_ps(_cvtsh_ss(b[i].d));
        for (int j = 0; j < 2; ++j) {
          const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b[i].qs + 16 * j));
          const __m512 v = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q));
          _mm512_storeu_ps(tmp + 32 * i + 16 * j, _mm512_mul_ps(d, v));
        }
      }
      return tmp;
    }
  }
  return tmp;
}

// dst[t * ld + r] = src[r][c + t] for a 16x16 block of 32-bit values:
// in-register transpose, a quarter of the stores of an element-wise scatter.
inline void transpose16(const uint32_t* const* src, int64_t c, uint32_t* dst, int64_t ld) {
  __m512 r[16], t[16];
  TANDEM_UNROLL for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(src[i] + c);
  TANDEM_UNROLL for (int i = 0; i < 16; i += 2) {  // interleave 32-bit elements of row pairs
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  TANDEM_UNROLL for (int i = 0; i < 16; i += 4)  // interleave 64-bit elements of pair pairs
      TANDEM_UNROLL for (int j = 0; j < 2; ++j) {
    const __m512d lo = _mm512_castps_pd(t[i + j]), hi = _mm512_castps_pd(t[i + j + 2]);
    r[i + 2 * j] = _mm512_castpd_ps(_mm512_unpacklo_pd(lo, hi));
    r[i + 2 * j + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(lo, hi));
  }
  TANDEM_UNROLL for (int i = 0; i < 8; ++i) {  // then 128-bit lanes, in two steps
    const int g = (i / 4) * 8, q = i % 4;
    t[2 * i] = _mm512_shuffle_f32x4(r[g + q], r[g + 4 + q], 0x88);
    t[2 * i + 1] = _mm512_shuffle_f32x4(r[g + q], r[g + 4 + q], 0xdd);
  }
  TANDEM_UNROLL for (int i = 0; i < 8; ++i) {
    r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
  }
  // r[i] now holds column (i & 8) | (i & 1) << 2 | (i >> 1 & 3).
  TANDEM_UNROLL for (int i = 0; i < 16; ++i) _mm512_storeu_ps(dst + ((i & 8) | (i & 1) << 2 | (i >> 1 & 3)) * ld, r[i]);
}

// Writes 16 rows of `units` 32-bit values into a packed panel: dst[c * NR + r] = rows[r][c].
void pack_group(const uint32_t* const* rows, int64_t units, uint32_t* dst) {
  int64_t c = 0;
  for (; c + 16 <= units; c += 16) transpose16(rows, c, dst + c * NR, NR);
  for (; c < units; ++c)
    for (int r = 0; r < 16; ++r) std::memcpy(dst + c * NR + r, rows[r] + c, 4);
}

// Packs weight rows [j0, j0 + nc) x columns [p0, p0 + kc) for kernel_f32:
// bp: [ceil(nc/64)][kc][64], rows past nc zero. tmp: 17 * kc floats.
void pack_f32(const weight_view& w, int64_t j0, int64_t nc, int64_t p0, int64_t kc, float* bp, float* tmp) {
  float* zero = tmp + 16 * kc;
  std::memset(zero, 0, size_t(kc) * 4);
  const uint32_t* rows[16];
  for (int64_t g = 0; g < (nc + NR - 1) / NR * NR; g += 16) {
    for (int r = 0; r < 16; ++r) {
      const float* src = g + r < nc ? row_f32(w, j0 + g + r, p0, kc, tmp + r * kc) : zero;
      rows[r] = reinterpret_cast<const uint32_t*>(src);
    }
    pack_group(rows, kc, reinterpret_cast<uint32_t*>(bp + (g / NR) * kc * NR + g % NR));
  }
}

// y[m, n] rows [r0, r1) of W against x[m, k] (rows at stride lda); y: [m, ldy].
void gemm_rows(const weight_view& w, const float* a, int64_t lda, int64_t m, float* y, int64_t ldy, int64_t r0,
               int64_t r1) {
  constexpr int64_t KC = KC_F32;
  const int64_t k = w.cols;
  auto* bp = static_cast<float*>(thread_scratch(scratch_panel, size_t(NC * KC) * 4));
  auto* tmp = static_cast<float*>(thread_scratch(scratch_tmp, size_t(17 * KC) * 4));
  for (int64_t jc = r0; jc < r1; jc += NC) {
    const int64_t nc = std::min(NC, r1 - jc);
    for (int64_t pc = 0; pc < k; pc += KC) {
      const int64_t kc = std::min(KC, k - pc);
      pack_f32(w, jc, nc, pc, kc, bp, tmp);
      for (int64_t jr = 0; jr < nc; jr += NR) {
        __mmask16 mask[4];
        for (int v = 0; v < 4; ++v) mask[v] = tail_mask(std::max<int64_t>(0, nc - jr - 16 * v));
        for (int64_t i = 0; i < m; i += MR) {
          float* yp = y + i * ldy + jc + jr;
          with_const<MR>(int(std::min<int64_t>(MR, m - i)), [&](auto rows) {
            kernel_f32<decltype(rows)::value>(a + i * lda + pc, lda, bp + jr * kc, kc, yp, ldy, mask, pc > 0);
          });
        }
      }
    }
  }
}

void prefill(const weight_view& w, const float* x, int64_t m, float* y, thread_pool& pool) {
  const int64_t k = w.cols, n = w.rows;
  if (n >= NR * pool.size()) {  // split weight rows: each is packed once
    pool.parallel_for(n, NR, [&](int64_t r0, int64_t r1, int) { gemm_rows(w, x, k, m, y, n, r0, r1); });
  } else {  // few weight rows: split the inputs
    pool.parallel_for(m, MR,
                      [&](int64_t i0, int64_t i1, int) { gemm_rows(w, x + i0 * k, k, i1 - i0, y + i0 * n, n, 0, n); });
  }
}

}  // namespace

void matmul_avx512(const weight_view& w, const float* x, int64_t m, float* y, thread_pool& pool, bool vnni_bf16,
                   bool gemm) {
  if (gemm) prefill(w, x, m, y, pool);
  else if (w.type == dtype::q8_0 && !vnni_bf16)  // no VNNI: the AVX2 integer kernel
    matmul_avx2(w, x, m, y, pool, false);
  else decode(w, x, m, y, pool);
}

}  // namespace tandem::kernels::cpu::detail
