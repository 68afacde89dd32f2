// Device queries, buffers and error checking for the CUDA backend.
#include "kernels/cuda/launchers.h"

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace tandem::kernels::cuda {

namespace detail {
void check(int err, const char* what) {
  const auto e = static_cast<cudaError_t>(err);
  if (e == cudaSuccess) return;
  // The runtime also records a failed call as its "last error"; clear it, or the next
  // launch check would report this failure again. (Sticky errors stay regardless.)
  cudaGetLastError();
  throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e) + " (" + cudaGetErrorName(e) + ")");
}
}  // namespace detail

namespace {
// Result of the first cudaGetDeviceCount. Probed once: the answer cannot change for this
// process (the runtime initialises once) and callers ask per op.
struct probe_result {
  int count = 0;
  std::string reason;
};
const probe_result& probe() {
  static const probe_result r = [] {
    probe_result p;
    const cudaError_t e = cudaGetDeviceCount(&p.count);
    if (e != cudaSuccess) {
      cudaGetLastError();  // clear the error so later checks do not report it again
      p.count = 0;
      p.reason = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e) + " (" + cudaGetErrorName(e) + ")";
    } else if (p.count == 0) {
      p.reason = "the CUDA runtime reports no devices";
    }
    return p;
  }();
  return r;
}

cudaDeviceProp properties(int index) {
  cudaDeviceProp prop{};
  detail::check(cudaGetDeviceProperties(&prop, index), "cudaGetDeviceProperties");
  return prop;
}
}  // namespace

int cuda_device_count() { return probe().count; }
std::string cuda_unavailable_reason() { return probe().reason; }
std::string cuda_device_name(int index) { return properties(index).name; }
size_t cuda_device_memory(int index) { return properties(index).totalGlobalMem; }

void* device_alloc(size_t bytes) {
  if (bytes == 0) return nullptr;
  void* p = nullptr;
  detail::check(cudaMalloc(&p, bytes), "cudaMalloc");
  return p;
}

void device_free(void* p) noexcept {
  if (p) cudaFree(p);
}

void copy_to_device(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  detail::check(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy to device");
}

void copy_to_host(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  detail::check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy to host");
}

void device_synchronize(const char* what) { detail::check(cudaDeviceSynchronize(), what); }

}  // namespace tandem::kernels::cuda
