#pragma once
// tandem's one error vocabulary. Every failure the runtime reports carries one of these codes;
// actors convert them to caf::error (actors/error.h) so they cross message boundaries intact.
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace tandem {

enum class errc : uint8_t {
  ok = 0,
  invalid_argument,  // a caller passed a value outside the documented range (bad flag, bad sampling param)
  io_error,  // a file could not be opened, mapped, read or written
  malformed_file,  // a model file breaks the GGUF format: bad magic, truncation, offsets out of bounds
  unsupported,  // well-formed but not something tandem handles: GGUF version, tensor type, architecture
  missing_key,  // a metadata key or tensor the architecture requires is absent
  out_of_kv_blocks,  // the KV block pool has no free block left; the caller may retry after freeing
  unknown_sequence,  // a sequence id that this engine does not hold (never created, or already freed)
  context_overflow,  // a sequence would grow past the model's context length
  checksum_mismatch,  // an imported KV block's payload does not match its checksum: refused
  incompatible_kv,  // an imported KV block does not fit this engine (shape, dtype, model, positions)
  overloaded,  // admission control refused a request (queue bound or latency budget); retry later
  worker_failed,  // the worker computing a request died; the request could not continue
  shutting_down,  // the server is stopping and takes no new work
  timeout,  // an answer did not come in time (a stuck or unreachable actor)
  refused,  // a worker declined work it may take later or another may take (no credits, batch full)
  internal,  // a failure of the actor system itself (a message it could not deliver or decode)
};

// Stable, lowercase names used in logs, JSON errors and caf::error rendering.
constexpr std::string_view to_string(errc e) {
  switch (e) {
    case errc::ok: return "ok";
    case errc::invalid_argument: return "invalid_argument";
    case errc::io_error: return "io_error";
    case errc::malformed_file: return "malformed_file";
    case errc::unsupported: return "unsupported";
    case errc::missing_key: return "missing_key";
    case errc::out_of_kv_blocks: return "out_of_kv_blocks";
    case errc::unknown_sequence: return "unknown_sequence";
    case errc::context_overflow: return "context_overflow";
    case errc::checksum_mismatch: return "checksum_mismatch";
    case errc::incompatible_kv: return "incompatible_kv";
    case errc::overloaded: return "overloaded";
    case errc::worker_failed: return "worker_failed";
    case errc::shutting_down: return "shutting_down";
    case errc::timeout: return "timeout";
    case errc::refused: return "refused";
    case errc::internal: return "internal";
  }
  return "unknown";
}

// Returned by operations whose failure is part of normal operation (out of blocks, bad import).
class status {
 public:
  status() = default;
  status(errc code, std::string message) : code_(code), message_(std::move(message)) {}
  static status success() { return {}; }
  bool ok() const { return code_ == errc::ok; }
  explicit operator bool() const { return ok(); }
  errc code() const { return code_; }
  const std::string& message() const { return message_; }
  std::string to_string() const { return ok() ? "ok" : std::string(tandem::to_string(code_)) + ": " + message_; }

 private:
  errc code_ = errc::ok;
  std::string message_;
};

// Thrown where failure ends the operation outright (loading a model, parsing a file).
class failure : public std::runtime_error {
 public:
  failure(errc code, const std::string& message) : std::runtime_error(message), code_(code) {}
  errc code() const { return code_; }
  status to_status() const { return {code_, what()}; }

 private:
  errc code_;
};

}  // namespace tandem
