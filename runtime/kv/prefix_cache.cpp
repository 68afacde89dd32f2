#include "runtime/kv/prefix_cache.h"

#include <xxhash.h>

#include <algorithm>

#include "kernels/cpu/attention.h"

namespace tandem {

uint64_t prefix_salt(uint64_t model_identity, const kv_layout& layout, kernels::dtype kv_dtype, int32_t variant) {
  // The K order is a function of the dtype today, but names the block format: a block written
  // in another order (another build) must not be found under this one's keys.
  const int64_t fields[] = {
      int64_t(model_identity), layout.n_layer,    layout.n_kv_head, layout.head_dim,
      layout.block_size,       int64_t(kv_dtype), variant,          int64_t(kernels::cpu::kv_k_order(kv_dtype)) + 1};
  // A fixed, arbitrary seed keeps salts apart from keys of blocks made with seed 0.
  return XXH3_64bits_withSeed(fields, sizeof(fields), 0x7461'6e64'656d'6b76ull);
}

block_key next_block_key(block_key parent, std::span<const token_id> block_tokens) {
  return XXH3_64bits_withSeed(block_tokens.data(), block_tokens.size_bytes(), parent);
}

std::vector<block_key> block_keys(uint64_t salt, std::span<const token_id> tokens, int32_t block_size) {
  std::vector<block_key> keys;
  if (block_size <= 0) return keys;
  block_key k = salt;
  for (size_t b = 0; (b + 1) * size_t(block_size) <= tokens.size(); ++b) {
    k = next_block_key(k, tokens.subspan(b * size_t(block_size), size_t(block_size)));
    keys.push_back(k);
  }
  return keys;
}

int32_t reusable_prompt_blocks(size_t prompt_tokens, int32_t block_size) {
  if (prompt_tokens == 0 || block_size <= 0) return 0;
  return int32_t((prompt_tokens - 1) / size_t(block_size));
}

std::vector<block_key> prompt_block_keys(uint64_t salt, std::span<const token_id> prompt, int32_t block_size) {
  const int32_t blocks = reusable_prompt_blocks(prompt.size(), block_size);
  if (blocks == 0) return {};
  return block_keys(salt, prompt.first(size_t(blocks) * size_t(block_size)), block_size);
}

std::vector<block_id> prefix_index::match(std::span<const block_key> keys) {
  std::vector<block_id> blocks;
  for (block_key k : keys) {
    auto it = entries_.find(k);
    if (it == entries_.end()) break;
    blocks.push_back(it->second.block);
  }
  // Tail first, so the chain's head ends up the most recently used.
  for (size_t i = blocks.size(); i-- > 0;) {
    auto& e = entries_.at(keys[i]);
    lru_.splice(lru_.begin(), lru_, e.lru);
  }
  return blocks;
}

int32_t prefix_index::count_cached(std::span<const block_key> keys) const {
  int32_t n = 0;
  for (block_key k : keys) {
    if (!entries_.count(k)) break;
    ++n;
  }
  return n;
}

bool prefix_index::insert(block_key k, block_id b) {
  if (entries_.count(k)) return false;
  pool_.retain(b);
  lru_.push_front(k);
  entries_.emplace(k, entry{b, lru_.begin()});
  return true;
}

int32_t prefix_index::evict(int32_t n) {
  int32_t freed = 0;
  for (auto it = lru_.end(); freed < n && it != lru_.begin();) {
    --it;
    auto e = entries_.find(*it);
    if (pool_.ref_count(e->second.block) != 1) continue;  // a sequence holds it too
    pool_.release(e->second.block);
    entries_.erase(e);
    it = lru_.erase(it);
    ++freed;
    ++evicted_;
  }
  return freed;
}

int32_t prefix_index::evictable() const {
  return int32_t(std::count_if(entries_.begin(), entries_.end(),
                               [&](const auto& kv) { return pool_.ref_count(kv.second.block) == 1; }));
}

void prefix_index::clear() {
  for (auto& [k, e] : entries_) pool_.release(e.block);
  entries_.clear();
  lru_.clear();
}

}  // namespace tandem
