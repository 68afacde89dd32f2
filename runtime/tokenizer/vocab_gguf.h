#pragma once
// Reads a tokenizer's vocab_spec from a GGUF file's tokenizer.ggml.* metadata.
#include "runtime/gguf/gguf.h"
#include "runtime/tokenizer/tokenizer.h"

namespace tandem {

// Required: tokenizer.ggml.model and tokenizer.ggml.tokens (failure(missing_key) otherwise).
// Optional: pre, scores, token_type, merges, the bos/eos/unknown/padding token ids (an id of
// 0xFFFFFFFF or a negative one means "none") and the add_bos/add_eos/add_space_prefix flags.
// Defaults follow llama.cpp: a "llama" vocab without id keys gets bos 1, eos 2, unk 0 and adds
// BOS and the space prefix; a "gpt2" vocab adds neither. The result is not validated here:
// constructing a tokenizer from it does that.
vocab_spec vocab_from_gguf(const gguf::file& f);

}  // namespace tandem
