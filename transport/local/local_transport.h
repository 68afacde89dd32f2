#pragma once
// In-process transport: engines in one process exchange KV blocks by memcpy between registered
// regions. Copies run on the caller's thread inside submit(); poll() reports the result. It is
// the reference the other transports are tested against.
#include <map>
#include <mutex>

#include "transport/transport.h"

namespace tandem::transport {

class local_transport final : public kv_transport {
 public:
  std::string kind() const override { return "local"; }
  region_id register_memory(void* base, size_t size) override;
  status unregister_memory(region_id r) override;
  transfer_id submit(std::vector<copy_op> ops) override;
  transfer_status poll(transfer_id t) override;

 private:
  struct region {
    std::byte* base;
    size_t size;
  };
  status check(const copy_op& op) const;

  std::mutex mu_;
  std::map<region_id, region> regions_;
  std::map<transfer_id, transfer_status> finished_;
  region_id next_region_ = 1;
  transfer_id next_transfer_ = 1;
};

}  // namespace tandem::transport
