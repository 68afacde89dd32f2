#pragma once
// What a transport that moves every byte inside submit() shares (local/ and shm/): the region
// table, the validation of a batch before any byte moves, and the finished transfers that poll()
// hands out once. A kind supplies only how one range moves (copy).
#include <cstddef>
#include <map>
#include <mutex>

#include "transport/transport.h"

namespace tandem::transport {

class synchronous_transport : public kv_transport {
 public:
  region_id register_memory(void* base, size_t size) final;
  status unregister_memory(region_id r) final;
  transfer_id submit(std::vector<copy_op> ops) final;
  transfer_status poll(transfer_id t) final;

 protected:
  // Moves n bytes from src to dst, both inside registered regions; called under the lock.
  virtual status copy(std::byte* dst, const std::byte* src, uint64_t n) = 0;

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
