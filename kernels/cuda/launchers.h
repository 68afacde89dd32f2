#pragma once
// Host-side entry points of the CUDA backend. Plain C++ (no CUDA headers) so that host code and
// tests can include it; defined in device.cu and elementwise.cu, linked only when
// TANDEM_HAVE_CUDA is set. Every failure is reported as std::runtime_error carrying the CUDA
// message, so callers (the actor layer) can turn it into an ordinary failure.
#include <cstddef>
#include <cstdint>
#include <string>

namespace tandem::kernels::cuda {

// ---- device queries (device.cu) ----
// Number of usable devices; 0 on any CUDA error (no driver, no device). Never throws.
int cuda_device_count();
// Why cuda_device_count() is 0 ("" when devices exist), for skip messages and logs.
std::string cuda_unavailable_reason();
std::string cuda_device_name(int index);
size_t cuda_device_memory(int index);  // total global memory, bytes

// ---- buffers (device.cu); the caller owns what it allocates ----
void* device_alloc(size_t bytes);  // throws on failure; bytes == 0 gives nullptr
void device_free(void* p) noexcept;  // nullptr is fine; errors are ignored (may run in unwinding)
void copy_to_device(void* dst, const void* src, size_t bytes);
void copy_to_host(void* dst, const void* src, size_t bytes);
// Waits for all queued work and throws if any of it failed. Kernels run asynchronously, so
// an execution error shows up here (or at the next copy), not at the launch.
void device_synchronize(const char* what = "cuda");

// ---- elementwise kernels (elementwise.cu); pointers are device memory ----
// Same contracts as kernels/cpu/ops.h. Queued on the default stream; only launch errors
// throw here.
void rms_norm(const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps);
void silu_mul(const float* gate, const float* up, float* out, int64_t n);
void add_inplace(float* x, const float* y, int64_t n);
void rope(float* x, const int32_t* pos, int64_t n_tokens, int64_t n_heads, int64_t head_dim, float freq_base);

namespace detail {
// Throws std::runtime_error("<what>: <CUDA message> (<error name>)") when err != cudaSuccess.
// Takes the cudaError_t as int so this header stays free of CUDA includes.
void check(int err, const char* what);
}  // namespace detail

}  // namespace tandem::kernels::cuda
