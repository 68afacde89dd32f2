#pragma once
// The prefill worker: owns a device (its threads) and an engine. Batches queued prompts up to
// a token budget, splits long prompts into chunks, produces each request's first token and
// KV blocks, and keeps the blocks under a lease until a decode worker holds them.
#include <map>
#include <memory>
#include <vector>

#include "actors/worker_common.h"

namespace tandem {

struct prefill_worker_state : prompt_worker_state_base {
  struct job : sched::sequence {  // a prompt until its first token
    request_actor req;
    // Its decode worker was reserved before the prompt finished: the KV streams over this
    // link as it is made (layer group by layer group), from stream_next on.
    kv_link_actor link;
    int32_t stream_next = 0;
    bool stream_broken = false;  // the link changed while a streamed step was in flight
  };
  struct lease {
    request_spec spec;
    request_actor req;
    seq_id seq = 0;
    kv_blocks_ptr kv;                // the whole set, or null when it streamed to `streamed_to`
    std::vector<token_id> generated;
    kv_link_actor streamed_to;       // the link holding its streamed pieces
    kv_link_actor sending;           // the link of the transfer in flight (replies from others are stale)
    kv_link_actor pending;           // a transfer waiting for the engine to be idle (to export again)
    bool resend_all = false;         // a try failed: the next one exports the whole set again
  };
  sched::sequence_table<job> queue;  // its prompts, first come first
  std::map<request_id, lease> leases;
  static inline const char* name = "prefill_worker";
};

prefill_worker_actor::behavior_type prefill_worker_behavior(
    prefill_worker_actor::stateful_pointer<prefill_worker_state> self, std::shared_ptr<const model> m,
    worker_options opts, router_actor router);

}  // namespace tandem
