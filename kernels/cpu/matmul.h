#pragma once
// CPU matrix multiplication against weight matrices of any supported type.
#include <cstdint>

#include "kernels/tensor_types.h"
#include "kernels/thread_pool.h"

namespace tandem::kernels {

// A weight matrix as stored in a model file: `rows` output features, each a contiguous row of
// `cols` input features of type `type` (for q8_0, cols/32 blocks per row).
// w: [rows, cols]
struct weight_view {
  dtype type = dtype::f32;
  const void* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
};

namespace cpu {

// y = x · Wᵀ.  x: [m, w.cols] f32 row-major, y: [m, w.rows] f32 row-major.
// Small m (decode) streams each weight row once for all m inputs (bandwidth-bound path);
// large m (prefill) uses a blocked GEMM (compute-bound path). Work is split over `pool`.
void matmul(const weight_view& w, const float* x, int64_t m, float* y, thread_pool& pool);

// The instruction set the CPU kernels dispatched to at runtime ("avx512", "avx2" or "scalar").
const char* isa_name();

}  // namespace cpu
}  // namespace tandem::kernels
