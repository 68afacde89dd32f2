// The batch-invariant matmul at GEMM speed (AVX-512 with VNNI and BF16).
//
// Weights are repacked once, at load, into panels of 64 output rows (pack_panels), and one
// register-blocked microkernel per weight type serves every m: a prefill of 512 rows runs it
// on 6 rows at a time (4 for q8_0), a decode step on 1. Each output element is one reduction
// whose order is fixed by k alone:
//   f32:  one FMA chain over k, in order (the chain crosses k blocks through y, stored and
//         reloaded exactly); f16 the same, each weight widened to f32 (exactly) as it is loaded;
//   bf16: x rounded to bf16 for every m, one vdpbf16ps chain over k pairs, in order;
//   q8_0: x quantized per 32-block for every m (as ggml's Q8_0), each block's dot
//         product in int32 with vpdpbusd (exact, so its order cannot matter), then one FMA
//         chain over blocks: acc = fma(float(isum), d_w * d_x, acc).
// Neither m, nor the row's place in a microkernel tile, nor how panels or rows are split over
// threads changes any of these, so a token's output row is bitwise the same in a prefill of
// any length, a chunk, or a decode batch of any size (matmul_mode::batch_invariant).
//
// Panel layouts (64-byte aligned, panels contiguous; rows past w.rows are zero):
//   f32:  [k][64] f32                      (one k step: 4 zmm of 16 output rows)
//   f16:  [k][64] f16                      (the file's bits; one k step: 4 ymm)
//   bf16: [ceil(k/2)][64][2] bf16          (k pairs, as vdpbf16ps takes them)
//   q8_0: [k/32] blocks of { u8 [8][64][4]: w + 128, k groups of 4 as vpdpbusd takes them;
//                            f16 [64]: the rows' scales }  = 2176 bytes, the same as 64 rows
//         of the file's blocks, so decode streams no more bytes than the file holds.
//   q4_k: [k/256] super-blocks of { u8 [4][8][64][4]: the file's nibble bytes, for sub-block
//                                   pair g and k group e of 4: low nibbles are sub-block 2g,
//                                   high ones 2g+1;
//                                   u8 [8][64] scales, u8 [8][64] mins (6 bits each);
//                                   f16 [64] d, f16 [64] dmin }  = 9472 bytes (file: 9216).
//         x is quantized per 256 as ggml's Q8_K (its one scale repeated in each 32-block's
//         entry); each sub-block j's dot product is exact in int32
//         (vpdpbusd of the nibbles, u8 0..15, by x's s8), then one FMA chain per element:
//         acc = fma(float(isum_j), d*sc_j * d_x, acc); acc = fnmadd(dmin*m_j * d_x, float(sum_x), acc).
//   q4_0: [k/32] blocks of { u8 [4][64][4]: the file's nibble bytes (low: k 4e.., high:
//                            16 + 4e..); f16 [64] d } = 1152 bytes (file: the same). q in 0..15
//         is u8 for vpdpbusd; sum(q * x) - 8 * sum(x) is exact, then acc = fma(., d * d_x, acc).
//   q5_k: q4_k's planes plus u8 [8][64][4] qh (the fifth bits: bit 2g of k 64g + 4e.., bit
//         2g + 1 of k 64g + 32 + 4e..) = 11520 bytes (file: 11264); otherwise as q4_k.
//   q6_k: [k/256] super-blocks of { u8 [2][8][64][4] ql (low nibbles: k 4e.. and 64+4e..),
//                                   u8 [2][8][64][4] ql (k 32+4e.. and 96+4e..), u8 [2][8][64][4]
//                                   qh (2 high bits of each of those four), per 128-half h and
//                                   k group e; i8 [16][64] scales; f16 [64] d } = 13440 bytes
//         (file: the same). q in 0..63 is u8 for vpdpbusd; each 16-sub-block's
//         sum(q * x) - 32 * sum(x) is exact in int32, and so is the sum over the two sub-blocks
//         of one x 32-block scaled by their sc_j; then acc = fma(float(that), d * d_x, acc).
// (vpdpbusd multiplies u8 by s8: w + 128 is the u8 side, and -128 * sum(x) per block, the
// bias, makes the sum exact again.)

#include <algorithm>
#include <cstring>
#include <span>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "kernels/cpu/simd.h"
#include "kernels/cpu/matmul_impl.h"

#define VNNI_BF16 __attribute__((target("avx512vnni,avx512bf16")))

namespace tandem::kernels::cpu::detail {
namespace {

constexpr int64_t PR = panel_rows;  // output rows per panel
constexpr int64_t q8_block_bytes = PR * 32 + PR * 2;  // one k block of a q8_0 panel
constexpr int64_t q8_scale_offset = PR * 32;

// q4_k super-block panel: nibbles, scales, mins, d, dmin (offsets within one super-block).
constexpr int64_t q4k_nib_bytes = 4 * 8 * PR * 4;
constexpr int64_t q4k_sc_offset = q4k_nib_bytes;
constexpr int64_t q4k_mn_offset = q4k_sc_offset + 8 * PR;
constexpr int64_t q4k_d_offset = q4k_mn_offset + 8 * PR;
constexpr int64_t q4k_dmin_offset = q4k_d_offset + 2 * PR;
constexpr int64_t q4k_block_bytes = q4k_dmin_offset + 2 * PR;
static_assert(q4k_block_bytes == 9472 && q4k_block_bytes % 64 == 0);

constexpr int64_t q40_block_bytes = PR * 16 + PR * 2;  // one 32-block of a q4_0 panel
constexpr int64_t q40_d_offset = PR * 16;
static_assert(q40_block_bytes % 64 == 0);
// q5_k: q4_k's layout, then the qh plane.
constexpr int64_t q5k_qh_offset = 9472;
constexpr int64_t q5k_block_bytes = q5k_qh_offset + 8 * PR * 4;
static_assert(q5k_block_bytes == 11520);

// q6_k super-block panel: the two ql planes, qh, scales, d.
constexpr int64_t q6k_plane_bytes = 2 * 8 * PR * 4;
constexpr int64_t q6k_b_offset = q6k_plane_bytes;
constexpr int64_t q6k_h_offset = 2 * q6k_plane_bytes;
constexpr int64_t q6k_sc_offset = 3 * q6k_plane_bytes;
constexpr int64_t q6k_d_offset = q6k_sc_offset + 16 * PR;
constexpr int64_t q6k_block_bytes = q6k_d_offset + 2 * PR;
static_assert(q6k_block_bytes == 13440 && q6k_block_bytes % 64 == 0);

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

void pack_f16_panel(const weight_view& w, int64_t j0, uint16_t* dst) {
  const int64_t k = w.cols;
  for (int64_t c = 0; c < PR; ++c) {
    const auto* src = j0 + c < w.rows ? reinterpret_cast<const uint16_t*>(row_ptr(w, j0 + c)) : nullptr;
    for (int64_t p = 0; p < k; ++p) dst[p * PR + c] = src ? src[p] : 0;
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
      const block_q8_0* src = j0 + c < w.rows ? reinterpret_cast<const block_q8_0*>(row_ptr(w, j0 + c)) + b : nullptr;
      scales[c] = src ? src->d : 0;
      for (int g = 0; g < 8; ++g)
        for (int e = 0; e < 4; ++e) blk[(g * PR + c) * 4 + e] = uint8_t(int(src ? src->qs[4 * g + e] : 0) + 128);
    }
  }
}

void pack_q40_panel(const weight_view& w, int64_t j0, uint8_t* dst) {
  const int64_t nb = w.cols / q4_0_block;
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t* blk = dst + b * q40_block_bytes;
    auto* d = reinterpret_cast<uint16_t*>(blk + q40_d_offset);
    for (int64_t c = 0; c < PR; ++c) {
      const block_q4_0* src = j0 + c < w.rows ? reinterpret_cast<const block_q4_0*>(row_ptr(w, j0 + c)) + b : nullptr;
      d[c] = src ? src->d : 0;
      for (int e = 0; e < 4; ++e)
        for (int l = 0; l < 4; ++l) blk[(e * PR + c) * 4 + l] = src ? src->qs[4 * e + l] : 0x88;  // zero: q = 8
    }
  }
}

