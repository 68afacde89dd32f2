#include "tools/hub/download.h"

#include <fmt/format.h>
#include <openssl/evp.h>
#include <spdlog/spdlog.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <memory>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/errors.h"
#include "tools/hub/progress.h"

namespace tandem::hub {
namespace {

class sha256 {
 public:
  sha256() { reset(); }
  void reset() {
    if (!EVP_DigestInit_ex(ctx_.get(), EVP_sha256(), nullptr)) throw failure(errc::internal, "OpenSSL: no SHA-256");
  }
  void update(const void* p, size_t n) { EVP_DigestUpdate(ctx_.get(), p, n); }
  std::string hex() {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    EVP_DigestFinal_ex(ctx_.get(), md, &n);
    std::string out;
    for (unsigned i = 0; i < n; ++i) out += fmt::format("{:02x}", md[i]);
    return out;
  }

 private:
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx_{EVP_MD_CTX_new(), &EVP_MD_CTX_free};
};

// A file-size limit (`ulimit -f`) kills a process with SIGXFSZ by default; ignored, it becomes
// EFBIG from write(), reported like a full disk, with the partial file kept for a later resume.
struct ignore_sigxfsz {
  ignore_sigxfsz() { old = std::signal(SIGXFSZ, SIG_IGN); }
  ~ignore_sigxfsz() { std::signal(SIGXFSZ, old); }
  void (*old)(int);
};

// The .part file, appended to and hashed as it grows.
class part_file {
 public:
  explicit part_file(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) throw failure(errc::io_error, "cannot open '" + path + "': " + std::strerror(errno));
    // Two pulls of one file would interleave their bytes.
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0)
      throw failure(errc::io_error, "'" + path + "' is being downloaded by another process");
  }
  ~part_file() {
    if (fd_ >= 0) ::close(fd_);
  }
  // Hashes what an earlier run left (the hash covers the whole file, not this run's part).
  uint64_t resume(uint64_t limit) {
    struct stat st {};
    ::fstat(fd_, &st);
    if (uint64_t(st.st_size) > limit) truncate();
    std::vector<char> buf(1 << 20);
    have_ = 0;
    ::lseek(fd_, 0, SEEK_SET);
    for (ssize_t n; (n = ::read(fd_, buf.data(), buf.size())) > 0;) {
      hash_.update(buf.data(), size_t(n));
      have_ += uint64_t(n);
    }
    return have_;
  }
  void truncate() {
    if (::ftruncate(fd_, 0) != 0)
      throw failure(errc::io_error, "cannot truncate '" + path_ + "': " + std::strerror(errno));
    ::lseek(fd_, 0, SEEK_SET);
    hash_.reset();
    have_ = 0;
  }
  void append(const char* p, size_t n) {
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        const int e = w < 0 ? errno : ENOSPC;
        throw failure(errc::io_error, "cannot write '" + path_ + "': " + std::strerror(e) + " (" +
                                          std::to_string(have_) +
                                          " bytes are kept there; run the command again to resume)");
      }
      hash_.update(p, size_t(w));  // only what reached the file: it and the hash stay in step
      have_ += uint64_t(w);
      p += w;
      n -= size_t(w);
    }
  }
  void sync_and_close() {
    if (::fsync(fd_) != 0) throw failure(errc::io_error, "cannot write '" + path_ + "': " + std::strerror(errno));
    ::close(fd_);
    fd_ = -1;
  }
  uint64_t have() const { return have_; }
  std::string hex() { return hash_.hex(); }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t have_ = 0;
  sha256 hash_;
};

bool is_sha256(const std::string& s) {
  return s.size() == 64 && s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

// The hub's X-Linked-Etag (on its redirect) is the LFS file's sha256, quoted.
std::string linked_sha256(const get_result& r) {
  for (const auto& h : r.chain) {
    std::string e = h.field("x-linked-etag");
    if (e.rfind("W/", 0) == 0) e.erase(0, 2);
    if (e.size() >= 2 && e.front() == '"' && e.back() == '"') e = e.substr(1, e.size() - 2);
    if (is_sha256(e)) return e;
  }
  return "";
}

[[noreturn]] void reject(part_file& part, const download_request& r, const std::string& why) {
  part.sync_and_close();
  const std::string bad = r.dest + ".bad";
  std::error_code ec;
  std::filesystem::rename(r.dest + ".part", bad, ec);
  throw failure(errc::checksum_mismatch, r.label + ": " + why + "; the download is kept aside as '" + bad +
                                             "' and will not be used (run the command again to download it anew)");
}

}  // namespace

