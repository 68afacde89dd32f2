#include "tools/chaos_cluster.h"

#include <signal.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include <nlohmann/json.hpp>

#include "tools/bench/client.h"

namespace tandem::cli {

using namespace std::chrono_literals;

std::string_view to_string(cluster_fault f) {
  switch (f) {
    case cluster_fault::prefill_process: return "prefill_process";
    case cluster_fault::decode_process: return "decode_process";
    case cluster_fault::router_process: return "router_process";
    case cluster_fault::partition: return "partition";
  }
  return "?";
}

chaos_cluster::chaos_cluster(chaos_cluster_options o) : o_(std::move(o)), tag_(std::to_string(::getpid() % 100000)) {
  std::filesystem::create_directories(o_.log_dir);
  http_port_ = std::to_string(bench::free_port());
  cluster_port_ = std::to_string(bench::free_port());
  if (o_.netns) {
    lan_ = std::make_unique<bench::netns_lan>("tcbr" + tag_, 214);
    if (!lan_->ok()) throw std::runtime_error("--netns needs root and network namespaces: " + lan_->why());
  }
  for (int i = 0; i < o_.prefill + o_.decode; ++i) {
    member m;
    m.role = i < o_.prefill ? "prefill" : "decode";
    m.slot = i;
    if (lan_) {
      m.host = lan_->add("tandem-c" + tag_ + "-" + std::to_string(i), "tc" + tag_ + "n" + std::to_string(i), i);
      if (!m.host->ok()) throw std::runtime_error("cannot make a network namespace: " + m.host->why());
    }
    members_.push_back(std::move(m));
  }
  std::lock_guard lk(mu_);
  start_router();
  if (router_->wait_for(R"(nodes join at)", 60s).empty())
    throw std::runtime_error("the router did not start:\n" + router_->log());
  for (auto& m : members_) start(m);
  // Serving once every node has joined.
  const bench::endpoint ep{"127.0.0.1", http_port_};
  for (auto until = std::chrono::steady_clock::now() + 60s; std::chrono::steady_clock::now() < until;) {
    try {
      const auto r = bench::http_call(ep, "GET", "/health", o_.admin_key);
      const auto h = nlohmann::json::parse(r.body, nullptr, false);
      if (h.is_object() && h.value("status", "") == "ok" && h.contains("nodes") &&
          int(h["nodes"].size()) == o_.prefill + o_.decode)
        return;
    } catch (const std::exception&) {}
    std::this_thread::sleep_for(100ms);
  }
  throw std::runtime_error("the nodes did not all join within a minute; logs in " + o_.log_dir.string());
}

chaos_cluster::~chaos_cluster() {
  std::lock_guard lk(mu_);
  for (auto& m : members_) m.proc.reset();  // SIGKILL, reaped
  router_.reset();
  members_.clear();  // the namespaces, then the bridge
  lan_.reset();
}

std::string chaos_cluster::join_address() const {
  return (lan_ ? lan_->here() : std::string("127.0.0.1")) + ":" + cluster_port_;
}

void chaos_cluster::start_router() {
  std::vector<std::string> args = {"serve",
                                   "--role",
                                   "router",
                                   "--model",
                                   o_.model,
                                   "--port",
                                   http_port_,
                                   "--cluster-port",
                                   cluster_port_,
                                   "--admin-key",
                                   o_.admin_key,
                                   "--heartbeat-timeout-ms",
                                   std::to_string(o_.heartbeat_timeout_ms)};
  if (lan_) args.insert(args.end(), {"--cluster-host", lan_->here(), "--node-transport", "tcp"});
  router_ = std::make_unique<bench::child_process>(
      o_.tandem_binary, args, o_.log_dir / ("router." + std::to_string(router_starts_++) + ".log"));
}

void chaos_cluster::start(member& m) {
  std::vector<std::string> args = {"serve", "--role", m.role, "--join", join_address(), "--model", o_.model};
  if (m.role == "decode" && m.host) args.insert(args.end(), {"--kv-listen", m.host->there});
  const auto log = o_.log_dir / (m.role + "-" + std::to_string(m.slot) + "." + std::to_string(m.starts++) + ".log");
  m.proc = std::make_unique<bench::child_process>(o_.tandem_binary, args, log, m.host ? m.host->name() : "");
}

std::string chaos_cluster::strike(cluster_fault f) {
  std::lock_guard lk(mu_);
  auto pick = [&](auto&& ok) -> member* {
    std::vector<member*> c;
    for (auto& m : members_)
      if (ok(m) && m.proc && m.proc->running() && !m.partitioned) c.push_back(&m);
    if (c.empty()) return nullptr;
    rng_ ^= rng_ << 13, rng_ ^= rng_ >> 7, rng_ ^= rng_ << 17;
    return c[rng_ % c.size()];
  };
  const auto now = std::chrono::steady_clock::now();
  switch (f) {
    case cluster_fault::prefill_process:
    case cluster_fault::decode_process: {
      const std::string role = f == cluster_fault::prefill_process ? "prefill" : "decode";
      member* m = pick([&](const member& x) { return x.role == role; });
      if (!m) return "";
      const std::string what = std::string(to_string(f)) + " " + role + "-node-" + std::to_string(m->slot) + " (pid " +
                               std::to_string(m->proc->pid()) + ")";
      m->proc->kill9();
      m->restart_at = now + o_.restart_after;
      return what;
    }
    case cluster_fault::router_process: {
      if (!router_ || !router_->running()) return "";
      const std::string what = "router_process (pid " + std::to_string(router_->pid()) + ")";
      router_->kill9();
      router_restart_at_ = now + o_.restart_after;
      return what;
    }
    case cluster_fault::partition: {
      member* m = pick([](const member&) { return true; });
      if (!m) return "";
      if (m->host ? !m->host->cut() : (m->proc->signal(SIGSTOP), false)) return "";
      m->partitioned = true;
      m->heal_at = now + o_.partition_for;
      return "partition " + m->role + "-node-" + std::to_string(m->slot) + (m->host ? " (link cut)" : " (stopped)");
    }
  }
  return "";
}

void chaos_cluster::tend() {
  std::lock_guard lk(mu_);
  const auto now = std::chrono::steady_clock::now();
  if (router_ && !router_->running()) {
    if (router_restart_at_ == std::chrono::steady_clock::time_point{}) router_restart_at_ = now + o_.restart_after;
    if (now >= router_restart_at_) {
      start_router();
      ++restarts_;
      router_restart_at_ = {};
    }
  }
  for (auto& m : members_) {
    if (m.partitioned && now >= m.heal_at) {
      if (m.host) m.host->heal();
      else m.proc->signal(SIGCONT);
      m.partitioned = false;
    }
    if (m.proc && !m.proc->running()) {
      // Killed, or it left by itself (its router went away, its pool failed past its intensity).
      if (m.restart_at == std::chrono::steady_clock::time_point{}) m.restart_at = now + o_.restart_after;
      if (now >= m.restart_at) {
        start(m);
        ++restarts_;
        m.restart_at = {};
      }
    }
  }
}

chaos_cluster::usage chaos_cluster::resources() {
  std::lock_guard lk(mu_);
  usage u;
  if (router_) u.router_rss = router_->resident_bytes(), u.router_fds = router_->open_fds();
  for (auto& m : members_) {
    if (!m.proc) continue;
    const int64_t rss = m.proc->resident_bytes(), fds = m.proc->open_fds();
    if (rss >= 0) u.nodes_rss = std::max<int64_t>(u.nodes_rss, 0) + rss;
    if (fds >= 0) u.nodes_fds = std::max<int64_t>(u.nodes_fds, 0) + fds;
  }
  return u;
}

int chaos_cluster::restarts() {
  std::lock_guard lk(mu_);
  return restarts_;
}

std::string chaos_cluster::troubles() {
  std::string out;
  for (const auto& e : std::filesystem::directory_iterator(o_.log_dir)) {
    std::ifstream in(e.path());
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    for (const char* bad : {"ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:", "Segmentation fault",
                            "terminate called"})
      if (text.find(bad) != std::string::npos) {
        out += e.path().string() + ": " + bad + "\n";
        break;
      }
  }
  return out;
}

}  // namespace tandem::cli
