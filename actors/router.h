#pragma once
// The router: admission control and placement. Two queues (waiting for prefill; prefilled and
// waiting for a decode slot) and two latency budgets (TTFT, TPOT). The decisions are the
// policies of runtime/policy.h; the router only keeps the queues and the workers' loads.
#include <atomic>
#include <deque>
#include <map>
#include <random>

#include "actors/cluster.h"
#include "actors/kv_link.h"
#include "actors/pipeline.h"
#include "actors/request.h"
#include "actors/kv_store.h"
#include "runtime/prefix_view.h"

namespace tandem {

struct router_options {
  serving_mode mode = serving_mode::disaggregated;
  admission_config admission;
  int32_t block_size = 16;
  int32_t context_length = 0;
  int32_t dispatch_tokens = 1024;   // prompt tokens a worker may have queued before it gets more
  std::string kv_transport = "local";  // see kv_link_options::transport
  // A request whose worker dies while it decodes is prefilled again (prompt plus the tokens
  // sent) and continues elsewhere, at most this many times; then it ends with worker_failed.
  int32_t max_migrations = 3;
  // A failed KV transfer (link died, block corrupted or lost) is shipped again from the
  // prefill side's lease this many times before the request is prefilled again instead.
  int32_t max_transfer_retries = 2;
  std::shared_ptr<fault_injector> faults;
  // Liveness: a worker that stays busy with one step this long (alive, not progressing) is
  // treated as failed: killed, restarted, its requests recovered. 0: not checked.
  std::chrono::milliseconds stall_timeout{30000};
  std::shared_ptr<const admission_policy> admission_policy_impl;
  std::shared_ptr<const prefill_placement> prefill_policy;
  std::shared_ptr<const decode_placement> decode_policy;
  // KV-aware placement: the workers' prefix caches as the router models them (prefix_view).
  // prefix_salt 0: off (no prefix cache, or not the engines' salt).
  uint64_t prefix_salt = 0;
  int32_t prefix_capacity_blocks = 0;  // blocks one worker's cache can hold (its pool)
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

struct router_state {
  struct entry {
    request_actor req;
    request_spec spec;             // what workers are sent (prompt, sampling, limits)
    request_state state = request_state::queued;
    int32_t prefill_worker = -1;   // where it is (prefill or colocated worker)
    int32_t decode_worker = -1;
    uint32_t prefill_gen = 0;      // which incarnation of that worker (restarts bump it)
    uint32_t decode_gen = 0;
    bool transfer_started = false; // the prefill worker handed its KV to a link
    bool decode_claimed = false;   // in the decode queue, or reserving/holding decode credits
    int32_t migrations = 0;        // times it was moved off a worker that died while decoding
    bool migrating = false;        // asking its actor for the tokens so far
    int32_t transfer_retries = 0;  // of the current prefill attempt's KV transfer
    steady::time_point dispatched;
    bool store_asking = false;     // waiting for the store's answer on its prompt's blocks
    int32_t store_tokens = 0;      // prompt tokens whose blocks the store holds (at that answer)
    bool direct = false;           // sent straight to decode (the store holds its prompt)
    bool direct_tried = false;     // ... and that failed once: prefill it
    bool awaiting_link = false;    // decode credits held, its link (another process's) still coming
  };
  router_options opts;
  std::vector<prefill_worker_actor> prefill;        // prefill or colocated workers
  std::vector<prefill_worker_load> prefill_load;
  std::unique_ptr<prefix_view> prefixes;            // with opts.prefix_salt
  std::vector<decode_worker_actor> decode;
  std::vector<decode_worker_load> decode_load;
  std::vector<std::vector<kv_link_actor>> links;    // [prefill][decode]
  std::vector<uint32_t> prefill_gen, decode_gen;    // incarnation of each worker slot
  struct watched_worker {
    int32_t index;
    bool prefill_side;
    uint32_t gen;
    uint64_t finished_steps = 0;       // progress at the last heartbeat that saw some
    steady::time_point progress_at{};  // when that was
  };
  std::map<caf::actor_addr, watched_worker> watched;  // monitored workers, by address
  std::map<caf::actor_addr, kv_link_actor> retiring_links;  // replaced, finishing their transfers
  std::map<caf::actor_addr, std::pair<size_t, size_t>> link_slots;  // live links: [prefill][decode]
  // Links asked of the cluster, by slot: the number of the latest ask (an answer to an older
  // one is stale). Remote links come asynchronously; requests wait for theirs (awaiting_link).
  std::map<std::pair<size_t, size_t>, uint64_t> link_asks;
  uint64_t next_link_ask = 1;
  // Every link alive (live and retiring), shared with the exit hook that stops them.
  std::shared_ptr<std::map<caf::actor_addr, caf::actor>> all_links = std::make_shared<std::map<caf::actor_addr, caf::actor>>();
  std::map<request_id, entry> requests;
  std::map<caf::actor_addr, request_id> request_actors;  // monitored: one that dies is forgotten
  std::deque<request_id> prefill_queue, decode_queue;
  int64_t prefill_queue_tokens = 0;
  bool reserving = false;                           // a decode reservation is in flight
  // ... which one: a reservation whose worker dies is given up at once (a remote worker's
  // reply never comes), and its late answer, if any, is stale by its number.
  uint64_t reserve_ticket = 0;
  int32_t reserving_worker = -1;
  request_id reserving_id = 0;
  // A pool found still empty seconds after its last worker died (degraded: no restart comes):
  // submits that need it are refused at once. A worker joining clears it.
  bool prefill_gone = false, decode_gone = false;
  std::vector<steady::time_point> prefill_busy_since;
  ewma prefill_rate{0.3}, tpot{0.2}, decode_admits{0.3};
  steady::time_point last_admit;
  request_id next_id = 1;
  std::minstd_rand chaos_rng{std::random_device{}()};  // picks a random victim for kill by kind
  static inline const char* name = "router";
};

router_actor::behavior_type router_behavior(router_actor::stateful_pointer<router_state> self, router_options opts);

}  // namespace tandem
