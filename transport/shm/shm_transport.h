#pragma once
// Shared-memory transport: bytes move through a named POSIX shared-memory arena
// (/dev/shm/tandem-<pid>-<n>), the path a prefill and a decode worker in two processes on one
// host will share. The sender writes a slot (header + payload) into the arena, the receiver
// checks the header and copies the payload out; large copies go slot by slot. In one process
// both halves run in submit(); the arena's layout is what a second process maps.
#include <string>

#include "transport/synchronous_transport.h"

namespace tandem::transport {

// Layout of one slot in the arena (the header protocol a peer process reads).
struct shm_slot_header {
  uint64_t magic;  // shm_slot_magic when the slot holds a payload
  uint64_t sequence;  // increases by one per slot written
  uint64_t size;  // payload bytes that follow the header
  uint64_t checksum;  // XXH3-64 of the payload
};
constexpr uint64_t shm_slot_magic = 0x746e656d64657373ull;  // "tandem" slot

class shm_transport final : public synchronous_transport {
 public:
  // Creates the arena; throws failure(io_error) if shared memory is unavailable.
  explicit shm_transport(size_t arena_bytes = 4u << 20);
  ~shm_transport() override;
  shm_transport(const shm_transport&) = delete;
  shm_transport& operator=(const shm_transport&) = delete;

  std::string kind() const override { return "shm"; }

  const std::string& arena_name() const { return name_; }
  size_t arena_bytes() const { return size_; }

 private:
  // Through the arena, slot by slot: the sender half writes, the receiver half checks and reads.
  status copy(std::byte* dst, const std::byte* src, uint64_t n) override;

  std::string name_;
  std::byte* arena_ = nullptr;
  size_t size_ = 0;
  uint64_t sequence_ = 0;
};

}  // namespace tandem::transport
