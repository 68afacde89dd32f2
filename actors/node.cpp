#include "actors/node.h"

#include <caf/io/all.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include "actors/cluster.h"
#include "actors/decode_worker.h"
#include "actors/error.h"
#include "actors/kv_link.h"
#include "actors/kv_store.h"
#include "actors/prefill_worker.h"
#include "actors/supervisor.h"
#include "runtime/model/synth.h"
#include "transport/channel.h"

namespace tandem {
namespace {

using json = nlohmann::json;

// What the agent and the node's main thread share: the events that end run()'s wait, the
// decode workers the KV receiver delivers to, and the links spawned here (stopped with it).
struct node_shared {
  std::mutex mu;
  std::condition_variable cv;
  bool lost = false, gone = false, stopping = false;
  uint64_t lost_id = 0;  // the member id the router let go
  std::string gone_reason;
  std::atomic<uint64_t> node_id{0};
  std::atomic<int64_t> heartbeat_ms{300};
  std::map<int32_t, decode_worker_actor> decodes;  // by global index
  std::vector<caf::actor> links;
  caf::actor pool;  // the workers' supervisor (asked each heartbeat whether it gave up)
  channel_mode kv_mode = channel_mode::automatic;
  int32_t max_worker_restarts = 5;
  std::shared_ptr<metrics::registry> metrics;
  std::shared_ptr<fault_injector> faults;

  // The member `id` was let go: only the current membership's loss means anything (a loss
  // reported twice, or one of a membership already replaced, would start a rejoin loop).
  void signal_lost(uint64_t id) {
    std::lock_guard<std::mutex> lk(mu);
    if (id != node_id.load()) return;
    lost = true;
    lost_id = id;
    cv.notify_all();
  }
  void signal_gone(const std::string& why) {
    std::lock_guard<std::mutex> lk(mu);
    gone = true;
    gone_reason = why;
    cv.notify_all();
  }
};

struct node_agent_state {
  std::shared_ptr<node_shared> shared;
  cluster_actor cluster;
  static inline const char* name = "node_agent";
};

node_actor::behavior_type node_agent(node_actor::stateful_pointer<node_agent_state> self,
                                     std::shared_ptr<node_shared> shared, cluster_actor cluster) {
  self->state.shared = std::move(shared);
  self->state.cluster = cluster;
  self->monitor(cluster);
  self->set_down_handler([self](caf::down_msg& dm) {
    if (dm.source == self->state.cluster.address())
      self->state.shared->signal_gone("the router went away (" + to_string(dm.reason) + ")");
  });
  self->set_error_handler([](caf::error&) {});
  return {
      [self](link_atom, int32_t p, int32_t d, decode_worker_actor& decode,
             const std::string& address) -> kv_link_actor {
        auto& sh = *self->state.shared;
        kv_link_options o;
        o.name = link_name(p, d);
        o.transport = kv_transport_kind::channel;
        o.channel_mode = sh.kv_mode;
        o.kv_address = address;
        o.target = d;  // its receiver delivers by global index
        o.metrics = sh.metrics;
        o.faults = sh.faults;
        // Not detached: a link never blocks on its frames (its sender ticks it when they
        // settle), and CAF 0.17's ~actor_system can wait forever for a detached actor's thread
        // when a link is killed at shutdown (example_cluster hung so about once in 50 runs).
        auto link = self->home_system().spawn(kv_link_behavior, std::move(decode), std::move(o));
        std::lock_guard<std::mutex> lk(sh.mu);
        std::erase_if(sh.links,
                      [](const caf::actor& a) { return !a || a->getf(caf::abstract_actor::is_terminated_flag); });
        sh.links.push_back(caf::actor_cast<caf::actor>(link));
        spdlog::debug("node: link {} to {}", o.name.str(), address);
        return link;
      },
      [self](lost_atom, uint64_t id) { self->state.shared->signal_lost(id); },
      [self](tick_atom) {
        auto& st = self->state;
        const uint64_t id = st.shared->node_id.load();
        const auto every = std::chrono::milliseconds(st.shared->heartbeat_ms.load());
        self->request(st.cluster, every * 4, heartbeat_atom::value, id)
            .then(
                [self, id](bool member) {
                  if (!member) self->state.shared->signal_lost(id);
                },
                [](caf::error&) {});  // not answered in time: the router decides, not us
        self->delayed_send(self, every, tick_atom::value);
        // A pool past its restart intensity restarts nothing any more: as one process would be
        // degraded, this one leaves (exit 1), for whatever runs it to start it afresh.
        caf::actor pool;
        {
          std::lock_guard<std::mutex> lk(st.shared->mu);
          pool = st.shared->pool;
        }
        if (pool)
          self->request(pool, every * 4, degraded_atom::value)
              .then(
                  [self](bool degraded) {
                    if (degraded)
                      self->state.shared->signal_gone("its worker pool failed past its restart intensity (" +
                                                      std::to_string(self->state.shared->max_worker_restarts) +
                                                      " restarts in 10 s)");
                  },
                  [](caf::error&) {});
      },
  };
}

std::string default_name() {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  return std::string(host) + ":" + std::to_string(::getpid());
}

}  // namespace

struct node::impl {
  node_config cfg;
  std::shared_ptr<const model> mdl;
  std::shared_ptr<node_shared> shared = std::make_shared<node_shared>();
  caf::actor_system_config sys_cfg;
  std::unique_ptr<caf::actor_system> sys;
  cluster_actor cluster;
  node_actor agent;
  caf::actor pool, store_pool;
  std::shared_ptr<kv_store_directory> store;
  std::unique_ptr<transport::kv_receiver> receiver;
  std::vector<int32_t> indices;
  std::optional<node_welcome> welcome;  // once joined
  uint64_t rejoins = 0;
  bool ticking = false;

