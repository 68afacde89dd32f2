#include "runtime/tokenizer/vocab_gguf.h"

#include <algorithm>
#include <limits>
#include <string>

#include "runtime/errors.h"

namespace tandem {

namespace {

// A token id key: absent -> def; 0xFFFFFFFF (u32 "none") or negative -> -1; other values are
// passed through (clamped into int32 range) so the tokenizer reports them as out of range.
token_id read_id(const gguf::file& f, std::string_view key, token_id def) {
  const gguf::value* v = f.find(key);
  if (v == nullptr) return def;
  constexpr auto kMax = static_cast<uint64_t>(std::numeric_limits<int32_t>::max());
  if (v->is_unsigned()) {
    if (v->u == 0xFFFFFFFFull || v->u == std::numeric_limits<uint64_t>::max()) return -1;
    return static_cast<token_id>(std::min(v->u, kMax));
  }
  if (v->is_signed()) {
    if (v->i < 0) return -1;
    return static_cast<token_id>(std::min(static_cast<uint64_t>(v->i), kMax));
  }
  throw failure(errc::malformed_file, std::string(key) + " in " + f.path() + " is not an integer");
}

}  // namespace

vocab_spec vocab_from_gguf(const gguf::file& f) {
  vocab_spec s;
  s.model = f.get_string("tokenizer.ggml.model");
  s.pre = f.get_string("tokenizer.ggml.pre", "default");
  s.tokens = f.get_string_array("tokenizer.ggml.tokens");
  if (f.find("tokenizer.ggml.scores")) s.scores = f.get_float_array("tokenizer.ggml.scores");
  if (f.find("tokenizer.ggml.token_type")) {
    s.token_types = f.get_int_array("tokenizer.ggml.token_type");
  }
  if (f.find("tokenizer.ggml.merges")) s.merges = f.get_string_array("tokenizer.ggml.merges");

  const bool llama = s.model == "llama";
  auto def = [&](token_id id) { return llama && static_cast<size_t>(id) < s.tokens.size() ? id : -1; };
  s.bos_id = read_id(f, "tokenizer.ggml.bos_token_id", def(1));
  s.eos_id = read_id(f, "tokenizer.ggml.eos_token_id", def(2));
  s.unk_id = read_id(f, "tokenizer.ggml.unknown_token_id", def(0));
  s.pad_id = read_id(f, "tokenizer.ggml.padding_token_id", -1);
  s.eot_id = read_id(f, "tokenizer.ggml.eot_token_id", -1);
  s.eom_id = read_id(f, "tokenizer.ggml.eom_token_id", -1);
  s.add_bos = f.get_bool("tokenizer.ggml.add_bos_token", llama);
  s.add_eos = f.get_bool("tokenizer.ggml.add_eos_token", false);
  s.add_space_prefix = f.get_bool("tokenizer.ggml.add_space_prefix", llama);
  // llama.cpp's rule for files whose general.name (lowercased) names Phi-3 ("Phi3", as
  // Microsoft's own GGUF; "Phi 3 Mini 128k Instruct" does not): whitespace after a special
  // token is dropped, as the model's Hugging Face tokenizer does (rstrip), except after <unk>,
  // <s> and <|endoftext|>; </s> drops it too.
  std::string name = f.get_string("general.name", "");
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  if (name.find("phi-3") != std::string::npos || name.find("phi3") != std::string::npos) {
    s.rstrip.assign(s.tokens.size(), 0);
    for (size_t i = 0; i < s.token_types.size(); ++i)
      if (s.token_types[i] == 2 || s.token_types[i] == 3 || s.token_types[i] == 4)
        s.rstrip[i] = 1;  // unknown, control, user-defined
    for (size_t i = 0; i < s.tokens.size(); ++i) {
      const std::string& t = s.tokens[i];
      if (t == "</s>") s.rstrip[i] = 1;
      if (t == "<unk>" || t == "<s>" || t == "<|endoftext|>") s.rstrip[i] = 0;
    }
  }
  return s;
}

}  // namespace tandem
