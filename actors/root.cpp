#include "actors/root.h"

namespace tandem {
namespace {

using self_ptr = root_actor::stateful_pointer<root_state>;

metrics::registry& reg(self_ptr self) { return *self->state.opts.router.request_ctx.metrics; }

metrics::gauge& router_degraded(self_ptr self) {
  return reg(self).get_gauge("tandem_pool_degraded", "1 when a pool exceeded its restart intensity", {{"pool", "router"}});
}

// A router, then the pools that serve it; submits it has not taken yet go to it in order.
void start_router(self_ptr self) {
  auto& st = self->state;
  auto ro = st.opts.router;
  ro.submits_taken = st.taken;
  st.router = self->spawn<caf::monitored>(router_behavior, std::move(ro));
  st.opts.directory->set(st.router);
  st.pools = st.opts.pools(self, st.router);
  for (auto& p : st.forwarded) self->send(st.router, submit_atom::value, p.spec, p.sub, p.seq);
}

void stop_children(self_ptr self, caf::exit_reason why) {
  auto& st = self->state;
  for (auto& p : st.pools) self->send_exit(p, why);
  st.pools.clear();
  if (st.router) self->send_exit(st.router, why);
}

// Submits the router has taken need not be kept.
void prune(self_ptr self) {
  auto& st = self->state;
  const uint64_t taken = st.taken->load();
  while (!st.forwarded.empty() && st.forwarded.front().seq <= taken) st.forwarded.pop_front();
}

void refuse(self_ptr self, const request_spec& spec, const subscriber_actor& sub) {
  request_event err = make_event(event_kind::error);
  err.id = spec.id;
  err.code = errc::worker_failed;
  err.message = "the router failed too often and is not restarted for now (the server is degraded; it tries again by itself)";
  self->send(sub, std::move(err));
}

}  // namespace

root_actor::behavior_type root_behavior(self_ptr self, root_options opts) {
  self->state.opts = std::move(opts);
  // Shutdown: no request waits for a router that will not come.
  self->attach_functor([dir = self->state.opts.directory] { dir->close(); });
  self->set_exit_handler([self](caf::exit_msg& em) {
    self->state.opts.directory->close();
    stop_children(self, caf::exit_reason::user_shutdown);
    self->quit(em.reason ? em.reason : caf::exit_reason::user_shutdown);
  });
  self->set_down_handler([self](caf::down_msg& dm) {
    auto& st = self->state;
    if (!st.router || dm.source != st.router.address()) return;
    st.router = nullptr;
    st.opts.directory->set(router_actor{});
    for (auto& p : st.pools) self->send_exit(p, caf::exit_reason::kill);  // rest_for_one
    st.pools.clear();
    prune(self);
    reg(self).get_counter("tandem_restarts_total", "Worker restarts by kind", {{"kind", "router"}}).inc();
    const auto now = std::chrono::steady_clock::now();
    std::erase_if(st.restarts, [&](auto t) { return now - t > st.opts.window; });
    if (int32_t(st.restarts.size()) >= st.opts.max_restarts) {
      st.degraded = true;
      st.opts.directory->close();
      router_degraded(self).set(1);
      for (auto& p : st.forwarded) refuse(self, p.spec, p.sub);
      st.forwarded.clear();
      // Tried again later, by itself: the wait doubles while degradations follow each other
      // (within ten of the last wait after a recovery), from recover_after up to its max.
      const bool soon_again = st.backoff.count() > 0 && now - st.recovered_at < 10 * st.backoff;
      st.backoff = soon_again ? std::min(2 * st.backoff, st.opts.recover_after_max) : st.opts.recover_after;
      self->delayed_send(self, st.backoff, recover_atom::value);
      return;
    }
    st.restarts.push_back(now);
    start_router(self);
  });
  self->state.opts.directory->set_gateway(caf::actor_cast<caf::actor>(self));
  start_router(self);
  return {
      [self](submit_atom, request_spec& spec, subscriber_actor& sub) {
        auto& st = self->state;
        if (st.degraded) return refuse(self, spec, sub);
        prune(self);
        const uint64_t seq = st.next_seq++;
        st.forwarded.push_back({seq, spec, sub});
        if (st.router) self->send(st.router, submit_atom::value, std::move(spec), std::move(sub), seq);
      },
      [self](cancel_atom, request_id id) {
        auto& st = self->state;
        if (st.router) return self->send(st.router, cancel_atom::value, id);
        // Between routers: a submit still held here ends now.
        auto it = std::find_if(st.forwarded.begin(), st.forwarded.end(), [&](auto& p) { return p.spec.id == id; });
        if (it == st.forwarded.end()) return;
        request_event done = make_event(event_kind::done);
        done.id = id;
        done.finish_reason = finish_reason::cancelled;
        self->send(it->sub, std::move(done));
        st.forwarded.erase(it);
      },
      [self](degraded_atom) { return self->state.degraded; },
      [self](recover_atom) {
        auto& st = self->state;
        if (!st.degraded) return;
        st.degraded = false;
        st.restarts.clear();
        st.recovered_at = std::chrono::steady_clock::now();
        router_degraded(self).set(0);
        reg(self).get_counter("tandem_router_recoveries_total", "Times the router was started again after it was degraded").inc();
        st.opts.directory->reopen(caf::actor_cast<caf::actor>(self));
        start_router(self);
      },
  };
}

}  // namespace tandem
