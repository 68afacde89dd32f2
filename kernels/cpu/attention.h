#pragma once
// Attention of query heads over a paged KV context.
#include <cstdint>

#include "kernels/cpu/ops.h"
#include "kernels/tensor_types.h"

namespace tandem::kernels::cpu {

// How a KV block holds its K rows. position_major: [block_size][head_dim], a position's row
// contiguous (V always, and K of a q8_0 cache, whose 32-blocks run along a row as llama.cpp's
// do). dim_major: [head_dim][block_size], K transposed, so that q . K reads 16 consecutive
// positions' element d as one vector and decode attention needs no per-step transpose.
enum class k_order { position_major, dim_major };

// The order a KV cache of dtype t keeps K in: dim_major for f32, f16 and bf16, position_major
// for q8_0 (a transposed q8_0 K would need a scale per 32 positions: another format).
constexpr k_order kv_k_order(dtype t) { return t == dtype::q8_0 ? k_order::position_major : k_order::dim_major; }

// Position `slot` of a K block (block_size positions, head_dim elements each, of type t, in
// order o): stores k[head_dim] into it, or loads it back widened to f32.
void store_k_row(dtype t, k_order o, const float* k, void* block, int32_t slot, int32_t block_size, int32_t head_dim);
void load_k_row(dtype t, k_order o, const void* block, int32_t slot, int32_t block_size, int32_t head_dim, float* k);

// store_k_row of k turned by RoPE on its way into the block (cs: this position's
// [head_dim / 2][2] (cos, sin), ops.h's rope_table): the rotated K goes straight to the cache,
// never back to the caller's tensor. Bitwise rope_apply(_neox) of one row, then store_k_row.
void store_k_row_roped(dtype t, k_order o, rope_style style, const float* k, const float* cs, void* block, int32_t slot,
                       int32_t block_size, int32_t head_dim);

// The reference kernel (plain C++). The n_q query heads that share one KV head (a GQA group)
// attend together, so each key and value row is read once per group.
//   q:        [n_q][head_dim]
//   k_blocks: n_blocks pointers, each [block_size][head_dim]; same for v_blocks
//   scores:   scratch [n_q][n_tokens]
//   out:      [n_q][head_dim]
// Positions first..n_tokens-1 of the context are attended (causality is the caller's n_tokens,
// a sliding window its first).
void attention_paged(const float* q, int32_t n_q, const float* const* k_blocks, const float* const* v_blocks,
                     int32_t block_size, int32_t n_tokens, int32_t head_dim, float scale, float* scores, float* out,
                     int32_t first = 0);

// Causal attention of a run of n_tok consecutive query tokens of one sequence, for the n_rep
// query heads of one KV head (GQA group). Token i of the run sits at position p = pos0 + i and
// attends to context positions [0, p] (window > 0: [p - window + 1, p], a sliding window),
// whose K/V rows must already be in the blocks.
//   q:   the group's heads of token i at q + i * q_stride, as [n_rep][head_dim]
//   out: the same layout at out + i * out_stride
//   k_blocks, v_blocks: the sequence's blocks in order, each [block_size][head_dim]
// With AVX-512 and head_dim a multiple of 16 (up to 256) this is a tiled kernel: a tile of
// query rows (tokens x heads) meets 64 keys at a time, with an online softmax (FlashAttention
// style), so K and V are read once per tile. Otherwise it runs attention_paged per token.
// Results agree with the reference within float rounding (different summation order, and a
// polynomial exp with ~2e-7 relative error).
void attention_causal(const float* q, int64_t q_stride, int32_t n_tok, int32_t n_rep, int32_t pos0,
                      const float* const* k_blocks, const float* const* v_blocks, int32_t block_size, int32_t head_dim,
                      float scale, float* out, int64_t out_stride, int32_t window = 0);

// As above with K/V blocks of kv_type (f32, f16, bf16 or q8_0; V blocks [block_size][head_dim]
// of that type, K blocks in order ko, dim_major for all but q8_0): the kernel widens them as it
// reads them (a half-size cache reads half the bytes). With dim_major K and a block size that
// is a multiple of 16, q . K streams the blocks as they are (no transpose).
void attention_causal(const float* q, int64_t q_stride, int32_t n_tok, int32_t n_rep, int32_t pos0,
                      const void* const* k_blocks, const void* const* v_blocks, dtype kv_type, k_order ko,
                      int32_t block_size, int32_t head_dim, float scale, float* out, int64_t out_stride,
                      int32_t window = 0);

// attention_causal through attention_paged only (for tests and CPUs without AVX-512).
void attention_causal_reference(const float* q, int64_t q_stride, int32_t n_tok, int32_t n_rep, int32_t pos0,
                                const float* const* k_blocks, const float* const* v_blocks, int32_t block_size,
                                int32_t head_dim, float scale, float* out, int64_t out_stride, int32_t window = 0);

void attention_causal_reference(const float* q, int64_t q_stride, int32_t n_tok, int32_t n_rep, int32_t pos0,
                                const void* const* k_blocks, const void* const* v_blocks, dtype kv_type, k_order ko,
                                int32_t block_size, int32_t head_dim, float scale, float* out, int64_t out_stride,
                                int32_t window = 0);

// Query tokens per tile of attention_causal for a GQA group of n_rep heads: callers that split
// a long run into tasks (one thread each) should cut it at multiples of this.
int32_t attention_tile_tokens(int32_t n_rep);

}  // namespace tandem::kernels::cpu
