// tokenizer: construction and validation, decoding, the streaming detokenizer.
// The two encoders live in tokenizer_spm.cpp ("llama") and tokenizer_bpe.cpp ("gpt2").
//
// Special tokens: encode() treats its input as plain text. Control tokens (type 3) such as
// "<s>" or "<|endoftext|>" written in the text are NOT recognised; they are tokenized like any
// other characters. Only normal and user-defined tokens can come out of encode(), plus BOS
// when asked for, byte tokens (byte fallback) and unk.
#include "runtime/tokenizer/tokenizer.h"

#include <algorithm>
#include <cctype>
#include <array>
#include <string>
#include <utility>
#include <mutex>

#include "runtime/errors.h"
#include "runtime/tokenizer/token_trie.h"
#include "runtime/tokenizer/tokenizer_internal.h"

namespace tandem {

using namespace detail;

namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD
constexpr std::string_view kUnknownPiece = "\xE2\x96\x85";  // U+2585, as llama.cpp shows <unk>
constexpr std::string_view kSpmSpace = "\xE2\x96\x81";  // U+2581 "▁"

std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (true) {
    const size_t j = s.find(from, i);
    if (j == std::string_view::npos) break;
    out.append(s.substr(i, j - i)).append(to);
    i = j + from.size();
  }
  out.append(s.substr(i));
  return out;
}

[[noreturn]] void malformed(const std::string& what) { throw failure(errc::malformed_file, "tokenizer: " + what); }

void check_special_id(token_id id, const char* key, size_t n_tokens) {
  if (id < -1 || (id >= 0 && static_cast<size_t>(id) >= n_tokens)) {
    malformed(std::string(key) + " " + std::to_string(id) + " is out of range (vocab of " + std::to_string(n_tokens) +
              " tokens)");
  }
}

void validate(const vocab_spec& s) {
  if (s.model != "llama" && s.model != "gpt2") {
    throw failure(errc::unsupported, "tokenizer model '" + s.model + "' is not supported (llama, gpt2)");
  }
  const size_t n = s.tokens.size();
  if (n == 0) malformed("tokenizer.ggml.tokens is empty");
  if (n > static_cast<size_t>(INT32_MAX)) malformed("tokenizer.ggml.tokens has too many entries");
  const bool scores_ok = s.scores.size() == n || (s.model == "gpt2" && s.scores.empty());
  if (!scores_ok) {
    malformed("tokenizer.ggml.scores has " + std::to_string(s.scores.size()) +
              " entries but tokenizer.ggml.tokens has " + std::to_string(n));
  }
  if (!s.rstrip.empty() && s.rstrip.size() != n)
    malformed("the rstrip attributes cover " + std::to_string(s.rstrip.size()) + " tokens of " + std::to_string(n));
  if (!s.token_types.empty() && s.token_types.size() != n) {
    malformed("tokenizer.ggml.token_type has " + std::to_string(s.token_types.size()) +
              " entries but tokenizer.ggml.tokens has " + std::to_string(n));
  }
  for (size_t i = 0; i < s.token_types.size(); ++i) {
    const int32_t ty = s.token_types[i];
    if (ty < type_undefined || ty > type_byte) {
      malformed("tokenizer.ggml.token_type[" + std::to_string(i) + "] = " + std::to_string(ty) +
                " is not a token type (0..6)");
    }
  }
  check_special_id(s.bos_id, "tokenizer.ggml.bos_token_id", n);
  check_special_id(s.eos_id, "tokenizer.ggml.eos_token_id", n);
  check_special_id(s.unk_id, "tokenizer.ggml.unknown_token_id", n);
  check_special_id(s.pad_id, "tokenizer.ggml.padding_token_id", n);
  check_special_id(s.eot_id, "tokenizer.ggml.eot_token_id", n);
  check_special_id(s.eom_id, "tokenizer.ggml.eom_token_id", n);
  if (s.model == "gpt2") {
    for (size_t i = 0; i < s.merges.size(); ++i) {
      const std::string& m = s.merges[i];
      const size_t sp = m.find(' ');
      if (sp == std::string::npos || sp == 0 || sp + 1 == m.size() || m.find(' ', sp + 1) != std::string::npos) {
        malformed("tokenizer.ggml.merges[" + std::to_string(i) + "] '" + m + "' is not two space-separated tokens");
      }
    }
  }
}

// The spec's types, or inferred ones when it has none: unk is unknown, bos/eos are control,
// "<0xXX>" entries of a llama vocab are byte tokens, the rest is normal.
std::vector<int32_t> resolve_types(const vocab_spec& s) {
  if (!s.token_types.empty()) return s.token_types;
  std::vector<int32_t> types(s.tokens.size(), type_normal);
  if (s.model == "llama") {
    for (size_t i = 0; i < s.tokens.size(); ++i) {
      if (parse_byte_token(s.tokens[i]) >= 0) types[i] = type_byte;
    }
  }
  if (s.bos_id >= 0) types[s.bos_id] = type_control;
  if (s.eos_id >= 0) types[s.eos_id] = type_control;
  if (s.unk_id >= 0) types[s.unk_id] = type_unknown;
  return types;
}

