#pragma once
// The decode worker: owns a device, an engine and its KV block pool. Continuous batching: each
// step advances every active sequence by one token; between steps it admits sequences whose KV
// has fully arrived, and retires finished ones. KV blocks are its credits: a request is only
// sent here after reserve() promised the blocks for its whole length, so it never overcommits.
#include <map>
#include <optional>
#include <set>

#include "actors/worker_common.h"
#include "runtime/scheduler/step_cost.h"

namespace tandem {

struct decode_worker_state : worker_state_base {
  struct active_seq : sched::sequence {  // decoding from its import on
    request_actor req;
  };
  struct arrival {
    request_spec spec;
    request_actor req;
    std::vector<kv_blocks_ptr> kv;  // streamed pieces, then the closing transfer's blocks
    std::vector<token_id> generated;
    caf::typed_response_promise<bool> promise;
    // Sent straight here (prompt in the host store): the prompt's tail to compute after the
    // fetched blocks, which cover kv_tokens positions. Empty for a transfer from prefill.
    std::vector<token_id> feed;
    int32_t kv_tokens = 0;
    std::shared_ptr<const std::vector<token_id>> penalty_prompt;  // made once, at its import step
  };
  std::unique_ptr<kv_credit_ledger> ledger;
  sched::sequence_table<active_seq> active;
  std::vector<arrival> arrivals;        // waiting for the next step
  std::vector<arrival> importing;       // in the step in flight
  std::set<request_id> cancelled_importing;  // cancelled while their import was in flight
  // A second try of a transfer (a retry after its first link died) while the first one is
  // still being imported: answered with the first's outcome, not refused as a failure.
  std::multimap<request_id, caf::typed_response_promise<bool>> duplicate_tries;
  struct staged_kv {
    uint32_t epoch = 0;
    std::vector<kv_blocks_ptr> pieces;
  };
  std::map<request_id, staged_kv> staged;   // streamed pieces of reserved requests, by id
  // Pacing (step_settings::decode_pace_ms): when the last step started, and whether a tick
  // to start the next one is on its way.
  std::chrono::steady_clock::time_point last_start;
  bool pace_pending = false;
  // Auto mode (steps.local_prefill): its steps' fitted cost and its TPOT slack say how many
  // prompt tokens it may compute itself (fetch with a feed); the figure last reported.
  sched::step_cost_model cost;
  std::optional<sched::tpot_slack> slack;
  int32_t reported_local = 0;
  static inline const char* name = "decode_worker";
};

decode_worker_actor::behavior_type decode_worker_behavior(
    decode_worker_actor::stateful_pointer<decode_worker_state> self, std::shared_ptr<const model> m,
    worker_options opts, router_actor router);

}  // namespace tandem
