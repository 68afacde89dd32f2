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

status shm_transport::copy(std::byte* dst, const std::byte* src, uint64_t n) {
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

}  // namespace tandem::transport
