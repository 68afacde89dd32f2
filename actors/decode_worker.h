#pragma once
// The decode worker: owns a device, an engine and its KV block pool. Continuous batching: each
// step advances every active sequence by one token; between steps it admits sequences whose KV
// has fully arrived, and retires finished ones. KV blocks are its credits: a request is only
// sent here after reserve() promised the blocks for its whole length, so it never overcommits.
// What it decides is its worker core's (runtime/scheduler/worker_core.h); the actor turns
// messages into the core's events and its commands into messages, replies and steps.
#include "actors/worker_common.h"

namespace tandem {

struct decode_worker_state : worker_state_base {
  // Pacing (step_settings::decode_pace_ms): when the last step started, and whether a tick to
  // start the next one is on its way.
  std::chrono::steady_clock::time_point last_start;
  bool pace_pending = false;
  static inline const char* name = "decode_worker";
};

decode_worker_actor::behavior_type decode_worker_behavior(
    decode_worker_actor::stateful_pointer<decode_worker_state> self, std::shared_ptr<const model> m,
    worker_options opts, router_actor router);

}  // namespace tandem
