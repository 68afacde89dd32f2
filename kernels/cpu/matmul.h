#pragma once
// CPU matrix multiplication against weight matrices of any supported type.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kernels/tensor_types.h"
#include "kernels/thread_pool.h"

namespace tandem::kernels {

// A weight matrix as stored in a model file: `rows` output features, each a contiguous row of
// `cols` input features of type `type` (for q8_0, cols/32 blocks per row).
// w: [rows, cols]
// `panels`, where set (pack_for_matmul), holds the same weights repacked for this CPU's
// batch-invariant kernels, in panels of panel_rows(w) rows; `data` stays the file's rows.
struct weight_view {
  dtype type = dtype::f32;
  const void* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  const void* panels = nullptr;
};

// Owns the memory of repacked weights (64-byte aligned chunks). Not copyable; views into it
// stay valid while it lives.
class panel_memory {
 public:
  panel_memory() = default;
  panel_memory(const panel_memory&) = delete;
  panel_memory& operator=(const panel_memory&) = delete;
  panel_memory(panel_memory&&) = default;
  panel_memory& operator=(panel_memory&&) = default;
  ~panel_memory();
  void* allocate(size_t bytes);
  size_t bytes() const { return bytes_; }

 private:
  std::vector<void*> chunks_;
  size_t bytes_ = 0;
};

// Returns w with `panels` set to its rows repacked (into `store`) for the batch-invariant
// kernels of this CPU, or w unchanged where those kernels read the rows as stored (CPUs
// without AVX-512 VNNI/BF16). Done once per weight, at load.
weight_view pack_for_matmul(const weight_view& w, panel_memory& store);

// Rows of w that a slice must start at a multiple of (1 without panels).
int64_t row_align(const weight_view& w);
// Rows [r0, r1) of w as a weight of its own (panels included); r0 % row_align(w) == 0.
weight_view slice_rows(const weight_view& w, int64_t r0, int64_t r1);

namespace cpu {

// How one row's result may depend on the rest of the batch.
//  batch_invariant: every row goes through the same kernel with the same reduction order,
//    whatever m is, so a token's result is bitwise the same in a prefill of many rows and in a
//    decode batch of any size. Exact recovery relies on it: a request prefilled again
//    elsewhere with the tokens it had produced goes on exactly as it would have (the same
//    argument as vLLM's batch-invariant mode). With panels (AVX-512 VNNI/BF16) the kernels are
//    GEMM microkernels whose per-element order depends on k only (matmul_panels.cpp); without,
//    the decode kernels, tiled so that weights are reused from cache (slower prefill).
//  fastest: where weights have panels, the same kernels as batch_invariant (they are the
//    fastest there too). Elsewhere (AVX2, AVX-512 without VNNI/BF16) large m
//    takes the GEMM path (OpenBLAS, or the AVX-512 microkernels, which round x to bf16 for
//    bf16 and q8_0 weights); rows then differ in their last bits (bf16/q8_0: in about the
//    third digit) between a prefill and a decode step, and a greedy pick at a near-tie can
//    differ after a recovery.
enum class matmul_mode { batch_invariant, fastest };

// y = x · Wᵀ.  x: [m, w.cols] f32 row-major, y: [m, w.rows] f32 row-major.
// Small m (decode) streams each weight row once for all m inputs (bandwidth-bound path);
// large m (prefill) uses a blocked GEMM (compute-bound path) in `fastest` mode. Work is split
// over `pool`.
void matmul(const weight_view& w, const float* x, int64_t m, float* y, thread_pool& pool,
            matmul_mode mode = matmul_mode::batch_invariant);

// A matmul's input as a layer makes it: x itself, or rows made from x (and `aux`) by one of the
// elementwise ops of ops.h that precede a matmul in a layer: RMSNorm before the q/k/v and
// gate/up projections, SwiGLU or GEGLU before the down projection.
enum class input_op {
  none,  // x: [m, k]
  rms_norm,  // rms_norm(x) * aux: x [m, k], aux the norm's weights [k], eps
  silu_mul,  // silu(x) * aux: x the gate [m, k], aux up [m, k] (silu_mul_fast)
  gelu_mul,  // gelu(x) * aux: the same with gelu_mul
};
struct matmul_input {
  const float* x = nullptr;
  input_op op = input_op::none;
  const float* aux = nullptr;
  float eps = 0.0f;
};

// Writes the input rows [m, k] that `in` stands for to out (which may be in.x for the
// elementwise ops, not for rms_norm), each row by ops.h's function of the same name, split over
// `pool` by rows for large inputs.
void form_input(const matmul_input& in, int64_t m, int64_t k, float* out, thread_pool& pool);

// Whether matmul(w, in, ...) forms each input row where its kernel converts x anyway (rounds it
// to bf16, quantizes it per block), in L1, so that the [m, k] f32 input is never written to
// memory and read back (the fused path: the panel kernels of the integer types and bf16; the
// f32 and f16 ones read x in place). Otherwise matmul
// forms the whole input in scratch first.
bool fuses_input(const weight_view& w);

// y = in · Wᵀ, bitwise equal to form_input followed by matmul on the formed x.
void matmul(const weight_view& w, const matmul_input& in, int64_t m, float* y, thread_pool& pool,
            matmul_mode mode = matmul_mode::batch_invariant);

// y_i = in · W_iᵀ for weights that share one input (a layer's q/k/v, gate/up), bitwise each
// matmul(*w_i, in, m, y_i) on its own. Where the weights have panels of one type and k, the
// input is converted once for all of them and one job covers all their panels, so that a
// prefill's threads meet once per group rather than once per weight.
struct matmul_output {
  const weight_view* w;
  float* y;  // [m, w->rows]
};
void matmul_group(std::span<const matmul_output> mats, const matmul_input& in, int64_t m, thread_pool& pool,
                  matmul_mode mode = matmul_mode::batch_invariant);

// The instruction set the CPU kernels dispatched to at runtime ("avx512", "avx2" or "scalar").
const char* isa_name();

}  // namespace cpu
}  // namespace tandem::kernels
