#pragma once
// Private to the CPU matmul: the ISA levels, the per-ISA entry points and the pieces they share.
// Only matmul.cpp, matmul_avx2.cpp, matmul_avx512.cpp, peak.cpp and tests include this.
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/matmul.h"

// Loops over register arrays (accumulators, unrolled vectors) must be fully unrolled, or GCC
// keeps the arrays in memory at -O2 and every FMA goes through a store and a reload.
#define TANDEM_UNROLL _Pragma("GCC unroll 64")

namespace tandem::kernels::cpu::detail {

// The same contract as cpu::matmul on a chosen ISA level (tests compare levels through this).
// Throws std::invalid_argument if the CPU lacks `level`.
void matmul_with_isa(isa level, const weight_view& w, const float* x, int64_t m, float* y, thread_pool& pool,
                     matmul_mode mode = matmul_mode::batch_invariant);

// Batches of up to this many input rows take the decode (GEMV-like) path on `level`; larger
// ones the GEMM path. Measured on the bench-76m shapes with weights out of cache (matmul.cpp).
int64_t decode_max_m(isa level, dtype t);

// ---- per-ISA entry points; call only after checking the CPU supports the level ----
// `gemm`: m is past decode_max_m and the mode is `fastest`; otherwise the decode kernels run
// (tiled by cache_tile_rows), whose per-row arithmetic does not depend on m.
void matmul_scalar(const weight_view& w, const float* x, int64_t m, float* y, thread_pool& pool, bool gemm);
void matmul_avx2(const weight_view& w, const float* x, int64_t m, float* y, thread_pool& pool, bool gemm);
void matmul_avx512(const weight_view& w, const float* x, int64_t m, float* y, thread_pool& pool, bool vnni_bf16,
                   bool gemm);

// Quantizes n floats of x (n % 32 == 0) to int8 q[n] and one f32 scale per 32 in d[n / 32],
// as ggml's quantize_row_q8_0 (but the scale is left in f32: see round_scales_f16). AVX2: the
// VNNI kernel uses it too.
void quantize_x_q8_avx2(const float* x, int64_t n, int8_t* q, float* d);
// The k-quants' x (n % 256 == 0): one f32 scale per 256 as ggml's Q8_K (quantize_row_q8_K_ref),
// so that k-quant dot products are llama.cpp's to float summation order; the scale is written
// to each of its eight 32-blocks' d entries (d[n / 32]), the layout the kernels read.
void quantize_x_q8k_avx2(const float* x, int64_t n, int8_t* q, float* d);
// d[i] = its value rounded to f16 and back: for Q8_0 weights, x's scales as ggml stores them in
// its block_q8_0, so that Q8_0 x Q8_0 dot products are llama.cpp's (to float summation order).
void round_scales_f16(float* d, int64_t n);

// ---- panels (matmul_panels.cpp): the batch-invariant kernels of the avx512_bf16 level ----
constexpr int64_t panel_rows = 64;
// The panel kernels of f32 and f16 read x in place (no conversion to fuse an input op into);
// every other type's convert x first (rounded to bf16, quantized per block).
constexpr bool panels_read_x_in_place(dtype t) { return t == dtype::f32 || t == dtype::f16; }
// Bytes of one panel (panel_rows rows) of k columns of type t.
int64_t panel_bytes(dtype t, int64_t k);
// Writes all ceil(w.rows / panel_rows) panels of w to dst (64-byte aligned).
void pack_panels(const weight_view& w, void* dst);
// y = x · Wᵀ from w.panels; the same for every m (see the file's header). in.op other than none
// only where fuses_input(w).
void matmul_panels(const weight_view& w, const matmul_input& in, int64_t m, float* y, thread_pool& pool);
// y_g = in · W_gᵀ for weights of one type and k, all with panels: in converted once, and one
// job over all their panels in a prefill (bitwise each matmul_panels on its own).
void matmul_panels(std::span<const matmul_output> mats, const matmul_input& in, int64_t m, thread_pool& pool);
// Row i of the input `in` stands for (k elements) into out: the arithmetic of form_input.
void form_row(const matmul_input& in, int64_t i, int64_t k, float* out);

// ---- block types without kernels of their own (matmul_dequant.cpp) ----
// The contract of matmul_with_isa for w.type with is_dequantized_on_the_fly(w.type): tiles of
// 64 rows dequantized to f32 and multiplied by `level`'s f32 kernels.
// Q4_0 and the k-quants on AVX2 (and AVX-512 without VNNI): int8 rows, exact integer sums,
// batch-invariant (matmul_kquant_avx2.cpp).
void matmul_kquant_avx2(const weight_view& w, const float* x, int64_t m, float* y, thread_pool& pool);
void matmul_dequantized(isa level, const weight_view& w, const float* x, int64_t m, float* y, thread_pool& pool,
                        matmul_mode mode);

// ---- shared helpers (matmul.cpp) ----

// Start of weight row r.
inline const uint8_t* row_ptr(const weight_view& w, int64_t r) {
  return static_cast<const uint8_t*>(w.data) + r * row_bytes(w.type, w.cols);
}

// A per-thread, 64-byte aligned scratch buffer of at least `bytes`, one per slot. It stays valid
// (and keeps its contents) until this thread asks for the same slot again. Slots let one call
// hold several buffers: the calling thread's slot 0 carries data its pool's workers read.
enum scratch_slot {
  scratch_x = 0,
  scratch_panel = 1,
  scratch_tmp = 2,
  scratch_deq_rows = 3,  // matmul_dequantized: a tile's rows in f32, its panel, its output
  scratch_deq_panel = 4,
  scratch_deq_y = 5,
  scratch_x_bf16 = 6,  // matmul_with_isa: x rounded to bf16 for bf16 weights
  scratch_input = 7,  // matmul(matmul_input): the formed input of an unfused path
  scratch_row = 8,  // matmul_panels: one formed input row of a fused conversion
  scratch_slots = 9
};
void* thread_scratch(scratch_slot slot, size_t bytes);

// Converts `n` elements of a weight row to f32 (an ISA's vectorised dequantize_row).
using dequant_fn = void (*)(dtype t, const void* src, float* dst, int64_t n);
// Prefill through OpenBLAS: each pool thread dequantizes panels of its weight rows with
// `dequant` and multiplies them with single-threaded cblas_sgemm (f32 weights are used in place).
void prefill_blas(const weight_view& w, const float* x, int64_t m, float* y, thread_pool& pool, dequant_fn dequant);
// Rows per parallel_for grain for the decode path on `threads` threads: equal slices, each big
// enough that waking a thread pays off.
int64_t decode_grain(const weight_view& w, int threads);

// Runs kern(t0, t1) over [r0, r1) in tiles of weight rows small enough (~256 KiB) to stay in
// L2 while a kernel passes over them once per chunk of input rows: the decode kernels then
// serve a prefill without streaming every weight from memory once per chunk.
template <class F>
void for_cache_tiles(const weight_view& w, int64_t r0, int64_t r1, F&& kern) {
  const int64_t tile = (int64_t(1) << 18) / row_bytes(w.type, w.cols) + 1;
  for (int64_t t = r0; t < r1; t += tile) kern(t, t + tile < r1 ? t + tile : r1);
}

// Calls f(std::integral_constant<int, c>{}) for a runtime 1 <= c <= N: kernels are templates on
// their row counts so that their accumulator arrays stay in registers.
template <int N, class F>
void with_const(int c, F&& f) {
  if constexpr (N > 1)
    if (c < N) return with_const<N - 1>(c, f);
  f(std::integral_constant<int, N>{});
}

// Calls kern(integral_constant<int, M>, i0) on consecutive chunks [i0, i0 + M) of m inputs,
// M <= MaxM.
template <int MaxM, class F>
void for_input_chunks(int64_t m, F&& kern) {
  for (int64_t i0 = 0; i0 < m;) {
    const int c = int(m - i0 < MaxM ? m - i0 : MaxM);
    with_const<MaxM>(c, [&](auto mc) { kern(mc, i0); });
    i0 += c;
  }
}

}  // namespace tandem::kernels::cpu::detail