std::string compute_bytes(const tokenizer_tables& t, size_t i) {
  const std::string& text = t.spec.tokens[i];
  switch (t.types[i]) {
    case type_control:
    case type_unused: return {};
    case type_unknown: return std::string(kUnknownPiece);
    case type_user_defined: return text;
    case type_byte: {
      const int b = parse_byte_token(text);
      if (b >= 0) return std::string(1, static_cast<char>(b));
      return text;
    }
    default:  // normal, undefined
      return t.is_llama ? replace_all(text, kSpmSpace, " ") : unspell_byte_level(text);
  }
}

}  // namespace

struct tokenizer::impl : tokenizer_tables {
  std::once_flag trie_once;
  std::shared_ptr<const token_trie> trie;
};

std::shared_ptr<const token_trie> tokenizer::vocab_trie() const {
  std::call_once(impl_->trie_once, [&] { impl_->trie = std::make_shared<const token_trie>(*this); });
  return impl_->trie;
}

tokenizer::tokenizer(vocab_spec spec) : impl_(std::make_unique<impl>()) {
  validate(spec);
  impl& t = *impl_;
  t.spec = std::move(spec);
  if (t.spec.pre.empty()) t.spec.pre = "default";
  t.is_llama = t.spec.model == "llama";
  t.types = resolve_types(t.spec);

  const size_t n = t.spec.tokens.size();
  t.text_to_id.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const int32_t ty = t.types[i];
    if (ty == type_normal || ty == type_user_defined || ty == type_undefined) {
      t.text_to_id.emplace(t.spec.tokens[i], static_cast<token_id>(i));  // first one wins
    }
  }
  t.byte_token.fill(-1);
  if (t.is_llama) {
    spm_build(t);
  } else {
    bpe_build(t);
  }

  t.bytes.resize(n);
  for (size_t i = 0; i < n; ++i) t.bytes[i] = compute_bytes(t, i);
  for (size_t i = 0; i < n; ++i) {
    const int32_t ty = t.types[i];
    if ((ty == type_control || ty == type_unknown || ty == type_user_defined) && !t.spec.tokens[i].empty())
      t.specials.push_back(token_id(i));
  }
  std::stable_sort(t.specials.begin(), t.specials.end(), [&t](token_id a, token_id b) {
    return t.spec.tokens[size_t(a)].size() > t.spec.tokens[size_t(b)].size();
  });

  static constexpr std::array<std::string_view, 6> kEotTexts = {"<|eot_id|>", "<|eom_id|>",    "<|im_end|>",
                                                                "<|end|>",    "<end_of_turn>", "<|endoftext|>"};
  t.eog.assign(n, 0);
  for (token_id id : {t.spec.eos_id, t.spec.eot_id, t.spec.eom_id})
    if (id >= 0 && size_t(id) < n) t.eog[size_t(id)] = 1;
  for (size_t i = 0; i < n; ++i) {
    if (t.types[i] == type_control &&
        std::find(kEotTexts.begin(), kEotTexts.end(), t.spec.tokens[i]) != kEotTexts.end()) {
      t.eog[i] = 1;
    }
  }
}

tokenizer::~tokenizer() = default;
tokenizer::tokenizer(tokenizer&&) noexcept = default;
tokenizer& tokenizer::operator=(tokenizer&&) noexcept = default;

tokenizer::specials tokenizer::file_specials() const {
  const vocab_spec& s = impl_->spec;
  return {.bos = s.add_bos && s.bos_id >= 0, .eos = s.add_eos && s.eos_id >= 0};
}

std::vector<token_id> tokenizer::encode(std::string_view text, bool add_special, bool parse_special) const {
  return encode(text, add_special ? file_specials() : specials{}, parse_special);
}

