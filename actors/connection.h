#pragma once
// The connection actor: one per client connection (a WebSocket, an HTTP keep-alive
// connection, or a lone request submitted through the pipeline API). It subscribes to every
// request started on the connection: their events land in one inbox that the connection's
// reader (an event loop, a thread) takes from at its own pace, and credits go back to each
// request only as the reader takes its events, so a slow reader pauses its own requests and
// nobody else's. When the connection ends, the actor ends, and every request still running
// sees its subscriber go and cancels itself, freeing its KV blocks.
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "actors/protocol.h"
#include "actors/router_directory.h"

namespace tandem {

using connection_actor =
    caf::typed_actor<caf::reacts_to<request_event>,  // from the requests' actors
                     caf::reacts_to<submit_atom, request_id>,  // a request of this connection (sent before its submit)
                     caf::reacts_to<credit_atom, request_id, int32_t>,  // the reader took n events of this request
                     caf::reacts_to<cancel_atom, request_id>>;

// What a connection's reader and its actor share.
struct connection_inbox {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<request_event> events;  // every request's, in arrival order
  std::unordered_set<request_id> unfinished;  // submitted; final event not yet taken
  std::unordered_set<request_id> abandoned;  // the reader will not read these: never queued
  std::function<void(const request_event&)> callback;  // instead of the queue (runs on the actor)
  std::function<void()> notify;  // events were queued (runs on the actor)
  connection_actor actor;
  uint64_t client = 0;  // its requests' request_spec::client (0: a lone request's own)
};

struct connection_state {
  std::shared_ptr<connection_inbox> inbox;
  std::shared_ptr<router_directory> routers;  // cancels of requests not accepted yet go there
  bool end_when_idle = false;  // a lone request's connection ends with it
  std::unordered_set<request_id> open;  // submitted; final event not yet seen
  std::unordered_map<request_id, request_actor> requests;  // their actors, once accepted
  static inline const char* name = "connection";
};

connection_actor::behavior_type connection_behavior(connection_actor::stateful_pointer<connection_state> self,
                                                    std::shared_ptr<connection_inbox> inbox,
                                                    std::shared_ptr<router_directory> routers, bool end_when_idle,
                                                    std::shared_ptr<std::atomic<int64_t>> live_connections);

}  // namespace tandem
