#pragma once
// Attention of query heads over a paged KV context (CPU reference kernel).
#include <cstdint>

namespace tandem::kernels::cpu {

// The n_q query heads that share one KV head (a GQA group) attend together, so each key and
// value row is read once per group.
//   q:        [n_q][head_dim]
//   k_blocks: n_blocks pointers, each [block_size][head_dim]; same for v_blocks
//   scores:   scratch [n_q][n_tokens]
//   out:      [n_q][head_dim]
// Positions 0..n_tokens-1 of the context are attended (causality is the caller's n_tokens).
void attention_paged(const float* q, int32_t n_q, const float* const* k_blocks,
                     const float* const* v_blocks, int32_t block_size, int32_t n_tokens,
                     int32_t head_dim, float scale, float* scores, float* out);

}  // namespace tandem::kernels::cpu
