#pragma once
// Machine peaks the CPU kernels are judged against (printed by benchmarks next to the
// achieved figures).
#include <cstddef>

#include "kernels/thread_pool.h"

namespace tandem::kernels::cpu {

// Peak f32 multiply-add throughput in GFLOP/s (an FMA counts 2): independent FMA chains held in
// registers on the ISA the matmul dispatches to, run on every thread of `pool` for `seconds`.
double measure_fma_gflops(thread_pool& pool, double seconds = 0.3);

// Read bandwidth in GB/s: every thread of `pool` sum-reduces its slice of a `bytes` buffer
// (choose it larger than the caches), repeated for about `seconds`.
double measure_read_bandwidth_gbs(thread_pool& pool, size_t bytes = 512ull << 20, double seconds = 0.3);

}  // namespace tandem::kernels::cpu
