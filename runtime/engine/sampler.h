#pragma once
// Token sampling. A request's i-th token depends only on (seed, i, logits): the random draw
// for token i comes from a counter-based generator keyed by (seed, i), so a request resumed
// on another worker continues exactly as it would have where it started.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "runtime/errors.h"
#include "runtime/tokenizer/tokenizer.h"

namespace tandem {

class grammar_constraint;

// The defaults (llama.cpp's) are tandem's one set: `tandem generate` and the HTTP API use them
// when a request leaves a field out (`tandem serve --temperature/--top-k/--top-p` change the
// server's); the WebSocket protocol alone defaults to greedy (docs/protocol.md).
struct sampling_params {
  float temperature = 0.8f;  // <= 0: greedy (argmax, lowest id on ties)
  int32_t top_k = 40;  // <= 0: no top-k cut
  float top_p = 0.95f;  // >= 1: no nucleus cut
  uint64_t seed = 0;
  // OpenAI's logit_bias: bias_values[i] (in [-100, 100]) added to the logit of bias_tokens[i]
  // before any other step (greedy included); -100 in effect bans a token.
  std::vector<token_id> bias_tokens;
  std::vector<float> bias_values;
  // Generation ends when one of these is sampled (finish "stop"; the token is not output),
  // whatever ignore_eos says (vLLM's stop_token_ids).
  std::vector<token_id> stop_tokens;
  // Before output token min_tokens, end-of-generation and stop tokens cannot be sampled
  // (vLLM's min_tokens).
  int32_t min_tokens = 0;
  // OpenAI's penalties, in [-2, 2], over the output so far (not the prompt): the logit of a
  // token that occurred c times drops by c * frequency_penalty + (c > 0) * presence_penalty.
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  // vLLM's repetition_penalty, in (0, 2]: every token of the prompt or the output so far has
  // its logit divided by it when positive, multiplied when not (1: off).
  float repetition_penalty = 1.0f;
  // >= 0: each output token comes with its log-probability and those of the `logprobs` most
  // likely tokens (at most 20); -1: none.
  int32_t logprobs = -1;
  // Constrained decoding: a grammar in GBNF (runtime/structured/grammar.h; the API compiles JSON schemas
  // into one) that the output must match; empty: none. Tokens it does not allow next are set
  // to -inf after every other adjustment, before temperature, top-k and top-p; end of
  // generation is allowed only where the grammar is complete. `constraint` is the compiled
  // grammar with the matcher that follows the output, shared by every in-process copy of these
  // parameters; it never travels (a peer rebuilds it from the text), and a step without one
  // compiles the text itself (set_grammar).
  std::string grammar;
  std::shared_ptr<grammar_constraint> constraint;

  // invalid_argument naming the bad field, or ok. With n_vocab > 0, token ids are checked too.
  status validate(int32_t n_vocab = 0) const;
  bool penalizes() const { return presence_penalty != 0.0f || frequency_penalty != 0.0f || repeats(); }
  bool repeats() const { return repetition_penalty != 1.0f; }  // needs the prompt's tokens too
  // Whether a step needs the output so far: penalties count it, a grammar is matched on it.
  bool needs_output() const { return penalizes() || !grammar.empty(); }
  // Sets `grammar` to `text` and compiles it (cached by text); invalid_argument with the
  // grammar's line and column when it does not compile. Empty text: no grammar.
  status set_grammar(std::string text);
  // Whether logits are changed before sampling at output index `token_index`.
  bool adjusts(uint64_t token_index) const {
    return !bias_tokens.empty() || uint64_t(min_tokens) > token_index || penalizes();
  }
};

// The logits output token `token_index` is sampled from: logit_bias added, the penalties of
// the output so far (`output`: output tokens 0..token_index-1, needed only when p.penalizes())
// subtracted, and before min_tokens the end-of-generation tokens of `tok` and the stop tokens
// set to -inf. Returns `logits` itself when nothing applies, else a view of `buf`. Every step
// of the request, on any worker, applies the same function of (params, index, output so far,
// logits): a resumed request continues exactly.
// `prompt` (needed only when p.repeats()): the prompt's tokens, a migrated request's resumed
// tail included. Order: logit_bias, repetition_penalty, frequency/presence, min_tokens' ban.
std::span<const float> adjusted_logits(std::span<const float> logits, const sampling_params& p, uint64_t token_index,
                                       const tokenizer& tok, std::vector<float>& buf,
                                       std::span<const token_id> output = {}, std::span<const token_id> prompt = {});

// Whether sampling `t` ends the generation: an end-of-generation token (unless ignore_eos) or
// one of p.stop_tokens.
bool ends_generation(const sampling_params& p, bool ignore_eos, const tokenizer& tok, token_id t);

// The logits with every token p.grammar forbids after `output` (the output so far) at -inf,
// in `buf` (which may already hold `logits`). Returns `logits` itself when there is no grammar.
// Should nothing finite remain (a min_tokens ban meeting a finished grammar), the allowed
// tokens get equal logits: the grammar wins.
std::span<const float> constrained_logits(std::span<const float> logits, const sampling_params& p,
                                          std::span<const token_id> output, const tokenizer& tok,
                                          std::vector<float>& buf);

// A sampled token's log-probability and the most likely alternatives, under the model's raw
// distribution: log_softmax of the logits as the model gave them, before logit_bias,
// penalties, temperature, top-k or top-p (vLLM's default, "raw_logprobs").
struct token_logprobs {
  float logprob = 0.0f;
  std::vector<token_id> top_ids;  // most likely first (ties: lower id first)
  std::vector<float> top_logprobs;
};
token_logprobs logprobs_of(std::span<const float> logits, token_id chosen, int32_t top_n);

// Uniform double in [0, 1) for draw `index` of stream `seed` (splitmix64 over both).
double sample_uniform(uint64_t seed, uint64_t index);

// Picks the token at index `token_index` of a request from its logits.
token_id sample(std::span<const float> logits, const sampling_params& p, uint64_t token_index);

}  // namespace tandem
