// The batch-invariant matmul at GEMM speed (AVX-512 with VNNI and BF16).
//
// Weights are repacked once, at load, into panels of 64 output rows (pack_panels), and one
// register-blocked microkernel per weight type serves every m: a prefill of 512 rows runs it
// on 6 rows at a time (4 for q8_0), a decode step on 1. Each output element is one reduction
// whose order is fixed by k alone:
//   f32:  one FMA chain over k, in order (the chain crosses k blocks through y, stored and
//         reloaded exactly);
//   bf16: x rounded to bf16 for every m, one vdpbf16ps chain over k pairs, in order;
//   q8_0: x quantized per 32-block for every m (q8_0 with an f32 scale), each block's dot
//         product in int32 with vpdpbusd (exact, so its order cannot matter), then one FMA
//         chain over blocks: acc = fma(float(isum), d_w * d_x, acc).
// Neither m, nor the row's place in a microkernel tile, nor how panels or rows are split over
// threads changes any of these, so a token's output row is bitwise the same in a prefill of
// any length, a chunk, or a decode batch of any size (matmul_mode::batch_invariant).
//
// Panel layouts (64-byte aligned, panels contiguous; rows past w.rows are zero):
//   f32:  [k][64] f32                      (one k step: 4 zmm of 16 output rows)
//   bf16: [ceil(k/2)][64][2] bf16          (k pairs, as vdpbf16ps takes them)
//   q8_0: [k/32] blocks of { u8 [8][64][4]: w + 128, k groups of 4 as vpdpbusd takes them;
//                            f16 [64]: the rows' scales }  = 2176 bytes, the same as 64 rows
//         of the file's blocks, so decode streams no more bytes than the file holds.
// (vpdpbusd multiplies u8 by s8: w + 128 is the u8 side, and -128 * sum(x) per block, the
// bias, makes the sum exact again.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cpu/matmul_impl.h"

#define VNNI_BF16 __attribute__((target("avx512vnni,avx512bf16")))

