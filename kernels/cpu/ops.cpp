#include "kernels/cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace tandem::kernels::cpu {

void rms_norm(const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float* yr = y + r * dim;
    double ss = 0.0;  // double: dim-long sums of squares lose digits in float
    for (int64_t i = 0; i < dim; ++i) ss += double(xr[i]) * xr[i];
    const float scale = float(1.0 / std::sqrt(ss / double(dim) + eps));
    for (int64_t i = 0; i < dim; ++i) yr[i] = xr[i] * scale * w[i];
  }
}

void silu_mul(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void add_inplace(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

void rope(float* x, const int32_t* pos, int64_t n_tokens, int64_t n_heads, int64_t head_dim,
          float freq_base) {
  // Angles depend only on (pos, i): compute the inverse frequencies once per call.
  std::vector<double> inv_freq(size_t(head_dim / 2));
  for (int64_t i = 0; i < head_dim / 2; ++i)
    inv_freq[size_t(i)] = std::pow(double(freq_base), -2.0 * double(i) / double(head_dim));
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t i = 0; i < head_dim / 2; ++i) {
      const double theta = double(pos[t]) * inv_freq[size_t(i)];
      const float c = float(std::cos(theta)), s = float(std::sin(theta));
      for (int64_t h = 0; h < n_heads; ++h) {
        float* p = x + (t * n_heads + h) * head_dim + 2 * i;
        const float a = p[0], b = p[1];
        p[0] = a * c - b * s;
        p[1] = a * s + b * c;
      }
    }
  }
}

void softmax(float* x, int64_t n) {
  if (n <= 0) return;
  const float mx = *std::max_element(x, x + n);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  const float inv = float(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

}  // namespace tandem::kernels::cpu
