#include "actors/connection.h"

namespace tandem {

namespace {

using self_ptr = connection_actor::stateful_pointer<connection_state>;

bool is_final(const request_event& ev) { return ev.kind == event_kind::done || ev.kind == event_kind::error; }

// Hands one event to the reader (queue or callback). Events of an abandoned request are not
// kept: their credit goes straight back so the request runs out instead of waiting.
void deliver(self_ptr self, request_event ev) {
  auto& in = *self->state.inbox;
  const bool final = is_final(ev);
  const request_id id = ev.id;
  bool credit_now = false;
  if (in.callback) {
    std::unique_lock<std::mutex> lk(in.mu);
    const bool abandoned = in.abandoned.count(id) > 0;
    if (final) {
      in.abandoned.erase(id);
      in.unfinished.erase(id);
    }
    lk.unlock();
    if (!abandoned) in.callback(ev);
    credit_now = !final;
  } else {
    {
      std::lock_guard<std::mutex> lk(in.mu);
      if (in.abandoned.count(id) > 0) {
        credit_now = !final;
        if (final) {
          in.abandoned.erase(id);
          in.unfinished.erase(id);
        }
      } else {
        in.events.push_back(std::move(ev));
        in.cv.notify_all();
      }
    }
    if (!credit_now && in.notify) in.notify();
  }
  if (credit_now) {
    auto it = self->state.requests.find(id);
    if (it != self->state.requests.end()) self->send(it->second, credit_atom::value, int32_t(1));
  }
}

void request_over(self_ptr self, request_id id) {
  auto& st = self->state;
  st.open.erase(id);
  if (auto it = st.requests.find(id); it != st.requests.end()) {
    self->demonitor(it->second.address());
    st.requests.erase(it);
  }
  if (st.end_when_idle && st.open.empty()) self->quit();
}

}  // namespace

connection_actor::behavior_type connection_behavior(self_ptr self, std::shared_ptr<connection_inbox> inbox,
                                                    std::shared_ptr<router_directory> routers, bool end_when_idle,
                                                    std::shared_ptr<std::atomic<int64_t>> live_connections) {
  auto& st = self->state;
  ++*live_connections;
  self->attach_functor([live_connections] { --*live_connections; });
  st.inbox = std::move(inbox);
  st.routers = std::move(routers);
  st.end_when_idle = end_when_idle;
  // A request actor that ends without a final event (killed) gets one here, so that no
  // reader waits for it forever.
  self->set_down_handler([self](caf::down_msg& dm) {
    auto& st = self->state;
    for (auto& [id, req] : st.requests) {
      if (req.address() != dm.source) continue;
      const request_id gone = id;
      request_event ev = make_event(event_kind::error);
      ev.id = gone;
      ev.code = errc::worker_failed;
      ev.message = "the request's actor ended unexpectedly";
      deliver(self, std::move(ev));
      request_over(self, gone);
      return;
    }
  });
  return {
      [self](request_event& ev) {
        auto& st = self->state;
        if (ev.kind == event_kind::accepted) {
          auto req = caf::actor_cast<request_actor>(self->current_sender());
          self->monitor(req);
          st.requests[ev.id] = std::move(req);
        }
        const bool final = is_final(ev);
        const request_id id = ev.id;
        deliver(self, std::move(ev));
        if (final) request_over(self, id);
      },
      [self](submit_atom, request_id id) { self->state.open.insert(id); },
      [self](credit_atom, request_id id, int32_t n) {
        auto it = self->state.requests.find(id);
        if (it != self->state.requests.end() && n > 0) self->send(it->second, credit_atom::value, n);
      },
      [self](cancel_atom, request_id id) {
        auto& st = self->state;
        if (st.open.count(id) == 0) return;
        if (auto it = st.requests.find(id); it != st.requests.end()) self->send(it->second, cancel_atom::value);
        else if (auto g = st.routers->gateway()) caf::anon_send(g, cancel_atom::value, id);
      },
  };
}

}  // namespace tandem
