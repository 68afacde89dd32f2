#pragma once
// AVX2 helpers shared by the translation units compiled with -mavx2 (matmul_avx2.cpp,
// matmul_kquant_avx2.cpp); include it only from those.
#include "kernels/cpu/simd.h"

namespace tandem::kernels::cpu::detail {

// The sum of a vector's 8 floats (a fixed order: results are reproducible).
inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

}  // namespace tandem::kernels::cpu::detail
