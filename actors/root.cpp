#include "actors/root.h"

#include "actors/error.h"

#include "runtime/oplog.h"

namespace tandem {
namespace {

using self_ptr = root_actor::stateful_pointer<root_state>;

metrics::registry& reg(self_ptr self) { return *self->state.opts.router.request_ctx.metrics; }

pool_health health(self_ptr self) { return {&reg(self), "router"}; }

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
  err.message =
      "the router failed too often and is not restarted for now (the server is degraded; it tries again by itself)";
  // Retrying helps once the backoff is over (HTTP Retry-After, the WebSocket's retry_after_ms).
  const auto left =
      std::chrono::duration<double, std::milli>(self->state.intensity.degraded_since() +
                                                self->state.intensity.backoff() - std::chrono::steady_clock::now())
          .count();
  err.retry_after_ms = std::max(1000.0, left);
  self->send(sub, std::move(err));
}

}  // namespace

root_actor::behavior_type root_behavior(self_ptr self, root_options opts) {
  self->state.opts = std::move(opts);
  {
    auto& o = self->state.opts;
    self->state.intensity = restart_intensity(
        {o.max_restarts, o.window, std::max(std::chrono::milliseconds(1), o.recover_after), o.recover_after_max});
  }
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
    const std::string reason = exit_reason_text(dm.reason);
    switch (st.intensity.failed(std::chrono::steady_clock::now())) {
      case restart_intensity::verdict::restart:
        // rest_for_one: its pools (and their workers) start again with it.
        oplog::event(oplog::level::warn, "restart", {{"actor", "router"}, {"reason", reason}});
        return start_router(self);
      case restart_intensity::verdict::degrade:
      case restart_intensity::verdict::ignore:  // (not reached: no router runs while degraded)
        break;
    }
    health(self).degraded("router", reason, st.opts.max_restarts, st.opts.window, st.intensity);
    st.opts.directory->close();
    for (auto& p : st.forwarded) refuse(self, p.spec, p.sub);
    st.forwarded.clear();
    // Tried again later, by itself, after the policy's backoff.
    self->delayed_send(self, st.intensity.backoff(), recover_atom::value);
  });
  self->state.opts.directory->set_gateway(caf::actor_cast<caf::actor>(self));
  health(self).set(false);
  start_router(self);
  return {
      [self](submit_atom, request_spec& spec, subscriber_actor& sub) {
        auto& st = self->state;
        if (st.intensity.degraded()) return refuse(self, spec, sub);
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
      [self](degraded_atom) { return self->state.intensity.degraded(); },
      [self](recover_atom) {
        auto& st = self->state;
        if (!st.intensity.degraded()) return;
        st.intensity.recover(std::chrono::steady_clock::now());
        health(self).recovered(st.intensity);
        st.opts.directory->reopen(caf::actor_cast<caf::actor>(self));
        start_router(self);
      },
  };
}

}  // namespace tandem
