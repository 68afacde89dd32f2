// Elementwise CUDA kernels of a Llama layer. Each mirrors kernels/cpu/ops.cpp closely enough to
// agree with it to ~1e-6 relative; the CPU version is the reference.
#include "kernels/cuda/launchers.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <initializer_list>
#include <stdexcept>
#include <string>

namespace tandem::kernels::cuda {
namespace {

constexpr int block_threads = 256;  // multiple of the warp size; the reductions rely on it
constexpr int64_t max_blocks = 1 << 16;  // grid-stride loops cover the rest

// Blocks for n independent items, one per thread, grid-stride beyond max_blocks.
unsigned grid_for(int64_t n) {
  return unsigned(std::min<int64_t>((n + block_threads - 1) / block_threads, max_blocks));
}

void check_sizes(const char* op, std::initializer_list<int64_t> sizes) {
  for (int64_t s : sizes)
    if (s < 0) throw std::invalid_argument(std::string(op) + ": negative size");
}

// A launch only fails synchronously for configuration or context errors (e.g. no device,
// no kernel image for this GPU); execution errors surface at device_synchronize.
void check_launch(const char* op) { detail::check(cudaGetLastError(), op); }

__device__ float warp_sum(float v) {
  for (int off = warpSize / 2; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// One block per row: threads stride over the row, then a two-level (warp, block) reduction.
__global__ void rms_norm_kernel(const float* x, const float* w, float* y, int64_t dim, float eps) {
  const float* xr = x + int64_t(blockIdx.x) * dim;
  float* yr = y + int64_t(blockIdx.x) * dim;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];

  __shared__ float warp_sums[block_threads / 32];
  ss = warp_sum(ss);
  const int lane = threadIdx.x % warpSize, warp = threadIdx.x / warpSize;
  if (lane == 0) warp_sums[warp] = ss;
  __syncthreads();
  if (warp == 0) {
    ss = lane < int(blockDim.x / warpSize) ? warp_sums[lane] : 0.0f;
    ss = warp_sum(ss);
    if (lane == 0) warp_sums[0] = ss;
  }
  __syncthreads();

  // 1/sqrtf rather than rsqrtf: rsqrtf's 2 ulp would show against the CPU reference.
  const float scale = 1.0f / sqrtf(warp_sums[0] / float(dim) + eps);
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = xr[i] * scale * w[i];
}

__global__ void silu_mul_kernel(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float g = gate[i];
    out[i] = g / (1.0f + expf(-g)) * up[i];  // expf, not __expf: keep full accuracy
  }
}

__global__ void add_inplace_kernel(float* x, const float* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] += y[i];
}

// One thread per rotated pair. The angle is computed in double, as on the CPU: at positions
// in the thousands a float angle is off by ~1e-4 rad, far outside the 1e-5 tolerance.
__global__ void rope_kernel(float* x, const int32_t* pos, int64_t n_heads, int64_t head_dim, int64_t n_pairs,
                            double freq_base) {
  const int64_t half = head_dim / 2;
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < n_pairs; k += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = k % half, row = k / half;  // row = t * n_heads + h
    const int64_t t = row / n_heads;
    const double theta = double(pos[t]) * pow(freq_base, -2.0 * double(i) / double(head_dim));
    double sd, cd;
    sincos(theta, &sd, &cd);
    const float c = float(cd), s = float(sd);
    float* p = x + row * head_dim + 2 * i;
    const float a = p[0], b = p[1];
    p[0] = a * c - b * s;
    p[1] = a * s + b * c;
  }
}

}  // namespace

void rms_norm(const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps) {
  check_sizes("cuda rms_norm", {rows, dim});
  if (rows > INT_MAX) throw std::invalid_argument("cuda rms_norm: more rows than grid blocks");
  if (rows == 0 || dim == 0) return;
  rms_norm_kernel<<<unsigned(rows), block_threads>>>(x, w, y, dim, eps);
  check_launch("cuda rms_norm");
}

void silu_mul(const float* gate, const float* up, float* out, int64_t n) {
  check_sizes("cuda silu_mul", {n});
  if (n == 0) return;
  silu_mul_kernel<<<grid_for(n), block_threads>>>(gate, up, out, n);
  check_launch("cuda silu_mul");
}

void add_inplace(float* x, const float* y, int64_t n) {
  check_sizes("cuda add_inplace", {n});
  if (n == 0) return;
  add_inplace_kernel<<<grid_for(n), block_threads>>>(x, y, n);
  check_launch("cuda add_inplace");
}

void rope(float* x, const int32_t* pos, int64_t n_tokens, int64_t n_heads, int64_t head_dim, float freq_base) {
  check_sizes("cuda rope", {n_tokens, n_heads, head_dim});
  const int64_t n_pairs = n_tokens * n_heads * (head_dim / 2);
  if (n_pairs == 0) return;
  rope_kernel<<<grid_for(n_pairs), block_threads>>>(x, pos, n_heads, head_dim, n_pairs, double(freq_base));
  check_launch("cuda rope");
}

}  // namespace tandem::kernels::cuda
