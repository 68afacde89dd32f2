#pragma once
// Prefix reuse: KV blocks named by their content, so a prompt that starts like an earlier one
// takes the earlier one's blocks instead of computing them again.
//
// A full block's key chains its parent's key with the token ids it holds:
//   key[0] = H(salt, tokens[0, bs)),  key[i] = H(key[i-1], tokens[i*bs, (i+1)*bs))
// so a key names the whole prefix up to its block: a changed token changes its block's key
// and every later one. The salt names what else decides the bytes (the model's weights, the
// KV layout, the matmul mode), so two models never share a block.
#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>
#include <vector>

#include "runtime/kv/kv_cache.h"
#include "runtime/tokenizer/tokenizer.h"

namespace tandem {

using block_key = uint64_t;

// What besides the tokens decides a block's bytes. `variant` is anything else that changes
// the arithmetic (the matmul mode).
uint64_t prefix_salt(uint64_t model_identity, const kv_layout& layout, kernels::dtype kv_dtype, int32_t variant);

// Keys of the full blocks of `tokens` (a trailing partial block has none).
std::vector<block_key> block_keys(uint64_t salt, std::span<const token_id> tokens, int32_t block_size);
// The full blocks a prompt can reuse: those before its last token, whose logits give the
// first output token and so are always computed. The one statement of that rule: the router
// counts with it, and prompt_block_keys keys exactly these blocks.
int32_t reusable_prompt_blocks(size_t prompt_tokens, int32_t block_size);
// Keys of those blocks. Empty for an empty prompt.
std::vector<block_key> prompt_block_keys(uint64_t salt, std::span<const token_id> prompt, int32_t block_size);
// The key of the block after `parent` (the salt for the first block).
block_key next_block_key(block_key parent, std::span<const token_id> block_tokens);

// The cache of one block pool: key -> block, holding one reference to each block it names.
// A block that only the cache holds is free to evict, least recently used first; a block a
// sequence also holds (reference count > 1) is never evicted.
class prefix_index {
 public:
  explicit prefix_index(kv_block_pool& pool) : pool_(pool) {}
  ~prefix_index() { clear(); }
  prefix_index(const prefix_index&) = delete;
  prefix_index& operator=(const prefix_index&) = delete;

  // Blocks of the longest run keys[0..n) that is cached (not retained for the caller), and
  // marks them used: the chain's first block becomes the most recent, so chains are evicted
  // from their tails, and a tail never outlives the parent it needs to be found.
  std::vector<block_id> match(std::span<const block_key> keys);
  // How many leading keys are cached, without touching recency.
  int32_t count_cached(std::span<const block_key> keys) const;
  // Names block b by k and retains it; false (nothing changes) if k is already cached. New
  // entries are the most recent: match() the chain afterwards to order it head first.
  bool insert(block_key k, block_id b);
  // Frees up to n blocks that only the cache holds, least recently used first: how many it freed.
  int32_t evict(int32_t n);
  // Blocks only the cache holds (evictable now).
  int32_t evictable() const;
  int32_t size() const { return int32_t(entries_.size()); }
  // The block cached under k, or -1.
  block_id block_of(block_key k) const {
    auto it = entries_.find(k);
    return it == entries_.end() ? -1 : it->second.block;
  }
  uint64_t evicted_total() const { return evicted_; }
  void clear();

 private:
  struct entry {
    block_id block;
    std::list<block_key>::iterator lru;
  };
  kv_block_pool& pool_;
  std::unordered_map<block_key, entry> entries_;
  std::list<block_key> lru_;  // front: most recently used
  uint64_t evicted_ = 0;
};

// Which request is computing which not-yet-cached blocks. A prompt whose next uncached block
// another prompt is computing waits for it (it is cached when that one finishes) instead of
// computing it too: a prefix shared by many requests arriving together is computed once.
class prefix_claims {
 public:
  // The request that is computing keys[first_uncached], if any other than `id`.
  bool blocked(uint64_t id, std::span<const block_key> keys, int32_t first_uncached) const {
    if (first_uncached >= int32_t(keys.size())) return false;
    auto it = owner_.find(keys[size_t(first_uncached)]);
    return it != owner_.end() && it->second != id;
  }
  // Keys from `from` on that requests other than `id` are computing, up to the first that none
  // is: what a prompt waiting for them will find.
  int32_t claimed_run(std::span<const block_key> keys, int32_t from, uint64_t id) const {
    int32_t n = 0;
    for (size_t i = size_t(std::max(from, 0)); i < keys.size(); ++i, ++n) {
      auto it = owner_.find(keys[i]);
      if (it == owner_.end() || it->second == id) break;
    }
    return n;
  }
  void claim(uint64_t id, std::span<const block_key> keys) {
    for (block_key k : keys)
      if (owner_.emplace(k, id).second) by_request_[id].push_back(k);
  }
  // The request finished (or left) its prompt: what it computed is cached or will not be.
  void release(uint64_t id) {
    auto it = by_request_.find(id);
    if (it == by_request_.end()) return;
    for (block_key k : it->second) owner_.erase(k);
    by_request_.erase(it);
  }
  size_t size() const { return owner_.size(); }

 private:
  std::unordered_map<block_key, uint64_t> owner_;
  std::unordered_map<uint64_t, std::vector<block_key>> by_request_;
};

}  // namespace tandem
