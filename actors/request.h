#pragma once
// The request actor: one per admitted request. It owns the request's lifecycle, every token
// generated so far (the source of truth for resuming it elsewhere) and its timings, and
// streams events to its subscriber under credit-based flow control.
#include <atomic>
#include <deque>
#include <memory>

#include "actors/protocol.h"
#include "actors/router_directory.h"
#include "runtime/model/model.h"

namespace tandem {

struct request_actor_config {
  int32_t initial_credits = 32;  // events sent before the subscriber must return credits
  int32_t pause_above = 64;  // buffered events that make the worker pause this request
  int32_t resume_below = 16;  // ... and let it continue again
};

// Router-side handles a request actor reports to (spawn arguments, not message types).
struct request_context {
  std::shared_ptr<const model> mdl;
  std::shared_ptr<metrics::registry> metrics;
  std::shared_ptr<std::atomic<int64_t>> live_requests;  // counts request actors alive
  request_actor_config config;
  std::shared_ptr<router_directory> routers;  // where to rejoin when its router dies (null: fail then)
  std::chrono::milliseconds rejoin_timeout{30000};  // waits this long for a new router
};

struct request_actor_state {
  request_spec spec;
  subscriber_actor subscriber;
  router_actor router;
  request_context ctx;
  request_state state = request_state::queued;
  std::vector<token_id> generated;
  std::unique_ptr<stream_decoder> decoder;
  std::deque<request_event> buffered;  // waiting for credits
  int32_t credits = 0;
  bool paused = false;
  steady::time_point rejoin_since;  // its router died at; zero while it has one
  steady::time_point t_submit, t_prefill_start, t_first_token, t_decode_start, t_last_token;
  bool prefill_started = false, decode_started = false;
  uint64_t kv_bytes = 0;
  std::string prefill_worker, decode_worker;  // where it ran last (empty: not there)
  int32_t cached_tokens = 0;  // prompt tokens taken from the prefix cache
  double kv_ms = 0;
  static inline const char* name = "request";
};

request_actor::behavior_type request_behavior(request_actor::stateful_pointer<request_actor_state> self,
                                              request_spec spec, subscriber_actor subscriber, router_actor router,
                                              request_context ctx, int32_t queue_position);

}  // namespace tandem
