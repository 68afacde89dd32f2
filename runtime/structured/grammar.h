#pragma once
// Grammar-constrained decoding. A grammar in GBNF (llama.cpp's notation: `name ::= ...`,
// "literals", [classes], [^negated], ., ( groups ), | alternatives, * + ? {m} {m,} {m,n})
// is compiled once into flat elements; a grammar_matcher holds one sequence's position in it
// as a set of stacks (a pushdown automaton over Unicode code points, partial UTF-8 carried
// between tokens) and answers, before each step, which tokens of the vocabulary may come next.
//
// The allowed set of a state is found by walking a byte trie of the vocabulary once
// (runtime/tokenizer/token_trie.h) and is cached in the grammar by (vocabulary, state): a JSON
// string's body, a number's digits and a schema's fixed keys recur, so most steps cost a cache
// lookup and a copy of V bits.
//
// A matcher's state is a function of the tokens it accepted, nothing else: a request resumed
// elsewhere rebuilds it from its output so far and continues identically.
#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "runtime/tokenizer/token_trie.h"
#include "runtime/tokenizer/tokenizer.h"

namespace tandem {

// A token mask: bit t of words[t / 64] set = token t allowed.
using token_mask = std::vector<uint64_t>;
inline bool mask_allows(const token_mask& m, token_id t) {
  return t >= 0 && size_t(t) / 64 < m.size() && (m[size_t(t) / 64] >> (t % 64)) & 1;
}

// A GBNF string literal matching exactly `bytes` (quotes, backslashes and control bytes
// escaped): how grammars built from data (schemas, tool names, choices) spell text.
std::string gbnf_literal(std::string_view bytes);

class grammar {
 public:
  // Parses and checks `text`: every rule referenced is defined, `root` exists, no rule can
  // reach itself without consuming input (left recursion). Throws failure(invalid_argument)
  // with the line and column of what is wrong.
  static std::shared_ptr<const grammar> compile(std::string_view text);
  // compile(), with the compiled grammars of recent texts kept (a schema sent by many
  // requests is compiled once, and its mask cache shared).
  static std::shared_ptr<const grammar> cached(const std::string& text);

  // Element kinds of the flat program.
  enum class kind : uint8_t {
    end,  // end of an alternative: return to the rule's caller
    chars,  // one code point in (or, negated, not in) ranges
    rule,  // a reference to a rule
  };
  struct element {
    kind k = kind::end;
    bool negated = false;
    uint32_t first = 0, count = 0;  // chars: ranges_[first .. first+count)
    uint32_t rule = 0;  // rule: its id
  };

  size_t rules() const { return alts_.size(); }
  size_t elements() const { return elems_.size(); }

 private:
  friend class grammar_matcher;
  grammar() = default;
  std::vector<element> elems_;
  std::vector<std::pair<uint32_t, uint32_t>> ranges_;  // inclusive code point ranges
  std::vector<std::vector<uint32_t>> alts_;  // rule -> start position of each alternative
  uint32_t root_ = 0;
  // ASCII bytes that every character element treats alike share a class (a JSON grammar has a
  // dozen); bytes >= 0x80 are each their own. Mask walks step once per class, not per byte.
  std::array<uint8_t, 256> byte_class_{};

  // Allowed-token masks by (trie uid, state key), bounded (cleared past a limit).
  mutable std::mutex mask_mu_;
  mutable std::unordered_map<std::string, std::shared_ptr<const token_mask>> masks_;
};

class grammar_matcher {
 public:
  // `trie` may be null for byte-level use (accept_bytes) alone.
  grammar_matcher(std::shared_ptr<const grammar> g, std::shared_ptr<const token_trie> trie);

  // The tokens that may come next. End-of-generation tokens are allowed when the grammar is
  // complete here; when nothing is allowed at all (a dead state) they are allowed alone.
  std::shared_ptr<const token_mask> allowed() const;
  // Feeds a token's bytes. False if the grammar cannot continue with it: the matcher is then
  // dead (it allows only end-of-generation). An end-of-generation token finishes it.
  bool accept(token_id t);
  // Tokens accepted so far (dead or not): the position in the sequence's output.
  size_t consumed() const { return consumed_; }
  // Some path has matched the root rule whole.
  bool complete() const;
  bool dead() const { return st_.stacks.empty(); }
  // Back to the start (nothing consumed).
  void reset();

  // Bytes alone, for tests and for text a client wrote: whether `bytes` can continue the
  // match (advances if so).
  bool accept_bytes(std::string_view bytes);

 private:
  using stack = std::vector<uint32_t>;
  struct state {
    std::vector<stack> stacks;  // sorted, unique; an empty stack: the root matched whole
    uint32_t partial = 0;  // bits of a code point whose UTF-8 bytes are not all in
    uint8_t left = 0;  // its continuation bytes still to come
    uint8_t width = 0;  // and its length in bytes
  };
  void expand(stack& s, std::vector<stack>& out) const;
  bool step_byte(const state& in, uint8_t b, state& out) const;
  bool advance(const state& in, uint32_t cp, state& out) const;
  static std::string state_key(const state& st);
  std::string key() const;  // the trie's uid and state_key(st_): names a mask in the cache
  struct walker;

  std::shared_ptr<const grammar> g_;
  std::shared_ptr<const token_trie> trie_;
  state st_;
  bool finished_ = false;  // an end-of-generation token was accepted
  size_t consumed_ = 0;
};

// One request's constraint as its sampling parameters carry it: the compiled grammar and a
// matcher kept in step with the request's output. Every copy of the parameters (a request's
// steps on any in-process worker) shares it; since the mask is recomputed from the output
// given, a step on a worker that never saw the earlier tokens, or after a retry that changed
// them, replays the output first and stays exact.
class grammar_constraint {
 public:
  explicit grammar_constraint(std::shared_ptr<const grammar> g) : g_(std::move(g)) {}
  // The tokens allowed after `output` (the request's output so far) under `trie`'s vocabulary.
  std::shared_ptr<const token_mask> mask_after(std::span<const token_id> output,
                                               const std::shared_ptr<const token_trie>& trie);
  const grammar& rules() const { return *g_; }

 private:
  std::shared_ptr<const grammar> g_;
  std::mutex mu_;
  std::unique_ptr<grammar_matcher> m_;
  std::shared_ptr<const token_trie> trie_;
  std::vector<token_id> seen_;  // the tokens m_ accepted
};

}  // namespace tandem