// q4_k and q5_k: the nibble planes, scales and mins from qs/scales (the two blocks agree up to
// qh), then for q5_k the qh plane.
template <class Block>
void pack_k4_planes(const weight_view& w, int64_t j0, uint8_t* dst, int64_t block_bytes) {
  const int64_t nb = w.cols / qk_k;
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t* blk = dst + b * block_bytes;
    auto* d = reinterpret_cast<uint16_t*>(blk + q4k_d_offset);
    auto* dmin = reinterpret_cast<uint16_t*>(blk + q4k_dmin_offset);
    for (int64_t c = 0; c < PR; ++c) {
      const Block* src = j0 + c < w.rows ? reinterpret_cast<const Block*>(row_ptr(w, j0 + c)) + b : nullptr;
      d[c] = src ? src->d : 0;
      dmin[c] = src ? src->dmin : 0;
      for (int j = 0; j < 8; ++j) {
        uint8_t sc = 0, m = 0;
        if (src) k4_scale_min(j, src->scales, sc, m);
        blk[q4k_sc_offset + j * PR + c] = sc;
        blk[q4k_mn_offset + j * PR + c] = m;
      }
      for (int g = 0; g < 4; ++g)
        for (int e = 0; e < 8; ++e)
          for (int l = 0; l < 4; ++l) blk[((g * 8 + e) * PR + c) * 4 + l] = src ? src->qs[32 * g + 4 * e + l] : 0;
      if constexpr (std::is_same_v<Block, block_q5_k>)
        for (int e = 0; e < 8; ++e)
          for (int l = 0; l < 4; ++l) blk[q5k_qh_offset + (e * PR + c) * 4 + l] = src ? src->qh[4 * e + l] : 0;
    }
  }
}

void pack_q6k_panel(const weight_view& w, int64_t j0, uint8_t* dst) {
  const int64_t nb = w.cols / qk_k;
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t* blk = dst + b * q6k_block_bytes;
    auto* d = reinterpret_cast<uint16_t*>(blk + q6k_d_offset);
    for (int64_t c = 0; c < PR; ++c) {
      const block_q6_k* src = j0 + c < w.rows ? reinterpret_cast<const block_q6_k*>(row_ptr(w, j0 + c)) + b : nullptr;
      d[c] = src ? src->d : 0;
      for (int j = 0; j < 16; ++j) blk[q6k_sc_offset + j * PR + c] = src ? uint8_t(src->scales[j]) : 0;
      for (int h = 0; h < 2; ++h)
        for (int e = 0; e < 8; ++e)
          for (int l = 0; l < 4; ++l) {
            const int64_t at = ((h * 8 + e) * PR + c) * 4 + l;
            blk[at] = src ? src->ql[64 * h + 4 * e + l] : 0;
            blk[q6k_b_offset + at] = src ? src->ql[64 * h + 32 + 4 * e + l] : 0;
            blk[q6k_h_offset + at] = src ? src->qh[32 * h + 4 * e + l] : 0x00;
          }
    }
  }
}

// ---------------------------------------------------------------- microkernels

// A panel's 16 weights at p as f32: f32 as stored, f16 widened (exactly).
inline __m512 load_weights(const float* p) { return _mm512_load_ps(p); }
inline __m512 load_weights(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(p)));
}

// y[R, 16V] (+)= a[R, kc] · panel, f32 or f16 weights: one FMA chain per element. a: rows at
// stride lda; b: the panel at its k step p0 ([kc][64]); y's columns outside `mask` are neither
// read nor written.
template <int R, int V, class W>
void kernel_float(const float* a, int64_t lda, const W* b, int64_t kc, float* y, int64_t ldy, const __mmask16* mask,
                  bool accumulate) {
  __m512 c[R][V];
  TANDEM_UNROLL for (int i = 0; i < R; ++i) TANDEM_UNROLL for (int v = 0; v < V; ++v) c[i][v] =
      accumulate ? _mm512_maskz_loadu_ps(mask[v], y + i * ldy + 16 * v) : _mm512_setzero_ps();
  for (int64_t p = 0; p < kc; ++p) {
    __m512 bv[V];
    TANDEM_UNROLL for (int v = 0; v < V; ++v) bv[v] = load_weights(b + p * PR + 16 * v);
    TANDEM_UNROLL for (int i = 0; i < R; ++i) {
      const __m512 av = _mm512_set1_ps(a[i * lda + p]);
      TANDEM_UNROLL for (int v = 0; v < V; ++v) c[i][v] = _mm512_fmadd_ps(av, bv[v], c[i][v]);
    }
  }
  TANDEM_UNROLL for (int i = 0; i < R; ++i) TANDEM_UNROLL for (int v = 0; v < V; ++v)
      _mm512_mask_storeu_ps(y + i * ldy + 16 * v, mask[v], c[i][v]);
}

