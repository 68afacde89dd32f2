#include "transport/local/local_transport.h"

#include <cstring>

namespace tandem::transport {

status local_transport::copy(std::byte* dst, const std::byte* src, uint64_t n) {
  std::memmove(dst, src, n);
  return {};
}

}  // namespace tandem::transport
