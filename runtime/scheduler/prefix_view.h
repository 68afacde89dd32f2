#pragma once
// The router's view of which worker has which prompt blocks cached: what KV-aware placement
// scores workers by. It is a model, not a mirror: the router records the blocks of each prompt
// it sends to a worker and lets each worker's set hold at most that worker's pool of blocks
// (least recently sent first out), as the worker's own LRU would. A wrong guess costs only a
// recomputation; correctness never depends on it.
#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>
#include <vector>

#include "runtime/kv/prefix_cache.h"

namespace tandem {

class prefix_view {
 public:
  // `capacity_blocks`: the most blocks one worker can keep cached (its pool).
  explicit prefix_view(int32_t capacity_blocks) : capacity_(capacity_blocks) {}

  // Leading keys worker w is believed to hold.
  int32_t overlap(int32_t w, std::span<const block_key> keys) const;
  // w was sent a prompt with these blocks: it holds them now (most recent).
  void record(int32_t w, std::span<const block_key> keys);
  // w restarted: its cache is empty.
  void forget(int32_t w);
  int32_t size(int32_t w) const;

 private:
  struct worker {
    std::list<block_key> lru;  // front: most recent
    std::unordered_map<block_key, std::list<block_key>::iterator> where;
  };
  worker* find(int32_t w);
  int32_t capacity_;
  std::vector<worker> workers_;
};

}  // namespace tandem
