#pragma once
// The router: admission control, placement and recovery. Two queues (waiting for prefill;
// prefilled and waiting for a decode slot) and two latency budgets (TTFT, TPOT). What it
// decides is decided by runtime/scheduler/router_core (a plain state machine over the policies
// of runtime/scheduler/policy.h); this actor translates between it and the other actors.
#include <atomic>
#include <deque>
#include <map>
#include <optional>
#include <random>

#include "actors/cluster.h"
#include "actors/kv_link.h"
#include "actors/pipeline.h"
#include "actors/request.h"
#include "actors/kv_store.h"
#include "runtime/scheduler/router_core.h"

namespace tandem {

struct router_options {
  // What the scheduler decides by: mode, admission, block and context sizes, migration and
  // transfer-retry limits, the stall timeout, KV-aware placement, the policies.
  sched::router_core_config core;
  kv_transport_kind kv_transport = kv_transport_kind::local;  // its links within this process
  std::shared_ptr<fault_hooks> faults = no_faults();  // given to the links it spawns
  // The host KV store, if any: a prompt whose full blocks are all in it goes straight to a
  // decode worker (disaggregated mode), which fetches them and computes only the tail.
  std::shared_ptr<kv_store_directory> store;
  request_context request_ctx;
  // Workers in other processes (actors/cluster.h): their KV links are spawned in the prefill
  // worker's process, asked for through the cluster actor. Null: one process.
  cluster_actor cluster;
  // The root's count of submits this router has taken (it forwards them again past it if the
  // router dies).
  std::shared_ptr<std::atomic<uint64_t>> submits_taken;
};

// The router actor translates: messages into router_core events, router_core commands into
// sends. It keeps only what the core cannot see: the actor handles behind worker indices,
// request ids and link slots, and the CAF bookkeeping (monitors, asks, timers).
struct router_state {
  router_options opts;
  std::unique_ptr<sched::router_core> core;
  std::vector<prefill_worker_actor> prefill;  // prefill or colocated workers, by index
  std::vector<decode_worker_actor> decode;
  std::vector<std::vector<kv_link_actor>> links;  // [prefill][decode]
  std::map<request_id, request_actor> requests;  // the request actors of the core's requests
  std::map<caf::actor_addr, request_id> request_actors;  // monitored: one that dies is forgotten
  struct watched_worker {
    sched::pool_side side;
    sched::worker_ref worker;
    // What it last answered (a heartbeat or a stats ask): the stats of a worker slow to answer
    // (busy starting, or under load) so that an observer's snapshot waits for no one.
    std::optional<worker_stats> last;
  };
  std::map<caf::actor_addr, watched_worker> watched;  // monitored workers, by address
  // When a worker died (by name: "decode-1"), until its replacement joins: the log's recovery time.
  std::map<std::string, std::chrono::steady_clock::time_point> down_since;
  std::map<caf::actor_addr, kv_link_actor> retiring_links;  // replaced, finishing their transfers
  std::map<caf::actor_addr, std::pair<size_t, size_t>> link_slots;  // live links: [prefill][decode]
  // Links asked of the cluster, by slot: the number of the latest ask (an answer to an older
  // one is stale). Remote links come asynchronously.
  std::map<std::pair<size_t, size_t>, uint64_t> link_asks;
  uint64_t next_link_ask = 1;
  // Every link alive (live and retiring), shared with the exit hook that stops them.
  std::shared_ptr<std::map<caf::actor_addr, caf::actor>> all_links =
      std::make_shared<std::map<caf::actor_addr, caf::actor>>();
  std::minstd_rand chaos_rng{std::random_device{}()};  // picks a random victim for kill by kind
  static inline const char* name = "router";
};

router_actor::behavior_type router_behavior(router_actor::stateful_pointer<router_state> self, router_options opts);

}  // namespace tandem
