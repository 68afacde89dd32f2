#pragma once
// The KV data path: one interface, one folder per kind: local/ (in-process memcpy, the reference),
// shm/ (a shared-memory arena); tcp/ and shm/shm_channel carry KV blocks between processes
// (channel.h). A device kind (CUDA IPC, NCCL, UCX) would be one more folder. As in Mooncake's transfer engine, a
// transport only moves bytes between memory regions registered with it: register memory, submit a batch of copies, poll
// for completion.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/errors.h"

namespace tandem::transport {

using region_id = uint64_t;
using transfer_id = uint64_t;

// One copy of `size` bytes from a source region to a destination region.
struct copy_op {
  region_id src = 0;
  uint64_t src_offset = 0;
  region_id dst = 0;
  uint64_t dst_offset = 0;
  uint64_t size = 0;
};

enum class transfer_state : uint8_t {
  pending,  // submitted, not finished
  done,  // every copy of the batch landed
  failed,  // at least one copy failed; the status says why; landed bytes are unspecified
};

constexpr const char* to_string(transfer_state s) {
  switch (s) {
    case transfer_state::pending: return "pending";
    case transfer_state::done: return "done";
    case transfer_state::failed: return "failed";
  }
  return "?";
}

struct transfer_status {
  transfer_state state = transfer_state::pending;
  status error;  // set when failed
  uint64_t bytes_moved = 0;  // of the whole batch, when done
};

class kv_transport {
 public:
  virtual ~kv_transport() = default;
  virtual std::string kind() const = 0;

  // Makes [base, base + size) visible to the transport. The memory must outlive the
  // registration; returns the region's id.
  virtual region_id register_memory(void* base, size_t size) = 0;
  // Removes a region; transfers submitted later that name it fail with invalid_argument.
  virtual status unregister_memory(region_id r) = 0;

  // Starts a batch of copies. Invalid ops (unknown region, out-of-bounds range) are reported
  // through poll() as a failed transfer, never by touching memory outside a region.
  virtual transfer_id submit(std::vector<copy_op> ops) = 0;
  // The state of a transfer; a finished transfer is forgotten after it has been polled once.
  // An unknown id gives failed with unknown_sequence.
  virtual transfer_status poll(transfer_id t) = 0;
};

}  // namespace tandem::transport
