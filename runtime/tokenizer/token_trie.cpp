#include "runtime/tokenizer/token_trie.h"

#include <algorithm>
#include <atomic>
#include <utility>

namespace tandem {

namespace {

std::atomic<uint64_t> next_trie_uid{1};

}  // namespace

token_trie::token_trie(const tokenizer& tok) : n_vocab(tok.n_vocab()), uid(next_trie_uid++) {
  // Built as a tree of vectors first, then laid out flat in depth-first order.
  struct tree_node {
    std::vector<std::pair<uint8_t, uint32_t>> children;  // by byte, ascending
    std::vector<token_id> tokens;
  };
  std::vector<tree_node> tree(1);
  bytes.resize(size_t(n_vocab));
  for (token_id id = 0; id < n_vocab; ++id) {
    if (tok.is_eog(id)) {
      eog.push_back(id);
      continue;
    }
    const int32_t type = tok.token_type(id);
    if (type == 2 || type == 3 || type == 5) continue;  // unknown, control, unused: no text of their own
    std::string b = tok.token_bytes(id);
    if (b.empty()) continue;
    uint32_t at = 0;
    for (unsigned char c : b) {
      auto& ch = tree[at].children;
      auto it = std::lower_bound(ch.begin(), ch.end(), c, [](const auto& p, uint8_t x) { return p.first < x; });
      if (it != ch.end() && it->first == c) {
        at = it->second;
      } else {
        const auto fresh = uint32_t(tree.size());
        ch.insert(it, {c, fresh});
        tree.emplace_back();
        at = fresh;
      }
    }
    tree[at].tokens.push_back(id);
    bytes[size_t(id)] = std::move(b);
  }
  // Depth-first numbering, then each node's edges and tokens in that order.
  std::vector<uint32_t> order, renum(tree.size());
  order.reserve(tree.size());
  std::vector<uint32_t> stack{0};
  while (!stack.empty()) {
    const uint32_t t = stack.back();
    stack.pop_back();
    renum[t] = uint32_t(order.size());
    order.push_back(t);
    const auto& ch = tree[t].children;
    for (auto it = ch.rbegin(); it != ch.rend(); ++it) stack.push_back(it->second);
  }
  nodes.resize(tree.size());
  for (uint32_t i = 0; i < order.size(); ++i) {
    const auto& t = tree[order[i]];
    node& n = nodes[i];
    n.first_edge = uint32_t(edge_byte.size());
    n.n_edges = uint32_t(t.children.size());
    for (const auto& [c, child] : t.children) {
      edge_byte.push_back(c);
      edge_child.push_back(renum[child]);
    }
    n.first_token = uint32_t(tokens.size());
    n.n_tokens = uint32_t(t.tokens.size());
    tokens.insert(tokens.end(), t.tokens.begin(), t.tokens.end());
  }
  auto ends = std::make_shared<std::vector<uint64_t>>((size_t(n_vocab) + 63) / 64, 0);
  for (token_id id : eog) (*ends)[size_t(id) / 64] |= uint64_t(1) << (id % 64);
  end_only = std::move(ends);
}

std::shared_ptr<const token_trie> token_trie::of(const tokenizer& tok) { return tok.vocab_trie(); }

}  // namespace tandem
