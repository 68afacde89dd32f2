#pragma once
// The vocabulary as a byte trie: what grammar-constrained decoding (runtime/structured/grammar.h)
// walks to find the tokens a grammar state allows. Built once per tokenizer, on first use
// (tokenizer::vocab_trie).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/tokenizer/tokenizer.h"

namespace tandem {

// The vocabulary as a trie of the tokens' bytes (control tokens, which have none, left out),
// with its end-of-generation tokens apart. Built once per tokenizer (token_trie::of).
struct token_trie {
  // Flat, in depth-first order (a walk reads memory mostly forward): node i's children are
  // edges [first_edge, first_edge + n_edges) by ascending byte, the tokens whose bytes end
  // there tokens[first_token, first_token + n_tokens).
  struct node {
    uint32_t first_edge = 0, n_edges = 0;
    uint32_t first_token = 0, n_tokens = 0;
  };
  std::vector<node> nodes;  // nodes[0] is the root (no token ends there)
  std::vector<uint8_t> edge_byte;
  std::vector<uint32_t> edge_child;
  std::vector<token_id> tokens;
  std::vector<token_id> eog;
  std::shared_ptr<const std::vector<uint64_t>> end_only;  // the mask of the eog tokens alone
  std::vector<std::string> bytes;  // by token: its bytes ("" for those left out)
  int32_t n_vocab = 0;
  uint64_t uid = 0;  // unique per trie built: keys the grammars' mask caches

  explicit token_trie(const tokenizer& tok);
  // The tokenizer's trie, built on first use and kept as long as the tokenizer lives
  // (tokenizer::vocab_trie).
  static std::shared_ptr<const token_trie> of(const tokenizer& tok);
};

}  // namespace tandem
