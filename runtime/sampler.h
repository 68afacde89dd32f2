#pragma once
// Token sampling. A request's i-th token depends only on (seed, i, logits): the random draw
// for token i comes from a counter-based generator keyed by (seed, i), so a request resumed
// on another worker continues exactly as it would have where it started.
#include <cstdint>
#include <span>

#include "runtime/errors.h"
#include "runtime/tokenizer.h"

namespace tandem {

struct sampling_params {
  float temperature = 0.8f;  // <= 0: greedy (argmax, lowest id on ties)
  int32_t top_k = 40;        // <= 0: no top-k cut
  float top_p = 0.95f;       // >= 1: no nucleus cut
  uint64_t seed = 0;

  // invalid_argument naming the bad field, or ok.
  status validate() const;
};

// Uniform double in [0, 1) for draw `index` of stream `seed` (splitmix64 over both).
double sample_uniform(uint64_t seed, uint64_t index);

// Picks the token at index `token_index` of a request from its logits.
token_id sample(std::span<const float> logits, const sampling_params& p, uint64_t token_index);

}  // namespace tandem
