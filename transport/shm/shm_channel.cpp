// The shared-memory ring of a KV channel (see shm_channel.h).
#include "transport/shm/shm_channel.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>
#include <utility>

#include "runtime/errors.h"

namespace tandem::transport {
namespace {

struct ring_header {
  uint64_t magic;
  uint64_t nonce;
  uint64_t data_bytes;
};

std::string errno_text() { return std::strerror(errno); }

uint64_t random_u64() {
  static std::atomic<uint64_t> counter{0};
  std::random_device rd;
  return (uint64_t(rd()) << 32 ^ rd()) + counter.fetch_add(0x9e3779b97f4a7c15ull);
}

}  // namespace

std::string shm_ring::name_prefix(long pid) { return "/tandem-kv-" + std::to_string(pid) + "-"; }
std::string shm_ring::name_prefix() { return name_prefix(long(::getpid())); }

shm_ring shm_ring::create(size_t data_bytes) {
  static std::atomic<uint64_t> next{0};
  if (data_bytes < 4096 || data_bytes > (64ull << 30))
    throw failure(errc::invalid_argument,
                  "shared-memory ring of " + std::to_string(data_bytes) + " bytes: outside 4 KiB..64 GiB");
  shm_ring r;
  r.nonce_ = random_u64();
  char suffix[32];
  std::snprintf(suffix, sizeof suffix, "%llu-%08x", static_cast<unsigned long long>(next.fetch_add(1)),
                unsigned(r.nonce_));
  r.name_ = name_prefix() + suffix;
  const int fd = ::shm_open(r.name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) throw failure(errc::io_error, "shm_open(" + r.name_ + "): " + errno_text());
  r.linked_ = true;
  const size_t total = header_bytes + data_bytes;
  if (::ftruncate(fd, off_t(total)) != 0) {
    const auto e = errno_text();
    ::close(fd);
    ::shm_unlink(r.name_.c_str());
    throw failure(errc::io_error, "ftruncate(" + r.name_ + "): " + e);
  }
  // Reserved now: on a small /dev/shm (containers often give 64 MiB) a sparse ring would fail
  // later with SIGBUS on a write; this way it fails here, and the connection uses TCP.
  if (const int rc = ::posix_fallocate(fd, 0, off_t(total)); rc != 0) {
    ::close(fd);
    ::shm_unlink(r.name_.c_str());
    throw failure(errc::io_error, "reserving " + std::to_string(total) + " bytes of shared memory for " + r.name_ +
                                      ": " + std::strerror(rc));
  }
  void* p = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) {
    const auto e = errno_text();
    ::shm_unlink(r.name_.c_str());
    throw failure(errc::io_error, "mmap(" + r.name_ + "): " + e);
  }
  r.base_ = static_cast<char*>(p);
  r.data_bytes_ = data_bytes;
  const ring_header h{magic, r.nonce_, data_bytes};
  std::memcpy(r.base_, &h, sizeof h);
  return r;
}

shm_ring shm_ring::open(const std::string& name, size_t data_bytes, uint64_t nonce) {
  if (name.empty() || name[0] != '/' || name.find('/', 1) != std::string::npos || name.size() > 200)
    throw failure(errc::invalid_argument, "bad shared-memory ring name '" + name + "'");
  if (data_bytes < 4096 || data_bytes > (64ull << 30))
    throw failure(errc::invalid_argument, "shared-memory ring of " + std::to_string(data_bytes) + " bytes");
  shm_ring r;
  const int fd = ::shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) throw failure(errc::unsupported, "cannot open the receiver's ring " + name + ": " + errno_text());
  ::shm_unlink(name.c_str());  // both ends have it now (or the receiver is gone): leave nothing behind
  const size_t total = header_bytes + data_bytes;
  struct stat st {};
  if (::fstat(fd, &st) != 0 || uint64_t(st.st_size) != total) {
    ::close(fd);
    throw failure(errc::unsupported, "ring " + name + " has the wrong size");
  }
  void* p = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) throw failure(errc::io_error, "mmap(" + name + "): " + errno_text());
  r.base_ = static_cast<char*>(p);
  r.data_bytes_ = data_bytes;
  r.name_ = name;
  r.nonce_ = nonce;
  ring_header h{};
  std::memcpy(&h, r.base_, sizeof h);
  if (h.magic != magic || h.nonce != nonce || h.data_bytes != data_bytes)
    throw failure(errc::unsupported, "ring " + name + " is not the one the receiver announced");
  return r;
}

void shm_ring::unlink() {
  if (linked_) ::shm_unlink(name_.c_str());
  linked_ = false;
}

void shm_ring::reset() {
  unlink();
  if (base_) ::munmap(base_, header_bytes + data_bytes_);
  base_ = nullptr;
  data_bytes_ = 0;
}

shm_ring::~shm_ring() { reset(); }

shm_ring::shm_ring(shm_ring&& o) noexcept { *this = std::move(o); }

shm_ring& shm_ring::operator=(shm_ring&& o) noexcept {
  if (this != &o) {
    reset();
    base_ = std::exchange(o.base_, nullptr);
    data_bytes_ = std::exchange(o.data_bytes_, 0);
    name_ = std::move(o.name_);
    nonce_ = o.nonce_;
    linked_ = std::exchange(o.linked_, false);
  }
  return *this;
}

}  // namespace tandem::transport
