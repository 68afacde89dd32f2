#pragma once
// Private to the tokenizer sources (tokenizer.cpp, tokenizer_spm.cpp, tokenizer_bpe.cpp):
// the tables a tokenizer is built into, UTF-8 helpers and the GPT-2 pre-tokenizer.
#ifndef PCRE2_CODE_UNIT_WIDTH
#define PCRE2_CODE_UNIT_WIDTH 8
#endif
#include <pcre2.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "runtime/tokenizer/tokenizer.h"

namespace tandem::detail {

// Token types (tokenizer.ggml.token_type).
enum token_type : int32_t {
  type_undefined = 0,
  type_normal = 1,
  type_unknown = 2,
  type_control = 3,
  type_user_defined = 4,
  type_unused = 5,
  type_byte = 6,
};

// Length of the valid UTF-8 character starting at p[0] (n bytes available): 1..4 when valid,
// 0 when p holds a valid but incomplete prefix of a character, -1 when p[0] cannot start a
// valid character here (a stray continuation byte, an invalid lead, or a lead followed by a
// byte that is not an allowed continuation; overlong forms and surrogates count as invalid).
inline int utf8_check(const unsigned char* p, size_t n) {
  const unsigned char c = p[0];
  if (c < 0x80) return 1;
  int len = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    if (c == 0xE0) lo = 0xA0;  // no overlong 3-byte forms
    else if (c == 0xED) hi = 0x9F;  // no surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    if (c == 0xF0) lo = 0x90;  // no overlong 4-byte forms
    else if (c == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    return -1;
  }
  for (int k = 1; k < len; ++k) {
    if (static_cast<size_t>(k) >= n) return 0;
    const unsigned char b = p[k];
    const bool ok = k == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
    if (!ok) return -1;
  }
  return len;
}

// Length of the UTF-8 character at s[i], treating anything invalid or truncated as one byte.
inline size_t utf8_char_len(std::string_view s, size_t i) {
  const int len = utf8_check(reinterpret_cast<const unsigned char*>(s.data()) + i, s.size() - i);
  return len > 0 ? static_cast<size_t>(len) : 1;
}

// "<0xXX>" (hex digits of either case) -> the byte; anything else -> -1.
inline int parse_byte_token(std::string_view text) {
  if (text.size() != 6 || text.substr(0, 3) != "<0x" || text[5] != '>') return -1;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  const int hi = hex(text[3]), lo = hex(text[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

// Appends the UTF-8 encoding of code point cp.
void append_utf8(std::string& out, uint32_t cp);

// Heterogeneous string hash so maps keyed by std::string can be probed with a string_view.
struct string_hash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};
using text_map = std::unordered_map<std::string, token_id, string_hash, std::equal_to<>>;

// GPT-2's bytes_to_unicode: byte b is spelled as the code point byte_to_unicode()[b].
const std::array<uint32_t, 256>& byte_to_unicode();
// The UTF-8 spelling of byte b under that mapping.
const std::string& byte_spelling(uint8_t b);
// Maps a byte-level spelled token back to its bytes; characters outside the mapping are kept.
std::string unspell_byte_level(std::string_view text);

// A byte-level BPE pre-tokenizer: splits text into pieces with the regexes that
// tokenizer.ggml.pre names (llama.cpp's table: GPT-2's, Llama 3's, Qwen 2's, SmolLM's), PCRE2
// with UTF + UCP. Several regexes apply in turn, each to the pieces of the one before, as
// llama.cpp does. Invalid UTF-8 never matches; each run of bytes between matches becomes a
// piece of its own, so the pieces always concatenate back to the input. Throws
// failure(unsupported) for a `pre` it does not know, naming the ones it does.
class gpt2_splitter {
 public:
  explicit gpt2_splitter(std::string_view pre = "gpt2");
  ~gpt2_splitter();
  gpt2_splitter(const gpt2_splitter&) = delete;
  gpt2_splitter& operator=(const gpt2_splitter&) = delete;
  std::vector<std::string_view> split(std::string_view text) const;

 private:
  void split_with(const pcre2_code* code, std::string_view text, std::vector<std::string_view>& out) const;
  std::vector<pcre2_code*> codes_;
};

// A usable merge rule of a gpt2 vocab: the pair (left id, right id) merges into `result`.
struct merge_rule {
  int32_t rank;
  token_id result;
};
inline uint64_t pair_key(token_id left, token_id right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

// Everything encode/decode need, built once by the tokenizer constructor.
struct tokenizer_tables {
  vocab_spec spec;
  bool is_llama = false;  // "llama" (SPM) or "gpt2" (byte-level BPE)
  std::vector<int32_t> types;  // one per token (inferred when the spec had none)
  std::vector<std::string> bytes;  // token_bytes() of every token
  std::vector<char> eog;  // is_eog() of every token
  text_map text_to_id;  // tokens that plain text may produce (normal, user-defined)
  std::array<token_id, 256> byte_token;  // the token for a single byte, or -1
  // gpt2 only
  std::unordered_map<uint64_t, merge_rule> merges;
  std::unique_ptr<gpt2_splitter> splitter;
  // A piece that is itself a token is that token, merges unasked (Hugging Face's
  // ignore_merges; llama.cpp sets it for the Llama 3 pre-tokenizers).
  bool ignore_merges = false;
  // Tokens found by their text before the rest is tokenized (llama.cpp's special-token
  // partition): user-defined ones always, control and unknown ones when asked. Longest first.
  std::vector<token_id> specials;
};

// Construction steps specific to each model (tokenizer_spm.cpp, tokenizer_bpe.cpp): fill
// byte_token (and for gpt2 merges and splitter). Run after types and text_to_id are set.
void spm_build(tokenizer_tables& t);
void bpe_build(tokenizer_tables& t);
// Appends the ids of `text` (no BOS) to `out`; spm: `space_prefix` puts the add_space_prefix
// space in front (llama.cpp: at the start of the text and after each special token).
void spm_encode(const tokenizer_tables& t, std::string_view text, std::vector<token_id>& out, bool space_prefix);
void bpe_encode(const tokenizer_tables& t, std::string_view text, std::vector<token_id>& out);

}  // namespace tandem::detail
