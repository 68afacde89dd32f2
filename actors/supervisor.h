#pragma once
// Supervision: a pool supervisor restarts the workers of one pool one-for-one, as Erlang/OTP
// does, up to a restart intensity (max restarts per window); past it the pool is marked
// degraded and its dead workers stay down for a backoff (runtime/scheduler/restart_intensity),
// after which it starts every dead worker again and the pool recovers by itself. Killing the
// supervisor kills its workers.
#include <chrono>
#include <functional>
#include <map>
#include <string>

#include <caf/all.hpp>

#include "actors/protocol.h"
#include "runtime/kinds.h"
#include "runtime/metrics.h"
#include "runtime/scheduler/restart_intensity.h"

namespace tandem {

using degraded_atom = caf::atom_constant<caf::atom("degraded")>;

struct pool_options {
  actor_kind kind = actor_kind::prefill;  // what it supervises: one kind of worker, or the KV store
  int32_t size = 1;
  int32_t max_restarts = 5;  // within `window`
  std::chrono::milliseconds window{10000};
  std::shared_ptr<metrics::registry> metrics;
  // Degraded, the pool starts its workers again after this (doubling while it keeps failing,
  // up to recover_after_max). 0: never (a node process exits instead, for its own supervisor).
  std::chrono::milliseconds recover_after{30000};
  std::chrono::milliseconds recover_after_max{300000};
};

// Spawns worker `index` as a monitored child of `self` and announces it (to the router).
using worker_spawner = std::function<caf::actor(caf::event_based_actor* self, int32_t index)>;

struct pool_supervisor_state {
  pool_options opts;
  worker_spawner spawn;
  // Shared with the exit hook, which runs after the state is gone.
  std::shared_ptr<std::map<int32_t, caf::actor>> children = std::make_shared<std::map<int32_t, caf::actor>>();
  restart_intensity intensity;
  static inline const char* name = "pool_supervisor";
};

// A pool's health as operators see it, the same for worker pools, the KV store and the router
// (the root's): the log's pool_degraded / pool_recovered events, the tandem_pool_degraded
// gauge (0 from the start) and tandem_pool_recoveries_total. `metrics` may be null.
struct pool_health {
  metrics::registry* metrics = nullptr;
  std::string pool;  // "prefill", "decode", "colocated", "kv_store", "router"
  void set(bool degraded) const;
  // Past its restart intensity (`max_restarts` in `window`), because `actor` died of `reason`.
  void degraded(const std::string& actor, const std::string& reason, int32_t max_restarts,
                std::chrono::milliseconds window, const restart_intensity& ri) const;
  // Its backoff ended (call after ri.recover()).
  void recovered(const restart_intensity& ri) const;
};

// Answers degraded_atom (bool); recover_atom ends a degradation now (its backoff sends it).
caf::behavior pool_supervisor(caf::stateful_actor<pool_supervisor_state>* self, pool_options opts,
                              worker_spawner spawn);

}  // namespace tandem
