#pragma once
// Tokenizers read from a GGUF file's tokenizer.ggml.* metadata:
//  - "llama": SentencePiece-style, merges by score, byte fallback through <0xXX> tokens;
//  - "gpt2":  byte-level BPE with ranked merges and the GPT-2 pre-tokenizer.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace tandem {

using token_id = int32_t;
struct token_trie;

// What a tokenizer is built from: exactly the tokenizer.ggml.* keys of a GGUF file.
struct vocab_spec {
  std::string model;  // tokenizer.ggml.model: "llama" or "gpt2"
  std::string pre;  // tokenizer.ggml.pre (informational; "default" if absent)
  std::vector<std::string> tokens;  // tokenizer.ggml.tokens
  std::vector<float> scores;  // tokenizer.ggml.scores (llama); may be empty for gpt2
  std::vector<int32_t> token_types;  // tokenizer.ggml.token_type: 1 normal, 2 unknown, 3 control,
                                     // 4 user-defined, 5 unused, 6 byte; may be empty
  std::vector<std::string> merges;  // tokenizer.ggml.merges (gpt2): "left right", by rank
  token_id bos_id = -1, eos_id = -1, unk_id = -1, pad_id = -1;
  token_id eot_id = -1, eom_id = -1;  // tokenizer.ggml.eot/eom_token_id: also end a turn
  bool add_bos = true;  // tokenizer.ggml.add_bos_token
  bool add_eos = false;  // tokenizer.ggml.add_eos_token
  bool add_space_prefix = true;  // tokenizer.ggml.add_space_prefix (llama only)
  // Per token, 1 where whitespace after the token is dropped when the token is matched in text
  // (llama.cpp's LLAMA_TOKEN_ATTR_RSTRIP, which GGUF has no key for: llama.cpp sets it by
  // general.name for Phi-3 files, as vocab_from_gguf does); empty: none.
  std::vector<uint8_t> rstrip;
};

class tokenizer {
 public:
  // Throws tandem::failure(errc::malformed_file / unsupported) naming what is wrong.
  explicit tokenizer(vocab_spec spec);
  ~tokenizer();
  tokenizer(tokenizer&&) noexcept;
  tokenizer& operator=(tokenizer&&) noexcept;

  // Text -> ids, with the special tokens the model file adds around a text when `add_special`
  // (tokenizer.ggml.add_bos_token / add_eos_token: llama.cpp's add_special, vLLM's
  // add_special_tokens). User-defined tokens written in the text are always their tokens;
  // control tokens (`<|im_start|>`, `<s>`) only with parse_special (raw completion prompts and
  // prompts rendered from a chat template), else plain characters: llama.cpp's rules
  // (llama_tokenize's parse_special).
  std::vector<token_id> encode(std::string_view text, bool add_special, bool parse_special = false) const;
  // Which special tokens go around the text: the file's (file_specials()) or a caller's choice.
  struct specials {
    bool bos = false, eos = false;
    bool operator==(const specials&) const = default;
  };
  specials file_specials() const;  // tokenizer.ggml.add_bos_token / add_eos_token, where the vocab has the token
  // As above with the specials given, except that no control or unknown token is recognised
  // across the byte ranges [first, second) of `literal` (sorted): text a chat template copied
  // from a user's message, whose "<|im_start|>" stays characters there while the template's
  // own markers around it are tokens.
  using byte_range = std::pair<uint32_t, uint32_t>;
  std::vector<token_id> encode(std::string_view text, specials add, bool parse_special,
                               std::span<const byte_range> literal = {}) const;
  // The raw bytes a token stands for (byte tokens give their byte, "▁" gives a space,
  // gpt2 byte-unicode is mapped back). Control tokens give "". May be part of a UTF-8 char.
  std::string token_bytes(token_id id) const;
  // Ids -> text (concatenated token_bytes). For a llama vocab with add_space_prefix,
  // `strip_leading_space` drops the space that encode() prefixed to the first word.
  std::string decode(std::span<const token_id> ids, bool strip_leading_space = false) const;

  int32_t n_vocab() const;
  token_id bos() const;
  token_id eos() const;
  bool is_eog(token_id id) const;  // end of generation: EOS (and EOT-like control tokens)
  const std::string& token_text(token_id id) const;  // the vocab entry as stored in the file
  // GGUF token type: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte
  // (inferred when the file gives none). 0 for an id out of range.
  int32_t token_type(token_id id) const;
  const vocab_spec& spec() const;
  // The vocabulary as a byte trie for grammar-constrained decoding (runtime/tokenizer/token_trie.h),
  // built on first use (thread-safe) and shared.
  std::shared_ptr<const token_trie> vocab_trie() const;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

// Streaming detokenizer for one sequence: push each generated id, get back only complete
// UTF-8 characters; bytes of a partial character are held until it completes.
class stream_decoder {
 public:
  explicit stream_decoder(const tokenizer& tok) : tok_(&tok) {}
  std::string push(token_id id);
  // Whatever is still held at the end (an incomplete character becomes U+FFFD per byte).
  std::string flush();

 private:
  const tokenizer* tok_;
  std::string pending_;
};

// A gpt2-style byte-level BPE vocabulary of exactly `n_vocab` entries, for synthetic models:
// `<unk>`, `<s>`, `</s>`, the 256 byte tokens (GPT-2 byte-to-unicode spelling), then merges learned
// deterministically from a built-in English text until the vocab is full. n_vocab >= 259.
vocab_spec make_byte_level_vocab(int32_t n_vocab);

}  // namespace tandem
