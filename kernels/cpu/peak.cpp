#include "kernels/cpu/peak.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <vector>

#include "kernels/cpu/matmul_impl.h"

namespace tandem::kernels::cpu {
namespace {

using detail::isa;

bool wide() { return detail::best_isa() == isa::avx512 || detail::best_isa() == isa::avx512_bf16; }

double fma_one_thread(double seconds) {
  if (wide()) return detail::fma_gflops_avx512(seconds);
  if (detail::best_isa() == isa::avx2) return detail::fma_gflops_avx2(seconds);
  return detail::fma_gflops_scalar(seconds);
}

float read_sum(const float* p, size_t n) {
  if (wide()) return detail::read_sum_avx512(p, n);
  if (detail::best_isa() == isa::avx2) return detail::read_sum_avx2(p, n);
  return detail::read_sum_scalar(p, n);
}

}  // namespace

double measure_fma_gflops(thread_pool& pool, double seconds) {
  std::vector<double> per(size_t(pool.size()), 0.0);
  pool.run_on_all([&](int t) { per[size_t(t)] = fma_one_thread(seconds); });
  double total = 0;
  for (double g : per) total += g;
  return total;
}

double measure_read_bandwidth_gbs(thread_pool& pool, size_t bytes, double seconds) {
  // Equal slices of whole 256-byte lines (the vector loops read 64 floats per step).
  const size_t threads = size_t(pool.size());
  const size_t slice_floats = std::max<size_t>(64, bytes / 4 / threads / 64 * 64);
  const size_t total = slice_floats * threads * 4;
  std::unique_ptr<float, decltype(&std::free)> buf(
      static_cast<float*>(std::aligned_alloc(64, total)), &std::free);
  if (!buf) throw std::bad_alloc();
  float* base = buf.get();
  // First touch by the thread that reads the slice later (its NUMA node, its page mapping).
  pool.run_on_all([&](int t) {
    float* s = base + size_t(t) * slice_floats;
    for (size_t i = 0; i < slice_floats; ++i) s[i] = float(i & 7);
  });
  std::atomic<uint64_t> sink{0};
  auto pass = [&] {
    pool.run_on_all([&](int t) {
      const float v = read_sum(base + size_t(t) * slice_floats, slice_floats);
      uint32_t bits;
      std::memcpy(&bits, &v, 4);
      sink.fetch_add(bits, std::memory_order_relaxed);  // keeps the sums alive
    });
  };
  pass();  // warm-up: page tables, clocks
  const auto t0 = std::chrono::steady_clock::now();
  double elapsed = 0;
  int passes = 0;
  do {
    pass();
    ++passes;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  } while (elapsed < seconds || passes < 2);
  return double(total) * passes / elapsed * 1e-9;
}

}  // namespace tandem::kernels::cpu
