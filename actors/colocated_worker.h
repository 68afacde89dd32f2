#pragma once
// The colocated baseline: one pool, no KV transfer. Each step mixes one decode token for every
// running sequence with chunks of pending prompts under a token budget (chunked prefill, as in
// Sarathi-Serve), with the same kernels as the disaggregated workers. A prompt starts only
// once its KV blocks for the whole request are reserved, so running sequences never starve.
#include <deque>
#include <map>

#include "actors/worker_common.h"

namespace tandem {

struct colocated_worker_state {
  struct seq_entry {
    request_spec spec;
    request_actor req;
    seq_id seq = 0;
    int32_t prefilled = 0;   // prompt tokens in the cache
    int32_t planned = 0;     // prompt tokens in the step in flight
    int32_t generated = 0;   // tokens sent
    std::vector<token_id> output;  // the tokens sent, kept only when spec.sampling.penalizes()
    std::shared_ptr<const std::vector<token_id>> penalty_prompt;  // when spec.sampling.repeats()
    token_id last = 0;
    bool reserved = false;   // KV credits held
    bool decoding = false;
    bool paused = false;
    bool in_step = false;
    bool cancelled = false;
    bool announced = false;  // told its request it is prefilling
    prompt_reuse reuse;      // what it has of the prefix cache and the host store
  };
  worker_options opts;
  router_actor router;
  std::unique_ptr<worker_engine> we;
  std::unique_ptr<kv_credit_ledger> ledger;
  std::deque<request_id> waiting;           // FIFO of prompts not fully prefilled
  std::map<request_id, seq_entry> seqs;     // every request this worker holds
  std::vector<seq_id> to_free;
  prefix_claims claims;              // prompt blocks being computed, by request
  prefix_cache_stats prefix_last;    // the engine's counters at the last report
  static inline const char* name = "colocated_worker";
};

prefill_worker_actor::behavior_type colocated_worker_behavior(
    prefill_worker_actor::stateful_pointer<colocated_worker_state> self, std::shared_ptr<const model> m,
    worker_options opts, router_actor router);

}  // namespace tandem
