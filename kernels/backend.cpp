#include "kernels/backend.h"

#include <unistd.h>

#include <fstream>
#include <stdexcept>

#include "kernels/cpu/ops.h"
#ifdef TANDEM_HAVE_CUDA
#include "kernels/cuda/launchers.h"
#endif

namespace tandem::kernels {
namespace {

// Without CUDA the call is not even compiled: its symbols do not exist in that build.
#ifdef TANDEM_HAVE_CUDA
#define TANDEM_CUDA_CALL(call) call
#else
[[noreturn]] void throw_no_cuda() { throw std::runtime_error("tandem was built without CUDA"); }
#define TANDEM_CUDA_CALL(call) throw_no_cuda()
#endif

[[noreturn]] void throw_bad_kind() { throw std::invalid_argument("unknown backend_kind"); }

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) != 0) continue;
    const auto colon = line.find(':');
    if (colon != std::string::npos && colon + 2 <= line.size()) return line.substr(colon + 2);
  }
  return "cpu";
}

size_t physical_memory() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? size_t(pages) * size_t(page) : 0;
}

}  // namespace

bool cuda_compiled() {
#ifdef TANDEM_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

std::vector<device_info> list_devices() {
  std::vector<device_info> out{{backend_kind::cpu, 0, cpu_model_name(), physical_memory()}};
#ifdef TANDEM_HAVE_CUDA
  for (int i = 0, n = cuda::cuda_device_count(); i < n; ++i)
    out.push_back({backend_kind::cuda, i, cuda::cuda_device_name(i), cuda::cuda_device_memory(i)});
#endif
  return out;
}

void rms_norm(backend_kind k, const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps) {
  switch (k) {
    case backend_kind::cpu: return cpu::rms_norm(x, w, y, rows, dim, eps);
    case backend_kind::cuda: return TANDEM_CUDA_CALL(cuda::rms_norm(x, w, y, rows, dim, eps));
  }
  throw_bad_kind();
}

void silu_mul(backend_kind k, const float* gate, const float* up, float* out, int64_t n) {
  switch (k) {
    case backend_kind::cpu: return cpu::silu_mul(gate, up, out, n);
    case backend_kind::cuda: return TANDEM_CUDA_CALL(cuda::silu_mul(gate, up, out, n));
  }
  throw_bad_kind();
}

void add_inplace(backend_kind k, float* x, const float* y, int64_t n) {
  switch (k) {
    case backend_kind::cpu: return cpu::add_inplace(x, y, n);
    case backend_kind::cuda: return TANDEM_CUDA_CALL(cuda::add_inplace(x, y, n));
  }
  throw_bad_kind();
}

void rope(backend_kind k, float* x, const int32_t* pos, int64_t n_tokens, int64_t n_heads, int64_t head_dim,
          float freq_base) {
  switch (k) {
    case backend_kind::cpu: return cpu::rope(x, pos, n_tokens, n_heads, head_dim, freq_base);
    case backend_kind::cuda: return TANDEM_CUDA_CALL(cuda::rope(x, pos, n_tokens, n_heads, head_dim, freq_base));
  }
  throw_bad_kind();
}

}  // namespace tandem::kernels
