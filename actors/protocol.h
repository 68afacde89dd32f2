#pragma once
// The messages tandem's actors exchange and their typed interfaces, in one header because
// the interfaces refer to each other (a worker sends to request actors, the router holds
// workers). Each actor's own header includes this and declares its state and behavior.
//
// Handles only point "down" the pipeline in message signatures (router → workers → request
// actors → subscribers); handles pointing back up (a worker's router) are spawn arguments.
#include <caf/all.hpp>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "actors/wire.h"
#include "runtime/kinds.h"
#include "runtime/errors.h"
#include "runtime/request_types.h"
#include "runtime/kv/kv_cache.h"
#include "runtime/metrics.h"
#include "runtime/scheduler/policy.h"
#include "runtime/engine/sampler.h"
#include "runtime/scheduler/router_core.h"
#include "runtime/tokenizer/tokenizer.h"

namespace tandem {

using steady = std::chrono::steady_clock;

// A fault-injection kill carries the time after which it must not act (steady clock, ns): a
// kill the router reads after its caller gave up is dropped, so a timed-out caller's "nothing
// killed" stays true (CLOCK_MONOTONIC is one clock for every process on a host).
inline int64_t kill_deadline(std::chrono::milliseconds within) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>((steady::now() + within).time_since_epoch()).count();
}
inline bool past(int64_t deadline_ns) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(steady::now().time_since_epoch()).count() > deadline_ns;
}

// A prefilled sequence's KV, handed between actors without copying in one process.
using kv_blocks_ptr = std::shared_ptr<const std::vector<kv_block_export>>;

// ---- atoms (CAF 0.17: at most 10 characters) ----
using submit_atom = caf::atom_constant<caf::atom("submit")>;
using cancel_atom = caf::atom_constant<caf::atom("cancel")>;
using credit_atom = caf::atom_constant<caf::atom("credit")>;
using token_atom = caf::atom_constant<caf::atom("token")>;
using state_atom = caf::atom_constant<caf::atom("state")>;
using done_atom = caf::atom_constant<caf::atom("done")>;
using fail_atom = caf::atom_constant<caf::atom("fail")>;
using prefill_atom = caf::atom_constant<caf::atom("prefill")>;
using prefilled_atom = caf::atom_constant<caf::atom("prefilled")>;
using ship_atom = caf::atom_constant<caf::atom("ship")>;
using transfer_atom = caf::atom_constant<caf::atom("transfer")>;
using arrive_atom = caf::atom_constant<caf::atom("arrive")>;
using release_atom = caf::atom_constant<caf::atom("release")>;
using reserve_atom = caf::atom_constant<caf::atom("reserve")>;
using load_atom = caf::atom_constant<caf::atom("load")>;
using step_atom = caf::atom_constant<caf::atom("step")>;
using kv_atom = caf::atom_constant<caf::atom("kv")>;
using pause_atom = caf::atom_constant<caf::atom("pause")>;
using forget_atom = caf::atom_constant<caf::atom("forget")>;
using stats_atom = caf::atom_constant<caf::atom("stats")>;
using join_atom = caf::atom_constant<caf::atom("join")>;
using down_atom = caf::atom_constant<caf::atom("wdown")>;
using kill_atom = caf::atom_constant<caf::atom("kill")>;
using recover_atom = caf::atom_constant<caf::atom("recover")>;
using kv_piece_atom = caf::atom_constant<caf::atom("kvpiece")>;
using resume_atom = caf::atom_constant<caf::atom("resume")>;
using rejoin_atom = caf::atom_constant<caf::atom("rejoin")>;
using heartbeat_atom = caf::atom_constant<caf::atom("heartbeat")>;
using stranded_atom = caf::atom_constant<caf::atom("stranded")>;
using orphan_atom = caf::atom_constant<caf::atom("orphan")>;
using publish_atom = caf::atom_constant<caf::atom("publish")>;
using lookup_atom = caf::atom_constant<caf::atom("lookup")>;
using fetch_atom = caf::atom_constant<caf::atom("fetch")>;
// Several processes (actors/cluster.h, actors/node.h)
using hello_atom = caf::atom_constant<caf::atom("hello")>;
using link_atom = caf::atom_constant<caf::atom("link")>;
using nodes_atom = caf::atom_constant<caf::atom("nodes")>;
using tick_atom = caf::atom_constant<caf::atom("tick")>;
using lost_atom = caf::atom_constant<caf::atom("lost")>;

// Result of a worker's compute step, produced on its compute thread.
struct step_result;
using step_result_ptr = std::shared_ptr<step_result>;

