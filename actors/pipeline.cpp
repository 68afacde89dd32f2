#include "actors/pipeline.h"

#include <cmath>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include <caf/io/all.hpp>
#include <tandem/version.h>

#include "actors/cluster.h"
#include "actors/colocated_worker.h"
#include "actors/kv_store.h"
#include "actors/connection.h"
#include "actors/decode_worker.h"
#include "actors/error.h"
#include "actors/prefill_worker.h"
#include "actors/root.h"
#include "actors/router.h"
#include "actors/supervisor.h"
#include "kernels/cpu/matmul.h"
#include "runtime/model/synth.h"

namespace tandem {

namespace {

bool is_final(const request_event& ev) { return ev.kind == event_kind::done || ev.kind == event_kind::error; }

// Pops the oldest queued event (in.mu held); a final event closes its request for the reader.
// Returns whether a credit is owed for it (every event but the final one).
bool take_front(connection_inbox& in, request_event& ev) {
  ev = std::move(in.events.front());
  in.events.pop_front();
  if (!is_final(ev)) return true;
  in.unfinished.erase(ev.id);
  return false;
}

void return_credit(connection_inbox& in, request_id id, int32_t n) {
  if (n > 0 && in.actor) caf::anon_send(in.actor, credit_atom::value, id, n);
}

bool inbox_try_next(connection_inbox& in, request_event& ev) {
  bool owed = false;
  {
    std::lock_guard<std::mutex> lk(in.mu);
    if (in.events.empty()) return false;
    owed = take_front(in, ev);
  }
  if (owed) return_credit(in, ev.id, 1);
  return true;
}

// Waits for an event; gives up at the timeout, or at once when `done` says nothing will come.
template <class Done>
bool inbox_next(connection_inbox& in, request_event& ev, std::chrono::milliseconds timeout, Done done) {
  bool owed = false;
  {
    std::unique_lock<std::mutex> lk(in.mu);
    if (in.events.empty() && done()) return false;
    if (!in.cv.wait_for(lk, timeout, [&] { return !in.events.empty(); })) return false;
    owed = take_front(in, ev);
  }
  if (owed) return_credit(in, ev.id, 1);
  return true;
}

void inbox_abandon(connection_inbox& in, request_id id) {
  int32_t unread = 0;
  bool unfinished = false;
  {
    std::lock_guard<std::mutex> lk(in.mu);
    bool final_dropped = false;
    for (auto it = in.events.begin(); it != in.events.end();) {
      if (it->id != id) {
        ++it;
        continue;
      }
      if (is_final(*it)) final_dropped = true;
      else ++unread;
      it = in.events.erase(it);
    }
    if (final_dropped) in.unfinished.erase(id);
    unfinished = in.unfinished.erase(id) > 0;  // for the reader it is over now
    if (unfinished) in.abandoned.insert(id);
  }
  return_credit(in, id, unread);
  if (unfinished && in.actor) caf::anon_send(in.actor, cancel_atom::value, id);
}

}  // namespace

request_id request_handle::id() const { return id_; }

bool request_handle::next(request_event& ev, std::chrono::milliseconds timeout) {
  if (!in_) return false;
  return inbox_next(*in_, ev, timeout, [this] { return in_->unfinished.count(id_) == 0; });
}

bool request_handle::try_next(request_event& ev) { return in_ && inbox_try_next(*in_, ev); }

bool request_handle::finished() const {
  if (!in_) return true;
  std::lock_guard<std::mutex> lk(in_->mu);
  return in_->unfinished.count(id_) == 0;
}

generation_result request_handle::wait(std::chrono::milliseconds timeout) {
  generation_result r;
  r.id = id();
  const auto deadline = steady::now() + timeout;
  for (request_event ev; next(ev, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - steady::now()));) {
    switch (ev.kind) {
      case event_kind::accepted: break;
      case event_kind::token:
        if (ev.token >= 0) r.tokens.push_back(ev.token);
        r.text += ev.text;
        break;
      case event_kind::done:
        r.finish_reason = ev.finish_reason;
        r.timings = ev.timings;
        break;
      case event_kind::error:
        r.error = ev.code == errc::ok ? errc::invalid_argument : ev.code;
        r.message = ev.message;
        r.retry_after_ms = ev.retry_after_ms;
        r.timings = ev.timings;
        break;
    }
  }
  if (r.finish_reason == finish_reason::none && r.error == errc::ok) {
    r.error = errc::io_error;
    r.message = "timed out waiting for the request to finish";
  }
  return r;
}

void request_handle::cancel() {
  if (in_ && in_->actor) caf::anon_send(in_->actor, cancel_atom::value, id_);
}

