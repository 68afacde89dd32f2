#pragma once
// The host's KV store actor: runtime/kv/kv_store.h behind messages. Prefill workers publish the
// full blocks of each prompt they compute, decode workers those of each answer; prefill and
// colocated workers fetch the blocks a prompt starts with before computing it, so a prefix
// computed once anywhere in the process is computed nowhere else. It is supervised apart from
// the router: when it dies a fresh, empty one replaces it, and until then (and for whatever it
// does not hold) requests compute their prompts themselves.
#include <memory>
#include <mutex>

#include "actors/protocol.h"
#include "actors/supervisor.h"
#include "runtime/kv/kv_store.h"

namespace tandem {

struct kv_store_state {
  std::unique_ptr<kv_block_store> store;
  std::shared_ptr<metrics::registry> metrics;
  kv_store_stats reported;  // counters as last exported
  static inline const char* name = "kv_store";
};

kv_store_actor::behavior_type kv_store_behavior(kv_store_actor::stateful_pointer<kv_store_state> self,
                                                kv_store_options opts, std::shared_ptr<metrics::registry> metrics);

// Which store is current (workers look it up for each use: a restarted store is a new actor).
class kv_store_directory {
 public:
  kv_store_actor get() const {
    std::lock_guard<std::mutex> lk(mu_);
    return current_;
  }
  void set(kv_store_actor s) {
    std::lock_guard<std::mutex> lk(mu_);
    current_ = std::move(s);
  }

 private:
  mutable std::mutex mu_;
  kv_store_actor current_;
};

// Spawns the host store under a supervisor of its own (a pool of one: a dead store is replaced
// by a fresh, empty one, within the restart intensity and backoff of `pool`; its kind and size
// are set here) and keeps `dir` pointing at the current one. Returns the supervisor.
caf::actor spawn_kv_store_pool(caf::actor_system& sys, const kv_store_options& opts,
                               std::shared_ptr<kv_store_directory> dir, pool_options pool);

}  // namespace tandem
