#include "actors/request.h"

namespace tandem {

namespace {

using self_ptr = request_actor::stateful_pointer<request_actor_state>;

double ms_between(steady::time_point a, steady::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// Sends what the credits allow; a terminal request quits once everything is delivered.
void flush(self_ptr self) {
  auto& st = self->state;
  while (!st.buffered.empty() && st.credits > 0) {
    self->send(st.subscriber, std::move(st.buffered.front()));
    st.buffered.pop_front();
    --st.credits;
  }
  const auto& cfg = st.ctx.config;
  if (!is_terminal(st.state)) {
    // A slow consumer slows only its own request: past the bound, its worker skips it.
    if (!st.paused && int32_t(st.buffered.size()) >= cfg.pause_above) {
      st.paused = true;
      self->send(st.router, pause_atom::value, st.spec.id, true);
    } else if (st.paused && int32_t(st.buffered.size()) <= cfg.resume_below) {
      st.paused = false;
      self->send(st.router, pause_atom::value, st.spec.id, false);
    }
  } else if (st.buffered.empty()) {
    self->quit();
  }
}

void emit(self_ptr self, request_event ev) {
  ev.id = self->state.spec.id;
  self->state.buffered.push_back(std::move(ev));
  flush(self);
}

metrics::request_timings timings_of(const request_actor_state& st, steady::time_point now) {
  metrics::request_timings t;
  t.prompt_tokens = int32_t(st.spec.prompt.size());
  t.output_tokens = int32_t(st.generated.size());
  t.e2e_ms = ms_between(st.t_submit, now);
  if (st.prefill_started) {
    t.queue_prefill_ms = ms_between(st.t_submit, st.t_prefill_start);
    if (!st.generated.empty()) {
      t.prefill_ms = ms_between(st.t_prefill_start, st.t_first_token);
      t.ttft_ms = ms_between(st.t_submit, st.t_first_token);
    }
  }
  if (st.generated.size() > 1)
    t.tpot_ms = ms_between(st.t_first_token, st.t_last_token) / double(st.generated.size() - 1);
  if (st.decode_started) {
    t.handoff_ms = ms_between(st.t_first_token, st.t_decode_start);
    t.queue_decode_ms = std::max(0.0, t.handoff_ms - st.kv_ms);
    t.decode_ms = ms_between(st.t_decode_start, now);
  }
  t.kv_bytes = st.kv_bytes;
  t.kv_transfer_ms = st.kv_ms;
  t.cached_tokens = st.cached_tokens;
  t.prefill_worker = st.prefill_worker;
  t.decode_worker = st.decode_worker;
  return t;
}

// Ends the request: final event, metrics, the router forgets it; the actor quits once the
// subscriber has taken every event.
void finish(self_ptr self, request_state end, request_event final_event) {
  auto& st = self->state;
  if (is_terminal(st.state)) return;
  st.state = end;
  const auto now = steady::now();
  const auto t = timings_of(st, now);
  final_event.timings = t;
  metrics::record_request(*st.ctx.metrics, t,
                          end == request_state::finished ? "finished"
                          : end == request_state::failed ? "failed"
                                                         : "cancelled");
  // The router frees what the request holds on its workers (if it did not end there).
  self->send(st.router, forget_atom::value, st.spec.id, end, t.tpot_ms);
  emit(self, std::move(final_event));
}

// Output token #index: emitted exactly once, in order (a repeated index is dropped, a gap is a
// bug upstream).
void on_token(self_ptr self, int32_t index, token_id tok, const token_logprobs* lp) {
  auto& st = self->state;
  if (is_terminal(st.state)) return;
  if (index < int32_t(st.generated.size())) return;
  if (index > int32_t(st.generated.size())) {
    request_event err = make_event(event_kind::error);
    err.code = errc::invalid_argument;
    err.message = "token " + std::to_string(index) + " arrived before token " + std::to_string(st.generated.size());
    finish(self, request_state::failed, std::move(err));
    return;
  }
  const auto now = steady::now();
  if (st.generated.empty()) st.t_first_token = now;
  st.t_last_token = now;
  st.generated.push_back(tok);
  request_event ev = make_event(event_kind::token);
  ev.index = index;
  ev.token = tok;
  ev.text = st.decoder->push(tok);
  if (lp) ev.logprobs = *lp;
  emit(self, std::move(ev));
}

// A lifecycle step: the first prefill and the first decode start the phases' clocks.
void on_state(self_ptr self, request_state s) {
  auto& st = self->state;
  if (is_terminal(st.state)) return;
  st.state = s;
  if (s == request_state::prefilling && !st.prefill_started) {
    st.prefill_started = true;
    st.t_prefill_start = steady::now();
  } else if (s == request_state::decoding && !st.decode_started) {
    st.decode_started = true;
    st.t_decode_start = steady::now();
  }
}

// No router will take this request any more: it ends (and so does its actor).
void router_gone(self_ptr self) {
  if (!is_terminal(self->state.state)) {
    request_event err = make_event(event_kind::error);
    err.code = errc::worker_failed;
    err.message = "the router ended";
    finish(self, request_state::failed, std::move(err));
  }
  self->quit();
}

}  // namespace

request_actor::behavior_type request_behavior(self_ptr self, request_spec spec, subscriber_actor subscriber,
                                              router_actor router, request_context ctx, int32_t queue_position) {
  auto& st = self->state;
  st.spec = std::move(spec);
  st.subscriber = std::move(subscriber);
  st.router = std::move(router);
  st.ctx = std::move(ctx);
  st.decoder = std::make_unique<stream_decoder>(st.ctx.mdl->tok());
  st.credits = st.ctx.config.initial_credits;
  st.t_submit = steady::now();
  ++*st.ctx.live_requests;
  self->attach_functor([live = st.ctx.live_requests] { --*live; });
  // A subscriber that goes away cancels its request: nobody would read the tokens.
  self->monitor(st.subscriber);
  self->set_down_handler([self](caf::down_msg& dm) {
    if (dm.source == self->state.subscriber.address()) {
      self->state.buffered.clear();
      if (!is_terminal(self->state.state)) {
        request_event ev = make_event(event_kind::done);
        ev.finish_reason = finish_reason::cancelled;
        finish(self, request_state::cancelled, std::move(ev));
      }
      self->quit();
    } else if (dm.source == self->state.router.address()) {
      // The router died. If the root restarts it, this request joins the new one with every
      // token it has (its workers were restarted with the router); else it ends.
      if (!is_terminal(self->state.state) && self->state.ctx.routers && !self->state.ctx.routers->gone()) {
        self->state.rejoin_since = steady::now();
        self->send(self, rejoin_atom::value);
        return;
      }
      router_gone(self);
    }
  });
  self->monitor(st.router);
  request_event accepted;
  accepted.kind = event_kind::accepted;
  accepted.queue_position = queue_position;
  emit(self, accepted);

  return {
      [self](state_atom, request_state s) { on_state(self, s); },
      [self](state_atom, request_state s, const std::string& worker, int32_t cached) {
        auto& st = self->state;
        if (is_terminal(st.state)) return;
        if (s == request_state::prefilling) {
          st.prefill_worker = worker;
          st.cached_tokens = cached;
        }
        if (s == request_state::decoding) st.decode_worker = worker;
        on_state(self, s);
      },
      [self](token_atom, int32_t index, token_id tok) { on_token(self, index, tok, nullptr); },
      [self](token_atom, int32_t index, token_id tok, const token_logprobs& lp) { on_token(self, index, tok, &lp); },
      [self](kv_atom, uint64_t bytes, double ms) {
        self->state.kv_bytes += bytes;
        self->state.kv_ms += ms;
      },
      [self](done_atom, finish_reason reason) {
        auto& st = self->state;
        if (is_terminal(st.state)) return;
        // Whatever the decoder still holds (an incomplete character) ends the text.
        if (std::string tail = st.decoder->flush(); !tail.empty()) {
          request_event ev = make_event(event_kind::token);
          ev.index = int32_t(st.generated.size()) - 1;
          ev.token = -1;
          ev.text = std::move(tail);
          emit(self, std::move(ev));
        }
        request_event done = make_event(event_kind::done);
        done.finish_reason = reason;
        finish(self, request_state::finished, std::move(done));
      },
      [self](fail_atom, errc code, const std::string& message) {
        request_event err = make_event(event_kind::error);
        err.code = code;
        err.message = message;
        finish(self, request_state::failed, std::move(err));
      },
      [self](credit_atom, int32_t n) {
        self->state.credits += std::max(0, n);
        flush(self);
      },
      [self](resume_atom) {
        const auto& st = self->state;
        return is_terminal(st.state) ? std::vector<token_id>{} : st.generated;
      },
      [self](rejoin_atom) {
        auto& st = self->state;
        if (is_terminal(st.state)) return;
        const auto& dir = *st.ctx.routers;
        auto next = dir.get();
        if (next && next != st.router) {
          st.router = next;
          st.rejoin_since = {};
          self->monitor(st.router);
          self->send(st.router, rejoin_atom::value, st.spec, st.generated, caf::actor_cast<request_actor>(self));
          st.paused = false;  // the new router knows no pause: the next event asks again
          return;
        }
        if (dir.gone() || steady::now() - st.rejoin_since > st.ctx.rejoin_timeout) return router_gone(self);
        self->delayed_send(self, std::chrono::milliseconds(10), rejoin_atom::value);
      },
      [self](cancel_atom) {
        auto& st = self->state;
        if (is_terminal(st.state)) return;
        request_event done = make_event(event_kind::done);
        done.finish_reason = finish_reason::cancelled;
        finish(self, request_state::cancelled, std::move(done));
      },
  };
}

}  // namespace tandem
