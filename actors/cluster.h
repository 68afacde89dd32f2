#pragma once
// Several processes: the router's process publishes a cluster actor (CAF 0.17's middleman);
// prefill and decode processes (actors/node.h) join it. A joining node says its wire version
// first, alone: another version is refused before any message whose shape depends on it. It
// then joins with its announcement (node_hello: role, device, capacity, model, KV receiver
// address), gets the welcome (node_welcome: the global worker indices its workers join the
// router under, and the deployment's KV and step settings, whole), and heartbeats.
//
// Everything remote is monitored and every request to it has a finite timeout (CAF 0.17
// never fails a request pending to a dead peer). A node is lost when its connection closes
// (down message) or its heartbeats stop (a partition: the sockets stay open, nothing comes);
// the router then recovers its workers' requests as for any dead worker.
#include <chrono>
#include <map>
#include <string>

#include "actors/protocol.h"
#include "runtime/kinds.h"
#include "runtime/serving_config.h"
#include "kernels/tensor_types.h"
#include "actors/router_directory.h"

namespace tandem {

// What a joining node announces (actors/wire.h inspects it).
struct node_hello {
  node_role role = node_role::prefill;
  std::string name, host, device;
  std::string kv_address;  // decode: its KV receiver
  int32_t workers = 0;
  int32_t threads = 0;  // per worker
  int64_t kv_blocks = 0;  // per worker, at the default block size
  uint64_t model_id = 0;
};

// What the router answers a node it takes: who it is, its workers' global indices, and what
// every worker of the deployment shares.
struct node_welcome {
  uint64_t node = 0;
  std::vector<int32_t> indices;
  kv_settings kv;
  step_settings steps;
  channel_mode kv_channel = channel_mode::automatic;
  int64_t heartbeat_ms = 300;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, node_hello& x) {
  return f(caf::meta::type_name("node_hello"), x.role, x.name, x.host, x.device, x.kv_address, x.workers, x.threads,
           x.kv_blocks, x.model_id);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, node_welcome& x) {
  return f(caf::meta::type_name("node_welcome"), x.node, x.indices, x.kv, x.steps, x.kv_channel, x.heartbeat_ms);
}

// A node's agent (actors/node.h): spawns the sender halves of KV links in its process.
using node_actor = caf::typed_actor<
    // A link from this node's prefill worker p to decode worker d (its handle, and its
    // process's KV receiver address).
    caf::replies_to<link_atom, int32_t, int32_t, decode_worker_actor, std::string>::with<kv_link_actor>,
    // The router declared this node (its member id) lost: heartbeats stopped arriving, or its
    // router was replaced. Its workers' requests went elsewhere; it must stop them and join
    // again as a new member (unless it has already: a loss of an earlier id is stale).
    caf::reacts_to<lost_atom, uint64_t>,
    caf::reacts_to<tick_atom>>;  // its own timer: heartbeat

// The router process's side.
using cluster_actor = caf::typed_actor<
    // First, alone: the node's wire version. An error when it is not ours.
    caf::replies_to<hello_atom, uint32_t>::with<bool>,
    // Join: the announcement and the agent. Replies with the welcome and the router, or an
    // error saying why the node is refused.
    caf::replies_to<join_atom, node_hello, caf::actor>::with<node_welcome, router_actor>,
    // Heartbeat of node `id`; false: not a member (declared lost): join again.
    caf::replies_to<heartbeat_atom, uint64_t>::with<bool>,
    // The router: a KV link from prefill worker p (on a node) to decode worker d.
    caf::replies_to<link_atom, int32_t, int32_t, decode_worker_actor>::with<kv_link_actor>,
    caf::replies_to<nodes_atom>::with<std::string>,  // the members as JSON (dashboard, /health)
    caf::reacts_to<tick_atom>>;  // its own timer: heartbeat check

// What the router process requires of its members, and tells them.
struct cluster_options {
  uint64_t model_id = 0;  // a node serving another model is refused
  // Every member's workers use these (exact recovery needs one matmul mode; links and the
  // store refuse KV of another layout).
  kv_settings kv;
  step_settings steps;
  channel_mode kv_channel = channel_mode::automatic;  // for links between nodes
  std::chrono::milliseconds heartbeat_timeout{1500};  // silence past this: the node is lost
  int32_t first_prefill_index = 0;  // global indices start past the router process's own workers
  int32_t first_decode_index = 0;
  std::shared_ptr<router_directory> routers;
  std::shared_ptr<metrics::registry> metrics;
};

struct cluster_state {
  struct member {
    uint64_t id = 0;
    node_role role = node_role::prefill;
    std::string name, host, device, kv_address;
    std::vector<int32_t> indices;
    node_actor agent;
    int32_t threads = 0;
    int64_t kv_blocks = 0;
    steady::time_point last_heartbeat;
    steady::time_point joined;
  };
  cluster_options opts;
  std::map<uint64_t, member> members;
  uint64_t next_id = 1;
  int32_t next_prefill = 0, next_decode = 0;
  uint64_t joins = 0, losses = 0, refusals = 0;
  router_actor router;  // the one members joined; a restarted router knows none of them
  static inline const char* name = "cluster";
};

cluster_actor::behavior_type cluster_behavior(cluster_actor::stateful_pointer<cluster_state> self,
                                              cluster_options opts);

}  // namespace tandem