// A worker's view for `stats`: KV pool occupancy and step counters.
struct worker_stats {
  std::string name;
  int32_t kv_total_blocks = 0;
  int32_t kv_free_blocks = 0;  // in the engine's pool: free, or held only by its prefix cache (evictable)
  int32_t reserved_blocks = 0;  // credits promised to admitted requests
  int32_t active = 0;  // sequences held
  int32_t max_batch = 0;
  uint64_t steps = 0;
  // Liveness (heartbeats): a worker busy with a step whose result does not come back is stalled.
  bool busy = false;
  uint64_t finished_steps = 0;
  // Its step in flight (busy) or its last one: sequences in it, and prompt tokens it computes.
  int32_t step_sequences = 0;
  int32_t step_prefill_tokens = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, worker_stats& x) {
  return f(caf::meta::type_name("worker_stats"), x.name, x.kv_total_blocks, x.kv_free_blocks, x.reserved_blocks,
           x.active, x.max_batch, x.steps, x.busy, x.finished_steps, x.step_sequences, x.step_prefill_tokens);
}

using sched::router_view;  // its own view (for `state`)

}  // namespace tandem

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tandem::router_view)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tandem::request_event)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tandem::step_result_ptr)

namespace tandem {

// Receives a request's events; sends back credits (credit_atom, id, n) as it consumes them.
using subscriber_actor = caf::typed_actor<caf::reacts_to<request_event>>;

// One per request: the source of truth for its tokens and state.
using request_actor =
    caf::typed_actor<caf::reacts_to<state_atom, request_state>,  // lifecycle step (from the router)
                                                                 // ... from a worker: its name ("prefill-0") and the
                                                                 // prompt tokens it took from the prefix cache (the
                                                                 // request's log line and timings say where it ran and
                                                                 // what it reused)
                     caf::reacts_to<state_atom, request_state, std::string, int32_t>,
                     caf::reacts_to<token_atom, int32_t, token_id>,  // token #index (from the worker producing it)
                     caf::reacts_to<token_atom, int32_t, token_id, token_logprobs>,  // ... with its log-probabilities
                     caf::reacts_to<kv_atom, uint64_t, double>,  // KV moved: bytes, ms (from the KV link)
                     caf::reacts_to<done_atom, finish_reason>,  // finished with this reason
                     caf::reacts_to<fail_atom, errc, std::string>,  // ended by an error
                     caf::reacts_to<credit_atom, int32_t>,  // the subscriber consumed n events
                     caf::reacts_to<cancel_atom>,  // the client gives up
                     // Its worker died while decoding: every token generated so far (empty once it has ended),
                     // to prefill again and continue elsewhere.
                     caf::replies_to<resume_atom>::with<std::vector<token_id>>,
                     caf::reacts_to<rejoin_atom>>;  // its router died: look for the new one

// Decode side: reserve credits, receive KV, continue requests; also a colocated target.
using decode_worker_actor = caf::typed_actor<
    caf::replies_to<reserve_atom, request_id, int32_t>::with<bool>,  // credits for max total tokens
    caf::replies_to<arrive_atom, request_spec, request_actor, kv_blocks_ptr, std::vector<token_id>>::with<bool>,
    // A prompt whose full blocks are all in the host store, sent here directly (credits already
    // reserved): fetch them, compute the tail, decode. false: the store no longer has them
    // (the router then sends it to a prefill worker).
    caf::replies_to<fetch_atom, request_spec, request_actor>::with<bool>,
    // Part of a request's KV streamed ahead of its arrival (id, epoch): staged, never decoded
    // alone; arrive() completes the set.
    caf::reacts_to<kv_piece_atom, request_id, uint32_t, kv_blocks_ptr>, caf::reacts_to<cancel_atom, request_id>,
    caf::reacts_to<pause_atom, request_id, bool>, caf::reacts_to<step_atom, step_result_ptr>,
    caf::replies_to<stats_atom>::with<worker_stats>,
    caf::reacts_to<load_atom>,  // report your load to the router
    caf::reacts_to<tick_atom>>;  // its pace's wait is over: step

// Moves one request's KV from a prefill worker to one decode worker through a transport.
// The host's KV store (actors/kv_store.h): full blocks by prefix key (runtime/kv/prefix_cache.h).
using kv_store_actor =
    caf::typed_actor<caf::reacts_to<publish_atom, std::vector<uint64_t>, kv_blocks_ptr>,  // keys[i] names blocks[i]
                     caf::replies_to<lookup_atom, std::vector<uint64_t>>::with<int32_t>,  // leading keys held
                     caf::replies_to<fetch_atom, std::vector<uint64_t>>::with<kv_blocks_ptr>>;  // the verified leading
                                                                                                // run

using kv_link_actor = caf::typed_actor<
    caf::replies_to<transfer_atom, request_spec, request_actor, kv_blocks_ptr, std::vector<token_id>>::with<bool>,
    // A piece streamed while prefill runs (id, epoch, the request for its transfer metrics);
    // the transfer above, sent after the last piece, completes the set.
    caf::reacts_to<kv_piece_atom, request_id, uint32_t, request_actor, kv_blocks_ptr>,
    caf::reacts_to<release_atom>,  // retire: finish the transfers in flight, then end
    caf::reacts_to<resume_atom, uint64_t>,  // its own timer: a delayed transfer goes on (fault injection)
    caf::reacts_to<tick_atom>,  // its sender settled frames: waiting transfers go on
    caf::replies_to<heartbeat_atom>::with<bool>>;  // liveness: answered unless the link is stuck

// Prefill side (and the colocated worker, which accepts the same jobs).
using prefill_worker_actor =
    caf::typed_actor<caf::reacts_to<prefill_atom, request_spec, request_actor>,  // a job
                     caf::reacts_to<ship_atom, request_id, kv_link_actor>,  // send its KV over this link
                     caf::reacts_to<release_atom, request_id>,  // the lease can end: decode has it
                     caf::reacts_to<release_atom, request_id, uint32_t>,  // ... if it is of this attempt (epoch)
                     caf::reacts_to<down_atom, kv_link_actor>,  // this link died
                     caf::reacts_to<cancel_atom, request_id>, caf::reacts_to<pause_atom, request_id, bool>,
                     caf::reacts_to<step_atom, step_result_ptr>, caf::replies_to<stats_atom>::with<worker_stats>>;

// Admission control and placement.
using router_actor = caf::typed_actor<
    // A new request, forwarded by the root in arrival order (the number is that order)
    caf::reacts_to<submit_atom, request_spec, subscriber_actor, uint64_t>,
    // A request whose router died: its original spec and every token it has, from its actor
    caf::reacts_to<rejoin_atom, request_spec, std::vector<token_id>, request_actor>,
    caf::reacts_to<prefilled_atom, request_id, int32_t, bool>,  // id, prefill worker, finished already
    caf::reacts_to<load_atom, prefill_worker_load>, caf::reacts_to<load_atom, decode_worker_load>,
    caf::reacts_to<forget_atom, request_id, request_state, double>,  // the request ended (state, its TPOT)
    caf::reacts_to<state_atom, request_id, request_state>,  // a worker started decoding it
    caf::reacts_to<ship_atom, request_id>,  // its KV was handed to a link
    // A transfer of attempt `epoch` over this link failed (the link or its decode worker died)
    caf::reacts_to<transfer_atom, request_id, uint32_t, kv_link_actor>,
    caf::reacts_to<cancel_atom, request_id>,  // from the client API
    caf::reacts_to<pause_atom, request_id, bool>,  // backpressure from a request actor
    caf::reacts_to<join_atom, int32_t, prefill_worker_actor>,  // (re)started prefill/colocated worker
    caf::reacts_to<join_atom, int32_t, decode_worker_actor>,  // (re)started decode worker
    caf::reacts_to<down_atom, int32_t, bool>,  // worker index died (true: prefill side)
    // fault injection: kill an actor of a kind (index -1: a random one; a link p -> d: index p
    // and decode d); replies with its name, empty if there is none
    caf::replies_to<kill_atom, actor_kind, int32_t, int32_t, int64_t>::with<std::string>,
    caf::replies_to<kill_atom, request_id, int64_t>::with<bool>,  // fault injection: kill a request actor
    caf::replies_to<stats_atom>::with<std::vector<worker_stats>>,
    caf::reacts_to<heartbeat_atom>,  // its own timer: check liveness
    caf::reacts_to<stranded_atom>,  // its own timer: a pool stayed empty
    caf::reacts_to<orphan_atom, request_id, uint32_t>,  // its own timer: a transfer whose sender died
    // its own timer: ask the cluster again for the link (prefill, decode) of this request number
    caf::reacts_to<link_atom, int32_t, int32_t, uint64_t>,
    // Its own view, listing at most this many requests
    caf::replies_to<state_atom, int32_t>::with<router_view>>;

}  // namespace tandem