  // Worker `index` (global) with what this node gives it and the deployment's settings.
  worker_options worker_opts(int32_t index) const {
    return {.kind = worker_kind_of(cfg.role),
            .index = index,
            .resources = {.n_threads = cfg.threads_per_worker,
                          .kv_blocks = cfg.kv_blocks_per_worker,
                          .kv_memory_bytes = cfg.kv_memory_bytes_per_worker},
            .kv = welcome->kv,
            .steps = welcome->steps,
            .store = welcome->kv.prefix_cache ? store : nullptr,
            .metrics = shared->metrics,
            .faults = shared->faults};
  }

  int64_t kv_blocks() const {
    // Announced before the welcome says the cluster's settings: the defaults until then.
    const kv_settings kv = welcome ? welcome->kv : kv_settings{};
    return kv_blocks_per_worker(*mdl, kv.block_size, kv.dtype, cfg.kv_blocks_per_worker,
                                cfg.kv_memory_bytes_per_worker);
  }

  std::string kv_address() const {
    if (!receiver) return "";
    if (cfg.kv_advertise_host.empty()) return receiver->address();
    return "tcp://" + cfg.kv_advertise_host + ":" + std::to_string(receiver->port()) +
           ";host=" + transport::host_identity();
  }

  // Hello, welcome, then the pool (its workers join the router themselves).
  void join() {
    node_hello hello{cfg.role,
                     cfg.name,
                     transport::host_identity(),
                     std::string("cpu (") + kernels::cpu::isa_name() + ", " + std::to_string(cfg.threads_per_worker) +
                         " threads per worker)",
                     kv_address(),
                     cfg.workers,
                     cfg.threads_per_worker,
                     kv_blocks(),
                     mdl->identity()};
    const uint32_t version = cfg.announce_wire_version ? cfg.announce_wire_version : wire_version;
    caf::scoped_actor self{*sys};
    router_actor router;
    status refused;
    // The version alone first: a router of another release refuses before any message whose
    // shape it may not share.
    self->request(cluster, std::chrono::seconds(10), hello_atom::value, version)
        .receive([](bool) {}, [&](caf::error& e) { refused = from_caf_error(e); });
    if (refused.ok())
      self->request(cluster, std::chrono::seconds(10), join_atom::value, std::move(hello),
                    caf::actor_cast<caf::actor>(agent))
          .receive(
              [&](node_welcome& w, router_actor& r) {
                welcome = std::move(w);
                router = std::move(r);
              },
              [&](caf::error& e) { refused = from_caf_error(e); });
    if (!refused.ok()) throw failure(refused.code(), "the router refused this node: " + refused.message());
    if (!welcome || !router) throw failure(errc::io_error, "the router's welcome is malformed");
    indices = welcome->indices;
    if (int(indices.size()) != cfg.workers)
      throw failure(errc::io_error, "the router gave the wrong number of indices");
    shared->node_id = welcome->node;
    shared->kv_mode = welcome->kv_channel;
    shared->heartbeat_ms = welcome->heartbeat_ms;
    if (!ticking) caf::anon_send(agent, tick_atom::value);  // its heartbeats go on across rejoins
    ticking = true;

    auto mdl_copy = mdl;
    impl* ip = this;
    const bool prefill = cfg.role == node_role::prefill;
    pool = sys->spawn(
        pool_supervisor,
        // No recovery here: past its intensity the node leaves (exits), for its
        // own supervisor (systemd, Kubernetes) to start it afresh.
        pool_options{.kind = actor_kind_of(worker_kind_of(cfg.role)),
                     .size = cfg.workers,
                     .max_restarts = cfg.max_worker_restarts,
                     .window = std::chrono::milliseconds(10000),
                     .metrics = shared->metrics,
                     .recover_after = std::chrono::milliseconds(0)},
        [ip, mdl_copy, router, prefill](caf::event_based_actor* self, int32_t i) -> caf::actor {
          const int32_t global = ip->indices[size_t(i)];
          if (prefill) {
            auto w = self->spawn<caf::monitored>(prefill_worker_behavior, mdl_copy, ip->worker_opts(global), router);
            self->send(router, join_atom::value, global, w);
            return caf::actor_cast<caf::actor>(w);
          }
          auto w = self->spawn<caf::monitored>(decode_worker_behavior, mdl_copy, ip->worker_opts(global), router);
          {
            std::lock_guard<std::mutex> lk(ip->shared->mu);
            ip->shared->decodes[global] = w;
          }
          self->send(router, join_atom::value, global, w);
          return caf::actor_cast<caf::actor>(w);
        });
    {
      std::lock_guard<std::mutex> lk(shared->mu);
      shared->pool = pool;
    }
    spdlog::info("node: joined as {} node {} with workers {}", to_string(cfg.role), shared->node_id.load(),
                 json(indices).dump());
  }

