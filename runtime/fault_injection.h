#pragma once
// Faults a tester arms and the parts that can suffer them meet: KV links (corrupt a block in
// flight, drop a streamed piece, hold a message back, block), decode workers (a block
// reservation fails), workers (the next compute step stalls). Kills are not here: they are
// messages.
//
// One seam: production code asks a fault_hooks at each point where a fault can strike and
// does what it answers; no_faults() answers "nothing happens" everywhere, so there is no
// null check and no fault logic at the call sites. fault_injector answers from armed counts
// (one instance per pipeline, shared by its actors; each armed fault is taken once by
// whichever actor meets it first); a test can put any other fault_hooks in its place.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <string>

#include "runtime/kv/kv_cache.h"
#include "runtime/metrics.h"

namespace tandem {

enum class fault_kind : uint8_t {
  corrupt_kv,  // a KV block lands with one value changed: the import checksum must catch it
  drop_kv,  // a streamed KV piece is lost: the decode side finds the set incomplete
  fail_alloc,  // a decode worker's block reservation fails as if its pool were full
  stall,  // a worker's next compute step hangs (alive, not progressing) for a while
  delay_kv,  // a KV transfer or piece is held back for the stall duration, then delivered
  stall_link,  // a KV link blocks (stops answering) for the stall duration
};

inline const char* to_string(fault_kind k) {
  switch (k) {
    case fault_kind::corrupt_kv: return "corrupt_kv";
    case fault_kind::drop_kv: return "drop_kv";
    case fault_kind::fail_alloc: return "fail_alloc";
    case fault_kind::stall: return "stall";
    case fault_kind::delay_kv: return "delay_kv";
    case fault_kind::stall_link: return "stall_link";
  }
  return "?";
}

class fault_hooks {
 public:
  using blocks = std::shared_ptr<const std::vector<kv_block_export>>;
  virtual ~fault_hooks() = default;
  // A worker: how long its next compute step hangs (alive, not progressing) before it
  // computes; 0: it does not.
  virtual std::chrono::milliseconds step_stall() { return {}; }
  // A decode worker: this reservation is refused as if its pool were full.
  virtual bool refuse_reservation() { return false; }
  // A KV link: the blocks as they land on the other side (a damaged copy, never the sender's
  // own set, when corrupted in flight).
  virtual blocks land(blocks kv) { return kv; }
  // A KV link: this streamed piece (or a channel's last frame) is lost in flight.
  virtual bool lose_piece() { return false; }
  // A KV link: how long a landed transfer or piece is held back before it is delivered; 0: not.
  virtual std::chrono::milliseconds hold_back() { return {}; }
  // A KV link: how long it blocks (and the thread it runs on), answering nothing; 0: not.
  virtual std::chrono::milliseconds block_link() { return {}; }
};

// The hooks that never inject anything (shared; the default of every option that holds hooks).
std::shared_ptr<fault_hooks> no_faults();

// A copy of the set with one value changed (what corrupt_kv delivers).
fault_hooks::blocks damaged_copy(const fault_hooks::blocks& kv);

class fault_injector : public fault_hooks {
 public:
  // Faults taken are counted here: tandem_faults_injected_total{kind}.
  explicit fault_injector(std::shared_ptr<metrics::registry> metrics = nullptr) : metrics_(std::move(metrics)) {}
  void arm(fault_kind k, int count) { slot(k).fetch_add(std::max(0, count)); }
  // Takes one armed fault of this kind; false when none is armed.
  bool take(fault_kind k) {
    auto& s = slot(k);
    int n = s.load();
    while (n > 0)
      if (s.compare_exchange_weak(n, n - 1)) {
        if (metrics_)
          metrics_->get_counter("tandem_faults_injected_total", "Faults injected by kind", {{"kind", to_string(k)}})
              .inc();
        return true;
      }
    return false;
  }
  int armed(fault_kind k) const { return const_cast<fault_injector*>(this)->slot(k).load(); }
  // How long a stalled step (or link) hangs, and how long a delayed KV message is held.
  void set_stall(std::chrono::milliseconds d) { stall_ms_ = d.count(); }
  std::chrono::milliseconds stall_duration() const { return std::chrono::milliseconds(stall_ms_.load()); }

  std::chrono::milliseconds step_stall() override { return take(fault_kind::stall) ? stall_duration() : zero(); }
  bool refuse_reservation() override { return take(fault_kind::fail_alloc); }
  blocks land(blocks kv) override { return kv && take(fault_kind::corrupt_kv) ? damaged_copy(kv) : kv; }
  bool lose_piece() override { return take(fault_kind::drop_kv); }
  std::chrono::milliseconds hold_back() override { return take(fault_kind::delay_kv) ? stall_duration() : zero(); }
  std::chrono::milliseconds block_link() override { return take(fault_kind::stall_link) ? stall_duration() : zero(); }

 private:
  static constexpr std::chrono::milliseconds zero() { return std::chrono::milliseconds(0); }
  std::atomic<int>& slot(fault_kind k) { return slots_[static_cast<size_t>(k)]; }
  std::atomic<int> slots_[6] = {0, 0, 0, 0, 0, 0};
  std::atomic<int64_t> stall_ms_{5000};
  std::shared_ptr<metrics::registry> metrics_;
};

inline bool parse_fault_kind(const std::string& s, fault_kind& out) {
  for (auto k : {fault_kind::corrupt_kv, fault_kind::drop_kv, fault_kind::fail_alloc, fault_kind::stall,
                 fault_kind::delay_kv, fault_kind::stall_link})
    if (s == to_string(k)) {
      out = k;
      return true;
    }
  return false;
}

}  // namespace tandem
