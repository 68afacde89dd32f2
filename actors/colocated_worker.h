#pragma once
// The colocated baseline: one pool, no KV transfer. Each step mixes one decode token for every
// running sequence with chunks of pending prompts under a token budget (chunked prefill, as in
// Sarathi-Serve), with the same kernels as the disaggregated workers. A prompt starts only
// once its KV blocks for the whole request are reserved, so running sequences never starve.
#include <deque>
#include <map>

#include "actors/worker_common.h"
#include "runtime/scheduler/step_cost.h"

namespace tandem {

struct colocated_worker_state : prompt_worker_state_base {
  struct seq_entry : sched::sequence {
    request_actor req;
    bool reserved = false;  // KV credits held
  };
  std::unique_ptr<kv_credit_ledger> ledger;
  sched::sequence_table<seq_entry> seqs;  // every request it holds; its prompts in arrival order
  // Its steps' measured times (steps.tpot_target_ms: each step's prefill sized from it).
  sched::step_cost_model cost;
  static inline const char* name = "colocated_worker";
};

prefill_worker_actor::behavior_type colocated_worker_behavior(
    prefill_worker_actor::stateful_pointer<colocated_worker_state> self, std::shared_ptr<const model> m,
    worker_options opts, router_actor router);

}  // namespace tandem