namespace tandem::kernels::cpu::detail {
namespace {

constexpr int64_t PR = panel_rows;                  // output rows per panel
constexpr int64_t q8_block_bytes = PR * 32 + PR * 2;  // one k block of a q8_0 panel
constexpr int64_t q8_scale_offset = PR * 32;

inline __mmask16 tail_mask(int64_t n) { return n >= 16 ? 0xffff : n <= 0 ? 0 : __mmask16((1u << n) - 1); }

// ---------------------------------------------------------------- packing (once, at load)

void pack_f32_panel(const weight_view& w, int64_t j0, float* dst) {
  const int64_t k = w.cols;
  std::vector<float> row(static_cast<size_t>(k));
  for (int64_t c = 0; c < PR; ++c) {
    if (j0 + c < w.rows) dequantize_row(w.type, row_ptr(w, j0 + c), row.data(), k);
    else std::fill(row.begin(), row.end(), 0.0f);
    for (int64_t p = 0; p < k; ++p) dst[p * PR + c] = row[size_t(p)];
  }
}

void pack_bf16_panel(const weight_view& w, int64_t j0, uint16_t* dst) {
  const int64_t k = w.cols, kp = (k + 1) / 2;
  for (int64_t c = 0; c < PR; ++c) {
    const auto* src = j0 + c < w.rows ? reinterpret_cast<const uint16_t*>(row_ptr(w, j0 + c)) : nullptr;
    for (int64_t p = 0; p < 2 * kp; ++p) dst[(p / 2) * PR * 2 + c * 2 + p % 2] = src && p < k ? src[p] : 0;
  }
}

void pack_q8_panel(const weight_view& w, int64_t j0, uint8_t* dst) {
  const int64_t nb = w.cols / q8_0_block;
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t* blk = dst + b * q8_block_bytes;
    auto* scales = reinterpret_cast<uint16_t*>(blk + q8_scale_offset);
    for (int64_t c = 0; c < PR; ++c) {
      const block_q8_0* src =
          j0 + c < w.rows ? reinterpret_cast<const block_q8_0*>(row_ptr(w, j0 + c)) + b : nullptr;
      scales[c] = src ? src->d : 0;
      for (int g = 0; g < 8; ++g)
        for (int e = 0; e < 4; ++e)
          blk[(g * PR + c) * 4 + e] = uint8_t(int(src ? src->qs[4 * g + e] : 0) + 128);
    }
  }
}

// ---------------------------------------------------------------- microkernels

// y[R, 16V] (+)= a[R, kc] · panel, f32: one FMA chain per element. a: rows at stride lda;
// b: the panel at its k step p0 ([kc][64]); y's columns outside `mask` are neither read nor
// written.
template <int R, int V>
void kernel_f32(const float* a, int64_t lda, const float* b, int64_t kc, float* y, int64_t ldy,
                const __mmask16* mask, bool accumulate) {
  __m512 c[R][V];
  TANDEM_UNROLL for (int i = 0; i < R; ++i)
    TANDEM_UNROLL for (int v = 0; v < V; ++v)
      c[i][v] = accumulate ? _mm512_maskz_loadu_ps(mask[v], y + i * ldy + 16 * v) : _mm512_setzero_ps();
  for (int64_t p = 0; p < kc; ++p) {
    __m512 bv[V];
    TANDEM_UNROLL for (int v = 0; v < V; ++v) bv[v] = _mm512_load_ps(b + p * PR + 16 * v);
    TANDEM_UNROLL for (int i = 0; i < R; ++i) {
      const __m512 av = _mm512_set1_ps(a[i * lda + p]);
      TANDEM_UNROLL for (int v = 0; v < V; ++v) c[i][v] = _mm512_fmadd_ps(av, bv[v], c[i][v]);
    }
  }
  TANDEM_UNROLL for (int i = 0; i < R; ++i)
    TANDEM_UNROLL for (int v = 0; v < V; ++v) _mm512_mask_storeu_ps(y + i * ldy + 16 * v, mask[v], c[i][v]);
}

// As kernel_f32 for bf16: a is x rounded to bf16 (k pairs at stride lda), b: [kc/2][64][2].
template <int R, int V>
VNNI_BF16 void kernel_bf16(const uint16_t* a, int64_t lda, const uint16_t* b, int64_t kc, float* y,
                           int64_t ldy, const __mmask16* mask, bool accumulate) {
  __m512 c[R][V];
  TANDEM_UNROLL for (int i = 0; i < R; ++i)
    TANDEM_UNROLL for (int v = 0; v < V; ++v)
      c[i][v] = accumulate ? _mm512_maskz_loadu_ps(mask[v], y + i * ldy + 16 * v) : _mm512_setzero_ps();
  for (int64_t p = 0; p < kc; p += 2) {
    __m512bh bv[V];
    TANDEM_UNROLL for (int v = 0; v < V; ++v) bv[v] = (__m512bh)_mm512_load_si512(b + p * PR + 32 * v);
    TANDEM_UNROLL for (int i = 0; i < R; ++i) {
      uint32_t pair;
      std::memcpy(&pair, a + i * lda + p, 4);
      const __m512bh av = (__m512bh)_mm512_set1_epi32(int(pair));
      TANDEM_UNROLL for (int v = 0; v < V; ++v) c[i][v] = _mm512_dpbf16_ps(c[i][v], av, bv[v]);
    }
  }
  TANDEM_UNROLL for (int i = 0; i < R; ++i)
    TANDEM_UNROLL for (int v = 0; v < V; ++v) _mm512_mask_storeu_ps(y + i * ldy + 16 * v, mask[v], c[i][v]);
}

// x quantized for kernel_q8, per row: q: [nb][32] s8, d: [nb] f32 scales, bias: [nb] int32
// (-128 * sum of the block's q). The same quantization as the rows-layout VNNI decode kernel.
struct q8_x {
  const int8_t* q;
  const float* d;
  const int32_t* bias;
  int64_t nb;  // blocks per row (row stride of q is nb * 32, of d and bias nb)
};

// y[R, 16V] (+)= x[R] · panel columns [16 v0, 16 (v0 + V)), over blocks [b0, b0 + nbk).
// panel points at block b0 of the panel.
template <int R, int V>
VNNI_BF16 void kernel_q8(const q8_x& x, int64_t i0, int64_t b0, const uint8_t* panel, int64_t nbk, int v0,
                         float* y, int64_t ldy, const __mmask16* mask, bool accumulate) {
  __m512 acc[R][V];
  TANDEM_UNROLL for (int i = 0; i < R; ++i)
    TANDEM_UNROLL for (int v = 0; v < V; ++v)
      acc[i][v] = accumulate ? _mm512_maskz_loadu_ps(mask[v], y + i * ldy + 16 * v) : _mm512_setzero_ps();
  for (int64_t b = 0; b < nbk; ++b) {
    const uint8_t* blk = panel + b * q8_block_bytes;
    const int64_t xb = b0 + b;
    __m512i s[R][V];
    TANDEM_UNROLL for (int i = 0; i < R; ++i) {
      const __m512i bias = _mm512_set1_epi32(x.bias[(i0 + i) * x.nb + xb]);
      TANDEM_UNROLL for (int v = 0; v < V; ++v) s[i][v] = bias;
    }
    TANDEM_UNROLL for (int g = 0; g < 8; ++g) {
      __m512i wv[V];
      TANDEM_UNROLL for (int v = 0; v < V; ++v) wv[v] = _mm512_load_si512(blk + (g * PR + 16 * (v0 + v)) * 4);
      TANDEM_UNROLL for (int i = 0; i < R; ++i) {
        int32_t four;
        std::memcpy(&four, x.q + ((i0 + i) * x.nb + xb) * 32 + 4 * g, 4);
        const __m512i xv = _mm512_set1_epi32(four);
        TANDEM_UNROLL for (int v = 0; v < V; ++v) s[i][v] = _mm512_dpbusd_epi32(s[i][v], wv[v], xv);
      }
    }
    __m512 dw[V];
    TANDEM_UNROLL for (int v = 0; v < V; ++v)
      dw[v] = _mm512_cvtph_ps(_mm256_load_si256(
          reinterpret_cast<const __m256i*>(blk + q8_scale_offset + 32 * (v0 + v))));
    TANDEM_UNROLL for (int i = 0; i < R; ++i) {
      const __m512 dx = _mm512_set1_ps(x.d[(i0 + i) * x.nb + xb]);
      TANDEM_UNROLL for (int v = 0; v < V; ++v)
        acc[i][v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[i][v]), _mm512_mul_ps(dw[v], dx), acc[i][v]);
    }
  }
  TANDEM_UNROLL for (int i = 0; i < R; ++i)
    TANDEM_UNROLL for (int v = 0; v < V; ++v) _mm512_mask_storeu_ps(y + i * ldy + 16 * v, mask[v], acc[i][v]);
}

