#pragma once
// CPU reference kernels for the elementwise parts of a Llama layer. Every other backend is
// tested against these.
#include <cstdint>

namespace tandem::kernels::cpu {

// y[r, :] = x[r, :] / sqrt(mean(x[r, :]²) + eps) * w.   x, y: [rows, dim], w: [dim]
void rms_norm(const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps);
// out = silu(gate) * up, elementwise over n.
void silu_mul(const float* gate, const float* up, float* out, int64_t n);
// silu_mul with a vectorised exp (AVX-512 where the CPU has it, else silu_mul): within a few
// ulp of silu_mul. The engine's path; silu_mul stays the reference other backends match.
void silu_mul_fast(const float* gate, const float* up, float* out, int64_t n);
// x += y over n.
void add_inplace(float* x, const float* y, int64_t n);
// Which elements of a head RoPE turns together: adjacent pairs (2i, 2i+1) (llama's "normal",
// rope_apply) or the two halves (i, i + head_dim/2) (GPT-NeoX's, rope_apply_neox; Qwen, Gemma
// and Phi-3).
enum class rope_style : uint8_t { normal, neox };
// Rotary embedding, llama "normal" layout (adjacent pairs (2i, 2i+1) rotate together):
// x: [n_tokens, n_heads, head_dim], pos: [n_tokens]; pair i turns by pos·base^(−2i/head_dim).
void rope(float* x, const int32_t* pos, int64_t n_tokens, int64_t n_heads, int64_t head_dim, float freq_base);
// rope in two steps, for callers that rotate many tensors at the same positions (every layer's
// q and k): the angles once, cs: [n_tokens][head_dim / 2][2] (cos, sin) ... Pair i turns by
// pos·freq_scale·base^(−2i/head_dim) / freq_factors[i] (llama.cpp's rope_ext without YaRN):
// freq_scale is linear position scaling (1 / llama.rope.scaling.factor), freq_factors (null:
// all 1) are Llama 3.1+'s rope_freqs.weight, [head_dim / 2].
void rope_table(const int32_t* pos, int64_t n_tokens, int64_t head_dim, float freq_base, float* cs,
                float freq_scale = 1.0f, const float* freq_factors = nullptr);
// ... then the rotation, with exactly rope's arithmetic.
void rope_apply(float* x, const float* cs, int64_t n_tokens, int64_t n_heads, int64_t head_dim);
// The same rotation in GPT-NeoX's layout: element i turns with element i + head_dim/2 (pair i
// of cs), as Qwen, Gemma and Phi-3 use.
void rope_apply_neox(float* x, const float* cs, int64_t n_tokens, int64_t n_heads, int64_t head_dim);
// out = gelu(gate) * up, GELU in its tanh form (ggml_gelu's; Gemma's FFN), elementwise over n.
void gelu_mul(const float* gate, const float* up, float* out, int64_t n);
// x[r, :] += b for rows r of x: [rows, n] (a bias).
void add_rows(float* x, const float* b, int64_t rows, int64_t n);
// x = cap * tanh(x / cap) over n (Gemma 2's final-logit soft-capping).
void softcap(float* x, int64_t n, float cap);
// x *= a over n.
void scale_inplace(float* x, int64_t n, float a);
// In-place softmax over n values; returns nothing, leaves probabilities summing to 1.
void softmax(float* x, int64_t n);

}  // namespace tandem::kernels::cpu