std::string download(const download_request& r) {
  std::string expected = r.sha256;
  std::string linked;  // X-Linked-Etag's sha256, checked too when the hub gives it
  part_file part(r.dest + ".part");
  ignore_sigxfsz sig;
  uint64_t have = part.resume(r.size);
  if (have > 0 && have < r.size) spdlog::info("{}: resuming at {} of {} bytes", r.label, have, r.size);
  progress bar(r.label, r.size, have);
  for (int attempt = 0; part.have() < r.size; ++attempt) {
    get_options o = r.http;
    if (part.have() > 0) o.fields["Range"] = fmt::format("bytes={}-", part.have());
    const uint64_t before = part.have();
    try {
      const auto on_head = [&](const get_result& g) {
        if (const std::string l = linked_sha256(g); !l.empty()) linked = l;
        if (g.head.status == 200 && part.have() > 0) {
          spdlog::info("{}: the server sends the whole file again; restarting", r.label);
          part.truncate();
        } else if (g.head.status == 206) {
          const std::string range = g.head.field("content-range");
          if (range.rfind(fmt::format("bytes {}-", part.have()), 0) != 0) {
            part.truncate();  // not where we asked: the next attempt starts from the beginning
            throw transfer_error("unexpected Content-Range '" + range + "'");
          }
        }
      };
      const auto sink = [&](const char* p, size_t n) {
        if (part.have() + n > r.size)
          reject(part, r, fmt::format("the server sent more than the {} bytes the hub lists", r.size));
        part.append(p, n);
        bar.update(part.have());
      };
      const get_result g = get(r.url, o, sink, on_head);
      const int st = g.head.status;
      if (st == 416) {  // our partial file is not a prefix the server knows: start over
        part.truncate();
        continue;
      }
      if (st == 429 || st >= 500) throw transfer_error(fmt::format("the server answered {}", st));
      if (st < 200 || st >= 300) throw status_error(st, fmt::format("{} answered {}", g.head.url, st));
      if (part.have() < r.size) throw transfer_error("the transfer ended early");
    } catch (const transfer_error& e) {
      if (part.have() > before) attempt = 0;  // progress: the retry budget is for failures in a row
      if (attempt >= r.retries) {
        bar.finish();
        throw failure(errc::io_error, fmt::format("{}: download failed after {} tries: {} ({} of {} bytes are kept "
                                                  "in '{}.part'; run the command again to resume)",
                                                  r.label, attempt + 1, e.what(), part.have(), r.size, r.dest));
      }
      const auto wait = std::chrono::milliseconds(std::min(8000, 500 << std::min(attempt, 4)));
      spdlog::warn("{}: {}; retrying from byte {} in {:.1f} s", r.label, e.what(), part.have(), wait.count() / 1000.0);
      std::this_thread::sleep_for(wait);
    }
  }
  bar.finish();
  const std::string got = part.hex();
  if (expected.empty() && linked.empty())
    spdlog::warn("{}: the hub gives no sha256 for this file; only its size was checked", r.label);
  if (!expected.empty() && got != expected) reject(part, r, "sha256 " + got + " does not match the hub's " + expected);
  if (!linked.empty() && got != linked)
    reject(part, r, "sha256 " + got + " does not match the hub's X-Linked-Etag " + linked);
  part.sync_and_close();
  std::error_code ec;
  std::filesystem::rename(r.dest + ".part", r.dest, ec);
  if (ec) throw failure(errc::io_error, "cannot rename '" + r.dest + ".part': " + ec.message());
  return got;
}

}  // namespace tandem::hub
