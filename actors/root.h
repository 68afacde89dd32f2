#pragma once
// The root of the supervision tree: root → router (with its KV links) → pools → workers.
// rest_for_one, as Erlang/OTP calls it: the pools' workers hold the router's state (sequences,
// reservations, leases), so when the router dies they are restarted after it; the request
// actors survive and rejoin the new router with every token they have (nothing is lost, and
// greedy or seeded outputs stay exact). Past `max_restarts` within `window` the root gives up
// for a while (degraded): the directory closes, requests end with an error, /health reports
// it; after `recover_after` (doubled at each degradation that follows within ten of them, up
// to `recover_after_max`) it starts a router and its pools again, as a crash-looping service
// is restarted with a backoff, and serving resumes by itself.
//
// The root is also the gateway: every submit passes through it, numbered, so that a submit
// the dying router never took is forwarded again to its replacement.
#include <chrono>
#include <deque>
#include <functional>

#include "actors/router.h"
#include "actors/router_directory.h"
#include "actors/supervisor.h"

namespace tandem {

// Spawns the worker pools (their supervisors) for this router; returns them.
using pool_spawner = std::function<std::vector<caf::actor>(caf::local_actor* root, router_actor router)>;

struct root_options {
  router_options router;
  pool_spawner pools;
  std::shared_ptr<router_directory> directory;
  int32_t max_restarts = 3;  // router restarts within `window`
  std::chrono::milliseconds window{10000};
  std::chrono::milliseconds recover_after{30000};
  std::chrono::milliseconds recover_after_max{300000};
};

struct root_state {
  root_options opts;
  router_actor router;
  std::vector<caf::actor> pools;
  std::shared_ptr<std::atomic<uint64_t>> taken = std::make_shared<std::atomic<uint64_t>>(0);
  struct pending_submit {
    uint64_t seq;
    request_spec spec;
    subscriber_actor sub;
  };
  std::deque<pending_submit> forwarded;  // not yet taken by the router
  uint64_t next_seq = 1;
  restart_intensity intensity;
  static inline const char* name = "root";
};

using root_actor = caf::typed_actor<caf::reacts_to<submit_atom, request_spec, subscriber_actor>,
                                    caf::reacts_to<cancel_atom, request_id>,  // after its submit
                                    caf::replies_to<degraded_atom>::with<bool>,
                                    caf::reacts_to<recover_atom>>;  // degraded: start again now

root_actor::behavior_type root_behavior(root_actor::stateful_pointer<root_state> self, root_options opts);

}  // namespace tandem
