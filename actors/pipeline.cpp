#include "actors/pipeline.h"

#include <condition_variable>
#include <deque>
#include <mutex>

#include "actors/colocated_worker.h"
#include "actors/decode_worker.h"
#include "actors/error.h"
#include "actors/prefill_worker.h"
#include "actors/router.h"
#include "actors/supervisor.h"
#include "runtime/synth.h"

namespace tandem {

// What a request handle and its bridge actor share.
struct handle_state {
  request_id id = 0;
  router_actor router;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<request_event> events;
  request_actor request;     // learned from the accepted event; gets the credits back
  bool closed = false;       // the final event has been returned to the reader
  std::function<void(const request_event&)> callback;
  std::function<void()> notify;  // events queued: the reader may take them (try_next)
  bool abandoned = false;        // nobody reads any more: credits go straight back
};

namespace {

bool is_final(const request_event& ev) { return ev.kind == event_kind::done || ev.kind == event_kind::error; }

struct bridge_state {
  std::shared_ptr<handle_state> hs;
  bool final_seen = false;
  static inline const char* name = "subscriber";
};

// Carries a request's events from its actor to the handle's queue (or callback). Credits go
// back as the reader consumes, so a reader that stops reading stops its request, nothing else.
subscriber_actor::behavior_type bridge(subscriber_actor::stateful_pointer<bridge_state> self,
                                       std::shared_ptr<handle_state> hs) {
  self->state.hs = std::move(hs);
  self->set_down_handler([self](caf::down_msg&) {
    // The request actor ended without a final event (killed): say so rather than hang.
    if (self->state.final_seen) return;
    request_event ev = make_event(event_kind::error);
    ev.id = self->state.hs->id;
    ev.code = errc::worker_failed;
    ev.message = "the request's actor ended unexpectedly";
    auto& hs = *self->state.hs;
    if (hs.callback) {
      hs.callback(ev);
    } else {
      {
        std::lock_guard<std::mutex> lk(hs.mu);
        hs.events.push_back(std::move(ev));
        hs.cv.notify_all();
      }
      if (hs.notify) hs.notify();
    }
    self->quit();
  });
  return {
      [self](request_event& ev) {
        auto& hs = *self->state.hs;
        const bool final = is_final(ev);
        self->state.final_seen = self->state.final_seen || final;
        if (ev.kind == event_kind::accepted) {
          auto req = caf::actor_cast<request_actor>(self->current_sender());
          self->monitor(req);
          std::lock_guard<std::mutex> lk(hs.mu);
          hs.request = req;
        }
        bool abandoned = false;
        {
          std::lock_guard<std::mutex> lk(hs.mu);
          abandoned = hs.abandoned;
        }
        if (abandoned) {  // the reader is gone: let the request run out instead of waiting for it
          if (!final && hs.request) self->send(hs.request, credit_atom::value, int32_t(1));
        } else if (hs.callback) {
          hs.callback(ev);
          if (!final && hs.request) self->send(hs.request, credit_atom::value, int32_t(1));
        } else {
          {
            std::lock_guard<std::mutex> lk(hs.mu);
            hs.events.push_back(std::move(ev));
            hs.cv.notify_all();
          }
          if (hs.notify) hs.notify();
        }
        if (final) self->quit();
      },
  };
}

// Pops the oldest queued event (hs.mu held); returns the request actor owed a credit for it
// (none for the final event, which also closes the handle).
request_actor take_front(handle_state& hs, request_event& ev) {
  ev = std::move(hs.events.front());
  hs.events.pop_front();
  if (!is_final(ev)) return hs.request;
  hs.closed = true;
  return {};
}

}  // namespace

request_id request_handle::id() const { return st_ ? st_->id : 0; }

bool request_handle::next(request_event& ev, std::chrono::milliseconds timeout) {
  if (!st_) return false;
  request_actor credit_to;
  {
    std::unique_lock<std::mutex> lk(st_->mu);
    if (st_->closed) return false;
    if (!st_->cv.wait_for(lk, timeout, [&] { return !st_->events.empty(); })) return false;
    credit_to = take_front(*st_, ev);
  }
  if (credit_to) caf::anon_send(credit_to, credit_atom::value, int32_t(1));
  return true;
}

bool request_handle::try_next(request_event& ev) {
  if (!st_) return false;
  request_actor credit_to;
  {
    std::lock_guard<std::mutex> lk(st_->mu);
    if (st_->closed || st_->events.empty()) return false;
    credit_to = take_front(*st_, ev);
  }
  if (credit_to) caf::anon_send(credit_to, credit_atom::value, int32_t(1));
  return true;
}

bool request_handle::finished() const {
  if (!st_) return true;
  std::lock_guard<std::mutex> lk(st_->mu);
  return st_->closed;
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
  if (r.finish_reason.empty() && r.error == errc::ok) {
    r.error = errc::io_error;
    r.message = "timed out waiting for the request to finish";
  }
  return r;
}

void request_handle::cancel() {
  if (st_) caf::anon_send(st_->router, cancel_atom::value, st_->id);
}

void request_handle::abandon() {
  if (!st_) return;
  request_actor credit_to;
  int32_t unread = 0;
  {
    std::lock_guard<std::mutex> lk(st_->mu);
    st_->abandoned = true;
    for (const auto& ev : st_->events) unread += is_final(ev) ? 0 : 1;
    st_->events.clear();
    st_->closed = true;
    credit_to = st_->request;
  }
  if (credit_to && unread > 0) caf::anon_send(credit_to, credit_atom::value, unread);
  cancel();
}

struct pipeline::impl {
  pipeline_config cfg;
  std::shared_ptr<const model> mdl;
  std::shared_ptr<metrics::registry> metrics = std::make_shared<metrics::registry>();
  std::shared_ptr<std::atomic<int64_t>> live = std::make_shared<std::atomic<int64_t>>(0);
  caf::actor_system_config sys_cfg;
  std::unique_ptr<caf::actor_system> sys;
  router_actor router;
  std::vector<caf::actor> pools;
  std::atomic<request_id> next_id{1};

