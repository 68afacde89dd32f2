#pragma once
// The prefill worker: owns a device (its threads) and an engine. Batches queued prompts up to
// a token budget, splits long prompts into chunks, produces each request's first token and
// KV blocks, and keeps the blocks under a lease until a decode worker holds them. What it
// decides is its worker core's (runtime/scheduler/worker_core.h); the actor translates.
#include "actors/worker_common.h"

namespace tandem {

struct prefill_worker_state : worker_state_base {
  static inline const char* name = "prefill_worker";
};

prefill_worker_actor::behavior_type prefill_worker_behavior(
    prefill_worker_actor::stateful_pointer<prefill_worker_state> self, std::shared_ptr<const model> m,
    worker_options opts, router_actor router);

}  // namespace tandem