// ---------------------------------------------------------------- drivers

constexpr int MR_FLOAT = 6;     // x rows per float microkernel (6 x 4 zmm accumulators)
constexpr int MR_Q8 = 4;        // x rows per q8_0 microkernel (4 x 2 int + 4 x 2 float zmm)
constexpr int64_t KC_F32 = 256;   // k per pass over a panel: [256][64] f32 = 64 KiB, from L2
constexpr int64_t KC_BF16 = 512;  // [256][64][2] bf16 = 64 KiB
constexpr int64_t KB_Q8 = 16;     // blocks per pass: 16 x 2176 bytes = 34 KiB

// Column masks of the four 16-row vectors of the panel starting at row j0.
void panel_masks(const weight_view& w, int64_t j0, __mmask16* mask) {
  for (int v = 0; v < 4; ++v) mask[v] = tail_mask(w.rows - j0 - 16 * v);
}

// Rows [i0, i1) of x against panels [p0, p1) of w. a: x as the kernel reads it.
template <dtype T>
void run_block(const weight_view& w, const void* a, int64_t lda, const q8_x* xq, int64_t i0, int64_t i1,
               float* y, int64_t p0, int64_t p1) {
  const int64_t k = w.cols, n = w.rows, pbytes = panel_bytes(T, k);
  const auto* base = static_cast<const uint8_t*>(w.panels);
  for (int64_t pj = p0; pj < p1; ++pj) {
    const uint8_t* panel = base + pj * pbytes;
    const int64_t j0 = pj * PR;
    __mmask16 mask[4];
    panel_masks(w, j0, mask);
    if constexpr (T == dtype::q8_0) {
      const int64_t nb = k / q8_0_block;
      for (int64_t b0 = 0; b0 < nb; b0 += KB_Q8) {
        const int64_t nbk = std::min(KB_Q8, nb - b0);
        for (int64_t i = i0; i < i1; i += MR_Q8) {
          float* yp = y + i * n + j0;
          with_const<MR_Q8>(int(std::min<int64_t>(MR_Q8, i1 - i)), [&](auto rows) {
            constexpr int R = decltype(rows)::value;
            for (int half = 0; half < 2; ++half)
              if (mask[2 * half])
                kernel_q8<R, 2>(*xq, i, b0, panel + b0 * q8_block_bytes, nbk, 2 * half, yp + 32 * half, n,
                                mask + 2 * half, b0 > 0);
          });
        }
      }
    } else {
      constexpr int64_t KC = T == dtype::f32 ? KC_F32 : KC_BF16;
      const int64_t kk = T == dtype::f32 ? k : k + (k & 1);
      for (int64_t pc = 0; pc < kk; pc += KC) {
        const int64_t kc = std::min(KC, kk - pc);
        for (int64_t i = i0; i < i1; i += MR_FLOAT) {
          float* yp = y + i * n + j0;
          with_const<MR_FLOAT>(int(std::min<int64_t>(MR_FLOAT, i1 - i)), [&](auto rows) {
            constexpr int R = decltype(rows)::value;
            if constexpr (T == dtype::f32)
              kernel_f32<R, 4>(static_cast<const float*>(a) + i * lda + pc, lda,
                               reinterpret_cast<const float*>(panel) + pc * PR, kc, yp, n, mask, pc > 0);
            else
              kernel_bf16<R, 4>(static_cast<const uint16_t*>(a) + i * lda + pc, lda,
                                reinterpret_cast<const uint16_t*>(panel) + pc * PR, kc, yp, n, mask, pc > 0);
          });
        }
      }
    }
  }
}