  worker_options worker_opts(int32_t index, int32_t budget) const {
    worker_options o;
    o.index = index;
    o.n_threads = cfg.threads_per_worker;
    o.block_size = cfg.block_size;
    o.kv_blocks = cfg.kv_blocks_per_worker;
    o.kv_memory_bytes = cfg.kv_memory_bytes_per_worker;
    o.token_budget = budget;
    o.chunk_size = cfg.chunk_size;
    o.stream_kv = cfg.stream_kv;
    o.stream_layer_group = cfg.stream_layer_group;
    o.max_batch = cfg.max_batch;
    o.metrics = metrics;
    return o;
  }
};

pipeline::pipeline(pipeline_config cfg) : impl_(std::make_unique<impl>()) {
  auto& im = *impl_;
  im.cfg = std::move(cfg);
  if (im.cfg.prefill_workers < 1 || im.cfg.decode_workers < 1 || im.cfg.colocated_workers < 1 ||
      im.cfg.threads_per_worker < 1 || im.cfg.block_size < 1 || im.cfg.max_batch < 1)
    throw failure(errc::invalid_argument, "worker counts, threads, block size and batch size must be positive");
  im.mdl = im.cfg.loaded_model ? im.cfg.loaded_model
                        : model::load(im.cfg.model_path.empty() ? default_model_path() : im.cfg.model_path);
  im.sys_cfg.set("scheduler.max-threads", std::max(1, im.cfg.scheduler_threads));
  register_error_category(im.sys_cfg);
  im.sys = std::make_unique<caf::actor_system>(im.sys_cfg);

  router_options ro;
  ro.mode = im.cfg.mode;
  ro.admission = im.cfg.admission;
  ro.block_size = im.cfg.block_size;
  ro.context_length = im.mdl->config().n_ctx;
  ro.dispatch_tokens = std::max(im.cfg.prefill_token_budget, im.cfg.colocated_token_budget) * 2;
  if (im.cfg.kv_transport != "handoff" && im.cfg.kv_transport != "local" && im.cfg.kv_transport != "shm")
    throw failure(errc::invalid_argument, "kv_transport must be handoff, local or shm (not '" + im.cfg.kv_transport + "')");
  ro.kv_transport = im.cfg.kv_transport;
  ro.admission_policy_impl = im.cfg.admission_policy_impl;
  ro.prefill_policy = im.cfg.prefill_policy;
  ro.decode_policy = im.cfg.decode_policy;
  ro.request_ctx = {im.mdl, im.metrics, im.live, {}};
  im.router = im.sys->spawn(router_behavior, ro);

  auto mdl = im.mdl;
  auto router = im.router;
  impl* ip = impl_.get();
  auto add_pool = [&](const std::string& kind, int n, worker_spawner spawner) {
    im.pools.push_back(im.sys->spawn(pool_supervisor, pool_options{kind, n, 5, std::chrono::milliseconds(10000), im.metrics},
                                     std::move(spawner)));
  };
  if (im.cfg.mode == serving_mode::disaggregated) {
    add_pool("decode", im.cfg.decode_workers, [ip, mdl, router](caf::event_based_actor* self, int32_t i) {
      auto w = self->spawn<caf::monitored>(decode_worker_behavior, mdl, ip->worker_opts(i, 0), router);
      self->send(router, join_atom::value, i, w);
      return caf::actor_cast<caf::actor>(w);
    });
    add_pool("prefill", im.cfg.prefill_workers, [ip, mdl, router](caf::event_based_actor* self, int32_t i) {
      auto w = self->spawn<caf::monitored>(prefill_worker_behavior, mdl,
                                           ip->worker_opts(i, ip->cfg.prefill_token_budget), router);
      self->send(router, join_atom::value, i, w);
      return caf::actor_cast<caf::actor>(w);
    });
  } else {
    add_pool("colocated", im.cfg.colocated_workers, [ip, mdl, router](caf::event_based_actor* self, int32_t i) {
      auto w = self->spawn<caf::monitored>(colocated_worker_behavior, mdl,
                                           ip->worker_opts(i, ip->cfg.colocated_token_budget), router);
      self->send(router, join_atom::value, i, w);
      return caf::actor_cast<caf::actor>(w);
    });
  }
}

pipeline::~pipeline() {
  auto& im = *impl_;
  // Workers first (their requests fail with worker_failed... or end), then the router, whose
  // request actors are linked to it; ~actor_system waits for every actor and compute thread.
  for (auto& p : im.pools) caf::anon_send_exit(p, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(im.router, caf::exit_reason::user_shutdown);
  im.router = nullptr;
  im.pools.clear();
  im.sys.reset();
}

namespace {

// Both submit overloads: build the spec, refuse a bad request with an error event (to the
// queue or the callback), else hand it to the router with a bridge carrying its events.
void start_request(caf::actor_system& sys, const router_actor& router, const model& mdl,
                   const std::shared_ptr<handle_state>& hs, const generation_request& req) {
  request_spec spec;
  spec.id = hs->id;
  spec.prompt = req.prompt_tokens.empty() ? mdl.tok().encode(req.prompt, req.add_bos) : req.prompt_tokens;
  spec.max_tokens = req.max_tokens;
  spec.sampling = req.sampling;
  spec.ignore_eos = req.ignore_eos;
  status bad = spec.sampling.validate();
  if (bad.ok() && spec.prompt.empty()) bad = {errc::invalid_argument, "the prompt is empty"};
  if (bad.ok() && spec.max_tokens < 1) bad = {errc::invalid_argument, "max_tokens must be at least 1"};
  for (token_id t : spec.prompt)
    if (bad.ok() && (t < 0 || t >= mdl.config().n_vocab))
      bad = {errc::invalid_argument, "token id " + std::to_string(t) + " is outside the vocabulary"};
  if (!bad.ok()) {
    request_event ev = make_event(event_kind::error);
    ev.id = hs->id;
    ev.code = bad.code();
    ev.message = bad.message();
    if (hs->callback) {
      hs->callback(ev);
    } else {
      {
        std::lock_guard<std::mutex> lk(hs->mu);
        hs->events.push_back(std::move(ev));
      }
      if (hs->notify) hs->notify();
    }
    return;
  }
  auto sub = sys.spawn(bridge, hs);
  caf::anon_send(router, submit_atom::value, std::move(spec), sub);
}

}  // namespace

request_handle pipeline::submit(generation_request req) {
  auto& im = *impl_;
  auto hs = std::make_shared<handle_state>();
  hs->id = im.next_id++;
  hs->router = im.router;
  start_request(*im.sys, im.router, *im.mdl, hs, req);
  request_handle h;
  h.st_ = hs;
  return h;
}

request_id pipeline::submit(generation_request req, std::function<void(const request_event&)> on_event) {
  auto& im = *impl_;
  auto hs = std::make_shared<handle_state>();
  hs->id = im.next_id++;
  hs->router = im.router;
  hs->callback = std::move(on_event);
  start_request(*im.sys, im.router, *im.mdl, hs, req);
  return hs->id;
}

request_handle pipeline::submit_notify(generation_request req, std::function<void()> on_ready) {
  auto& im = *impl_;
  auto hs = std::make_shared<handle_state>();
  hs->id = im.next_id++;
  hs->router = im.router;
  hs->notify = std::move(on_ready);
  request_handle h;
  h.st_ = hs;
  start_request(*im.sys, im.router, *im.mdl, hs, req);
  return h;
}

void pipeline::cancel(request_id id) { caf::anon_send(impl_->router, cancel_atom::value, id); }

bool pipeline::kill_worker(const std::string& pool, int index) {
  auto& im = *impl_;
  if (pool != "prefill" && pool != "decode" && pool != "colocated")
    throw failure(errc::invalid_argument, "unknown pool '" + pool + "' (prefill, decode, colocated)");
  bool killed = false;
  caf::scoped_actor self{*im.sys};
  self->request(im.router, std::chrono::seconds(10), kill_atom::value, pool != "decode", int32_t(index))
      .receive([&](bool ok) { killed = ok; }, [&](caf::error&) {});
  return killed;
}

const model& pipeline::get_model() const { return *impl_->mdl; }
metrics::registry& pipeline::metrics() { return *impl_->metrics; }
const pipeline_config& pipeline::config() const { return impl_->cfg; }

pipeline_stats pipeline::stats() {
  auto& im = *impl_;
  pipeline_stats out;
  caf::scoped_actor self{*im.sys};
  self->request(im.router, std::chrono::seconds(10), stats_atom::value)
      .receive(
          [&](std::vector<worker_stats>& ws) {
            for (auto& w : ws)
              out.workers.push_back({w.name, w.kv_total_blocks, w.kv_free_blocks, w.reserved_blocks, w.active, w.steps});
          },
          [&](caf::error&) {});
  self->request(im.router, std::chrono::seconds(10), state_atom::value)
      .receive(
          [&](std::vector<int32_t>& v) {
            if (v.size() < 2) return;
            out.prefill_queue = v[0];
            out.decode_queue = v[1];
            for (size_t i = 2; i < v.size(); ++i)
              out.requests_by_state.emplace_back(std::string(to_string(request_state(i - 2))), v[i]);
          },
          [&](caf::error&) {});
  out.live_requests = im.live->load();
  return out;
}

}  // namespace tandem
