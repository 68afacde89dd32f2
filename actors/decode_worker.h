#pragma once
// The decode worker: owns a device, an engine and its KV block pool. Continuous batching: each
// step advances every active sequence by one token; between steps it admits sequences whose KV
// has fully arrived, and retires finished ones. KV blocks are its credits: a request is only
// sent here after reserve() promised the blocks for its whole length, so it never overcommits.
// What it decides is sched::worker_core's (runtime/scheduler/worker_core.h); this actor turns
// messages into the core's events and its commands into messages, replies and steps.
#include <map>
#include <memory>

#include "actors/worker_common.h"
#include "runtime/scheduler/worker_core.h"

namespace tandem {

struct decode_worker_state : worker_state_base {
  std::unique_ptr<sched::worker_core> core;
  std::map<request_id, request_actor> requests;  // of the requests the core holds
  // Replies the core gives by ticket (reservations, transfers, fetches).
  std::map<uint64_t, caf::typed_response_promise<bool>> replies;
  uint64_t next_ticket = 1;
  // Pacing (step_settings::decode_pace_ms): when the last step started, and whether a tick
  // to start the next one is on its way.
  std::chrono::steady_clock::time_point last_start;
  bool pace_pending = false;
  static inline const char* name = "decode_worker";
};

decode_worker_actor::behavior_type decode_worker_behavior(
    decode_worker_actor::stateful_pointer<decode_worker_state> self, std::shared_ptr<const model> m,
    worker_options opts, router_actor router);

}  // namespace tandem
