#pragma once
// A worker process: `tandem serve --role prefill|decode --join HOST:PORT`. It loads the model,
// joins the router's cluster actor (actors/cluster.h) over CAF's middleman, and runs a pool of
// workers that join the router under the global indices the cluster gave them; its pool
// supervisor restarts them here as in one process. A decode node also runs the KV receiver
// (transport/channel.h) that hands landed blocks to its decode workers; a prefill node spawns
// the sender halves of KV links when the router asks.
//
//   tandem::node n({.role = tandem::node_role::decode, .join_host = "10.0.0.1", .join_port = 7070});
//   n.run();  // until the router goes away or stop()
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/kinds.h"
#include "runtime/model/model.h"

namespace tandem {

struct node_config {
  node_role role = node_role::decode;
  std::string join_host = "127.0.0.1";
  uint16_t join_port = 0;  // the router's --cluster-port
  std::string model_path;  // empty: the built-in default model (as the router's)
  std::shared_ptr<const model> loaded_model;
  int workers = 1;
  int threads_per_worker = 1;
  int32_t kv_blocks_per_worker = 0;  // 0: from kv_memory_bytes_per_worker
  int64_t kv_memory_bytes_per_worker = 256ll << 20;
  // Decode: where the KV receiver listens, and the host senders reach it at.
  std::string kv_listen_host = "127.0.0.1";
  uint16_t kv_port = 0;  // 0: any free port
  std::string kv_advertise_host;  // empty: kv_listen_host
  bool allow_shm = true;  // offer shared memory to senders on this host
  int scheduler_threads = 2;
  int32_t max_worker_restarts = 5;  // per 10 s; past it the node leaves (exit 1)
  std::string name;  // empty: hostname:pid
  // Tests: join announcing this wire version instead of ours (refused unless equal).
  uint32_t announce_wire_version = 0;
};

class node {
 public:
  // Loads the model and joins; throws failure (with the router's reason) when it is refused
  // or the router cannot be reached.
  explicit node(node_config cfg);
  ~node();  // stops the workers and leaves
  node(const node&) = delete;
  node& operator=(const node&) = delete;

  // Serves until stop() or until the router goes away (returns false then). A node the router
  // declared lost (its heartbeats did not arrive: a partition) stops its workers and joins
  // again as a new member; that is not the end.
  bool run();
  void stop();  // any thread (a signal handler's event loop)

  const std::vector<int32_t>& indices() const;  // this node's workers' global indices
  uint16_t kv_port() const;  // decode: the receiver's port
  uint64_t rejoins() const;
  // Fault injection (tandem serve --role decode: SIGUSR1): closes the KV receiver's
  // connections; transfers in flight fail and are shipped again from their leases.
  void drop_kv_connections();

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace tandem