void request_handle::abandon() {
  if (in_) inbox_abandon(*in_, id_);
}

struct pipeline::impl {
  serving_config cfg;
  std::shared_ptr<const model> mdl;
  std::shared_ptr<metrics::registry> metrics = std::make_shared<metrics::registry>();
  std::shared_ptr<std::atomic<int64_t>> live = std::make_shared<std::atomic<int64_t>>(0);
  std::shared_ptr<std::atomic<int64_t>> live_connections = std::make_shared<std::atomic<int64_t>>(0);
  caf::actor_system_config sys_cfg;
  std::unique_ptr<caf::actor_system> sys;
  std::shared_ptr<router_directory> routers = std::make_shared<router_directory>();
  std::shared_ptr<fault_injector> faults = std::make_shared<fault_injector>(metrics);  // counts the faults met
  root_actor root;
  std::shared_ptr<kv_store_directory> store;  // with a store: which one is current
  caf::actor store_pool;  // its supervisor
  cluster_actor cluster;  // a router process's members (cluster_port >= 0)
  uint16_t cluster_port = 0;
  std::atomic<request_id> next_id{1};
  std::atomic<uint64_t> next_client{1};  // connections' client ids (request_spec::client)
  // The process's cores when its workers share them (pools.share_cores, disaggregated): every
  // prefill and decode worker's threads together; null: each owns threads_per_worker.
  std::shared_ptr<kernels::core_share> cores;

  // The observer: refreshes `latest` when asked (snapshot()) or every interval otherwise.
  struct observer {
    mutable std::mutex mu;
    mutable std::condition_variable cv;
    mutable uint64_t asked = 1;  // snapshot() calls (the first refresh at once)
    uint64_t answered = 0;  // the `asked` count the latest refresh began after
    bool stop = false;
    std::shared_ptr<const pipeline_stats> latest;
    std::thread thread;
  } watch;

  // Worker `index` of a kind, with what this process gives it and the deployment's settings.
  // A pool's supervision: its restart intensity and the backoff before it recovers.
  pool_options pool_opts(actor_kind kind, int32_t n) const {
    return {.kind = kind,
            .size = n,
            .max_restarts = cfg.pools.max_worker_restarts,
            .window = cfg.pools.restart_window,
            .metrics = metrics,
            .recover_after = std::max(std::chrono::milliseconds(1), cfg.pools.recover_after),
            .recover_after_max = cfg.pools.recover_after_max};
  }
  worker_options worker_opts(worker_kind kind, int32_t index) const {
    return {.kind = kind,
            .index = index,
            .resources = {.n_threads = cfg.pools.threads_per_worker,
                          .kv_blocks = cfg.pools.kv_blocks_per_worker,
                          .kv_memory_bytes = cfg.pools.kv_memory_bytes_per_worker,
                          .cores = cores},
            .kv = cfg.kv,
            .steps = cfg.steps,
            .store = store,
            .metrics = metrics,
            .faults = faults};
  }
  // The pool supervisors of the current router (the observer asks them whether they gave up).
  mutable std::mutex pools_mu;
  std::vector<std::pair<worker_kind, caf::actor>> pools;

  // The kinds whose pool is past its restart intensity, asked of their supervisors (on the
  // observer's thread: it may wait for them; nothing on a request's path does).
  std::vector<std::string> degraded_pools() const {
    std::vector<std::pair<worker_kind, caf::actor>> ps;
    {
      std::lock_guard<std::mutex> lk(pools_mu);
      ps = pools;
    }
    std::vector<std::string> out;
    caf::scoped_actor self{*sys};
    for (const auto& [kind, sup] : ps)
      self->request(sup, std::chrono::seconds(2), degraded_atom::value)
          .receive(
              [&, k = kind](bool d) {
                if (d) out.emplace_back(to_string(k));
              },
              [](caf::error&) {});
    return out;
  }
};

