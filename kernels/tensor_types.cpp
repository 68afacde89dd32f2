#include "kernels/tensor_types.h"

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/simd.h"

#include <algorithm>

namespace tandem::kernels {

std::optional<dtype> dtype_from_ggml(uint32_t t) {
  switch (t) {
    case 0: return dtype::f32;
    case 1: return dtype::f16;
    case 2: return dtype::q4_0;
    case 8: return dtype::q8_0;
    case 12: return dtype::q4_k;
    case 13: return dtype::q5_k;
    case 14: return dtype::q6_k;
    case 30: return dtype::bf16;
    default: return std::nullopt;
  }
}

std::optional<dtype> dtype_from_name(std::string_view n) {
  for (auto t : {dtype::f32, dtype::f16, dtype::q4_0, dtype::q8_0, dtype::q4_k, dtype::q5_k, dtype::q6_k, dtype::bf16})
    if (n == to_string(t)) return t;
  return std::nullopt;
}

int64_t block_elems(dtype t) {
  switch (t) {
    case dtype::f32:
    case dtype::f16:
    case dtype::bf16: return 1;
    case dtype::q4_0: return q4_0_block;
    case dtype::q8_0: return q8_0_block;
    case dtype::q4_k:
    case dtype::q5_k:
    case dtype::q6_k: return qk_k;
  }
  return 1;
}

int64_t block_bytes(dtype t) {
  switch (t) {
    case dtype::f32: return 4;
    case dtype::f16: return 2;
    case dtype::bf16: return 2;
    case dtype::q4_0: return sizeof(block_q4_0);
    case dtype::q8_0: return sizeof(block_q8_0);
    case dtype::q4_k: return sizeof(block_q4_k);
    case dtype::q5_k: return sizeof(block_q5_k);
    case dtype::q6_k: return sizeof(block_q6_k);
  }
  return 0;
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      u = sign | (uint32_t(127 - 15 - e) << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (mant << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;  // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // overflow to inf (incl. rounding)
  if (abs < 0x38800000u) {  // subnormal or zero in half
    if (abs < 0x33000000u) return sign;  // below half of smallest subnormal
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const int shift = 126 - int(abs >> 23);  // bits to drop: half ulp is 2^-24
    uint32_t h = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1u))) ++h;
    return sign | uint16_t(h);
  }
  uint32_t h = ((abs >> 13) - (112u << 10));
  const uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return sign | uint16_t(h);
}

namespace {
// One Q4_K or Q5_K super-block (ggml's order of float operations): 4-bit q from qs, plus the
// fifth bit from qh for Q5_K (qh null for Q4_K, whose values are then q + 0). Advances dst.
void dequantize_k4(uint16_t dh, uint16_t dminh, const uint8_t* scales, const uint8_t* ql, const uint8_t* qh,
                   float*& dst) {
  const float d = f16_to_f32(dh), dmin = f16_to_f32(dminh);
  uint8_t u1 = 1, u2 = 2;
  for (int j = 0; j < qk_k; j += 64, ql += 32, u1 <<= 2, u2 <<= 2) {
    uint8_t sc, m;
    k4_scale_min(j / 32, scales, sc, m);
    const float d1 = d * float(sc), m1 = dmin * float(m);
    k4_scale_min(j / 32 + 1, scales, sc, m);
    const float d2 = d * float(sc), m2 = dmin * float(m);
    for (int l = 0; l < 32; ++l) *dst++ = d1 * float((ql[l] & 0xF) + (qh && (qh[l] & u1) ? 16 : 0)) - m1;
    for (int l = 0; l < 32; ++l) *dst++ = d2 * float((ql[l] >> 4) + (qh && (qh[l] & u2) ? 16 : 0)) - m2;
  }
}
}  // namespace