// As kernel_float for bf16: a is x rounded to bf16 (k pairs at stride lda), b: [kc/2][64][2].
template <int R, int V>
VNNI_BF16 void kernel_bf16(const uint16_t* a, int64_t lda, const uint16_t* b, int64_t kc, float* y, int64_t ldy,
                           const __mmask16* mask, bool accumulate) {
  __m512 c[R][V];
  TANDEM_UNROLL for (int i = 0; i < R; ++i) TANDEM_UNROLL for (int v = 0; v < V; ++v) c[i][v] =
      accumulate ? _mm512_maskz_loadu_ps(mask[v], y + i * ldy + 16 * v) : _mm512_setzero_ps();
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
  TANDEM_UNROLL for (int i = 0; i < R; ++i) TANDEM_UNROLL for (int v = 0; v < V; ++v)
      _mm512_mask_storeu_ps(y + i * ldy + 16 * v, mask[v], c[i][v]);
}

// x quantized for kernel_q8, per row: q: [nb][32] s8, d: [nb] f32 scales, bias: [nb] int32
// (-128 * sum of the block's q). The same quantization as the rows-layout VNNI decode kernel.
struct q8_x {
  const int8_t* q;
  const float* d;
  const int32_t* bias;  // -128 * sum of the block's q (q8_0's u8 offset)
  int64_t nb;  // blocks per row (row stride of q is nb * 32, of d and bias nb)
  const int32_t* sum16 = nullptr;  // q6_k: the sum of q over each half block, [m][2 nb]
};

// y[R, 16V] (+)= x[R] · panel columns [16 v0, 16 (v0 + V)), over blocks [b0, b0 + nbk).
// panel points at block b0 of the panel.
template <int R, int V>
VNNI_BF16 void kernel_q8(const q8_x& x, int64_t i0, int64_t b0, const uint8_t* panel, int64_t nbk, int v0, float* y,
                         int64_t ldy, const __mmask16* mask, bool accumulate) {
  __m512 acc[R][V];
  TANDEM_UNROLL for (int i = 0; i < R; ++i) TANDEM_UNROLL for (int v = 0; v < V; ++v) acc[i][v] =
      accumulate ? _mm512_maskz_loadu_ps(mask[v], y + i * ldy + 16 * v) : _mm512_setzero_ps();
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
    TANDEM_UNROLL for (int v = 0; v < V; ++v) dw[v] =
        _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(blk + q8_scale_offset + 32 * (v0 + v))));
    TANDEM_UNROLL for (int i = 0; i < R; ++i) {
      const __m512 dx = _mm512_set1_ps(x.d[(i0 + i) * x.nb + xb]);
      TANDEM_UNROLL for (int v = 0; v < V; ++v) acc[i][v] =
          _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[i][v]), _mm512_mul_ps(dw[v], dx), acc[i][v]);
    }
  }
  TANDEM_UNROLL for (int i = 0; i < R; ++i) TANDEM_UNROLL for (int v = 0; v < V; ++v)
      _mm512_mask_storeu_ps(y + i * ldy + 16 * v, mask[v], acc[i][v]);
}

// ---------------------------------------------------------------- drivers

// y[R, 16V] (+)= x[R, k] · the 16-row quarters [v0, v0 + V) of a q4_k panel, super-blocks
// [s0, s0 + nsb); y's rows at stride ldy, quarter v's columns at y + 16 v under mask[v]. Each
// output lane's arithmetic is the same whatever R and V are: decode (R = 1) reads all four
// quarters of a panel in one pass (contiguous 256-byte groups), a prefill one quarter per pass.
// Q5 (q5_k): the same with the fifth bits ORed in (16 where set), from the qh plane.
template <int R, int V, bool Q5 = false>
VNNI_BF16 void kernel_q4k(const q8_x& x, int64_t i0, int64_t s0, const uint8_t* panel, int64_t nsb, int v0, float* y,
                          int64_t ldy, const __mmask16* mask, bool accumulate) {
  constexpr int64_t block_bytes = Q5 ? q5k_block_bytes : q4k_block_bytes;
  const __m512i low4 = _mm512_set1_epi8(0x0F), bit4 = _mm512_set1_epi8(0x10);
  __m512 acc[R][V];
  TANDEM_UNROLL for (int i = 0; i < R; ++i) TANDEM_UNROLL for (int v = 0; v < V; ++v) acc[i][v] =
      accumulate ? _mm512_maskz_loadu_ps(mask[v], y + i * ldy + 16 * v) : _mm512_setzero_ps();
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const uint8_t* blk = panel + sb * block_bytes;
    for (int g = 0; g < 4; ++g) {
      __m512i slo[R][V], shi[R][V];
      TANDEM_UNROLL for (int i = 0; i < R; ++i) TANDEM_UNROLL for (int v = 0; v < V; ++v) slo[i][v] = shi[i][v] =
          _mm512_setzero_si512();
      const int64_t xb = (s0 + sb) * 8 + 2 * g;  // x's 32-blocks of sub-blocks 2g and 2g + 1
      TANDEM_UNROLL for (int e = 0; e < 8; ++e) {
        __m512i xa[R], xc[R];
        TANDEM_UNROLL for (int i = 0; i < R; ++i) {
          int32_t a, b;
          std::memcpy(&a, x.q + ((i0 + i) * x.nb + xb) * 32 + 4 * e, 4);
          std::memcpy(&b, x.q + ((i0 + i) * x.nb + xb + 1) * 32 + 4 * e, 4);
          xa[i] = _mm512_set1_epi32(a);
          xc[i] = _mm512_set1_epi32(b);
        }
        TANDEM_UNROLL for (int v = 0; v < V; ++v) {
          const __m512i raw = _mm512_load_si512(blk + ((g * 8 + e) * PR + 16 * (v0 + v)) * 4);
          __m512i lo = _mm512_and_si512(raw, low4);
          __m512i hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4);
          if constexpr (Q5) {  // bit 2g -> 16 for the low half, bit 2g + 1 for the high one
            const __m512i qh = _mm512_load_si512(blk + q5k_qh_offset + (e * PR + 16 * (v0 + v)) * 4);
            lo = _mm512_or_si512(lo, _mm512_and_si512(_mm512_slli_epi16(_mm512_srli_epi16(qh, 2 * g), 4), bit4));
            hi = _mm512_or_si512(hi, _mm512_and_si512(_mm512_slli_epi16(_mm512_srli_epi16(qh, 2 * g + 1), 4), bit4));
          }
          TANDEM_UNROLL for (int i = 0; i < R; ++i) {
            slo[i][v] = _mm512_dpbusd_epi32(slo[i][v], lo, xa[i]);
            shi[i][v] = _mm512_dpbusd_epi32(shi[i][v], hi, xc[i]);
          }
        }
      }
      TANDEM_UNROLL for (int v = 0; v < V; ++v) {
        const int q = v0 + v;
        const __m512 dw =
            _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(blk + q4k_d_offset + 32 * q)));
        const __m512 dmw =
            _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(blk + q4k_dmin_offset + 32 * q)));
        for (int h = 0; h < 2; ++h) {
          const int j = 2 * g + h;
          const __m512 sc = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(
              _mm_load_si128(reinterpret_cast<const __m128i*>(blk + q4k_sc_offset + j * PR + 16 * q))));
          const __m512 mn = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(
              _mm_load_si128(reinterpret_cast<const __m128i*>(blk + q4k_mn_offset + j * PR + 16 * q))));
          const __m512 a = _mm512_mul_ps(dw, sc), bm = _mm512_mul_ps(dmw, mn);
          TANDEM_UNROLL for (int i = 0; i < R; ++i) {
            const int64_t xi = (i0 + i) * x.nb + xb + h;
            const __m512 dx = _mm512_set1_ps(x.d[xi]);
            const __m512 sx = _mm512_set1_ps(float(x.bias[xi] / -128));
            acc[i][v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(h ? shi[i][v] : slo[i][v]), _mm512_mul_ps(a, dx), acc[i][v]);
            acc[i][v] = _mm512_fnmadd_ps(_mm512_mul_ps(bm, dx), sx, acc[i][v]);
          }
        }
      }
    }
  }
  TANDEM_UNROLL for (int i = 0; i < R; ++i) TANDEM_UNROLL for (int v = 0; v < V; ++v)
      _mm512_mask_storeu_ps(y + i * ldy + 16 * v, mask[v], acc[i][v]);
}

