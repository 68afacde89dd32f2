#include "kernels/cpu/ops.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/simd.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace tandem::kernels::cpu {
namespace {

bool have_avx512() { return detail::cpu_has(detail::isa::avx512); }

#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,fma")

// Sum of squares of x[0, n) in double (as rms_norm's scalar loop, in another order).
double sum_squares_avx512(const float* x, int64_t n) {
  __m512d acc[4] = {_mm512_setzero_pd(), _mm512_setzero_pd(), _mm512_setzero_pd(), _mm512_setzero_pd()};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int u = 0; u < 4; ++u) {
      const __m512d v = _mm512_cvtps_pd(_mm256_loadu_ps(x + i + 8 * u));
      acc[u] = _mm512_fmadd_pd(v, v, acc[u]);
    }
  double ss = _mm512_reduce_add_pd(_mm512_add_pd(_mm512_add_pd(acc[0], acc[1]), _mm512_add_pd(acc[2], acc[3])));
  for (; i < n; ++i) ss += double(x[i]) * x[i];
  return ss;
}

// y = (x * scale) * w, rounded as the scalar expression.
void scale_mul_avx512(const float* x, float scale, const float* w, float* y, int64_t n) {
  const __m512 s = _mm512_set1_ps(scale);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(y + i, _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(x + i), s), _mm512_loadu_ps(w + i)));
  for (; i < n; ++i) y[i] = x[i] * scale * w[i];
}

// e^x: x = n ln2 + r (ln2 in two parts, |r| <= ln2 / 2), e^r by a degree-7 Taylor polynomial
// (truncation < 6e-9), times 2^n. Saturates to 0 below -104 and to inf above 89.
inline __m512 exp_ps(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-104.0f)), _mm512_set1_ps(89.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);  // ln2 high part: exact product
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

void silu_mul_avx512(const float* gate, const float* up, float* out, int64_t n) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 mk = n - i >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - i)) - 1);
    const __m512 g = _mm512_maskz_loadu_ps(mk, gate + i);
    const __m512 e = exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), g));
    const __m512 s = _mm512_div_ps(g, _mm512_add_ps(one, e));
    _mm512_mask_storeu_ps(out + i, mk, _mm512_mul_ps(s, _mm512_maskz_loadu_ps(mk, up + i)));
  }
}

#pragma GCC pop_options

}  // namespace

void rms_norm(const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps) {
  const bool fast = have_avx512();
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float* yr = y + r * dim;
    double ss = 0.0;  // double: dim-long sums of squares lose digits in float
    if (fast) {
      ss = sum_squares_avx512(xr, dim);
    } else {
      for (int64_t i = 0; i < dim; ++i) ss += double(xr[i]) * xr[i];
    }
    const float scale = float(1.0 / std::sqrt(ss / double(dim) + eps));
    if (fast) {
      scale_mul_avx512(xr, scale, w, yr, dim);
    } else {
      for (int64_t i = 0; i < dim; ++i) yr[i] = xr[i] * scale * w[i];
    }
  }
}

void silu_mul(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void silu_mul_fast(const float* gate, const float* up, float* out, int64_t n) {
  if (have_avx512()) return silu_mul_avx512(gate, up, out, n);
  silu_mul(gate, up, out, n);
}

void add_inplace(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

void rope_table(const int32_t* pos, int64_t n_tokens, int64_t head_dim, float freq_base, float* cs, float freq_scale,
                const float* freq_factors) {
  // Angles depend only on (pos, i): the inverse frequencies once per call.
  std::vector<double> inv_freq(size_t(head_dim / 2));
  for (int64_t i = 0; i < head_dim / 2; ++i) {
    inv_freq[size_t(i)] = std::pow(double(freq_base), -2.0 * double(i) / double(head_dim)) * double(freq_scale);
    if (freq_factors) inv_freq[size_t(i)] /= double(freq_factors[i]);
  }
  for (int64_t t = 0; t < n_tokens; ++t)
    for (int64_t i = 0; i < head_dim / 2; ++i) {
      const double theta = double(pos[t]) * inv_freq[size_t(i)];
      cs[(t * (head_dim / 2) + i) * 2] = float(std::cos(theta));
      cs[(t * (head_dim / 2) + i) * 2 + 1] = float(std::sin(theta));
    }
}

void rope_apply(float* x, const float* cs, int64_t n_tokens, int64_t n_heads, int64_t head_dim) {
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* ct = cs + t * head_dim;  // head_dim / 2 pairs
    for (int64_t h = 0; h < n_heads; ++h) {
      float* p = x + (t * n_heads + h) * head_dim;
      for (int64_t i = 0; i < head_dim / 2; ++i) {
        const float c = ct[2 * i], s = ct[2 * i + 1];
        const float a = p[2 * i], b = p[2 * i + 1];
        p[2 * i] = a * c - b * s;
        p[2 * i + 1] = a * s + b * c;
      }
    }
  }
}

void rope_apply_neox(float* x, const float* cs, int64_t n_tokens, int64_t n_heads, int64_t head_dim) {
  const int64_t half = head_dim / 2;
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* ct = cs + t * head_dim;
    for (int64_t h = 0; h < n_heads; ++h) {
      float* p = x + (t * n_heads + h) * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        const float c = ct[2 * i], s = ct[2 * i + 1];
        const float a = p[i], b = p[i + half];
        p[i] = a * c - b * s;
        p[i + half] = a * s + b * c;
      }
    }
  }
}

void gelu_mul(const float* gate, const float* up, float* out, int64_t n) {
  constexpr float k = 0.7978845608028654f;  // sqrt(2 / pi)
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = 0.5f * g * (1.0f + std::tanh(k * g * (1.0f + 0.044715f * g * g))) * up[i];
  }
}

void add_rows(float* x, const float* b, int64_t rows, int64_t n) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < n; ++i) x[r * n + i] += b[i];
}

void softcap(float* x, int64_t n, float cap) {
  const float inv = 1.0f / cap;
  for (int64_t i = 0; i < n; ++i) x[i] = cap * std::tanh(x[i] * inv);
}

void scale_inplace(float* x, int64_t n, float a) {
  for (int64_t i = 0; i < n; ++i) x[i] *= a;
}

void rope(float* x, const int32_t* pos, int64_t n_tokens, int64_t n_heads, int64_t head_dim, float freq_base) {
  std::vector<float> cs(size_t(n_tokens * (head_dim / 2) * 2));
  rope_table(pos, n_tokens, head_dim, freq_base, cs.data());
  rope_apply(x, cs.data(), n_tokens, n_heads, head_dim);
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