// x: [m, k] f32 -> xb: [m, lda] bf16 (nearest even), zero-padded to lda.
VNNI_BF16 void x_to_bf16(const float* x, int64_t k, int64_t lda, uint16_t* xb) {
  for (int64_t c = 0; c < k; c += 16) {
    const __mmask16 mk = tail_mask(k - c);
    const __m256bh h = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mk, x + c));
    _mm256_mask_storeu_epi16(xb + c, mk, (__m256i)h);
  }
  for (int64_t c = k; c < lda; ++c) xb[c] = 0;
}

template <dtype T>
void run_panels(const weight_view& w, const float* x, int64_t m, float* y, thread_pool& pool) {
  const int64_t k = w.cols, np = (w.rows + PR - 1) / PR;
  const void* a = x;
  int64_t lda = k;
  q8_x xq{};
  // x in the form the kernel reads, once per call in the calling thread's scratch (workers
  // only read it). Rows are converted independently: the same row gives the same bytes.
  auto convert = [&](auto&& row_fn) {
    if (m * k < (int64_t(1) << 14) || pool.size() == 1) return row_fn(int64_t(0), m);
    pool.parallel_for(m, 16, [&](int64_t r0, int64_t r1, int) { row_fn(r0, r1); });
  };
  if constexpr (T == dtype::bf16) {
    lda = k + (k & 1);
    auto* xb = static_cast<uint16_t*>(thread_scratch(scratch_x, size_t(m * lda) * 2));
    convert([&](int64_t r0, int64_t r1) {
      for (int64_t i = r0; i < r1; ++i) x_to_bf16(x + i * k, k, lda, xb + i * lda);
    });
    a = xb;
  } else if constexpr (T == dtype::q8_0) {
    const int64_t nb = k / q8_0_block;
    auto* buf = static_cast<uint8_t*>(thread_scratch(scratch_x, size_t(m * nb) * (32 + 4 + 4)));
    auto* q = reinterpret_cast<int8_t*>(buf);
    auto* d = reinterpret_cast<float*>(buf + m * nb * 32);
    auto* bias = reinterpret_cast<int32_t*>(buf + m * nb * 36);
    convert([&](int64_t r0, int64_t r1) {
      for (int64_t i = r0; i < r1; ++i) {
        quantize_x_q8_avx2(x + i * k, k, q + i * nb * 32, d + i * nb);
        for (int64_t b = 0; b < nb; ++b) {
          int32_t sum = 0;
          for (int j = 0; j < 32; ++j) sum += q[(i * nb + b) * 32 + j];
          bias[i * nb + b] = -128 * sum;
        }
      }
    });
    xq = {q, d, bias, nb};
  }
  const int threads = pool.size();
  // Few panels and many rows: split the rows (stories260K-sized matrices in a prefill).
  // Otherwise split panels; in decode each slice is at least 128 KiB of weights, so that
  // waking a thread pays off (as decode_grain).
  const int64_t mr = T == dtype::q8_0 ? MR_Q8 : MR_FLOAT;
  if (np < threads && m >= 2 * mr) {
    pool.parallel_for(m, mr, [&](int64_t i0, int64_t i1, int) { run_block<T>(w, a, lda, &xq, i0, i1, y, 0, np); });
    return;
  }
  const int64_t parts =
      m > 8 ? threads : std::clamp<int64_t>(np * panel_bytes(T, k) / (int64_t(1) << 17), 1, threads);
  pool.parallel_for(np, (np + parts - 1) / parts,
                    [&](int64_t p0, int64_t p1, int) { run_block<T>(w, a, lda, &xq, 0, m, y, p0, p1); });
}

}  // namespace

