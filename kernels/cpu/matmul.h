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

// How one row's result may depend on the rest of the batch.
//  batch_invariant: every row goes through the same kernel with the same reduction order,
//    whatever m is (the decode kernels, tiled so that weights are reused from cache), so a
//    token's result is bitwise the same in a prefill of many rows and in a decode batch of any
//    size. Exact recovery relies on it: a request prefilled again elsewhere with the tokens it
//    had produced goes on exactly as it would have (the same argument as vLLM's batch-invariant
//    mode). Costs prefill throughput (see docs/performance.md).
//  fastest: large m takes the GEMM path (OpenBLAS, or the AVX-512 microkernels, which round x
//    to bf16 for bf16 and q8_0 weights); rows then differ in their last bits (bf16/q8_0: in
//    about the third digit) between a prefill and a decode step, and a greedy pick at a
//    near-tie can differ after a recovery.
enum class matmul_mode { batch_invariant, fastest };

// y = x · Wᵀ.  x: [m, w.cols] f32 row-major, y: [m, w.rows] f32 row-major.
// Small m (decode) streams each weight row once for all m inputs (bandwidth-bound path);
// large m (prefill) uses a blocked GEMM (compute-bound path) in `fastest` mode. Work is split
// over `pool`.
void matmul(const weight_view& w, const float* x, int64_t m, float* y, thread_pool& pool,
            matmul_mode mode = matmul_mode::batch_invariant);

// The instruction set the CPU kernels dispatched to at runtime ("avx512", "avx2" or "scalar").
const char* isa_name();

}  // namespace cpu
}  // namespace tandem::kernels
