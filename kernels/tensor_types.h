#pragma once
// Element types of weight tensors and the conversions every backend shares.
// Numbering follows GGUF's ggml_type so a file's type field maps directly.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace tandem::kernels {

enum class dtype : uint32_t { f32 = 0, f16 = 1, q4_0 = 2, q8_0 = 8, q4_k = 12, q5_k = 13, q6_k = 14, bf16 = 30 };

constexpr int q8_0_block = 32;  // elements per Q8_0 block
struct block_q8_0 {  // 34 bytes, laid out exactly as in GGUF
  uint16_t d;  // scale, IEEE half
  int8_t qs[q8_0_block];  // value = d * qs[i]
};
static_assert(sizeof(block_q8_0) == 34);

// The 4-bit and k-quant ("super-block") types, laid out exactly as in GGUF (ggml-common.h).
constexpr int q4_0_block = 32;
struct block_q4_0 {  // 18 bytes: value = d * (q - 8), q in [0, 15]
  uint16_t d;
  uint8_t qs[q4_0_block / 2];  // element j in the low nibble of qs[j], j + 16 in the high one
};
static_assert(sizeof(block_q4_0) == 18);

constexpr int qk_k = 256;  // elements per k-quant super-block
// Q4_K: 8 sub-blocks of 32, each with a 6-bit scale and a 6-bit min:
// value = d * sc[j] * q - dmin * m[j], q in [0, 15].
struct block_q4_k {  // 144 bytes
  uint16_t d, dmin;
  uint8_t scales[12];  // sc and m, 6 bits each, packed (get_scale_min_k4)
  uint8_t qs[qk_k / 2];  // 64-element groups: low nibbles sub-block 2g, high ones 2g+1
};
static_assert(sizeof(block_q4_k) == 144);
// Q5_K: Q4_K with a fifth bit per element in qh: q in [0, 31].
struct block_q5_k {  // 176 bytes
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qh[qk_k / 8];
  uint8_t qs[qk_k / 2];
};
static_assert(sizeof(block_q5_k) == 176);
// Q6_K: 16 sub-blocks of 16 with int8 scales: value = d * sc[j] * (q - 32), q in [0, 63].
struct block_q6_k {  // 210 bytes
  uint8_t ql[qk_k / 2];  // low 4 bits
  uint8_t qh[qk_k / 4];  // high 2 bits
  int8_t scales[qk_k / 16];
  uint16_t d;
};
static_assert(sizeof(block_q6_k) == 210);
// Q4_K/Q5_K sub-block j's 6-bit scale and min (ggml's get_scale_min_k4).
inline void k4_scale_min(int j, const uint8_t* q, uint8_t& sc, uint8_t& m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = uint8_t((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    m = uint8_t((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

constexpr std::string_view to_string(dtype t) {
  switch (t) {
    case dtype::f32: return "f32";
    case dtype::f16: return "f16";
    case dtype::q4_0: return "q4_0";
    case dtype::q8_0: return "q8_0";
    case dtype::q4_k: return "q4_k";
    case dtype::q5_k: return "q5_k";
    case dtype::q6_k: return "q6_k";
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
// Whether t is one of the 4-6 bit block types (q4_0 and the k-quants): integer panel kernels
// on AVX-512 VNNI (matmul_panels.cpp); below it, weights dequantized to f32 on the fly
// (matmul_dequant.cpp).
constexpr bool is_dequantized_on_the_fly(dtype t) {
  return t == dtype::q4_0 || t == dtype::q4_k || t == dtype::q5_k || t == dtype::q6_k;
}

// Quantizes n f32 values into n/32 Q8_0 blocks (n a multiple of 32), as ggml does.
void quantize_row_q8_0(const float* src, block_q8_0* dst, int64_t n);
// Converts n f32 values to type t (the inverse of dequantize_row, lossy for all but f32). The
// k-quants use a plain per-sub-block min/max fit (llama-quantize searches harder): enough for
// synthetic test models, not for converting real ones.
void quantize_row(dtype t, const float* src, void* dst, int64_t n);

}  // namespace tandem::kernels
