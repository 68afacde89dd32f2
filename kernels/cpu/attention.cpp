#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace tandem::kernels::cpu {
namespace {

inline float dot(const float* a, const float* b, int32_t n) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int32_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

inline void axpy(float a, const float* x, float* y, int32_t n) {
#pragma omp simd
  for (int32_t i = 0; i < n; ++i) y[i] += a * x[i];
}

}  // namespace

void attention_paged(const float* q, int32_t n_q, const float* const* k_blocks,
                     const float* const* v_blocks, int32_t block_size, int32_t n_tokens,
                     int32_t head_dim, float scale, float* scores, float* out) {
  // scores[h][t] = q_h · k_t * scale
  for (int32_t t0 = 0, b = 0; t0 < n_tokens; t0 += block_size, ++b) {
    const int32_t n = std::min(block_size, n_tokens - t0);
    for (int32_t j = 0; j < n; ++j) {
      const float* k = k_blocks[b] + int64_t(j) * head_dim;
      for (int32_t h = 0; h < n_q; ++h)
        scores[int64_t(h) * n_tokens + t0 + j] = dot(q + int64_t(h) * head_dim, k, head_dim) * scale;
    }
  }
  for (int32_t h = 0; h < n_q; ++h) {
    float* s = scores + int64_t(h) * n_tokens;
    const float mx = *std::max_element(s, s + n_tokens);
    float sum = 0.0f;
    for (int32_t t = 0; t < n_tokens; ++t) {
      s[t] = std::exp(s[t] - mx);
      sum += s[t];
    }
    const float inv = 1.0f / sum;
    for (int32_t t = 0; t < n_tokens; ++t) s[t] *= inv;
  }
  std::memset(out, 0, sizeof(float) * size_t(n_q) * size_t(head_dim));
  for (int32_t t0 = 0, b = 0; t0 < n_tokens; t0 += block_size, ++b) {
    const int32_t n = std::min(block_size, n_tokens - t0);
    for (int32_t j = 0; j < n; ++j) {
      const float* v = v_blocks[b] + int64_t(j) * head_dim;
      for (int32_t h = 0; h < n_q; ++h)
        axpy(scores[int64_t(h) * n_tokens + t0 + j], v, out + int64_t(h) * head_dim, head_dim);
    }
  }
}

}  // namespace tandem::kernels::cpu
