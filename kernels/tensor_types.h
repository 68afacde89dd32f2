#pragma once
// Element types of weight tensors and the conversions every backend shares.
// Numbering follows GGUF's ggml_type so a file's type field maps directly.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace tandem::kernels {

enum class dtype : uint32_t { f32 = 0, f16 = 1, q8_0 = 8, bf16 = 30 };

constexpr int q8_0_block = 32;  // elements per Q8_0 block
struct block_q8_0 {             // 34 bytes, laid out exactly as in GGUF
  uint16_t d;                   // scale, IEEE half
  int8_t qs[q8_0_block];        // value = d * qs[i]
};
static_assert(sizeof(block_q8_0) == 34);

constexpr std::string_view to_string(dtype t) {
  switch (t) {
    case dtype::f32: return "f32";
    case dtype::f16: return "f16";
    case dtype::q8_0: return "q8_0";
    case dtype::bf16: return "bf16";
  }
  return "?";
}

std::optional<dtype> dtype_from_ggml(uint32_t ggml_type);
std::optional<dtype> dtype_from_name(std::string_view name);

// Elements per block and bytes per block (1 and sizeof(element) for plain types).
int64_t block_elems(dtype t);
int64_t block_bytes(dtype t);
// Bytes of a row of n elements; n must be a multiple of block_elems(t).
inline int64_t row_bytes(dtype t, int64_t n) { return n / block_elems(t) * block_bytes(t); }

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);  // round to nearest even
inline float bf16_to_f32(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint16_t f32_to_bf16(float f) {  // round to nearest even, NaN stays NaN
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

// Converts n elements of a row of type t to f32 (n a multiple of block_elems(t)).
void dequantize_row(dtype t, const void* src, float* dst, int64_t n);
// Quantizes n f32 values into n/32 Q8_0 blocks (n a multiple of 32), as ggml does.
void quantize_row_q8_0(const float* src, block_q8_0* dst, int64_t n);
// Converts n f32 values to type t (the inverse of dequantize_row, lossy for all but f32).
void quantize_row(dtype t, const float* src, void* dst, int64_t n);

}  // namespace tandem::kernels
