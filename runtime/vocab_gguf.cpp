#include "runtime/vocab_gguf.h"

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
  throw failure(errc::malformed_file,
                std::string(key) + " in " + f.path() + " is not an integer");
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
  return s;
}

}  // namespace tandem
