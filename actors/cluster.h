#pragma once
// Several processes: the router's process publishes a cluster actor (CAF 0.17's middleman);
// prefill and decode processes (actors/node.h) join it. A joining node says its wire version
// first: another version is refused before any message whose shape depends on it. It then
// announces its role, device, capacity, model and KV receiver address, gets the global worker
// indices its workers join the router under, and heartbeats.
//
// Everything remote is monitored and every request to it has a finite timeout (CAF 0.17
// never fails a request pending to a dead peer). A node is lost when its connection closes
// (down message) or its heartbeats stop (a partition: the sockets stay open, nothing comes);
// the router then recovers its workers' requests as for any dead worker.
#include <chrono>
#include <map>
#include <string>

#include "actors/protocol.h"
#include "kernels/tensor_types.h"
#include "actors/router_directory.h"

namespace tandem {

// A node's agent (actors/node.h): spawns the sender halves of KV links in its process.
using node_actor = caf::typed_actor<
    // A link from this node's prefill worker to a decode worker (its handle, its process's KV
    // receiver address, its index there), named for metrics and logs.
    caf::replies_to<link_atom, int32_t, decode_worker_actor, std::string, int32_t, std::string>::with<kv_link_actor>,
    // The router declared this node (its member id) lost: heartbeats stopped arriving, or its
    // router was replaced. Its workers' requests went elsewhere; it must stop them and join
    // again as a new member (unless it has already: a loss of an earlier id is stale).
    caf::reacts_to<lost_atom, uint64_t>,
    caf::reacts_to<tick_atom>>;  // its own timer: heartbeat

// The router process's side.
using cluster_actor = caf::typed_actor<
    // Join: wire version, the announcement (JSON: role, name, host, device, workers,
    // threads, KV blocks, model id, block size, KV address), the agent. Replies with the
    // welcome (JSON: node id, worker indices, the settings its workers must use) and the
    // router, or an error saying why the node is refused.
    caf::replies_to<hello_atom, uint32_t, std::string, caf::actor>::with<std::string, router_actor>,
    // Heartbeat of node `id`; false: not a member (declared lost): join again.
    caf::replies_to<heartbeat_atom, uint64_t>::with<bool>,
    // The router: a KV link from prefill worker p (on a node) to decode worker d.
    caf::replies_to<link_atom, int32_t, int32_t, decode_worker_actor>::with<kv_link_actor>,
    caf::replies_to<nodes_atom>::with<std::string>,  // the members as JSON (dashboard, /health)
    caf::reacts_to<tick_atom>>;                      // its own timer: heartbeat check

// What the router process requires of its members, and tells them.
struct cluster_options {
  uint64_t model_id = 0;       // a node serving another model is refused
  int32_t block_size = 16;
  std::string matmul;          // "batch-invariant" or "fastest": workers must agree for exact recovery
  kernels::dtype kv_dtype = kernels::dtype::f16;  // every worker's KV cache (links refuse another)
  bool prefix_cache = true;
  bool stream_kv = true;
  int32_t stream_layer_group = 4;
  int32_t prefill_token_budget = 512;
  int32_t chunk_size = 256;
  int32_t max_batch = 64;
  std::string kv_transport = "auto";  // for links between nodes: auto (shm on one host), tcp, shm
  std::chrono::milliseconds heartbeat_timeout{1500};  // silence past this: the node is lost
  int32_t first_prefill_index = 0;    // global indices start past the router process's own workers
  int32_t first_decode_index = 0;
  std::shared_ptr<router_directory> routers;
  std::shared_ptr<metrics::registry> metrics;
};

struct cluster_state {
  struct member {
    uint64_t id = 0;
    std::string role, name, host, device, kv_address;
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

cluster_actor::behavior_type cluster_behavior(cluster_actor::stateful_pointer<cluster_state> self, cluster_options opts);

}  // namespace tandem