void dequantize_row(dtype t, const void* src, float* dst, int64_t n) {
  switch (t) {
    case dtype::f32: std::memcpy(dst, src, size_t(n) * 4); return;
    case dtype::f16: {
      auto s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
      return;
    }
    case dtype::bf16: {
      auto s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
      return;
    }
    case dtype::q8_0: {
      auto b = static_cast<const block_q8_0*>(src);
      for (int64_t i = 0; i < n / q8_0_block; ++i) {
        const float d = f16_to_f32(b[i].d);
        for (int j = 0; j < q8_0_block; ++j) dst[i * q8_0_block + j] = d * float(b[i].qs[j]);
      }
      return;
    }
    // The block types below follow ggml's reference dequantize_row_* (ggml-quants.c) in
    // the order of their float operations, so the values are bitwise llama.cpp's.
    case dtype::q4_0: {
      auto b = static_cast<const block_q4_0*>(src);
      for (int64_t i = 0; i < n / q4_0_block; ++i, dst += q4_0_block) {
        const float d = f16_to_f32(b[i].d);
        for (int j = 0; j < q4_0_block / 2; ++j) {
          dst[j] = float((b[i].qs[j] & 0x0F) - 8) * d;
          dst[j + q4_0_block / 2] = float((b[i].qs[j] >> 4) - 8) * d;
        }
      }
      return;
    }
    case dtype::q4_k: {
      auto b = static_cast<const block_q4_k*>(src);
      for (int64_t i = 0; i < n / qk_k; ++i) dequantize_k4(b[i].d, b[i].dmin, b[i].scales, b[i].qs, nullptr, dst);
      return;
    }
    case dtype::q5_k: {
      auto b = static_cast<const block_q5_k*>(src);
      for (int64_t i = 0; i < n / qk_k; ++i) dequantize_k4(b[i].d, b[i].dmin, b[i].scales, b[i].qs, b[i].qh, dst);
      return;
    }
    case dtype::q6_k: {
      auto b = static_cast<const block_q6_k*>(src);
      for (int64_t i = 0; i < n / qk_k; ++i) {
        const float d = f16_to_f32(b[i].d);
        const uint8_t* ql = b[i].ql;
        const uint8_t* qh = b[i].qh;
        const int8_t* sc = b[i].scales;
        for (int h = 0; h < qk_k; h += 128, dst += 128, ql += 64, qh += 32, sc += 8)
          for (int l = 0; l < 32; ++l) {
            const int is = l / 16;
            const int q1 = int((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
            const int q2 = int((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
            const int q3 = int((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            const int q4 = int((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            dst[l] = d * float(sc[is]) * float(q1);
            dst[l + 32] = d * float(sc[is + 2]) * float(q2);
            dst[l + 64] = d * float(sc[is + 4]) * float(q3);
            dst[l + 96] = d * float(sc[is + 6]) * float(q4);
          }
      }
      return;
    }
  }
}

namespace {

// The nearest integer to v in [lo, hi].
int clamp_round(float v, int lo, int hi) { return std::clamp(int(std::lround(v)), lo, hi); }

void quantize_q4_0(const float* x, block_q4_0* b, int64_t n) {
  for (int64_t i = 0; i < n / q4_0_block; ++i, x += q4_0_block) {
    float amax = 0.0f, maxv = 0.0f;  // as ggml: the signed value of largest magnitude maps to -8
    for (int j = 0; j < q4_0_block; ++j)
      if (std::fabs(x[j]) > amax) {
        amax = std::fabs(x[j]);
        maxv = x[j];
      }
    const float d = maxv / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    b[i].d = f32_to_f16(d);
    for (int j = 0; j < q4_0_block / 2; ++j) {
      const int lo = clamp_round(x[j] * id + 8.0f, 0, 15), hi = clamp_round(x[j + 16] * id + 8.0f, 0, 15);
      b[i].qs[j] = uint8_t(lo | (hi << 4));
    }
  }
}

// One super-block's sub-block scales and mins (unsigned, asymmetric: value = s * q - m with
// q in [0, qmax]), then 6-bit codes relative to the super-block's d and dmin.
struct k_fit {
  float d = 0, dmin = 0;
  uint8_t sc[8] = {}, m[8] = {};
};
k_fit fit_k(const float* x, int qmax) {
  float s[8], mn[8];
  for (int j = 0; j < 8; ++j) {
    float lo = x[32 * j], hi = x[32 * j];
    for (int l = 1; l < 32; ++l) {
      lo = std::min(lo, x[32 * j + l]);
      hi = std::max(hi, x[32 * j + l]);
    }
    lo = std::min(lo, 0.0f);  // the min is subtracted: keep it >= 0
    s[j] = (hi - lo) / float(qmax);
    mn[j] = -lo;
  }
  k_fit f;
  const float smax = *std::max_element(s, s + 8), mmax = *std::max_element(mn, mn + 8);
  f.d = smax / 63.0f;
  f.dmin = mmax / 63.0f;
  for (int j = 0; j < 8; ++j) {
    f.sc[j] = f.d > 0 ? uint8_t(clamp_round(s[j] / f.d, 0, 63)) : 0;
    f.m[j] = f.dmin > 0 ? uint8_t(clamp_round(mn[j] / f.dmin, 0, 63)) : 0;
  }
  return f;
}
void pack_k4_scales(const k_fit& f, uint8_t* q) {  // the inverse of k4_scale_min
  for (int j = 0; j < 4; ++j) {
    q[j] = uint8_t((f.sc[j] & 63) | ((f.sc[j + 4] >> 4) << 6));
    q[j + 4] = uint8_t((f.m[j] & 63) | ((f.m[j + 4] >> 4) << 6));
    q[j + 8] = uint8_t((f.sc[j + 4] & 0xF) | ((f.m[j + 4] & 0xF) << 4));
  }
}
// Sub-block j's integer codes under the fit's rounded d/dmin (as the file will decode them).
void k_codes(const k_fit& f, const float* x, int j, int qmax, int* q) {
  const float hd = f16_to_f32(f32_to_f16(f.d)), hm = f16_to_f32(f32_to_f16(f.dmin));
  const float s = hd * float(f.sc[j]), m = hm * float(f.m[j]);
  for (int l = 0; l < 32; ++l) q[l] = s > 0 ? clamp_round((x[32 * j + l] + m) / s, 0, qmax) : 0;
}

// One Q4_K (qh null, q in 0..15) or Q5_K (q in 0..31, fifth bits in qh) super-block.
void quantize_k4(const float* x, uint16_t& d, uint16_t& dmin, uint8_t* scales, uint8_t* qs, uint8_t* qh) {
  const int qmax = qh ? 31 : 15;
  const k_fit f = fit_k(x, qmax);
  d = f32_to_f16(f.d);
  dmin = f32_to_f16(f.dmin);
  pack_k4_scales(f, scales);
  if (qh) std::memset(qh, 0, qk_k / 8);
  for (int g = 0; g < 4; ++g) {
    int lo[32], hi[32];
    k_codes(f, x, 2 * g, qmax, lo);
    k_codes(f, x, 2 * g + 1, qmax, hi);
    for (int l = 0; l < 32; ++l) {
      qs[32 * g + l] = uint8_t((lo[l] & 0xF) | ((hi[l] & 0xF) << 4));
      if (qh && (lo[l] & 16)) qh[l] |= uint8_t(1 << (2 * g));
      if (qh && (hi[l] & 16)) qh[l] |= uint8_t(2 << (2 * g));
    }
  }
}

void quantize_q4_k(const float* x, block_q4_k* b, int64_t n) {
  for (int64_t i = 0; i < n / qk_k; ++i, x += qk_k) quantize_k4(x, b[i].d, b[i].dmin, b[i].scales, b[i].qs, nullptr);
}

void quantize_q5_k(const float* x, block_q5_k* b, int64_t n) {
  for (int64_t i = 0; i < n / qk_k; ++i, x += qk_k) quantize_k4(x, b[i].d, b[i].dmin, b[i].scales, b[i].qs, b[i].qh);
}

void quantize_q6_k(const float* x, block_q6_k* b, int64_t n) {
  for (int64_t i = 0; i < n / qk_k; ++i, x += qk_k) {
    float s[16], smax = 0.0f;
    for (int j = 0; j < 16; ++j) {
      float amax = 0.0f;
      for (int l = 0; l < 16; ++l) amax = std::max(amax, std::fabs(x[16 * j + l]));
      s[j] = amax / 31.0f;
      smax = std::max(smax, s[j]);
    }
    const float d = smax / 127.0f, hd = f16_to_f32(f32_to_f16(d));
    b[i].d = f32_to_f16(d);
    int q[qk_k];
    for (int j = 0; j < 16; ++j) {
      b[i].scales[j] = int8_t(d > 0 ? clamp_round(s[j] / d, -128, 127) : 0);
      const float sj = hd * float(b[i].scales[j]);
      for (int l = 0; l < 16; ++l) q[16 * j + l] = sj > 0 ? clamp_round(x[16 * j + l] / sj, -32, 31) + 32 : 32;
    }
    std::memset(b[i].qh, 0, sizeof b[i].qh);
    for (int h = 0; h < 2; ++h)  // the inverse of dequantize_row's layout, 128 elements at a time
      for (int l = 0; l < 32; ++l) {
        const int* e = q + 128 * h;
        b[i].ql[64 * h + l] = uint8_t((e[l] & 0xF) | ((e[l + 64] & 0xF) << 4));
        b[i].ql[64 * h + l + 32] = uint8_t((e[l + 32] & 0xF) | ((e[l + 96] & 0xF) << 4));
        b[i].qh[32 * h + l] =
            uint8_t((e[l] >> 4) | ((e[l + 32] >> 4) << 2) | ((e[l + 64] >> 4) << 4) | ((e[l + 96] >> 4) << 6));
      }
  }
}

}  // namespace

void quantize_row_q8_0(const float* src, block_q8_0* dst, int64_t n) {
  for (int64_t i = 0; i < n / q8_0_block; ++i) {
    const float* x = src + i * q8_0_block;
    float amax = 0.0f;
    for (int j = 0; j < q8_0_block; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    dst[i].d = f32_to_f16(d);
    for (int j = 0; j < q8_0_block; ++j) dst[i].qs[j] = int8_t(std::lround(x[j] * id));
  }
}

namespace {
// f32 -> f16 8 at a time with F16C (round to nearest even, as f32_to_f16; NaNs stay NaN, their
// payload bits aside): the f16 KV cache's writes went through the scalar routine, 2% of a
// bench-76m run under perf.
__attribute__((target("avx,f16c"))) void f32_to_f16_f16c(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; ++i) dst[i] = f32_to_f16(src[i]);
}
// (F16C comes with AVX2 on every CPU but Ivy Bridge, which takes the exact scalar routine.)
const bool have_f16c = cpu::detail::cpu_has(cpu::detail::isa::avx2);
}  // namespace

void quantize_row(dtype t, const float* src, void* dst, int64_t n) {
  switch (t) {
    case dtype::f32: std::memcpy(dst, src, size_t(n) * 4); return;
    case dtype::f16: {
      auto d = static_cast<uint16_t*>(dst);
      if (have_f16c) return f32_to_f16_f16c(src, d, n);
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_f16(src[i]);
      return;
    }
    case dtype::bf16: {
      auto d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
      return;
    }
    case dtype::q8_0: quantize_row_q8_0(src, static_cast<block_q8_0*>(dst), n); return;
    case dtype::q4_0: return quantize_q4_0(src, static_cast<block_q4_0*>(dst), n);
    case dtype::q4_k: return quantize_q4_k(src, static_cast<block_q4_k*>(dst), n);
    case dtype::q5_k: return quantize_q5_k(src, static_cast<block_q5_k*>(dst), n);
    case dtype::q6_k: return quantize_q6_k(src, static_cast<block_q6_k*>(dst), n);
  }
}

}  // namespace tandem::kernels