  void start();  // the receiver or store, the connection to the router, the agent; then join()

  void shutdown() {
    stop_workers();
    if (agent) caf::anon_send_exit(agent, caf::exit_reason::user_shutdown);
    agent = nullptr;
    if (store_pool) caf::anon_send_exit(store_pool, caf::exit_reason::user_shutdown);
    store_pool = nullptr;
    receiver.reset();
    cluster = nullptr;
    sys.reset();
  }

  void stop_workers() {
    if (pool) caf::anon_send_exit(pool, caf::exit_reason::user_shutdown);
    pool = nullptr;
    std::vector<caf::actor> links;
    {
      std::lock_guard<std::mutex> lk(shared->mu);
      links.swap(shared->links);
      shared->decodes.clear();
      shared->pool = nullptr;
    }
    for (auto& l : links) caf::anon_send_exit(l, caf::exit_reason::user_shutdown);
  }
};

node::node(node_config cfg) : impl_(std::make_unique<impl>()) {
  auto& im = *impl_;
  im.cfg = std::move(cfg);
  if (im.cfg.workers < 1 || im.cfg.threads_per_worker < 1)
    throw failure(errc::invalid_argument, "workers and threads per worker must be positive");
  if (im.cfg.join_port == 0)
    throw failure(errc::invalid_argument, "--join needs HOST:PORT of the router's cluster port");
  if (im.cfg.name.empty()) im.cfg.name = default_name();
  im.mdl = im.cfg.loaded_model ? im.cfg.loaded_model
                               : model::load(im.cfg.model_path.empty() ? default_model_path() : im.cfg.model_path);
  im.shared->metrics = std::make_shared<metrics::registry>();
  im.shared->faults = std::make_shared<fault_injector>(im.shared->metrics);
  im.shared->max_worker_restarts = im.cfg.max_worker_restarts;
  im.sys_cfg.set("scheduler.max-threads", std::max(1, im.cfg.scheduler_threads));
  im.sys_cfg.load<caf::io::middleman>();
  register_error_category(im.sys_cfg);
  register_wire_types(im.sys_cfg);
  im.sys = std::make_unique<caf::actor_system>(im.sys_cfg);
  try {
    im.start();
  } catch (...) {
    im.shutdown();  // else ~actor_system would wait for the actors started so far forever
    throw;
  }
}

void node::impl::start() {
  auto& im = *this;
  if (im.cfg.role == node_role::decode) {
    transport::receiver_options ro;
    ro.bind_host = im.cfg.kv_listen_host;
    ro.port = im.cfg.kv_port;
    ro.allow_shm = im.cfg.allow_shm;
    auto shared = im.shared;
    im.receiver = std::make_unique<transport::kv_receiver>(ro, [shared](transport::kv_frame&& f) {
      decode_worker_actor w;
      {
        std::lock_guard<std::mutex> lk(shared->mu);
        if (auto it = shared->decodes.find(f.target); it != shared->decodes.end()) w = it->second;
      }
      // Staged there before the frame is acknowledged, so the link's closing arrive (sent after
      // the acknowledgement) always finds it.
      if (w && f.blocks)
        caf::anon_send(w, kv_piece_atom::value, request_id(f.request), f.epoch, kv_blocks_ptr(f.blocks));
    });
  } else {
    // A prefill node's own host store: its workers reuse each other's computed prefixes.
    im.store = std::make_shared<kv_store_directory>();
    pool_options po;
    po.max_restarts = im.cfg.max_worker_restarts;
    po.metrics = im.shared->metrics;
    im.store_pool = spawn_kv_store_pool(*im.sys, kv_store_options{512ll << 20, "", 0}, im.store, po);
  }
  auto c = im.sys->middleman().remote_actor<cluster_actor>(im.cfg.join_host, im.cfg.join_port);
  if (!c)
    throw failure(errc::io_error, "cannot reach the router at " + im.cfg.join_host + ":" +
                                      std::to_string(im.cfg.join_port) + ": " + im.sys->render(c.error()));
  im.cluster = *c;
  im.agent = im.sys->spawn(node_agent, im.shared, im.cluster);
  im.join();
}

node::~node() { impl_->shutdown(); }

bool node::run() {
  auto& im = *impl_;
  for (;;) {
    std::unique_lock<std::mutex> lk(im.shared->mu);
    im.shared->cv.wait(lk, [&] { return im.shared->lost || im.shared->gone || im.shared->stopping; });
    if (im.shared->stopping) return true;
    if (im.shared->gone) {
      spdlog::error("node: {}", im.shared->gone_reason);
      return false;
    }
    im.shared->lost = false;
    if (im.shared->lost_id != im.shared->node_id.load()) continue;  // rejoined since
    lk.unlock();
    spdlog::warn("node: the router declared this node lost; stopping its workers and joining again");
    im.stop_workers();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    ++im.rejoins;
    try {
      im.join();
    } catch (const failure& f) {
      spdlog::error("node: joining again failed: {}", f.what());
      return false;
    }
  }
}

void node::stop() {
  std::lock_guard<std::mutex> lk(impl_->shared->mu);
  impl_->shared->stopping = true;
  impl_->shared->cv.notify_all();
}

const std::vector<int32_t>& node::indices() const { return impl_->indices; }
uint16_t node::kv_port() const { return impl_->receiver ? impl_->receiver->port() : 0; }
uint64_t node::rejoins() const { return impl_->rejoins; }

void node::drop_kv_connections() {
  if (!impl_->receiver) return;
  impl_->receiver->drop_connections();
  spdlog::warn("node: dropped the KV connections (fault injection)");
}

}  // namespace tandem
