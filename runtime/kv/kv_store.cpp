#include "runtime/kv/kv_store.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace tandem {

namespace {
// A disk slot: this header, then the payload floats.
struct slot_header {
  uint64_t model_id;
  int32_t layer_begin, layer_end, pos_begin, pos_end;
  uint32_t dtype;
  int32_t block_size, n_kv_head, head_dim;
  uint64_t request;
  uint32_t epoch;
  uint32_t pad;
  uint64_t checksum;
  uint64_t payload_floats;
};
}  // namespace

kv_block_store::kv_block_store(kv_store_options o) : opts_(std::move(o)) {
  if (opts_.disk_path.empty() || opts_.disk_bytes <= 0) return;
  fd_ = ::open(opts_.disk_path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd_ < 0)
    throw failure(errc::io_error, "KV store disk tier: cannot open " + opts_.disk_path + ": " + std::strerror(errno));
  if (::ftruncate(fd_, opts_.disk_bytes) != 0) {
    const std::string why = std::strerror(errno);
    ::close(fd_);
    throw failure(errc::io_error, "KV store disk tier: cannot size " + opts_.disk_path + ": " + why);
  }
  void* p = ::mmap(nullptr, size_t(opts_.disk_bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  if (p == MAP_FAILED) {
    const std::string why = std::strerror(errno);
    ::close(fd_);
    throw failure(errc::io_error, "KV store disk tier: cannot map " + opts_.disk_path + ": " + why);
  }
  map_ = static_cast<uint8_t*>(p);
  map_bytes_ = opts_.disk_bytes;
}

kv_block_store::~kv_block_store() {
  if (map_) ::munmap(map_, size_t(map_bytes_));
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(opts_.disk_path.c_str());  // the tier is a cache of this process, not a database
  }
}

int32_t kv_block_store::put(std::span<const block_key> keys, std::span<const kv_block_export> blocks) {
  int32_t added = 0;
  for (size_t i = 0; i < keys.size() && i < blocks.size(); ++i) {
    const block_key k = keys[i];
    if (auto it = mem_.find(k); it != mem_.end()) {
      mem_lru_.splice(mem_lru_.begin(), mem_lru_, it->second.lru);
      continue;
    }
    if (disk_.count(k)) continue;
    kv_block_export b = blocks[i];
    b.request = k;  // the name goes under the checksum
    b.epoch = 0;
    b.checksum = b.compute_checksum();
    mem_bytes_ += block_bytes(b);
    mem_lru_.push_front(k);
    mem_.emplace(k, mem_entry{std::move(b), mem_lru_.begin()});
    ++added;
  }
  counts_.published += uint64_t(added);
  make_room();
  return added;
}

void kv_block_store::make_room() {
  while (mem_bytes_ > opts_.memory_bytes && !mem_lru_.empty()) {
    const block_key k = mem_lru_.back();
    auto it = mem_.find(k);
    mem_bytes_ -= block_bytes(it->second.block);
    kv_block_export b = std::move(it->second.block);
    mem_.erase(it);
    mem_lru_.pop_back();
    if (!spill(k, std::move(b))) ++counts_.evicted;
  }
}

bool kv_block_store::spill(block_key k, kv_block_export&& b) {
  if (!map_) return false;
  const int64_t need = int64_t(sizeof(slot_header) + b.payload.size() * sizeof(float));
  if (slot_bytes_ == 0) {
    slot_bytes_ = need;
    for (int64_t s = map_bytes_ / slot_bytes_ - 1; s >= 0; --s) free_slots_.push_back(s);
  }
  if (need > slot_bytes_ || map_bytes_ < slot_bytes_) return false;  // another model's size: memory only
  if (free_slots_.empty()) {  // the disk's least recent block leaves
    const block_key old = disk_lru_.back();
    drop_disk(old);
    ++counts_.evicted;
  }
  const int64_t slot = free_slots_.back();
  free_slots_.pop_back();
  uint8_t* at = map_ + slot * slot_bytes_;
  const slot_header h{
      b.model_id,  b.layer_begin, b.layer_end, b.pos_begin, b.pos_end, uint32_t(b.dtype), b.block_size,
      b.n_kv_head, b.head_dim,    b.request,   b.epoch,     0,         b.checksum,        uint64_t(b.payload.size())};
  std::memcpy(at, &h, sizeof h);
  std::memcpy(at + sizeof h, b.payload.data(), b.payload.size() * sizeof(float));
  disk_lru_.push_front(k);
  disk_.emplace(k, disk_entry{slot, disk_lru_.begin()});
  ++counts_.spilled;
  return true;
}

bool kv_block_store::read_slot(int64_t slot, kv_block_export& out) const {
  const uint8_t* at = map_ + slot * slot_bytes_;
  slot_header h;
  std::memcpy(&h, at, sizeof h);
  if (int64_t(sizeof h + h.payload_floats * sizeof(float)) > slot_bytes_) return false;
  out.model_id = h.model_id;
  out.layer_begin = h.layer_begin;
  out.layer_end = h.layer_end;
  out.pos_begin = h.pos_begin;
  out.pos_end = h.pos_end;
  out.dtype = kernels::dtype(h.dtype);
  out.block_size = h.block_size;
  out.n_kv_head = h.n_kv_head;
  out.head_dim = h.head_dim;
  out.request = h.request;
  out.epoch = h.epoch;
  out.checksum = h.checksum;
  out.payload.resize(size_t(h.payload_floats));
  std::memcpy(out.payload.data(), at + sizeof h, out.payload.size() * sizeof(float));
  return true;
}

void kv_block_store::drop_disk(block_key k) {
  auto it = disk_.find(k);
  if (it == disk_.end()) return;
  free_slots_.push_back(it->second.slot);
  disk_lru_.erase(it->second.lru);
  disk_.erase(it);
}

int32_t kv_block_store::count(std::span<const block_key> keys) const {
  int32_t n = 0;
  for (block_key k : keys) {
    if (!mem_.count(k) && !disk_.count(k)) break;
    ++n;
  }
  return n;
}

std::vector<kv_block_export> kv_block_store::get(std::span<const block_key> keys) {
  std::vector<kv_block_export> out;
  std::vector<block_key> found;
  for (block_key k : keys) {
    if (auto it = mem_.find(k); it != mem_.end()) {
      if (!valid(it->second.block, k)) {
        mem_bytes_ -= block_bytes(it->second.block);
        mem_lru_.erase(it->second.lru);
        mem_.erase(it);
        ++counts_.corrupted;
        break;
      }
      out.push_back(it->second.block);
    } else if (auto d = disk_.find(k); d != disk_.end()) {
      kv_block_export b;
      const bool ok = read_slot(d->second.slot, b) && valid(b, k);
      drop_disk(k);
      if (!ok) {
        ++counts_.corrupted;
        break;
      }
      out.push_back(b);
      mem_bytes_ += block_bytes(b);
      mem_lru_.push_front(k);
      mem_.emplace(k, mem_entry{std::move(b), mem_lru_.begin()});
    } else {
      break;
    }
    found.push_back(k);
  }
  // Tail first: the run's head ends up the most recent (tails leave first).
  for (size_t i = found.size(); i-- > 0;) {
    auto it = mem_.find(found[i]);
    if (it != mem_.end()) mem_lru_.splice(mem_lru_.begin(), mem_lru_, it->second.lru);
  }
  counts_.fetched += out.size();
  make_room();
  return out;
}

kv_store_stats kv_block_store::stats() const {
  kv_store_stats s = counts_;
  s.memory_blocks = int64_t(mem_.size());
  s.disk_blocks = int64_t(disk_.size());
  s.memory_bytes = mem_bytes_;
  s.disk_bytes = int64_t(disk_.size()) * slot_bytes_;
  return s;
}

bool kv_block_store::corrupt(block_key k) {
  if (auto it = mem_.find(k); it != mem_.end() && !it->second.block.payload.empty()) {
    uint32_t bits;
    std::memcpy(&bits, &it->second.block.payload[0], 4);
    bits ^= 1u;
    std::memcpy(&it->second.block.payload[0], &bits, 4);
    return true;
  }
  if (auto d = disk_.find(k); d != disk_.end()) {
    map_[d->second.slot * slot_bytes_ + sizeof(slot_header)] ^= 1u;
    return true;
  }
  return false;
}

}  // namespace tandem
