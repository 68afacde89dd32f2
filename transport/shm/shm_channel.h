#pragma once
// The shared-memory ring of a KV channel (transport/channel.h): a named POSIX shared-memory
// object that the receiver creates (O_EXCL, a name unique per connection) and the sender maps
// by the name the receiver sent it over the channel's TCP connection. Both sides unlink the name
// as soon as the sender has mapped it, so nothing stays in /dev/shm once the pair is set up,
// whichever process dies later (kill -9 included); the receiver also unlinks it when the
// connection closes before the sender mapped it.
//
// Layout: one 4 KiB page of header {magic, nonce, data bytes}, then the data area. Frames go
// into the data area as a byte stream at increasing absolute positions (offset = position mod
// data bytes); the doorbell/release messages on the TCP connection move the two ends.
#include <cstddef>
#include <cstdint>
#include <string>

namespace tandem::transport {

class shm_ring {
 public:
  static constexpr uint64_t magic = 0x676e6972766b7464ull;  // "dtkvring"
  static constexpr size_t header_bytes = 4096;

  shm_ring() = default;
  // Receiver: creates and maps a new ring of `data_bytes`; throws failure(io_error).
  static shm_ring create(size_t data_bytes);
  // Sender: maps the ring `name`, checks its size and nonce (so it mapped the object the
  // receiver made), then unlinks the name; throws failure(io_error) or failure(unsupported).
  static shm_ring open(const std::string& name, size_t data_bytes, uint64_t nonce);
  ~shm_ring();
  shm_ring(shm_ring&& o) noexcept;
  shm_ring& operator=(shm_ring&& o) noexcept;
  shm_ring(const shm_ring&) = delete;
  shm_ring& operator=(const shm_ring&) = delete;

  bool mapped() const { return base_ != nullptr; }
  char* data() const { return base_ + header_bytes; }
  size_t size() const { return data_bytes_; }
  const std::string& name() const { return name_; }
  uint64_t nonce() const { return nonce_; }
  // Removes the name from /dev/shm (idempotent; the mapping stays).
  void unlink();

  // Names this process's rings start with: "/tandem-kv-<pid>-" (tests look for leftovers).
  static std::string name_prefix();
  static std::string name_prefix(long pid);

 private:
  void reset();
  char* base_ = nullptr;
  size_t data_bytes_ = 0;
  std::string name_;
  uint64_t nonce_ = 0;
  bool linked_ = false;
};

}  // namespace tandem::transport
