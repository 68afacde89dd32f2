#pragma once
// Paged KV cache: a preallocated pool of fixed-size blocks, and per-sequence block tables.
// A block holds `block_size` consecutive positions of one sequence for every layer:
//   block: [n_layer][2 (k, v)][n_kv_head][block_size x head_dim]  of the layout's dtype
// so that attention for one (layer, kv head) reads each block's keys as one contiguous run.
// V is [block_size][head_dim]; K is [head_dim][block_size] (transposed: decode's q . K reads 16
// positions per vector) except in a q8_0 cache, whose K rows keep their 32-blocks
// (kernels::cpu::kv_k_order, store_k_row).
// The dtype is f32, f16 (the engine's default: half the bytes to read per decode step, to
// move over a KV link and to keep in the host store), bf16 or q8_0 (a quarter of f32's plus a
// scale per 32: 34 bytes per 32 elements, as llama.cpp's -ctk q8_0); attention reads it directly.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kernels/tensor_types.h"
#include "runtime/errors.h"

namespace tandem {

struct kv_layout {
  int32_t n_layer = 0;
  int32_t n_kv_head = 0;
  int32_t head_dim = 0;
  int32_t block_size = 16;
  kernels::dtype dtype = kernels::dtype::f32;  // of each stored K/V element
  int64_t elems_per_layer() const { return int64_t(2) * n_kv_head * block_size * head_dim; }
  // One position's K (or V) row of one head: head_dim elements of dtype (q8_0: head_dim / 32
  // blocks of 34 bytes).
  int64_t row_bytes() const { return kernels::row_bytes(dtype, head_dim); }
  int64_t bytes_per_layer() const { return int64_t(2) * n_kv_head * block_size * row_bytes(); }
  int64_t bytes_per_block() const { return int64_t(n_layer) * bytes_per_layer(); }
  // The pool and payloads count in 4-byte words (kv_payload); a layer is whole words for
  // every dtype (2 bytes x an even element count; q8_0: 34 bytes x an even row count, the
  // pool's check).
  int64_t words_per_layer() const { return bytes_per_layer() / 4; }
  int64_t words_per_block() const { return int64_t(n_layer) * words_per_layer(); }
  bool operator==(const kv_layout&) const = default;
};

// Whether the KV cache can hold elements of type t (f32, f16, bf16, q8_0).
constexpr bool kv_dtype_supported(kernels::dtype t) {
  return t == kernels::dtype::f32 || t == kernels::dtype::f16 || t == kernels::dtype::bf16 || t == kernels::dtype::q8_0;
}
// "" when a KV cache of dtype t holds rows of head_dim (q8_0 needs whole 32-blocks), else why not.
std::string kv_dtype_problem(kernels::dtype t, int32_t head_dim);

using block_id = int32_t;

class kv_block_pool {
 public:
  kv_block_pool(kv_layout layout, int32_t n_blocks);

  const kv_layout& layout() const { return layout_; }
  int32_t total_blocks() const { return int32_t(refs_.size()); }
  int32_t free_blocks() const { return int32_t(free_.size()); }

  // A free block with reference count 1, or -1 when none is left (a status, not an error).
  block_id allocate();
  // Another holder of a block (prefix sharing): bumps its reference count.
  void retain(block_id b);
  // Drops one reference; the block returns to the free list at zero.
  void release(block_id b);
  int32_t ref_count(block_id b) const { return refs_[size_t(b)]; }

  // A block's memory, in 4-byte words (layout().words_per_block() of them).
  float* block_data(block_id b) { return data_.data() + int64_t(b) * layout_.words_per_block(); }
  const float* block_data(block_id b) const { return data_.data() + int64_t(b) * layout_.words_per_block(); }
  // k/v of one (layer, kv head) in a block, block_size x head_dim of layout().dtype (K in
  // kv_k_order(dtype), V position-major)
  void* k(block_id b, int32_t layer, int32_t head) { return bytes(b) + offset(layer, 0, head); }
  void* v(block_id b, int32_t layer, int32_t head) { return bytes(b) + offset(layer, 1, head); }
  const void* k(block_id b, int32_t layer, int32_t head) const {
    return const_cast<kv_block_pool*>(this)->k(b, layer, head);
  }
  const void* v(block_id b, int32_t layer, int32_t head) const {
    return const_cast<kv_block_pool*>(this)->v(b, layer, head);
  }