// y[R, 16V] (+)= x[R, k] · the 16-row quarters [v0, v0 + V) of a q4_0 panel, blocks [b0, b0 + nbk)
// (quarter v at y + 16 v under mask[v]); as kernel_q4k, R and V change no lane's arithmetic.
template <int R, int V>
VNNI_BF16 void kernel_q40(const q8_x& x, int64_t i0, int64_t b0, const uint8_t* panel, int64_t nbk, int v0, float* y,
                          int64_t ldy, const __mmask16* mask, bool accumulate) {
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  __m512 acc[R][V];
  TANDEM_UNROLL for (int i = 0; i < R; ++i) TANDEM_UNROLL for (int v = 0; v < V; ++v) acc[i][v] =
      accumulate ? _mm512_maskz_loadu_ps(mask[v], y + i * ldy + 16 * v) : _mm512_setzero_ps();
  for (int64_t b = 0; b < nbk; ++b) {
    const uint8_t* blk = panel + b * q40_block_bytes;
    const int64_t xb = b0 + b;
    __m512i s[R][V];
    TANDEM_UNROLL for (int i = 0; i < R; ++i) {
      const __m512i bias = _mm512_set1_epi32(-8 * (x.bias[(i0 + i) * x.nb + xb] / -128));
      TANDEM_UNROLL for (int v = 0; v < V; ++v) s[i][v] = bias;
    }
    TANDEM_UNROLL for (int e = 0; e < 4; ++e) {
      __m512i xa[R], xc[R];
      TANDEM_UNROLL for (int i = 0; i < R; ++i) {
        int32_t a, c;
        std::memcpy(&a, x.q + ((i0 + i) * x.nb + xb) * 32 + 4 * e, 4);
        std::memcpy(&c, x.q + ((i0 + i) * x.nb + xb) * 32 + 16 + 4 * e, 4);
        xa[i] = _mm512_set1_epi32(a);
        xc[i] = _mm512_set1_epi32(c);
      }
      TANDEM_UNROLL for (int v = 0; v < V; ++v) {
        const __m512i raw = _mm512_load_si512(blk + (e * PR + 16 * (v0 + v)) * 4);
        const __m512i lo = _mm512_and_si512(raw, low4);
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4);
        TANDEM_UNROLL for (int i = 0; i < R; ++i) {
          s[i][v] = _mm512_dpbusd_epi32(s[i][v], lo, xa[i]);
          s[i][v] = _mm512_dpbusd_epi32(s[i][v], hi, xc[i]);
        }
      }
    }
    TANDEM_UNROLL for (int v = 0; v < V; ++v) {
      const __m512 dw =
          _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(blk + q40_d_offset + 32 * (v0 + v))));
      TANDEM_UNROLL for (int i = 0; i < R; ++i) acc[i][v] = _mm512_fmadd_ps(
          _mm512_cvtepi32_ps(s[i][v]), _mm512_mul_ps(dw, _mm512_set1_ps(x.d[(i0 + i) * x.nb + xb])), acc[i][v]);
    }
  }
  TANDEM_UNROLL for (int i = 0; i < R; ++i) TANDEM_UNROLL for (int v = 0; v < V; ++v)
      _mm512_mask_storeu_ps(y + i * ldy + 16 * v, mask[v], acc[i][v]);
}

