#pragma once
// The host's KV-cache pool (Mooncake's idea): published full KV blocks, named by their prefix
// keys (runtime/kv/prefix_cache.h), kept in host memory up to a budget, with an optional disk
// tier (a memory-mapped file of fixed slots) behind it. Least recently used blocks go to disk
// when memory is full, and off disk when the disk is full.
//
// A stored block carries its key under its checksum (in the export's request tag), so a block
// read back is used only if its bytes and its name are both what was stored: a corrupted block
// or one filed under the wrong key ends the run there, and the caller computes the rest.
#include <cstdint>
#include <list>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/kv/kv_cache.h"
#include "runtime/kv/prefix_cache.h"

namespace tandem {

struct kv_store_options {
  int64_t memory_bytes = 1ll << 30;
  std::string disk_path;  // empty: no disk tier
  int64_t disk_bytes = 0;  // size of the disk tier's file
};

struct kv_store_stats {
  int64_t memory_blocks = 0, disk_blocks = 0;
  int64_t memory_bytes = 0, disk_bytes = 0;  // held now
  uint64_t published = 0;  // blocks added
  uint64_t fetched = 0;  // blocks handed out
  uint64_t evicted = 0;  // blocks dropped for room (from the last tier)
  uint64_t spilled = 0;  // blocks moved from memory to disk
  uint64_t corrupted = 0;  // blocks that failed their checksum or key, dropped
};

class kv_block_store {
 public:
  // Throws tandem::failure (io_error) when the disk tier's file cannot be made.
  explicit kv_block_store(kv_store_options o);
  ~kv_block_store();
  kv_block_store(const kv_block_store&) = delete;
  kv_block_store& operator=(const kv_block_store&) = delete;

  // Files blocks[i] under keys[i] (full blocks, every layer). A key already held is only
  // refreshed. Returns how many were added.
  int32_t put(std::span<const block_key> keys, std::span<const kv_block_export> blocks);
  // Leading keys held, in either tier (recency untouched): the metadata a router asks for.
  int32_t count(std::span<const block_key> keys) const;
  // The blocks of the longest verified run of leading keys, marked used (disk blocks move
  // back to memory). Each has its key in `request` and a valid checksum.
  std::vector<kv_block_export> get(std::span<const block_key> keys);
  kv_store_stats stats() const;

  // Fault injection for tests: flips one payload bit of the stored block (either tier).
  bool corrupt(block_key k);

 private:
  struct mem_entry {
    kv_block_export block;
    std::list<block_key>::iterator lru;
  };
  struct disk_entry {
    int64_t slot;
    std::list<block_key>::iterator lru;
  };
  static int64_t block_bytes(const kv_block_export& b) { return int64_t(b.payload.size() * sizeof(float)) + 64; }
  void make_room();
  bool spill(block_key k, kv_block_export&& b);
  bool read_slot(int64_t slot, kv_block_export& out) const;
  void drop_disk(block_key k);
  static bool valid(const kv_block_export& b, block_key k) {
    return b.request == k && b.checksum == b.compute_checksum();
  }

  kv_store_options opts_;
  std::unordered_map<block_key, mem_entry> mem_;
  std::list<block_key> mem_lru_;  // front: most recent
  int64_t mem_bytes_ = 0;
  std::unordered_map<block_key, disk_entry> disk_;
  std::list<block_key> disk_lru_;
  std::vector<int64_t> free_slots_;
  int fd_ = -1;
  uint8_t* map_ = nullptr;
  int64_t map_bytes_ = 0;
  int64_t slot_bytes_ = 0;  // fixed by the first block spilled
  kv_store_stats counts_;
};

}  // namespace tandem
