#include "transport/shm/shm_transport.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>

#include <atomic>
#include <cerrno>
#include <cstring>

namespace tandem::transport {
namespace {
std::atomic<uint64_t> arena_counter{0};
}

shm_transport::shm_transport(size_t arena_bytes) : size_(arena_bytes) {
  if (size_ < sizeof(shm_slot_header) + 4096)
    throw failure(errc::invalid_argument, "shared-memory arena must hold a header and at least 4 KiB");
  name_ = "/tandem-" + std::to_string(::getpid()) + "-" + std::to_string(arena_counter++);
  const int fd = ::shm_open(name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) throw failure(errc::io_error, "shm_open(" + name_ + "): " + std::strerror(errno));
  if (::ftruncate(fd, off_t(size_)) != 0) {
    const int e = errno;
    ::close(fd);
    ::shm_unlink(name_.c_str());
    throw failure(errc::io_error, "sizing shared memory " + name_ + ": " + std::strerror(e));
  }
  void* p = ::mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) {
    const int e = errno;
    ::shm_unlink(name_.c_str());
    throw failure(errc::io_error, "mapping shared memory " + name_ + ": " + std::strerror(e));
  }
  arena_ = static_cast<std::byte*>(p);
  // Both ends of this link live in this process and hold the mapping, so the name is not
  // needed past this point: unlinked now, a kill -9 leaves nothing in /dev/shm (issue 22).
  ::shm_unlink(name_.c_str());
}

shm_transport::~shm_transport() {
  if (arena_) ::munmap(arena_, size_);
}

region_id shm_transport::register_memory(void* base, size_t size) {
  std::lock_guard<std::mutex> lk(mu_);
  const region_id id = next_region_++;
  regions_.emplace(id, region{static_cast<std::byte*>(base), size});
  return id;
}

status shm_transport::unregister_memory(region_id r) {
  std::lock_guard<std::mutex> lk(mu_);
  if (regions_.erase(r) == 0) return {errc::invalid_argument, "region " + std::to_string(r) + " is not registered"};
  return {};
}

status shm_transport::check(const copy_op& op) const {
  for (auto [id, off] : {std::pair{op.src, op.src_offset}, std::pair{op.dst, op.dst_offset}}) {
    auto it = regions_.find(id);
    if (it == regions_.end()) return {errc::invalid_argument, "region " + std::to_string(id) + " is not registered"};
    if (off > it->second.size || op.size > it->second.size - off)
      return {errc::invalid_argument, "copy of " + std::to_string(op.size) + " bytes at offset " + std::to_string(off) +
                                          " overruns region " + std::to_string(id)};
  }
  return {};
}

// Sender half writes a slot, receiver half validates and reads it; slot by slot.
status shm_transport::move_through_arena(std::byte* dst, const std::byte* src, uint64_t n) {
  const uint64_t cap = size_ - sizeof(shm_slot_header);
  for (uint64_t done = 0; done < n;) {
    const uint64_t len = std::min(cap, n - done);
    shm_slot_header h{shm_slot_magic, ++sequence_, len, XXH3_64bits(src + done, len)};
    std::memcpy(arena_ + sizeof(h), src + done, len);
    std::memcpy(arena_, &h, sizeof(h));
    // Receiver: trusts nothing it did not check.
    shm_slot_header r;
    std::memcpy(&r, arena_, sizeof(r));
    if (r.magic != shm_slot_magic || r.sequence != sequence_ || r.size != len)
      return {errc::io_error, "shared-memory slot header is inconsistent"};
    if (XXH3_64bits(arena_ + sizeof(r), r.size) != r.checksum)
      return {errc::checksum_mismatch, "shared-memory slot payload fails its checksum"};
    std::memcpy(dst + done, arena_ + sizeof(r), r.size);
    done += len;
  }
  return {};
}

transfer_id shm_transport::submit(std::vector<copy_op> ops) {
  std::lock_guard<std::mutex> lk(mu_);
  const transfer_id id = next_transfer_++;
  transfer_status st;
  for (const auto& op : ops) {
    if (status s = check(op); !s.ok()) {
      st.state = transfer_state::failed;
      st.error = s;
      finished_.emplace(id, st);
      return id;
    }
  }
  for (const auto& op : ops) {
    status s = move_through_arena(regions_.at(op.dst).base + op.dst_offset, regions_.at(op.src).base + op.src_offset,
                                  op.size);
    if (!s.ok()) {
      st.state = transfer_state::failed;
      st.error = s;
      finished_.emplace(id, st);
      return id;
    }
    st.bytes_moved += op.size;
  }
  st.state = transfer_state::done;
  finished_.emplace(id, st);
  return id;
}

transfer_status shm_transport::poll(transfer_id t) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = finished_.find(t);
  if (it == finished_.end()) {
    transfer_status st;
    st.state = transfer_state::failed;
    st.error = {errc::unknown_sequence, "transfer " + std::to_string(t) + " is unknown (or already polled)"};
    return st;
  }
  transfer_status st = it->second;
  finished_.erase(it);
  return st;
}

}  // namespace tandem::transport