// y[R, 16V] (+)= x[R, k] · the 16-row quarters [v0, v0 + V) of a q6_k panel, super-blocks
// [s0, s0 + nsb) (quarter v at y + 16 v under mask[v]); as kernel_q4k, R and V change no lane's
// arithmetic. The two 16-sub-blocks that share one of x's 32-blocks (one x scale) are scaled and
// summed in integers, exactly (|q - 32| <= 32, |x| <= 127: 16 * 32 * 127 * 127 * 2 < 2^31), and
// meet the floats once per 32-block: half the float work of a float step per sub-block, which
// was as much as the dot products themselves in 1-thread decode.
template <int R, int V>
VNNI_BF16 void kernel_q6k(const q8_x& x, int64_t i0, int64_t s0, const uint8_t* panel, int64_t nsb, int v0, float* y,
                          int64_t ldy, const __mmask16* mask, bool accumulate) {
  const __m512i low4 = _mm512_set1_epi8(0x0F), bits45 = _mm512_set1_epi8(0x30);
  __m512 acc[R][V];
  TANDEM_UNROLL for (int i = 0; i < R; ++i) TANDEM_UNROLL for (int v = 0; v < V; ++v) acc[i][v] =
      accumulate ? _mm512_maskz_loadu_ps(mask[v], y + i * ldy + 16 * v) : _mm512_setzero_ps();
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const uint8_t* blk = panel + sb * q6k_block_bytes;
    // Unrolled so that odd is a constant in each copy: no selects in the inner loop.
    TANDEM_UNROLL for (int h = 0; h < 2; ++h)
        TANDEM_UNROLL for (int odd = 0; odd < 2;
                           ++odd) {  // x's 32-blocks q = odd, 2 + odd: ql plane a (odd 0) or b (1)
      const uint8_t* plane = blk + (odd ? q6k_b_offset : 0);
      __m512i s[R][V][2][2];  // [x row][quarter][c: q = 2c + odd][half: k 16 half..]
      TANDEM_UNROLL for (int i = 0; i < R; ++i) TANDEM_UNROLL for (int v = 0; v < V; ++v)
          TANDEM_UNROLL for (int c = 0; c < 2; ++c) s[i][v][c][0] = s[i][v][c][1] = _mm512_setzero_si512();
      const int64_t xb = (s0 + sb) * 8 + 4 * h;  // x's 32-blocks of k 128h + 32q
      TANDEM_UNROLL for (int e = 0; e < 8; ++e) {
        const int half = e / 4;
        __m512i xv[R][2];
        TANDEM_UNROLL for (int i = 0; i < R; ++i) TANDEM_UNROLL for (int c = 0; c < 2; ++c) {
          int32_t four;
          std::memcpy(&four, x.q + ((i0 + i) * x.nb + xb + 2 * c + odd) * 32 + 4 * e, 4);
          xv[i][c] = _mm512_set1_epi32(four);
        }
        TANDEM_UNROLL for (int v = 0; v < V; ++v) {
          const int64_t at = ((h * 8 + e) * PR + 16 * (v0 + v)) * 4;
          const __m512i a = _mm512_load_si512(plane + at);
          const __m512i hb = _mm512_load_si512(blk + q6k_h_offset + at);
          // q = odd: low nibbles, qh bits 2 odd..; q = 2 + odd: high nibbles, qh bits 4 + 2 odd..
          const __m512i hlo = odd ? _mm512_slli_epi16(hb, 2) : _mm512_slli_epi16(hb, 4);
          const __m512i hhi = odd ? _mm512_srli_epi16(hb, 2) : hb;
          const __m512i q0 = _mm512_or_si512(_mm512_and_si512(a, low4), _mm512_and_si512(hlo, bits45));
          const __m512i q1 =
              _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(a, 4), low4), _mm512_and_si512(hhi, bits45));
          TANDEM_UNROLL for (int i = 0; i < R; ++i) {
            s[i][v][0][half] = _mm512_dpbusd_epi32(s[i][v][0][half], q0, xv[i][0]);
            s[i][v][1][half] = _mm512_dpbusd_epi32(s[i][v][1][half], q1, xv[i][1]);
          }
        }
      }
      TANDEM_UNROLL for (int v = 0; v < V; ++v) {
        const __m512 dw =
            _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(blk + q6k_d_offset + 32 * (v0 + v))));
        TANDEM_UNROLL for (int c = 0; c < 2; ++c) {
          const int q = 2 * c + odd;
          __m512i sc[2];  // the 16-sub-blocks k 128h + 32q + 16 half: j = 8h + 2q + half
          TANDEM_UNROLL for (int hf = 0; hf < 2; ++hf) sc[hf] = _mm512_cvtepi8_epi32(_mm_load_si128(
              reinterpret_cast<const __m128i*>(blk + q6k_sc_offset + (8 * h + 2 * q + hf) * PR + 16 * (v0 + v))));
          TANDEM_UNROLL for (int i = 0; i < R; ++i) {
            const int64_t xi = (i0 + i) * x.nb + xb + q;
            // (sum (q6 x) - 32 sum x) per sub-block: the q6 - 32 offset, exact in integers
            const __m512i e0 = _mm512_sub_epi32(s[i][v][c][0], _mm512_set1_epi32(32 * x.sum16[2 * xi]));
            const __m512i e1 = _mm512_sub_epi32(s[i][v][c][1], _mm512_set1_epi32(32 * x.sum16[2 * xi + 1]));
            const __m512i t = _mm512_add_epi32(_mm512_mullo_epi32(e0, sc[0]), _mm512_mullo_epi32(e1, sc[1]));
            acc[i][v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), _mm512_mul_ps(dw, _mm512_set1_ps(x.d[xi])), acc[i][v]);
          }
        }
      }
    }
  }
  TANDEM_UNROLL for (int i = 0; i < R; ++i) TANDEM_UNROLL for (int v = 0; v < V; ++v)
      _mm512_mask_storeu_ps(y + i * ldy + 16 * v, mask[v], acc[i][v]);
}

constexpr int MR_FLOAT = 6;  // x rows per float microkernel (6 x 4 zmm accumulators)
constexpr int MR_Q8 = 4;  // x rows per q8_0 microkernel (4 x 2 int + 4 x 2 float zmm)
constexpr int64_t KC_F32 = 256;  // k per pass over a panel: [256][64] f32 = 64 KiB, from L2
constexpr int64_t KC_F16 = 512;  // [512][64] f16 = 64 KiB
constexpr int64_t KC_BF16 = 512;  // [256][64][2] bf16 = 64 KiB
constexpr int64_t KB_Q8 = 16;  // blocks per pass: 16 x 2176 bytes = 34 KiB
constexpr int MR_Q4K = 4;  // x rows per q4_k microkernel
constexpr int64_t KB_Q4K = 4;  // super-blocks per pass: 4 x 9472 bytes = 37 KiB
constexpr int MR_Q6K = 2;  // x rows per q6_k microkernel (8 int accumulators + temporaries)
constexpr int64_t KB_Q6K = 3;  // 3 x 13440 bytes = 39 KiB
constexpr int64_t PREFILL_ROWS = 96;  // x rows per block of a prefill (a multiple of every MR)
constexpr int Q6K_DECODE_V = 4;  // quarters per decode pass: the whole panel (measured +14% decode over 1)