pipeline::pipeline(serving_config cfg) : impl_(std::make_unique<impl>()) {
  auto& im = *impl_;
  im.cfg = std::move(cfg);
  const bool cluster = im.cfg.cluster.port >= 0;
  if (cluster && !splits_phases(im.cfg.pools.mode))
    throw failure(errc::invalid_argument, "a router process for other processes' workers serves disaggregated only");
  if (cluster) im.cfg.pools.prefill_workers = im.cfg.pools.decode_workers = 1;  // not started: checked as valid only
  if (im.cfg.pools.mode == serving_mode::automatic) im.cfg.steps.local_prefill = true;
  if (im.cfg.pools.prefill_workers < 1 || im.cfg.pools.decode_workers < 1 || im.cfg.pools.colocated_workers < 1 ||
      im.cfg.pools.threads_per_worker < 1 || im.cfg.kv.block_size < 1 || im.cfg.steps.max_batch < 1)
    throw failure(errc::invalid_argument, "worker counts, threads, block size and batch size must be positive");
  if (!(im.cfg.scheduling.route_overlap_weight >= 0 && im.cfg.scheduling.route_load_weight >= 0) ||
      !std::isfinite(im.cfg.scheduling.route_overlap_weight) || !std::isfinite(im.cfg.scheduling.route_load_weight))
    throw failure(errc::invalid_argument, "routing weights must be finite and not negative");
  im.mdl = im.cfg.model.loaded ? im.cfg.model.loaded
                               : model::load(im.cfg.model.path.empty() ? default_model_path() : im.cfg.model.path);
  // Auto: the cores follow the work whenever both pools are in this process.
  if ((im.cfg.pools.share_cores || im.cfg.pools.mode == serving_mode::automatic) && splits_phases(im.cfg.pools.mode) &&
      !cluster)
    im.cores = std::make_shared<kernels::core_share>((im.cfg.pools.prefill_workers + im.cfg.pools.decode_workers) *
                                                     im.cfg.pools.threads_per_worker);
  im.sys_cfg.set("scheduler.max-threads", std::max(1, im.cfg.pools.scheduler_threads));
  register_error_category(im.sys_cfg);
  if (cluster) {
    im.sys_cfg.load<caf::io::middleman>();
    register_wire_types(im.sys_cfg);
  }
  im.sys = std::make_unique<caf::actor_system>(im.sys_cfg);

  // Weight memory, for the duplication factor (resident bytes across all workers / one copy):
  // every worker of this process computes from the one read-only mapping of the model file.
  const double weights = double(im.mdl->weight_bytes());
  im.metrics->get_gauge("tandem_model_weight_bytes", "Bytes of one copy of the model's weights").set(weights);
  im.metrics
      ->get_gauge("tandem_weight_resident_bytes",
                  "Bytes of weights resident for all workers (shared copies counted once)")
      .set(weights);
  // Info metrics (value 1, the facts in labels), as Prometheus exporters give build_info.
  im.metrics
      ->get_gauge("tandem_build_info", "tandem's version and the CPU kernels it runs",
                  {{"version", TANDEM_VERSION}, {"isa", kernels::cpu::isa_name()}})
      .set(1);
  {
    std::map<std::string, uint64_t> bytes_by_type;  // the type most of the weights' bytes are in
    for (const auto& t : im.mdl->file().tensors())
      bytes_by_type[std::string(kernels::to_string(t.type))] += t.size_bytes;
    std::string type;
    uint64_t most = 0;
    for (const auto& [t, b] : bytes_by_type)
      if (b > most) type = t, most = b;
    const auto& c = im.mdl->config();
    im.metrics
        ->get_gauge(
            "tandem_model_info", "The model served",
            {{"model",
              im.cfg.model.path.empty() ? c.name : std::filesystem::path(im.cfg.model.path).filename().string()},
             {"architecture", std::string(to_string(c.arch))},
             {"type", type},
             {"mode", im.cfg.cluster.port >= 0 ? std::string("router") : std::string(to_string(im.cfg.pools.mode))}})
        .set(1);
  }
  router_options ro;
  ro.core.mode = im.cfg.pools.mode;
  ro.core.admission = im.cfg.scheduling.admission;
  ro.core.block_size = im.cfg.kv.block_size;
  ro.core.context_length = im.mdl->config().n_ctx;
  ro.core.dispatch_tokens = std::max(im.cfg.steps.prefill_token_budget, im.cfg.steps.colocated_token_budget) * 2;
  if (im.cfg.kv.transport == kv_transport_kind::channel)
    throw failure(errc::invalid_argument, "kv transport 'channel' is for links between processes (cluster.kv_channel)");
  ro.kv_transport = im.cfg.kv.transport;
  ro.core.max_migrations = std::max(0, im.cfg.scheduling.max_migrations);
  ro.core.admission_policy_impl = im.cfg.scheduling.admission_policy_impl;
  ro.core.prefill_policy = im.cfg.scheduling.prefill_policy
                               ? im.cfg.scheduling.prefill_policy
                               : std::make_shared<prefill_placement>(im.cfg.scheduling.route_overlap_weight,
                                                                     im.cfg.scheduling.route_load_weight);
  if (im.cfg.kv.prefix_cache) {
    ro.core.prefix_salt = engine_prefix_salt(*im.mdl, im.cfg.kv.block_size, im.cfg.steps.matmul, im.cfg.kv.dtype);
    ro.core.prefix_capacity_blocks =
        kv_blocks_per_worker(*im.mdl, im.cfg.kv.block_size, im.cfg.kv.dtype, im.cfg.pools.kv_blocks_per_worker,
                             im.cfg.pools.kv_memory_bytes_per_worker);
  }
  ro.core.decode_policy = im.cfg.scheduling.decode_policy;
  ro.request_ctx = {im.mdl, im.metrics, im.live, {}, im.routers};
  ro.faults = im.faults;
  ro.core.stall_timeout = std::max(std::chrono::milliseconds(0), im.cfg.pools.stall_timeout);

  // The pools for a router (the first, or one that replaced a dead one).
  auto mdl = im.mdl;
  impl* ip = impl_.get();
  auto spawn_pools = [ip, mdl, cluster](caf::local_actor* root, router_actor router) {
    std::vector<caf::actor> pools;
    if (cluster) return pools;  // every worker is another process's (they join the cluster)
    std::vector<std::pair<worker_kind, caf::actor>> kinds;
    // A pool of n workers of a kind; each (re)started one joins the router.
    auto add_pool = [&](worker_kind kind, int n, auto behavior) {
      worker_spawner spawner = [ip, mdl, router, kind, behavior](caf::event_based_actor* self, int32_t i) {
        auto w = self->spawn<caf::monitored>(behavior, mdl, ip->worker_opts(kind, i), router);
        self->send(router, join_atom::value, i, w);
        return caf::actor_cast<caf::actor>(w);
      };
      pools.push_back(root->spawn(pool_supervisor, ip->pool_opts(actor_kind_of(kind), n), std::move(spawner)));
      kinds.emplace_back(kind, pools.back());
    };
    switch (ip->cfg.pools.mode) {
      case serving_mode::disaggregated:
      case serving_mode::automatic:
        add_pool(worker_kind::decode, ip->cfg.pools.decode_workers, decode_worker_behavior);
        add_pool(worker_kind::prefill, ip->cfg.pools.prefill_workers, prefill_worker_behavior);
        break;
      case serving_mode::colocated:
        add_pool(worker_kind::colocated, ip->cfg.pools.colocated_workers, colocated_worker_behavior);
        break;
    }
    std::lock_guard<std::mutex> lk(ip->pools_mu);
    ip->pools = std::move(kinds);
    return pools;
  };
  if (im.cfg.kv.prefix_cache && im.cfg.kv.store_memory_bytes > 0 && !cluster) {
    // One store for the host, supervised apart from the router: a router restart keeps it, and
    // its own death brings a fresh empty one (requests compute what they cannot fetch).
    kv_store_options so{im.cfg.kv.store_memory_bytes, im.cfg.kv.store_disk_path, im.cfg.kv.store_disk_bytes};
    if (!so.disk_path.empty()) kv_block_store probe(so);  // a bad disk path is the caller's error, now
    im.store = std::make_shared<kv_store_directory>();
    im.store_pool = spawn_kv_store_pool(*im.sys, so, im.store, im.pool_opts(actor_kind::kv_store, 1));
  }
  ro.store = im.store;
  if (cluster) {
    cluster_options co;
    co.model_id = im.mdl->identity();
    co.kv = im.cfg.kv;
    co.steps = im.cfg.steps;
    co.kv_channel = im.cfg.cluster.kv_channel;
    co.heartbeat_timeout = std::max(std::chrono::milliseconds(50), im.cfg.cluster.heartbeat_timeout);
    co.routers = im.routers;
    co.metrics = im.metrics;
    im.cluster = im.sys->spawn(cluster_behavior, std::move(co));
    ro.cluster = im.cluster;
  }
  root_options rto;
  rto.router = std::move(ro);
  rto.pools = spawn_pools;
  rto.directory = im.routers;
  rto.max_restarts = std::max(0, im.cfg.pools.max_router_restarts);
  rto.recover_after = std::max(std::chrono::milliseconds(1), im.cfg.pools.recover_after);
  rto.recover_after_max = std::max(rto.recover_after, im.cfg.pools.recover_after_max);
  im.root = im.sys->spawn(root_behavior, std::move(rto));
  // The root starts the router on its first run: until then nothing could find it (a cancel
  // or stats call right after construction), so the pipeline is ready only once it has.
  im.routers->set_gateway(caf::actor_cast<caf::actor>(im.root));
  for (int i = 0; i < 5000 && !im.routers->get(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (!im.routers->get()) throw failure(errc::io_error, "the router did not start");
  if (cluster) {
    auto port = im.sys->middleman().publish(im.cluster, uint16_t(im.cfg.cluster.port),
                                            im.cfg.cluster.host.empty() ? nullptr : im.cfg.cluster.host.c_str(), true);
    if (!port) {
      const std::string why = im.sys->render(port.error());
      caf::anon_send_exit(im.cluster, caf::exit_reason::user_shutdown);
      caf::anon_send_exit(im.root, caf::exit_reason::user_shutdown);
      throw failure(errc::io_error, "cannot listen for nodes on " + im.cfg.cluster.host + ":" +
                                        std::to_string(im.cfg.cluster.port) + ": " + why);
    }
    im.cluster_port = *port;
  }
  im.watch.thread = std::thread([this] {
    auto& w = impl_->watch;
    for (;;) {
      uint64_t serving = 0;
      {
        std::unique_lock<std::mutex> lk(w.mu);
        w.cv.wait_for(lk, std::chrono::milliseconds(200), [&] { return w.asked > w.answered || w.stop; });
        if (w.stop) return;
        serving = w.asked;
      }
      auto s = std::make_shared<pipeline_stats>(stats(snapshot_listed));
      publish_gauges(*s);
      s->degraded_pools = impl_->degraded_pools();
      s->router_degraded = degraded();
      if (s->router_degraded) s->degraded_pools.emplace_back("router");
      s->cluster_nodes = cluster_nodes();
      s->taken_at = std::chrono::steady_clock::now();
      std::lock_guard<std::mutex> lk(w.mu);
      w.latest = std::move(s);
      w.answered = serving;
      w.cv.notify_all();  // callers waiting for a fresh one
    }
  });
}

std::shared_ptr<const pipeline_stats> pipeline::snapshot() const {
  auto& w = impl_->watch;
  std::unique_lock<std::mutex> lk(w.mu);
  const uint64_t ask = ++w.asked;
  w.cv.notify_all();
  // A refresh that began after this call, if one comes soon (it takes a round trip to the
  // router and the workers); else the latest there is (a stuck worker delays only the
  // observer). At start-up, the first one.
  w.cv.wait_for(lk, w.latest ? std::chrono::milliseconds(50) : std::chrono::milliseconds(2000),
                [&] { return w.answered >= ask; });
  return w.latest;
}

uint16_t pipeline::cluster_port() const { return impl_->cluster_port; }

std::string pipeline::cluster_nodes() {
  auto& im = *impl_;
  if (!im.cluster) return "[]";
  std::string out = "[]";
  caf::scoped_actor self{*im.sys};
  self->request(im.cluster, std::chrono::seconds(2), nodes_atom::value)
      .receive([&](std::string& nodes) { out = std::move(nodes); }, [](caf::error&) {});
  return out;
}

// Gauges a snapshot knows (refreshed every 200 ms by the observer, idle or not): requests per
// lifecycle state, and each worker's KV use and running sequences.
void pipeline::publish_gauges(const pipeline_stats& s) {
  auto& m = *impl_->metrics;
  for (const auto& [state, n] : s.requests_by_state)
    m.get_gauge("tandem_requests", "Requests the router tracks, by lifecycle state (queued: waiting for prefill)",
                {{"state", state}})
        .set(n);
  for (const auto& w : s.workers) {
    if (w.kv_free_blocks < 0) continue;  // not known (yet)
    const metrics::labels l{{"worker", w.name}};
    m.get_gauge("tandem_worker_kv_free_blocks",
                "KV blocks free to take in the worker's pool (free, or kept only by the prefix cache)", l)
        .set(w.kv_free_blocks);
    m.get_gauge("tandem_worker_kv_usage_ratio", "Share of the worker's KV blocks in use (reserved included)", l)
        .set(w.kv_total_blocks > 0
                 ? double(w.kv_total_blocks - w.kv_free_blocks + w.reserved_blocks) / w.kv_total_blocks
                 : 0.0);
    m.get_gauge("tandem_worker_running", "Sequences in the worker (prefilling or decoding)", l).set(w.active);
  }
}

pipeline::~pipeline() {
  auto& im = *impl_;
  {
    std::lock_guard<std::mutex> lk(im.watch.mu);
    im.watch.stop = true;
  }
  im.watch.cv.notify_one();
  if (im.watch.thread.joinable()) im.watch.thread.join();
  // The root stops the pools (workers first) and the router; request actors then end with an
  // error (no router will come); ~actor_system waits for every actor and compute thread.
  caf::anon_send_exit(im.root, caf::exit_reason::user_shutdown);
  im.root = nullptr;
  if (im.cluster) caf::anon_send_exit(im.cluster, caf::exit_reason::user_shutdown);
  im.cluster = nullptr;
  if (im.store_pool) caf::anon_send_exit(im.store_pool, caf::exit_reason::user_shutdown);
  im.store_pool = nullptr;
  if (im.store) im.store->set(kv_store_actor{});
  im.sys.reset();
}

std::vector<token_id> prompt_ids(const tokenizer& tok, const generation_request& req) {
  if (!req.prompt_tokens.empty()) return req.prompt_tokens;
  tokenizer::specials add = req.add_special ? tok.file_specials() : tokenizer::specials{};
  if (req.add_bos) add.bos = *req.add_bos;
  return tok.encode(req.prompt, add, req.parse_special, req.literal_ranges);
}

namespace {

// Builds a request's spec; a request that cannot run gets its error event right away.
std::optional<request_spec> make_spec(connection_inbox& in, request_id id, const model& mdl,
                                      const generation_request& req) {
  request_spec spec;
  spec.id = id;
  spec.prompt = prompt_ids(mdl.tok(), req);
  spec.max_tokens = req.max_tokens;
  spec.sampling = req.sampling;
  spec.ignore_eos = req.ignore_eos;
  spec.client = in.client;
  status bad = spec.sampling.validate(mdl.config().n_vocab);
  if (bad.ok() && spec.prompt.empty()) bad = {errc::invalid_argument, "the prompt is empty"};
  if (bad.ok() && spec.max_tokens < 1) bad = {errc::invalid_argument, "max_tokens must be at least 1"};
  for (token_id t : spec.prompt)
    if (bad.ok() && (t < 0 || t >= mdl.config().n_vocab))
      bad = {errc::invalid_argument, "token id " + std::to_string(t) + " is outside the vocabulary"};
  if (bad.ok()) {
    std::lock_guard<std::mutex> lk(in.mu);
    in.unfinished.insert(id);
    return spec;
  }
  request_event ev = make_event(event_kind::error);
  ev.id = id;
  ev.code = bad.code();
  ev.message = bad.message();
  if (in.callback) {
    in.callback(ev);
  } else {
    {
      std::lock_guard<std::mutex> lk(in.mu);
      in.unfinished.insert(id);
      in.events.push_back(std::move(ev));
      in.cv.notify_all();
    }
    if (in.notify) in.notify();
  }
  return std::nullopt;
}

// The connection learns of the request before anything the request sends it can arrive; the
// router gets the submit from the caller's thread, so requests queue in the order they came.
void send_submit(connection_inbox& in, const root_actor& root, request_spec spec) {
  caf::anon_send(in.actor, submit_atom::value, spec.id);
  caf::anon_send(root, submit_atom::value, std::move(spec), caf::actor_cast<subscriber_actor>(in.actor));
}

}  // namespace

// A lone request: a connection of its own, whose actor ends with the request.
request_handle pipeline::submit(generation_request req) { return submit_notify(std::move(req), nullptr); }

request_id pipeline::submit(generation_request req, std::function<void(const request_event&)> on_event) {
  auto& im = *impl_;
  auto in = std::make_shared<connection_inbox>();
  in->callback = std::move(on_event);
  const request_id id = im.next_id++;
  if (auto spec = make_spec(*in, id, *im.mdl, req)) {
    in->actor = im.sys->spawn(connection_behavior, in, im.routers, true, im.live_connections);
    send_submit(*in, im.root, std::move(*spec));
  }
  return id;
}

request_handle pipeline::submit_notify(generation_request req, std::function<void()> on_ready) {
  auto& im = *impl_;
  request_handle h;
  h.in_ = std::make_shared<connection_inbox>();
  h.in_->notify = std::move(on_ready);
  h.id_ = im.next_id++;
  if (auto spec = make_spec(*h.in_, h.id_, *im.mdl, req)) {
    h.in_->actor = im.sys->spawn(connection_behavior, h.in_, im.routers, true, im.live_connections);
    send_submit(*h.in_, im.root, std::move(*spec));
  }
  return h;
}

connection pipeline::connect(std::function<void()> on_ready) {
  auto& im = *impl_;
  connection c;
  c.in_ = std::make_shared<connection_inbox>();
  c.in_->notify = std::move(on_ready);
  c.in_->client = im.next_client++;
  c.in_->actor = im.sys->spawn(connection_behavior, c.in_, im.routers, false, im.live_connections);
  c.pipe_ = this;
  return c;
}

connection::connection(connection&& o) noexcept : in_(std::move(o.in_)), pipe_(o.pipe_) { o.pipe_ = nullptr; }

connection& connection::operator=(connection&& o) noexcept {
  if (this != &o) {
    close();
    in_ = std::move(o.in_);
    pipe_ = o.pipe_;
    o.pipe_ = nullptr;
  }
  return *this;
}

connection::~connection() { close(); }

request_id connection::submit(generation_request req) {
  if (!in_ || !pipe_) throw failure(errc::invalid_argument, "submit on a closed connection");
  auto& im = *pipe_->impl_;
  const request_id id = im.next_id++;
  if (auto spec = make_spec(*in_, id, *im.mdl, req)) send_submit(*in_, im.root, std::move(*spec));
  return id;
}

bool connection::try_next(request_event& ev) { return in_ && inbox_try_next(*in_, ev); }

bool connection::next(request_event& ev, std::chrono::milliseconds timeout) {
  if (!in_) return false;
  return inbox_next(*in_, ev, timeout, [this] { return in_->unfinished.empty(); });
}

void connection::cancel(request_id id) {
  if (in_) caf::anon_send(in_->actor, cancel_atom::value, id);
}

void connection::abandon(request_id id) {
  if (in_) inbox_abandon(*in_, id);
}

size_t connection::unfinished() const {
  if (!in_) return 0;
  std::lock_guard<std::mutex> lk(in_->mu);
  return in_->unfinished.size();
}

// The actor's end is what cancels the requests: each request actor watches its subscriber.
void connection::close() {
  if (!in_) return;
  {
    std::lock_guard<std::mutex> lk(in_->mu);
    in_->events.clear();
  }
  if (in_->actor) caf::anon_send_exit(in_->actor, caf::exit_reason::user_shutdown);
  in_.reset();
  pipe_ = nullptr;
}

void pipeline::cancel(request_id id) {
  if (auto g = impl_->routers->gateway()) caf::anon_send(caf::actor_cast<root_actor>(g), cancel_atom::value, id);
}

bool pipeline::kill_worker(worker_kind pool, int index) { return !kill(actor_kind_of(pool), index).empty(); }

std::string pipeline::kill(const std::string& kind_or_name, int index, std::chrono::milliseconds within) {
  // A name as kill() returns it ("decode-1", "kv_link-p0-d1", "request-17"), a kind, or random.
  if (auto n = parse_actor_name(kind_or_name)) return kill(*n, within);
  if (auto k = parse_actor_kind(kind_or_name)) return kill(*k, index, within);
  if (kind_or_name != "random")
    throw failure(errc::invalid_argument,
                  "unknown kind '" + kind_or_name +
                      "' (prefill, decode, colocated, kv_link, kv_store, request, router, random, "
                      "or a name such as decode-1)");
  // Any kind this pipeline has; the router rarely (one in 20: it restarts everything below it).
  thread_local std::mt19937 rng{std::random_device{}()};
  if (std::uniform_int_distribution<int>(0, 19)(rng) == 0) return kill(actor_kind::router, -1, within);
  std::vector<actor_kind> pick;
  switch (impl_->cfg.pools.mode) {
    case serving_mode::disaggregated:
    case serving_mode::automatic:
      pick = {actor_kind::prefill, actor_kind::decode, actor_kind::kv_link, actor_kind::request};
      break;
    case serving_mode::colocated: pick = {actor_kind::colocated, actor_kind::request}; break;
  }
  return kill(pick[std::uniform_int_distribution<size_t>(0, pick.size() - 1)(rng)], -1, within);
}

namespace {
// A kill the router did not decide within the bound: nothing was killed, and the caller says so.
void throw_if_unanswered(const status& err, std::chrono::milliseconds within) {
  // The router drops a kill it reads after its deadline (kill_deadline), so "nothing killed"
  // stays true after the caller has given up: a late kill would land unasked for.
  if (err.code() == errc::timeout)
    throw failure(errc::timeout,
                  "the router did not answer within " + std::to_string(within.count()) + " ms: nothing killed");
}
}  // namespace

std::string pipeline::kill(actor_kind kind, int index, std::chrono::milliseconds within) {
  return kill_actor(kind, index, -1, within);
}

std::string pipeline::kill(const actor_name& name, std::chrono::milliseconds within) {
  switch (name.kind) {
    case actor_kind::request: return kill_request(request_id(name.index), within) ? name.str() : std::string();
    case actor_kind::kv_link: return kill_actor(name.kind, int32_t(name.index), name.decode, within);
    case actor_kind::prefill:
    case actor_kind::decode:
    case actor_kind::colocated: return kill_actor(name.kind, int32_t(name.index), -1, within);
    case actor_kind::router:
    case actor_kind::kv_store: return kill_actor(name.kind, -1, -1, within);
  }
  return {};
}

std::string pipeline::kill_actor(actor_kind kind, int32_t index, int32_t decode, std::chrono::milliseconds within) {
  auto& im = *impl_;
  if (kind == actor_kind::kv_store) {
    auto s = im.store ? im.store->get() : kv_store_actor{};
    if (!s) return {};
    caf::anon_send_exit(s, caf::exit_reason::kill);
    return actor_name{actor_kind::kv_store}.str();
  }
  auto router = im.routers->get();
  if (!router) return {};
  if (kind == actor_kind::router) {
    caf::anon_send_exit(router, caf::exit_reason::kill);
    return actor_name{actor_kind::router}.str();
  }
  std::string killed;
  status err;
  caf::scoped_actor self{*im.sys};
  self->request(router, within, kill_atom::value, kind, index, decode, kill_deadline(within))
      .receive([&](std::string& name) { killed = std::move(name); }, [&](caf::error& e) { err = from_caf_error(e); });
  throw_if_unanswered(err, within);
  return killed;
}

bool pipeline::kill_request(request_id id) { return kill_request(id, kill_wait); }

bool pipeline::kill_request(request_id id, std::chrono::milliseconds within) {
  auto& im = *impl_;
  auto router = im.routers->get();
  if (!router) return false;
  bool killed = false;
  status err;
  caf::scoped_actor self{*im.sys};
  self->request(router, within, kill_atom::value, id, kill_deadline(within))
      .receive([&](bool ok) { killed = ok; }, [&](caf::error& e) { err = from_caf_error(e); });
  throw_if_unanswered(err, within);
  return killed;
}

void pipeline::inject(fault_kind kind, int count, std::chrono::milliseconds stall) {
  if (kind == fault_kind::stall) impl_->faults->set_stall(stall);
  impl_->faults->arm(kind, count);
}

bool pipeline::degraded() {
  auto& im = *impl_;
  if (im.routers->gone()) return true;
  bool d = false;
  caf::scoped_actor self{*im.sys};
  self->request(im.root, std::chrono::seconds(10), degraded_atom::value)
      .receive([&](bool v) { d = v; }, [&](caf::error&) {});
  return d;
}

const model& pipeline::get_model() const { return *impl_->mdl; }
metrics::registry& pipeline::metrics() { return *impl_->metrics; }
const serving_config& pipeline::config() const { return impl_->cfg; }

pipeline_stats pipeline::stats(size_t listed_requests) {
  auto& im = *impl_;
  pipeline_stats out;
  caf::scoped_actor self{*im.sys};
  auto router = im.routers->get();
  if (!router) {  // between routers (a restart): nothing to ask
    out.live_requests = im.live->load();
    out.live_connections = im.live_connections->load();
    return out;
  }
  self->request(router, std::chrono::seconds(10), stats_atom::value)
      .receive(
          [&](std::vector<worker_stats>& ws) {
            for (auto& w : ws)
              out.workers.push_back({w.name, w.kv_total_blocks, w.kv_free_blocks, w.reserved_blocks, w.active, w.steps,
                                     w.max_batch, w.busy, w.step_sequences, w.step_prefill_tokens});
          },
          [&](caf::error&) {});
  self->request(router, std::chrono::seconds(10), state_atom::value, int32_t(listed_requests))
      .receive(
          [&](router_view& v) {
            out.prefill_queue = v.prefill_queue;
            out.decode_queue = v.decode_queue;
            for (size_t i = 0; i < v.by_state.size(); ++i)
              out.requests_by_state.emplace_back(std::string(to_string(request_state(i))), v.by_state[i]);
            const bool colocated = im.cfg.pools.mode == serving_mode::colocated;
            auto name = [](worker_kind kind, int32_t i) { return i < 0 ? std::string() : worker_name(kind, i).str(); };
            for (const auto& r : v.requests)
              out.requests.push_back({r.id, std::string(to_string(r.state)),
                                      name(colocated ? worker_kind::colocated : worker_kind::prefill, r.prefill_worker),
                                      name(worker_kind::decode, r.decode_worker), r.prompt_tokens, r.max_tokens});
            out.kv_links = v.links;
            out.retiring_kv_links = v.retiring_links;
          },
          [&](caf::error&) {});
  out.live_requests = im.live->load();
  out.live_connections = im.live_connections->load();
  return out;
}

}  // namespace tandem
