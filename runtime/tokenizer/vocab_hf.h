#pragma once
// Reads a vocab_spec from a Hugging Face `tokenizer.json` (and the `tokenizer_config.json`
// beside it, when present), as llama.cpp's convert_hf_to_gguf.py turns one into
// tokenizer.ggml.*: so that `tandem model synth --vocab-from` makes models with the real
// vocabularies of Llama 3, Qwen 2/3 and the like.
#include <string>

#include "runtime/tokenizer/tokenizer.h"

namespace tandem {

// Byte-level BPE vocabularies (model.type "BPE" with a ByteLevel pre-tokenizer): the
// pre-tokenizer name (tokenizer.ggml.pre) is recognised from the Split regex (Llama 3's is
// "llama-bpe", Qwen 2's "qwen2", plain ByteLevel "gpt-2"), or given as `pre`. And SentencePiece
// BPEs in Hugging Face's form (a BPE with byte_fallback: Llama 2, Gemma): model "llama", the
// scores rebuilt from the merge ranks, "<0xXX>" byte tokens, the unknown token, the space
// prefix from the normalizer. Added tokens become control tokens when special, user-defined
// otherwise. BOS/EOS come from
// tokenizer_config.json (bos_token, eos_token, add_bos_token), else from a TemplateProcessing
// post-processor. Throws failure(io_error / malformed_file / unsupported) naming the problem.
vocab_spec vocab_from_tokenizer_json(const std::string& path, const std::string& pre = "");

// The chat_template of the tokenizer_config.json beside `tokenizer_json_path` ("" when there is
// none), as convert_hf_to_gguf.py stores it in tokenizer.chat_template.
std::string chat_template_beside(const std::string& tokenizer_json_path);

}  // namespace tandem
