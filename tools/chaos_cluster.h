#pragma once
// The cluster `tandem chaos --cluster` soaks: a router process and prefill and decode
// processes (`tandem serve --role ...`) that it starts itself, kills with SIGKILL, partitions
// and starts again as a service manager (systemd, Kubernetes) would: a node that dies or exits
// comes back after `restart_after`, a router too (its nodes then exit and come back joined to
// the new one). A partition cuts a node's network link (its own network namespace on a LAN
// bridge: needs root) or, without namespaces, stops the process (SIGSTOP: to the others the
// same silence) for `partition_for`, then heals it.
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tools/bench/process.h"

namespace tandem::cli {

struct chaos_cluster_options {
  std::string tandem_binary;  // the binary to run (this one)
  std::string model;
  int prefill = 2, decode = 2;
  bool netns = false;  // each node in a network namespace of its own (root)
  std::chrono::milliseconds partition_for{3000}, restart_after{500};
  int heartbeat_timeout_ms = 1500;
  std::string admin_key;
  std::filesystem::path log_dir;
};

// What a strike can do to the cluster.
enum class cluster_fault : uint8_t { prefill_process, decode_process, router_process, partition };
std::string_view to_string(cluster_fault f);

class chaos_cluster {
 public:
  // Starts the router and every node and waits until all have joined and it serves; throws
  // std::runtime_error (with the log's end) if that does not happen within a minute.
  explicit chaos_cluster(chaos_cluster_options o);
  ~chaos_cluster();  // stops every process and removes the namespaces
  const std::string& http_port() const { return http_port_; }
  // Kills (SIGKILL) or partitions a random live process of that kind: what was hit ("decode
  // node 1, pid 123"), or empty if none was there to hit.
  std::string strike(cluster_fault f);
  // Starts again what has died (after restart_after) and heals partitions that are due; call
  // every ~100 ms.
  void tend();
  struct usage {
    int64_t router_rss = -1, router_fds = -1, nodes_rss = -1, nodes_fds = -1;
  };
  usage resources();
  int restarts();  // processes started again so far
  // The end of every log that mentions a sanitizer report or a crash (empty: none).
  std::string troubles();

 private:
  struct member {
    std::string role;  // "prefill" | "decode"
    int slot = 0;
    std::unique_ptr<bench::netns_host> host;
    std::unique_ptr<bench::child_process> proc;
    std::chrono::steady_clock::time_point restart_at{}, heal_at{};
    bool partitioned = false;
    int starts = 0;
  };
  void start_router();
  void start(member& m);
  std::string join_address() const;

  chaos_cluster_options o_;
  std::mutex mu_;
  std::unique_ptr<bench::netns_lan> lan_;
  std::unique_ptr<bench::child_process> router_;
  std::chrono::steady_clock::time_point router_restart_at_{};
  int router_starts_ = 0, restarts_ = 0;
  std::vector<member> members_;
  std::string http_port_, cluster_port_, tag_;
  uint64_t rng_ = 0x9e3779b97f4a7c15ull;
};

}  // namespace tandem::cli