std::vector<token_id> tokenizer::encode(std::string_view text, specials add, bool parse_special,
                                        std::span<const byte_range> literal) const {
  const impl& t = *impl_;
  // Whether [b, e) of text touches a literal range (those are sorted and few).
  auto in_literal = [&](size_t b, size_t e) {
    for (const auto& [lb, le] : literal)
      if (b < le && lb < e) return true;
    return false;
  };
  std::vector<token_id> out;
  out.reserve(text.size() / 3 + 2);
  if (add.bos && t.spec.bos_id >= 0) out.push_back(t.spec.bos_id);
  // Split out the special tokens written in the text, as llama.cpp's tokenizer_st_partition:
  // each special, longest first, cuts every piece of plain text still left at its occurrences.
  struct fragment {
    token_id id;  // -1: plain text
    std::string_view text;
  };
  std::vector<fragment> frags{{-1, text}}, next;
  for (token_id sid : t.specials) {
    if (!parse_special && t.types[size_t(sid)] != type_user_defined) continue;
    const std::string& st = t.spec.tokens[size_t(sid)];
    next.clear();
    const bool may_be_literal = !literal.empty() && t.types[size_t(sid)] != type_user_defined;
    const bool rstrip = size_t(sid) < t.spec.rstrip.size() && t.spec.rstrip[size_t(sid)];
    for (const fragment& f : frags) {
      if (f.id >= 0 || f.text.find(st) == std::string_view::npos) {
        next.push_back(f);
        continue;
      }
      // Cut at each occurrence outside the literal ranges; the text between cuts stays one piece.
      size_t start = 0, from = 0;
      for (size_t p; (p = f.text.find(st, from)) != std::string_view::npos;) {
        const size_t at = size_t(f.text.data() - text.data()) + p;
        if (may_be_literal && in_literal(at, at + st.size())) {
          from = p + 1;
          continue;
        }
        if (p > start) next.push_back({-1, f.text.substr(start, p - start)});
        next.push_back({sid, {}});
        start = from = p + st.size();
        if (rstrip)  // llama.cpp's isspace(): space, \t, \n, \v, \f, \r
          while (start < f.text.size() && std::isspace(static_cast<unsigned char>(f.text[start]))) start = ++from;
      }
      if (start < f.text.size()) next.push_back({-1, f.text.substr(start)});
    }
    frags.swap(next);
  }
  bool after_special = true;  // spm: the space prefix goes at the start and after each special
  for (const fragment& f : frags) {
    if (f.id >= 0) {
      out.push_back(f.id);
      after_special = true;
    } else if (t.is_llama) {
      spm_encode(t, f.text, out, t.spec.add_space_prefix && after_special);
      after_special = false;
    } else {
      bpe_encode(t, f.text, out);
      after_special = false;
    }
  }
  if (add.eos && t.spec.eos_id >= 0) out.push_back(t.spec.eos_id);
  return out;
}

std::string tokenizer::token_bytes(token_id id) const {
  if (id < 0 || id >= n_vocab()) {
    throw failure(errc::invalid_argument, "token id " + std::to_string(id) + " is out of range (vocab of " +
                                              std::to_string(n_vocab()) + " tokens)");
  }
  return impl_->bytes[id];
}

std::string tokenizer::decode(std::span<const token_id> ids, bool strip_leading_space) const {
  std::string out;
  for (token_id id : ids) {
    if (id < 0 || id >= n_vocab()) (void)token_bytes(id);  // throws
    out += impl_->bytes[id];
  }
  if (strip_leading_space && impl_->is_llama && impl_->spec.add_space_prefix && !out.empty() && out[0] == ' ') {
    out.erase(0, 1);
  }
  return out;
}

int32_t tokenizer::token_type(token_id id) const { return id >= 0 && id < n_vocab() ? impl_->types[size_t(id)] : 0; }

int32_t tokenizer::n_vocab() const { return static_cast<int32_t>(impl_->spec.tokens.size()); }
token_id tokenizer::bos() const { return impl_->spec.bos_id; }
token_id tokenizer::eos() const { return impl_->spec.eos_id; }

bool tokenizer::is_eog(token_id id) const { return id >= 0 && id < n_vocab() && impl_->eog[id] != 0; }

const std::string& tokenizer::token_text(token_id id) const {
  if (id < 0 || id >= n_vocab()) (void)token_bytes(id);  // throws
  return impl_->spec.tokens[id];
}

const vocab_spec& tokenizer::spec() const { return impl_->spec; }

// ---- streaming detokenizer ----

namespace {

// Moves the complete characters at the front of `pending` to the result; invalid bytes become
// U+FFFD each. A valid but incomplete character at the end stays in `pending`, unless `at_end`,
// in which case its bytes are replaced too.
std::string drain(std::string& pending, bool at_end) {
  std::string out;
  out.reserve(pending.size());
  const auto* p = reinterpret_cast<const unsigned char*>(pending.data());
  const size_t n = pending.size();
  size_t i = 0;
  while (i < n) {
    const int len = utf8_check(p + i, n - i);
    if (len > 0) {
      out.append(pending, i, static_cast<size_t>(len));
      i += static_cast<size_t>(len);
    } else if (len == 0 && !at_end) {
      break;  // may still complete with the next token's bytes
    } else {
      out.append(kReplacement);
      ++i;
    }
  }
  pending.erase(0, i);
  return out;
}

}  // namespace

std::string stream_decoder::push(token_id id) {
  pending_ += tok_->token_bytes(id);
  return drain(pending_, false);
}

std::string stream_decoder::flush() {
  std::string out = drain(pending_, true);
  pending_.clear();
  return out;
}

}  // namespace tandem
