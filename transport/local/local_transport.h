#pragma once
// In-process transport: engines in one process exchange KV blocks by memcpy between registered
// regions. Copies run on the caller's thread inside submit(); poll() reports the result. It is
// the reference the other transports are tested against.
#include "transport/synchronous_transport.h"

namespace tandem::transport {

class local_transport final : public synchronous_transport {
 public:
  std::string kind() const override { return "local"; }

 private:
  status copy(std::byte* dst, const std::byte* src, uint64_t n) override;
};

}  // namespace tandem::transport
