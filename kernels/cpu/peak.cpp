// Machine peaks for the dispatched ISA. The vector loops are compiled for their ISA through
// target attributes and run only after best_isa() says the CPU has it.
#include "kernels/cpu/peak.h"
#include "kernels/cpu/simd.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <vector>

#include "kernels/cpu/matmul_impl.h"

namespace tandem::kernels::cpu {
namespace {

using detail::isa;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Twelve independent multiply-add chains per thread, enough to cover FMA latency x throughput
// (4 cycles x 2 pipes). Distinct seeds keep the compiler from merging chains; TANDEM_UNROLL
// keeps them in registers. Evaluates to GFLOP/s (a multiply-add counts 2 per lane). A macro,
// not a template: the intrinsics must expand inside the target-attributed functions below.
#define TANDEM_FMA_CHAINS(V, LANES, FMA, SET1)                           \
  volatile float seed = 0.999999f; /* opaque to the optimiser */         \
  const V b = SET1(seed), c = SET1(1e-7f);                               \
  V a[12];                                                               \
  TANDEM_UNROLL for (int j = 0; j < 12; ++j) a[j] = SET1(float(j));      \
  const auto t0 = std::chrono::steady_clock::now();                      \
  int64_t rounds = 0;                                                    \
  do {                                                                   \
    for (int it = 0; it < 1 << 14; ++it) {                               \
      TANDEM_UNROLL for (int j = 0; j < 12; ++j) a[j] = FMA(a[j], b, c); \
    }                                                                    \
    rounds += 1 << 14;                                                   \
  } while (seconds_since(t0) < seconds);                                 \
  const double elapsed = seconds_since(t0);                              \
  TANDEM_UNROLL for (int j = 1; j < 12; ++j) a[0] = FMA(a[0], b, a[j]);  \
  float first;                                                           \
  std::memcpy(&first, &a[0], sizeof first);                              \
  volatile float sink = first;                                           \
  (void)sink;                                                            \
  return double(rounds) * 12 * 2 * (LANES) / elapsed * 1e-9

__attribute__((target("avx512f,fma"))) double fma_avx512(double seconds) {
  TANDEM_FMA_CHAINS(__m512, 16, _mm512_fmadd_ps, _mm512_set1_ps);
}

__attribute__((target("avx2,fma"))) double fma_avx2(double seconds) {
  TANDEM_FMA_CHAINS(__m256, 8, _mm256_fmadd_ps, _mm256_set1_ps);
}

inline float mul_add(float a, float b, float c) { return a * b + c; }  // no FMA assumed
inline float splat(float v) { return v; }
double fma_scalar(double seconds) { TANDEM_FMA_CHAINS(float, 1, mul_add, splat); }

// Sum-reductions of n floats (n a multiple of 64, p 64-byte aligned): four independent
// accumulators, so the loop waits on memory, not on add latency.
__attribute__((target("avx512f"))) float sum_avx512(const float* p, size_t n) {
  __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  for (size_t i = 0; i < n; i += 64) {
    s0 = _mm512_add_ps(s0, _mm512_load_ps(p + i));
    s1 = _mm512_add_ps(s1, _mm512_load_ps(p + i + 16));
    s2 = _mm512_add_ps(s2, _mm512_load_ps(p + i + 32));
    s3 = _mm512_add_ps(s3, _mm512_load_ps(p + i + 48));
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}

__attribute__((target("avx2"))) float sum_avx2(const float* p, size_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  for (size_t i = 0; i < n; i += 32) {
    s0 = _mm256_add_ps(s0, _mm256_load_ps(p + i));
    s1 = _mm256_add_ps(s1, _mm256_load_ps(p + i + 8));
    s2 = _mm256_add_ps(s2, _mm256_load_ps(p + i + 16));
    s3 = _mm256_add_ps(s3, _mm256_load_ps(p + i + 24));
  }
  const __m256 s = _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3));
  float lanes[8];
  _mm256_storeu_ps(lanes, s);
  return lanes[0] + lanes[1] + lanes[2] + lanes[3] + lanes[4] + lanes[5] + lanes[6] + lanes[7];
}

float sum_scalar(const float* p, size_t n) {
  // Integer adds of 8-byte words are associative, so the compiler may vectorise them freely.
  uint64_t s = 0;
  for (size_t i = 0; i < n; i += 2) {
    uint64_t u;
    std::memcpy(&u, p + i, 8);
    s += u;
  }
  return float(s & 0xffff);
}

bool wide() { return detail::best_isa() >= isa::avx512; }

double fma_one_thread(double seconds) {
  if (wide()) return fma_avx512(seconds);
  if (detail::best_isa() == isa::avx2) return fma_avx2(seconds);
  return fma_scalar(seconds);
}

float read_sum(const float* p, size_t n) {
  if (wide()) return sum_avx512(p, n);
  if (detail::best_isa() == isa::avx2) return sum_avx2(p, n);
  return sum_scalar(p, n);
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
  // Equal slices of whole 256-byte steps (the vector loops read 64 floats per step).
  const size_t threads = size_t(pool.size());
  const size_t slice = std::max<size_t>(64, bytes / 4 / threads / 64 * 64);  // floats
  const size_t total = slice * threads * 4;  // bytes
  std::unique_ptr<float, decltype(&std::free)> buf(static_cast<float*>(std::aligned_alloc(64, total)), &std::free);
  if (!buf) throw std::bad_alloc();
  float* base = buf.get();
  // First touch by the thread that reads the slice later (its NUMA node, its page mapping).
  pool.run_on_all([&](int t) {
    float* s = base + size_t(t) * slice;
    for (size_t i = 0; i < slice; ++i) s[i] = float(i & 7);
  });
  std::atomic<uint32_t> sink{0};
  auto pass = [&] {
    pool.run_on_all([&](int t) {
      const float v = read_sum(base + size_t(t) * slice, slice);
      uint32_t bits;
      std::memcpy(&bits, &v, 4);
      sink.fetch_xor(bits, std::memory_order_relaxed);  // keeps the sums alive
    });
  };
  pass();  // warm-up: page tables, clocks
  const auto t0 = std::chrono::steady_clock::now();
  int passes = 0;
  do {
    pass();
    ++passes;
  } while (seconds_since(t0) < seconds || passes < 2);
  return double(total) * passes / seconds_since(t0) * 1e-9;
}

}  // namespace tandem::kernels::cpu
