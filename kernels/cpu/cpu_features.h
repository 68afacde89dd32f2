#pragma once
// The one CPU-feature probe: every kernel asks here which instruction sets it may use, so a
// level means the same everywhere (matmul, attention, the elementwise ops, the peak probe).

namespace tandem::kernels::cpu::detail {

// Ordered: a level needs everything the ones before it need.
enum class isa {
  scalar,  // portable C++ (prefill still goes through OpenBLAS)
  avx2,  // AVX2 + FMA + F16C
  avx512,  // AVX-512 F/BW/VL/DQ (+ FMA/F16C); q8_0 decode borrows the AVX2 kernel
  avx512_bf16,  // avx512 + AVX512-VNNI + AVX512-BF16
};

const char* isa_label(isa level);
// Whether this CPU runs `level` (detected once).
bool cpu_has(isa level);
// The level the matmul kernels run: the best this CPU has, capped by TANDEM_ISA=scalar|avx2|
// avx512|avx512_bf16 (to measure or test a lower one on this CPU). Attention and the elementwise
// ops ask cpu_has() and are not capped (docs/performance.md measures the matmul levels alone).
isa best_isa();
bool isa_supported(isa level);

}  // namespace tandem::kernels::cpu::detail
