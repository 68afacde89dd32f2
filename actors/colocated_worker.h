#pragma once
// The colocated baseline: one pool, no KV transfer. Each step mixes one decode token for every
// running sequence with chunks of pending prompts under a token budget (chunked prefill, as in
// Sarathi-Serve), with the same kernels as the disaggregated workers. A prompt starts only
// once its KV blocks for the whole request are reserved, so running sequences never starve.
// What it decides is its worker core's (runtime/scheduler/worker_core.h); the actor translates.
#include "actors/worker_common.h"

namespace tandem {

struct colocated_worker_state : worker_state_base {
  static inline const char* name = "colocated_worker";
};

prefill_worker_actor::behavior_type colocated_worker_behavior(
    prefill_worker_actor::stateful_pointer<colocated_worker_state> self, std::shared_ptr<const model> m,
    worker_options opts, router_actor router);

}  // namespace tandem
