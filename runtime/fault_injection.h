#pragma once
// Faults a tester arms and the parts that can suffer them consume: KV links (corrupt a block
// in flight, drop a streamed piece, hold a message back, block), decode workers (a block
// allocation fails), workers (the next compute step stalls). One instance per pipeline, shared by its actors; each armed fault
// is taken once by whichever actor meets it first. Kills are not here: they are messages.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <string>

namespace tandem {

enum class fault_kind : uint8_t {
  corrupt_kv,    // a KV block lands with one value changed: the import checksum must catch it
  drop_kv,       // a streamed KV piece is lost: the decode side finds the set incomplete
  fail_alloc,    // a decode worker's block reservation fails as if its pool were full
  stall,         // a worker's next compute step hangs (alive, not progressing) for a while
  delay_kv,      // a KV transfer or piece is held back for the stall duration, then delivered
  stall_link,    // a KV link blocks (stops answering) for the stall duration
};

class fault_injector {
 public:
  void arm(fault_kind k, int count) { slot(k).fetch_add(std::max(0, count)); }
  // Takes one armed fault of this kind; false when none is armed.
  bool take(fault_kind k) {
    auto& s = slot(k);
    int n = s.load();
    while (n > 0)
      if (s.compare_exchange_weak(n, n - 1)) return true;
    return false;
  }
  int armed(fault_kind k) const { return const_cast<fault_injector*>(this)->slot(k).load(); }
  // How long a stalled step (or link) hangs, and how long a delayed KV message is held.
  void set_stall(std::chrono::milliseconds d) { stall_ms_ = d.count(); }
  std::chrono::milliseconds stall_duration() const { return std::chrono::milliseconds(stall_ms_.load()); }

 private:
  std::atomic<int>& slot(fault_kind k) { return slots_[static_cast<size_t>(k)]; }
  std::atomic<int> slots_[6] = {0, 0, 0, 0, 0, 0};
  std::atomic<int64_t> stall_ms_{5000};
};

inline bool parse_fault_kind(const std::string& s, fault_kind& out) {
  if (s == "corrupt_kv") out = fault_kind::corrupt_kv;
  else if (s == "drop_kv") out = fault_kind::drop_kv;
  else if (s == "fail_alloc") out = fault_kind::fail_alloc;
  else if (s == "stall") out = fault_kind::stall;
  else if (s == "delay_kv") out = fault_kind::delay_kv;
  else if (s == "stall_link") out = fault_kind::stall_link;
  else return false;
  return true;
}

}  // namespace tandem
