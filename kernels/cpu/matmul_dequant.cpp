// Matmul against weights of a block type without a kernel of its own (Q4_0 and the k-quants):
// each tile of 64 weight rows is dequantized to f32 in per-thread scratch (exactly ggml's
// values, dequantize_row) and multiplied by this level's f32 kernels on one thread.
//
// Memory stays at the file's bytes (nothing is expanded at load), and a row's arithmetic after
// the dequantization is the f32 path's, so batch invariance holds as it does for f32 weights:
// on avx512_bf16 the tile is transposed into an f32 panel and the panel microkernel runs (one
// FMA chain over k for every m); elsewhere the f32 decode kernels (batch_invariant) or the
// GEMM (`fastest`, large m) run. The cost is the dequantization, paid again at every call: a
// decode step is bound by it rather than by memory (docs/performance.md has the figures).
#include <algorithm>

#include "kernels/cpu/matmul_impl.h"

namespace tandem::kernels::cpu::detail {
namespace {

thread_pool& this_thread_only() {
  thread_local thread_pool serial(1);  // size 1: runs inline, no threads
  return serial;
}

// rows x k f32 rows -> one [k][panel_rows] panel, rows past `rows` zero.
void to_f32_panel(const float* rows_f32, int64_t rows, int64_t k, float* panel) {
  for (int64_t p = 0; p < k; ++p) {
    float* dst = panel + p * panel_rows;
    int64_t c = 0;
    for (; c < rows; ++c) dst[c] = rows_f32[c * k + p];
    for (; c < panel_rows; ++c) dst[c] = 0.0f;
  }
}

}  // namespace

void matmul_dequantized(isa level, const weight_view& w, const float* x, int64_t m, float* y, thread_pool& pool,
                        matmul_mode mode) {
  const int64_t k = w.cols, n = w.rows, tiles = (n + panel_rows - 1) / panel_rows;
  auto tile = [&](int64_t t) {
    const int64_t r0 = t * panel_rows, rows = std::min(panel_rows, n - r0);
    auto* wf = static_cast<float*>(thread_scratch(scratch_deq_rows, size_t(rows * k) * sizeof(float)));
    for (int64_t r = 0; r < rows; ++r) dequantize_row(w.type, row_ptr(w, r0 + r), wf + r * k, k);
    weight_view tv{dtype::f32, wf, rows, k, nullptr};
    if (level == isa::avx512_bf16) {
      auto* panel = static_cast<float*>(thread_scratch(scratch_deq_panel, size_t(panel_rows * k) * sizeof(float)));
      to_f32_panel(wf, rows, k, panel);
      tv.panels = panel;
    }
    auto* yt = static_cast<float*>(thread_scratch(scratch_deq_y, size_t(m * rows) * sizeof(float)));
    matmul_with_isa(level, tv, x, m, yt, this_thread_only(), mode);
    for (int64_t i = 0; i < m; ++i) std::copy(yt + i * rows, yt + (i + 1) * rows, y + i * n + r0);
  };
  pool.parallel_for(tiles, 1, [&](int64_t t0, int64_t t1, int) {
    for (int64_t t = t0; t < t1; ++t) tile(t);
  });
}

}  // namespace tandem::kernels::cpu::detail
