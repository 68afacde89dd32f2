#include "kernels/tensor_types.h"

#include <algorithm>

namespace tandem::kernels {

std::optional<dtype> dtype_from_ggml(uint32_t t) {
  switch (t) {
    case 0: return dtype::f32;
    case 1: return dtype::f16;
    case 8: return dtype::q8_0;
    case 30: return dtype::bf16;
    default: return std::nullopt;
  }
}

std::optional<dtype> dtype_from_name(std::string_view n) {
  for (auto t : {dtype::f32, dtype::f16, dtype::q8_0, dtype::bf16})
    if (n == to_string(t)) return t;
  return std::nullopt;
}

int64_t block_elems(dtype t) { return t == dtype::q8_0 ? q8_0_block : 1; }

int64_t block_bytes(dtype t) {
  switch (t) {
    case dtype::f32: return 4;
    case dtype::f16: return 2;
    case dtype::bf16: return 2;
    case dtype::q8_0: return sizeof(block_q8_0);
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
      do { ++e; mant <<= 1; } while ((mant & 0x400u) == 0);
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
  if (abs > 0x7f800000u) return sign | 0x7e00u;            // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;           // overflow to inf (incl. rounding)
  if (abs < 0x38800000u) {                                 // subnormal or zero in half
    if (abs < 0x33000000u) return sign;                    // below half of smallest subnormal
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const int shift = 126 - int(abs >> 23);                // bits to drop: half ulp is 2^-24
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

void dequantize_row(dtype t, const void* src, float* dst, int64_t n) {
  switch (t) {
    case dtype::f32:
      std::memcpy(dst, src, size_t(n) * 4);
      return;
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
  }
}

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

void quantize_row(dtype t, const float* src, void* dst, int64_t n) {
  switch (t) {
    case dtype::f32:
      std::memcpy(dst, src, size_t(n) * 4);
      return;
    case dtype::f16: {
      auto d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_f16(src[i]);
      return;
    }
    case dtype::bf16: {
      auto d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
      return;
    }
    case dtype::q8_0:
      quantize_row_q8_0(src, static_cast<block_q8_0*>(dst), n);
      return;
  }
}

}  // namespace tandem::kernels
