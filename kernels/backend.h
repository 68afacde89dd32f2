#pragma once
// The CUDA backend as it stands: device discovery and the elementwise ops it has, each
// selectable by backend_kind so that tests/test_cuda.cpp checks it against the CPU reference.
// It is NOT wired into the engine: runtime/engine/engine.cpp computes with kernels/cpu/* directly
// (matmul, attention, quantized dot products exist only there), so no request runs on a GPU
// today. When the CUDA backend has the engine's ops, this becomes their one dispatch point.
//
// Callers name a backend_kind and pass pointers in that backend's memory: host memory for
// cpu, device memory for cuda. CUDA ops are queued asynchronously on the default stream;
// execution errors surface as std::runtime_error at the next synchronisation or copy (see
// kernels/cuda/launchers.h).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::kernels {

enum class backend_kind { cpu, cuda };

constexpr std::string_view to_string(backend_kind k) {
  switch (k) {
    case backend_kind::cpu: return "cpu";
    case backend_kind::cuda: return "cuda";
  }
  return "?";
}

struct device_info {
  backend_kind kind;
  int index;  // device ordinal within its backend (0 for the CPU)
  std::string name;
  size_t memory_bytes;  // physical RAM for the CPU, global memory for a GPU
};

// True when this build includes the CUDA backend (TANDEM_HAVE_CUDA).
bool cuda_compiled();
// The CPU always comes first; then each CUDA device when compiled in and present.
std::vector<device_info> list_devices();

// Elementwise ops, contracts as in kernels/cpu/ops.h. backend_kind::cuda throws
// std::runtime_error in a build without CUDA, or with the CUDA message when it fails.
void rms_norm(backend_kind, const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps);
void silu_mul(backend_kind, const float* gate, const float* up, float* out, int64_t n);
void add_inplace(backend_kind, float* x, const float* y, int64_t n);
void rope(backend_kind, float* x, const int32_t* pos, int64_t n_tokens, int64_t n_heads, int64_t head_dim,
          float freq_base);

}  // namespace tandem::kernels
