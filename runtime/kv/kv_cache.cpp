#include "runtime/kv/kv_cache.h"

#include <xxhash.h>

#include <cassert>
#include <stdexcept>

namespace tandem {

namespace {
kv_layout checked(const kv_layout& l) {
  if (const auto why = kv_dtype_problem(l.dtype, l.head_dim); !why.empty()) throw failure(errc::invalid_argument, why);
  if (l.bytes_per_layer() % 4 != 0)
    throw failure(errc::invalid_argument, "KV blocks of " + std::to_string(l.block_size) + " positions of " +
                                              std::string(kernels::to_string(l.dtype)) + " are not whole 4-byte words");
  return l;
}
}  // namespace

std::string kv_dtype_problem(kernels::dtype t, int32_t head_dim) {
  if (!kv_dtype_supported(t))
    return "the KV cache holds f32, f16, bf16 or q8_0, not " + std::string(kernels::to_string(t));
  if (head_dim <= 0 || head_dim % kernels::block_elems(t) != 0)
    return "a " + std::string(kernels::to_string(t)) + " KV cache needs head_dim a multiple of " +
           std::to_string(kernels::block_elems(t)) + "; this model's is " + std::to_string(head_dim);
  return "";
}

kv_block_pool::kv_block_pool(kv_layout layout, int32_t n_blocks)
    : layout_(checked(layout)),
      data_(size_t(layout.words_per_block() * std::max(n_blocks, 0)), 0.0f),
      refs_(size_t(std::max(n_blocks, 0)), 0) {
  free_.reserve(refs_.size());
  for (int32_t b = n_blocks - 1; b >= 0; --b) free_.push_back(b);
}

block_id kv_block_pool::allocate() {
  if (free_.empty()) return -1;
  const block_id b = free_.back();
  free_.pop_back();
  refs_[size_t(b)] = 1;
  return b;
}

void kv_block_pool::retain(block_id b) {
  assert(refs_[size_t(b)] > 0);
  ++refs_[size_t(b)];
}

void kv_block_pool::release(block_id b) {
  if (b < 0 || size_t(b) >= refs_.size() || refs_[size_t(b)] <= 0)
    throw std::logic_error("kv_block_pool: release of a block that is not held");
  if (--refs_[size_t(b)] == 0) free_.push_back(b);
}

kv_checksum::kv_checksum(const kv_block_export& b) : state_(XXH3_createState()) {
  auto* st = static_cast<XXH3_state_t*>(state_);
  XXH3_64bits_reset(st);
  const int64_t header[] = {int64_t(b.model_id), b.layer_begin,      b.layer_end,     b.pos_begin,
                            b.pos_end,           int64_t(b.dtype),   b.block_size,    b.n_kv_head,
                            b.head_dim,          int64_t(b.request), int64_t(b.epoch)};
  XXH3_64bits_update(st, header, sizeof(header));
}

kv_checksum::~kv_checksum() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }

void kv_checksum::update(const void* bytes, size_t n) {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), bytes, n);
}

uint64_t kv_checksum::digest() const { return XXH3_64bits_digest(static_cast<XXH3_state_t*>(state_)); }

uint64_t kv_block_export::compute_checksum() const {
  kv_checksum c(*this);
  c.update(payload.data(), payload.size() * sizeof(float));
  return c.digest();
}

}  // namespace tandem