 private:
  uint8_t* bytes(block_id b) { return reinterpret_cast<uint8_t*>(block_data(b)); }
  // In bytes.
  int64_t offset(int32_t layer, int32_t kv, int32_t head) const {
    return ((int64_t(layer) * 2 + kv) * layout_.n_kv_head + head) * layout_.block_size * layout_.row_bytes();
  }
  kv_layout layout_;
  std::vector<float> data_;
  std::vector<int32_t> refs_;
  std::vector<block_id> free_;  // used as a stack: recently freed blocks are reused first
};

// Allocates without zeroing: a KV payload is always overwritten whole where it is sized (an
// export, a transport's landing buffer, a store read), and zeroing it first was one more pass
// over every byte a KV link moves.
template <class T>
struct uninitialized_allocator : std::allocator<T> {
  template <class U>
  struct rebind {
    using other = uninitialized_allocator<U>;
  };
  uninitialized_allocator() = default;
  template <class U>
  uninitialized_allocator(const uninitialized_allocator<U>&) noexcept {}
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    if constexpr (sizeof...(Args) == 0) ::new (static_cast<void*>(p)) U;
    else ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};
using kv_payload = std::vector<float, uninitialized_allocator<float>>;

// One block of a sequence's KV cache as it travels between engines (the unit a KV link moves).
struct kv_block_export {
  uint64_t model_id = 0;  // model::identity() of the engine that produced it
  int32_t layer_begin = 0;  // layers [layer_begin, layer_end) are in the payload
  int32_t layer_end = 0;
  int32_t pos_begin = 0;  // positions [pos_begin, pos_end) are valid
  int32_t pos_end = 0;
  kernels::dtype dtype = kernels::dtype::f32;
  int32_t block_size = 0;
  int32_t n_kv_head = 0;
  int32_t head_dim = 0;
  uint64_t request = 0;  // whose KV (0: untagged, e.g. a local export)
  uint32_t epoch = 0;  // which prefill attempt of that request made it
  uint64_t checksum = 0;  // XXH3-64 over every field above and the payload
  // [layer_end-layer_begin][2][n_kv_head][block_size x head_dim] of dtype, as the pool holds
  // it (K transposed but for q8_0), in 4-byte words
  kv_payload payload;

  uint64_t compute_checksum() const;  // = kv_checksum(*this) over the whole payload
  // Every field but the payload (which a transport fills): copying the payload only to
  // overwrite it doubled the bytes a KV link touched.
  kv_block_export without_payload() const {
    kv_block_export e;
    e.model_id = model_id;
    e.layer_begin = layer_begin;
    e.layer_end = layer_end;
    e.pos_begin = pos_begin;
    e.pos_end = pos_end;
    e.dtype = dtype;
    e.block_size = block_size;
    e.n_kv_head = n_kv_head;
    e.head_dim = head_dim;
    e.request = request;
    e.epoch = epoch;
    e.checksum = checksum;
    return e;
  }
};

// The block checksum computed as a payload lands, piece by piece (each piece hashed while it
// is still in cache): the same value as compute_checksum() once every byte was given.
class kv_checksum {
 public:
  explicit kv_checksum(const kv_block_export& fields);  // hashes every field but the payload
  ~kv_checksum();
  kv_checksum(const kv_checksum&) = delete;
  kv_checksum& operator=(const kv_checksum&) = delete;
  void update(const void* bytes, size_t n);
  uint64_t digest() const;

 private:
  void* state_;  // XXH3_state_t
};

}  // namespace tandem