bool has_panels(dtype t) { return t == dtype::f32 || t == dtype::bf16 || t == dtype::q8_0; }

int64_t panel_bytes(dtype t, int64_t k) {
  switch (t) {
    case dtype::f32: return k * PR * 4;
    case dtype::bf16: return (k + 1) / 2 * PR * 4;
    case dtype::q8_0: return k / q8_0_block * q8_block_bytes;
    case dtype::f16:
    case dtype::q4_0:
    case dtype::q4_k:
    case dtype::q5_k:
    case dtype::q6_k: return 0;
  }
  return 0;
}

void pack_panels(const weight_view& w, void* dst) {
  const int64_t np = (w.rows + PR - 1) / PR, pb = panel_bytes(w.type, w.cols);
  auto* out = static_cast<uint8_t*>(dst);
  for (int64_t p = 0; p < np; ++p) {
    switch (w.type) {
      case dtype::f32: pack_f32_panel(w, p * PR, reinterpret_cast<float*>(out + p * pb)); break;
      case dtype::bf16: pack_bf16_panel(w, p * PR, reinterpret_cast<uint16_t*>(out + p * pb)); break;
      case dtype::q8_0: pack_q8_panel(w, p * PR, out + p * pb); break;
      case dtype::f16:
      case dtype::q4_0:
      case dtype::q4_k:
      case dtype::q5_k:
      case dtype::q6_k: break;
    }
  }
}

void matmul_panels(const weight_view& w, const float* x, int64_t m, float* y, thread_pool& pool) {
  switch (w.type) {
    case dtype::f32: return run_panels<dtype::f32>(w, x, m, y, pool);
    case dtype::bf16: return run_panels<dtype::bf16>(w, x, m, y, pool);
    case dtype::q8_0: return run_panels<dtype::q8_0>(w, x, m, y, pool);
    case dtype::f16:
    case dtype::q4_0:
    case dtype::q4_k:
    case dtype::q5_k:
    case dtype::q6_k: break;
  }
}

}  // namespace tandem::kernels::cpu::detail