// Column masks of the four 16-row vectors of the panel starting at row j0.
void panel_masks(const weight_view& w, int64_t j0, __mmask16* mask) {
  for (int v = 0; v < 4; ++v) mask[v] = tail_mask(w.rows - j0 - 16 * v);
}

// Rows [i0, i1) of x against panels [p0, p1) of w. a: x as the kernel reads it.
template <dtype T>
void run_block(const weight_view& w, const void* a, int64_t lda, const q8_x* xq, int64_t i0, int64_t i1, float* y,
               int64_t p0, int64_t p1) {
  const int64_t k = w.cols, n = w.rows, pbytes = panel_bytes(T, k);
  const auto* base = static_cast<const uint8_t*>(w.panels);
  for (int64_t pj = p0; pj < p1; ++pj) {
    const uint8_t* panel = base + pj * pbytes;
    const int64_t j0 = pj * PR;
    __mmask16 mask[4];
    panel_masks(w, j0, mask);
    // The 4-6 bit kernels: blocks of the panel in passes of KB, x rows in chunks of MR, each
    // 16-row quarter of the panel on its own (kern(R, first x row, first block, blocks, quarter)).
    auto quarters = [&](auto mr, int64_t nblocks, int64_t kb, int64_t block_bytes, auto&& kern) {
      constexpr int MR = decltype(mr)::value;
      for (int64_t b0 = 0; b0 < nblocks; b0 += kb) {
        const int64_t nbk = std::min(kb, nblocks - b0);
        for (int64_t i = i0; i < i1; i += MR) {
          float* yp = y + i * n + j0;
          with_const<MR>(int(std::min<int64_t>(MR, i1 - i)), [&](auto rows) {
            for (int v = 0; v < 4; ++v)
              if (mask[v]) kern(rows, i, b0, panel + b0 * block_bytes, nbk, v, yp + 16 * v, b0 > 0);
          });
        }
      }
    };
    // Decode (one x row): the panel's blocks in passes of KB, all its rows at once
    // (kern(first block, its bytes, blocks, y of the panel's first row)).
    auto decode_passes = [&](int64_t nblocks, int64_t kb, int64_t block_bytes, auto&& kern) {
      for (int64_t b0 = 0; b0 < nblocks; b0 += kb)
        kern(b0, panel + b0 * block_bytes, std::min(kb, nblocks - b0), y + i0 * n + j0);
    };
    if constexpr (T == dtype::q6_k) {
      if (i1 - i0 == 1) {  // decode: Q6K_DECODE_V quarters per pass
        decode_passes(k / qk_k, KB_Q6K, q6k_block_bytes, [&](int64_t b0, const uint8_t* p, int64_t nbk, float* yp) {
          for (int v = 0; v < 4; v += Q6K_DECODE_V)
            kernel_q6k<1, Q6K_DECODE_V>(*xq, i0, b0, p, nbk, v, yp + 16 * v, n, mask + v, b0 > 0);
        });
      } else {
        quarters(std::integral_constant<int, MR_Q6K>{}, k / qk_k, KB_Q6K, q6k_block_bytes,
                 [&](auto rows, int64_t i, int64_t b0, const uint8_t* p, int64_t nbk, int v, float* yp, bool acc) {
                   kernel_q6k<decltype(rows)::value, 1>(*xq, i, b0, p, nbk, v, yp, n, mask + v, acc);
                 });
      }
    } else if constexpr (T == dtype::q4_k || T == dtype::q5_k) {
      constexpr bool q5 = T == dtype::q5_k;
      constexpr int64_t bytes = q5 ? q5k_block_bytes : q4k_block_bytes;
      if (i1 - i0 == 1) {  // decode: the whole panel per pass
        decode_passes(k / qk_k, KB_Q4K, bytes, [&](int64_t b0, const uint8_t* p, int64_t nbk, float* yp) {
          kernel_q4k<1, 4, q5>(*xq, i0, b0, p, nbk, 0, yp, n, mask, b0 > 0);
        });
      } else {
        quarters(std::integral_constant<int, MR_Q4K>{}, k / qk_k, KB_Q4K, bytes,
                 [&](auto rows, int64_t i, int64_t b0, const uint8_t* p, int64_t nbk, int v, float* yp, bool acc) {
                   kernel_q4k<decltype(rows)::value, 1, q5>(*xq, i, b0, p, nbk, v, yp, n, mask + v, acc);
                 });
      }
    } else if constexpr (T == dtype::q4_0) {
      if (i1 - i0 == 1) {  // decode: the whole panel per pass
        decode_passes(k / q4_0_block, KB_Q8, q40_block_bytes,
                      [&](int64_t b0, const uint8_t* p, int64_t nbk, float* yp) {
                        kernel_q40<1, 4>(*xq, i0, b0, p, nbk, 0, yp, n, mask, b0 > 0);
                      });
      } else {
        quarters(std::integral_constant<int, MR_Q4K>{}, k / q4_0_block, KB_Q8, q40_block_bytes,
                 [&](auto rows, int64_t i, int64_t b0, const uint8_t* p, int64_t nbk, int v, float* yp, bool acc) {
                   kernel_q40<decltype(rows)::value, 1>(*xq, i, b0, p, nbk, v, yp, n, mask + v, acc);
                 });
      }
    } else if constexpr (T == dtype::q8_0) {
      const int64_t nb = k / q8_0_block;
      if (i1 - i0 == 1) {  // decode: the whole panel per pass (contiguous 256-byte groups)
        decode_passes(nb, KB_Q8, q8_block_bytes, [&](int64_t b0, const uint8_t* p, int64_t nbk, float* yp) {
          kernel_q8<1, 4>(*xq, i0, b0, p, nbk, 0, yp, n, mask, b0 > 0);
        });
        continue;
      }
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
      constexpr int64_t KC = T == dtype::f32 ? KC_F32 : T == dtype::f16 ? KC_F16 : KC_BF16;
      const int64_t kk = T == dtype::bf16 ? k + (k & 1) : k;
      for (int64_t pc = 0; pc < kk; pc += KC) {
        const int64_t kc = std::min(KC, kk - pc);
        for (int64_t i = i0; i < i1; i += MR_FLOAT) {
          float* yp = y + i * n + j0;
          with_const<MR_FLOAT>(int(std::min<int64_t>(MR_FLOAT, i1 - i)), [&](auto rows) {
            constexpr int R = decltype(rows)::value;
            if constexpr (T == dtype::f32)
              kernel_float<R, 4>(static_cast<const float*>(a) + i * lda + pc, lda,
                                 reinterpret_cast<const float*>(panel) + pc * PR, kc, yp, n, mask, pc > 0);
            else if constexpr (T == dtype::f16)
              kernel_float<R, 4>(static_cast<const float*>(a) + i * lda + pc, lda,
                                 reinterpret_cast<const uint16_t*>(panel) + pc * PR, kc, yp, n, mask, pc > 0);
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

// x as the kernels of T read it: f32 in place (f32, f16), rounded to bf16 (bf16), or quantized
// per block with its scales and sums (the integer types).
struct x_form {
  const void* a = nullptr;
  int64_t lda = 0;
  q8_x xq{};
};

// bias[b] = -128 * sum(q of block b), sum16[2b], sum16[2b + 1] = the sums of its two halves,
// for the nb 32-blocks of one row. Exact integers: the order of the additions cannot matter.
VNNI_BF16 void block_sums(const int8_t* q, int64_t nb, int32_t* bias, int32_t* sum16) {
  const __m256i flip = _mm256_set1_epi8(char(0x80)), zero = _mm256_setzero_si256();
  for (int64_t b = 0; b < nb; ++b) {
    // q + 128 as u8, summed in groups of 8 bytes (vpsadbw); each group sum is 8 * 128 too high.
    const __m256i u = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + b * 32)), flip);
    const __m256i g = _mm256_sad_epu8(u, zero);  // 4 x u64: bytes 0-7, 8-15, 16-23, 24-31
    const int32_t lo = int32_t(_mm256_extract_epi64(g, 0) + _mm256_extract_epi64(g, 1)) - 2048;
    const int32_t hi = int32_t(_mm256_extract_epi64(g, 2) + _mm256_extract_epi64(g, 3)) - 2048;
    bias[b] = -128 * (lo + hi);
    sum16[2 * b] = lo;
    sum16[2 * b + 1] = hi;
  }
}

// x in the form the kernel reads, once per call in the calling thread's scratch (workers only
// read it). Rows are converted independently: the same row gives the same bytes.
template <dtype T>
x_form prepare_x(const matmul_input& in, int64_t m, int64_t k, thread_pool& pool) {
  const float* x = in.x;
  x_form f{x, k, {}};
  auto convert = [&](auto&& row_fn) {
    if (m * k < (int64_t(1) << 14) || pool.size() == 1) return row_fn(int64_t(0), m);
    pool.parallel_for(m, 16, [&](int64_t r0, int64_t r1, int) { row_fn(r0, r1); });
  };
  // Input row i as f32: x's own row, or (fused) formed by in.op into this thread's row buffer,
  // which stays in L1 while the conversion reads it.
  auto input_row = [&](int64_t i) -> const float* {
    if (in.op == input_op::none) return x + i * k;
    auto* row = static_cast<float*>(thread_scratch(scratch_row, size_t(k) * sizeof(float)));
    form_row(in, i, k, row);
    return row;
  };
  if constexpr (panels_read_x_in_place(T)) {
    if (in.op != input_op::none) throw std::logic_error("matmul_panels: float panels read x in place (no fused input)");
  } else if constexpr (T == dtype::bf16) {
    f.lda = k + (k & 1);
    auto* xb = static_cast<uint16_t*>(thread_scratch(scratch_x, size_t(m * f.lda) * 2));
    convert([&](int64_t r0, int64_t r1) {
      for (int64_t i = r0; i < r1; ++i) x_to_bf16(input_row(i), k, f.lda, xb + i * f.lda);
    });
    f.a = xb;
  } else {  // the integer kernels: x quantized per 32
    const int64_t nb = k / q8_0_block;
    auto* buf = static_cast<uint8_t*>(thread_scratch(scratch_x, size_t(m * nb) * (32 + 4 + 4 + 8)));
    auto* q = reinterpret_cast<int8_t*>(buf);
    auto* d = reinterpret_cast<float*>(buf + m * nb * 32);
    auto* bias = reinterpret_cast<int32_t*>(buf + m * nb * 36);
    auto* sum16 = reinterpret_cast<int32_t*>(buf + m * nb * 40);
    convert([&](int64_t r0, int64_t r1) {
      for (int64_t i = r0; i < r1; ++i) {
        // x as llama.cpp quantizes it for the weight type: Q8_0 (scales per 32, in f16) for
        // Q8_0 and Q4_0, Q8_K (an f32 scale per 256) for the k-quants.
        const float* xi = input_row(i);
        if constexpr (T == dtype::q8_0 || T == dtype::q4_0) {
          quantize_x_q8_avx2(xi, k, q + i * nb * 32, d + i * nb);
          round_scales_f16(d + i * nb, nb);
        } else {
          quantize_x_q8k_avx2(xi, k, q + i * nb * 32, d + i * nb);
        }
        block_sums(q + i * nb * 32, nb, bias + i * nb, sum16 + 2 * i * nb);
      }
    });
    f.xq = {q, d, bias, nb, sum16};
  }
  return f;
}

// y_g = x · W_gᵀ for weights of type T with panels and one k (a layer's q/k/v, gate/up): x is
// converted once for all of them, and one job covers all their panels, so that the threads
// meet once per group instead of once per weight.
template <dtype T>
void run_panels(std::span<const matmul_output> mats, const matmul_input& in, int64_t m, thread_pool& pool) {
  const int64_t k = mats[0].w->cols;
  const x_form xf = prepare_x<T>(in, m, k, pool);
  const int threads = pool.size();
  auto panels_of = [](const weight_view& w) { return (w.rows + PR - 1) / PR; };
  int64_t np = 0;
  for (const matmul_output& t : mats) np += panels_of(*t.w);
  const int64_t mr = T == dtype::q8_0                                         ? MR_Q8
                     : T == dtype::q6_k                                       ? MR_Q6K
                     : T == dtype::f32 || T == dtype::f16 || T == dtype::bf16 ? MR_FLOAT
                                                                              : MR_Q4K;
  auto block = [&](const matmul_output& t, int64_t i0, int64_t i1, int64_t p0, int64_t p1) {
    run_block<T>(*t.w, xf.a, xf.lda, &xf.xq, i0, i1, t.y, p0, p1);
  };
  // Few panels and many rows: split the rows (stories260K-sized matrices in a prefill).
  if (np < threads && m >= 2 * mr) {
    pool.parallel_for(m, mr, [&](int64_t i0, int64_t i1, int) {
      for (const matmul_output& t : mats) block(t, i0, i1, 0, panels_of(*t.w));
    });
    return;
  }
  if (m > 8) {
    // A prefill: slices of panels small enough to stay in L2 (at most half of a 1 MiB one) and
    // at least 4 per thread over the group, handed out in turn (a thread that the VM slows or
    // deschedules for a while holds up one small slice, not half the matrix). Each slice meets
    // x in blocks of PREFILL_ROWS rows: a block stays in L1/L2 across the slice's panels, which
    // are read again from L2 per block, so x is read from L3 once per slice instead of once per
    // panel (at 2 threads that traffic cost ~16% of the kernels' time, measured with perf).
    // The last 2 slices per thread are cut into their x blocks: the threads then run out of
    // work within one block of each other, not within one slice (with 4-panel slices of
    // gate/up, a slice is ~0.6 ms of a 2-thread prefill's ~10 ms per layer). The loops' order
    // changes no element's reduction order.
    const int64_t per = std::clamp<int64_t>(
        std::min<int64_t>((int64_t(1) << 19) / panel_bytes(T, k), np / (4 * int64_t(threads))), 1, np);
    struct item {
      int32_t task;
      int64_t p0, p1, i0, i1;
    };
    // The calling thread's list; workers read it through this reference (a thread_local named
    // inside the lambda would be each worker's own).
    thread_local std::vector<item> own_items;
    std::vector<item>& items = own_items;
    items.clear();
    for (size_t g = 0; g < mats.size(); ++g)
      for (int64_t p0 = 0, n = panels_of(*mats[g].w); p0 < n; p0 += per)
        items.push_back({int32_t(g), p0, std::min(n, p0 + per), 0, m});
    const size_t whole = items.size() > 2 * size_t(threads) ? items.size() - 2 * size_t(threads) : 0;
    if (m > PREFILL_ROWS && threads > 1) {
      const size_t n = items.size();
      for (size_t s = whole; s < n; ++s) {
        items[s].i1 = std::min(m, PREFILL_ROWS);
        for (int64_t i0 = PREFILL_ROWS; i0 < m; i0 += PREFILL_ROWS)
          items.push_back({items[s].task, items[s].p0, items[s].p1, i0, std::min(m, i0 + PREFILL_ROWS)});
      }
      // The cut slices after the whole ones, each slice's blocks in turn.
      std::stable_sort(items.begin() + std::ptrdiff_t(whole), items.end(),
                       [](const item& a, const item& b) { return a.task != b.task ? a.task < b.task : a.p0 < b.p0; });
    }
    pool.for_each_dynamic(int64_t(items.size()), [&](int64_t s, int) {
      const item& it = items[size_t(s)];
      for (int64_t i0 = it.i0; i0 < it.i1; i0 += PREFILL_ROWS)
        block(mats[size_t(it.task)], i0, std::min(it.i1, i0 + PREFILL_ROWS), it.p0, it.p1);
    });
    return;
  }
  // Decode and small batches: each weight's panels in slices of at least 128 KiB of weights, so
  // that waking a thread pays off (as decode_grain).
  for (const matmul_output& t : mats) {
    const int64_t n = panels_of(*t.w);
    const int64_t parts = std::clamp<int64_t>(n * panel_bytes(T, k) / (int64_t(1) << 17), 1, threads);
    pool.parallel_for(n, (n + parts - 1) / parts, [&](int64_t p0, int64_t p1, int) { block(t, 0, m, p0, p1); });
  }
}

}  // namespace

int64_t panel_bytes(dtype t, int64_t k) {
  switch (t) {
    case dtype::f32: return k * PR * 4;
    case dtype::bf16: return (k + 1) / 2 * PR * 4;
    case dtype::q8_0: return k / q8_0_block * q8_block_bytes;
    case dtype::q4_k: return k / qk_k * q4k_block_bytes;
    case dtype::q6_k: return k / qk_k * q6k_block_bytes;
    case dtype::q5_k: return k / qk_k * q5k_block_bytes;
    case dtype::q4_0: return k / q4_0_block * q40_block_bytes;
    case dtype::f16: return k * PR * 2;
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
      case dtype::q4_k: pack_k4_planes<block_q4_k>(w, p * PR, out + p * pb, q4k_block_bytes); break;
      case dtype::q6_k: pack_q6k_panel(w, p * PR, out + p * pb); break;
      case dtype::q5_k: pack_k4_planes<block_q5_k>(w, p * PR, out + p * pb, q5k_block_bytes); break;
      case dtype::q4_0: pack_q40_panel(w, p * PR, out + p * pb); break;
      case dtype::f16: pack_f16_panel(w, p * PR, reinterpret_cast<uint16_t*>(out + p * pb)); break;
    }
  }
}

void matmul_panels(std::span<const matmul_output> mats, const matmul_input& x, int64_t m, thread_pool& pool) {
  if (mats.empty()) return;
  const weight_view& w = *mats[0].w;
  for (const matmul_output& t : mats)
    if (t.w->type != w.type || t.w->cols != w.cols || !t.w->panels)
      throw std::logic_error("matmul_panels: a group's weights share one type and k, and have panels");
  switch (w.type) {
    case dtype::f32: return run_panels<dtype::f32>(mats, x, m, pool);
    case dtype::bf16: return run_panels<dtype::bf16>(mats, x, m, pool);
    case dtype::q8_0: return run_panels<dtype::q8_0>(mats, x, m, pool);
    case dtype::q4_k: return run_panels<dtype::q4_k>(mats, x, m, pool);
    case dtype::q6_k: return run_panels<dtype::q6_k>(mats, x, m, pool);
    case dtype::q5_k: return run_panels<dtype::q5_k>(mats, x, m, pool);
    case dtype::q4_0: return run_panels<dtype::q4_0>(mats, x, m, pool);
    case dtype::f16: return run_panels<dtype::f16>(mats, x, m, pool);
  }
}

void matmul_panels(const weight_view& w, const matmul_input& x, int64_t m, float* y, thread_pool& pool) {
  const matmul_output t{&w, y};
  matmul_panels(std::span<const matmul_output>(&t, 1), x, m, pool);
}

}  // namespace tandem::kernels::cpu::detail
