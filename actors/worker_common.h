#pragma once
// What the three worker actors share: their state, and the translation between the worker
// core (runtime/scheduler/worker_core.h) and CAF. A worker actor turns its messages into the
// core's events (on_event) and carries out the commands that come back (execute): sends,
// replies by ticket, store asks, steps on its compute thread. Its options and engine are in
// worker_engine.h, its dealings with the host KV store in worker_store.h.
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "actors/error.h"
#include "actors/protocol.h"
#include "actors/worker_engine.h"
#include "actors/worker_store.h"
#include "runtime/scheduler/worker_core.h"

namespace tandem {

struct worker_state_base {
  worker_options opts;
  router_actor router;
  std::unique_ptr<worker_engine> we;
  std::unique_ptr<engine_adapter> port;  // the core's view of the engine
  std::unique_ptr<sched::worker_core> core;  // everything it decides about its requests
  // What the core names by number: request handles by id, replies by ticket, links by id.
  std::map<request_id, request_actor> requests;
  std::map<uint64_t, caf::typed_response_promise<bool>> replies;
  uint64_t next_ticket = 1;
  std::map<caf::actor_addr, sched::worker::link_id> link_ids;
  std::vector<kv_link_actor> links;  // by link id - 1 (links are few: replaced ones keep theirs)
  prefix_cache_stats prefix_last;  // the engine's prefix-cache counters at the last report
};

namespace worker_actor {

namespace wk = sched::worker;

template <class Self>
void kick(Self self);

template <class Self>
void on_event(Self self, const wk::event& e);

template <class Self>
request_actor request_of(Self self, request_id id) {
  auto it = self->state.requests.find(id);
  return it == self->state.requests.end() ? request_actor{} : it->second;
}

template <class Self>
kv_link_actor link_of(Self self, wk::link_id id) {
  auto& links = self->state.links;
  return id > 0 && id <= links.size() ? links[id - 1] : kv_link_actor{};
}

template <class Self>
wk::link_id link_id_of(Self self, const kv_link_actor& link) {
  if (!link) return 0;
  auto& st = self->state;
  auto [it, fresh] = st.link_ids.try_emplace(link.address(), st.links.size() + 1);
  if (fresh) st.links.push_back(link);
  return it->second;
}

// A reply the core gives by ticket, now or later.
template <class Self>
uint64_t await_answer(Self self, caf::typed_response_promise<bool> rp) {
  auto& st = self->state;
  const uint64_t ticket = st.next_ticket++;
  st.replies.emplace(ticket, std::move(rp));
  return ticket;
}

template <class Self>
void report_load(Self self) {
  auto& st = self->state;
  if (st.opts.kind == worker_kind::decode) {
    self->send(st.router, load_atom::value, st.core->decode_load(st.opts.index));
    return;
  }
  prefill_worker_load l;  // a prefill or colocated worker: its prompts still to compute
  l.worker = st.opts.index;
  l.alive = true;
  const sched::prompt_load p = st.core->waiting_load();
  l.queued_tokens = p.tokens;
  l.queued_requests = p.requests;
  self->send(st.router, load_atom::value, l);
}

// A try of a transfer answered: delivered, or failed (the link or its decode worker died, or
// decode refused a corrupted or incomplete set).
template <class Self>
void transfer_answered(Self self, request_id id, wk::link_id link, const status& outcome) {
  if (!outcome.ok())
    spdlog::debug("{}: the KV transfer of request {} failed: {}", self->state.opts.name(), id, outcome.to_string());
  on_event(self, wk::ev::transfer_answer{id, link, outcome});
  kick(self);  // an ended lease freed blocks that waiting prompts may need
}

// Posts a step; streamed KV pieces leave from the compute thread, straight to their link.
template <class Self>
void start_step(Self self, wk::cmd::start_step& c) {
  auto& st = self->state;
  if (!c.streams.empty()) {
    auto to = std::make_shared<std::map<request_id, std::pair<kv_link_actor, request_actor>>>();
    for (auto [id, link] : c.streams) to->emplace(id, std::make_pair(link_of(self, link), request_of(self, id)));
    c.work.on_kv_piece = [to](work_id id, kv_blocks_ptr piece) {
      auto it = to->find(id);
      if (it == to->end() || piece->empty()) return;
      caf::anon_send(it->second.first, kv_piece_atom::value, request_id(id), piece->front().epoch, it->second.second,
                     std::move(piece));
    };
  }
  if constexpr (requires(decltype(st) s) { s.last_start; }) st.last_start = std::chrono::steady_clock::now();
  st.we->start(self, std::move(c.work));
}

// Carries out one of the core's commands.
template <class Self>
void execute(Self self, wk::command& command) {
  auto& st = self->state;
  std::visit(
      [&](auto& c) {
        using C = std::decay_t<decltype(c)>;
        if constexpr (std::is_same_v<C, wk::cmd::answer>) {
          auto it = st.replies.find(c.ticket);
          if (it == st.replies.end()) return;
          if (c.outcome.ok()) it->second.deliver(true);
          else it->second.deliver(to_caf_error(c.outcome));
          st.replies.erase(it);
        } else if constexpr (std::is_same_v<C, wk::cmd::ask_store>) {
          const uint64_t ask = c.ask;
          auto answered = [self, ask](const std::vector<block_key>&, kv_blocks_ptr blocks) {
            on_event(self, wk::ev::store_answer{ask, std::move(blocks)});
            kick(self);
          };
          if (!fetch_from_store(self, st.opts, std::move(c.keys), answered)) answered({}, nullptr);  // no store now
        } else if constexpr (std::is_same_v<C, wk::cmd::start_step>) {
          start_step(self, c);
        } else if constexpr (std::is_same_v<C, wk::cmd::token>) {
          auto req = request_of(self, c.id);
          if (c.logprobs) self->send(req, token_atom::value, c.index, c.tok, *c.logprobs);
          else self->send(req, token_atom::value, c.index, c.tok);
        } else if constexpr (std::is_same_v<C, wk::cmd::done>) {
          self->send(request_of(self, c.id), done_atom::value, c.reason);
        } else if constexpr (std::is_same_v<C, wk::cmd::fail>) {
          self->send(request_of(self, c.id), fail_atom::value, c.code, std::move(c.message));
        } else if constexpr (std::is_same_v<C, wk::cmd::tell_request>) {
          self->send(request_of(self, c.id), state_atom::value, c.state, st.opts.name(), c.cached_tokens);
        } else if constexpr (std::is_same_v<C, wk::cmd::tell_router>) {
          self->send(st.router, state_atom::value, c.id, c.state);
        } else if constexpr (std::is_same_v<C, wk::cmd::publish>) {
          publish_to_store(st.opts, *st.we->eng, c.seq, c.from_block);
        } else if constexpr (std::is_same_v<C, wk::cmd::report_load>) {
          report_load(self);
        } else if constexpr (std::is_same_v<C, wk::cmd::prefilled>) {
          self->send(st.router, prefilled_atom::value, c.id, st.opts.index, c.finished);
        } else if constexpr (std::is_same_v<C, wk::cmd::ship_started>) {
          self->send(st.router, ship_atom::value, c.id);
        } else if constexpr (std::is_same_v<C, wk::cmd::transfer>) {
          // The lease stays until decode confirms; a failed try goes to the router, which ships
          // it again from this lease or moves the request on (and releases the lease).
          const request_id id = c.id;
          const wk::link_id link = c.link;
          self->request(link_of(self, link), std::chrono::seconds(60), transfer_atom::value, std::move(c.spec),
                        request_of(self, id), std::move(c.kv), std::move(c.generated))
              .then(
                  [self, id, link](bool ok) {
                    transfer_answered(self, id, link,
                                      ok ? status{} : status{errc::refused, "the decode side refused the KV"});
                  },
                  [self, id, link](caf::error& e) { transfer_answered(self, id, link, from_caf_error(e)); });
        } else if constexpr (std::is_same_v<C, wk::cmd::transfer_failed>) {
          self->send(st.router, transfer_atom::value, c.id, c.epoch, link_of(self, c.link));
        } else if constexpr (std::is_same_v<C, wk::cmd::forget>) {
          st.requests.erase(c.id);
        } else {
          static_assert(sizeof(C) == 0, "a command the worker actors do not carry out");
        }
      },
      command);
}

template <class Self>
void on_event(Self self, const wk::event& e) {
  for (auto& c : self->state.core->on(e)) execute(self, c);
}

// Pacing with shared cores: while a prompt computes beside a decode worker, its steps start
// at most every pace_ms(), and the cores are the prompt's in between (this worker is not busy
// then). True: the next step waits for a tick. Arrivals are never held back.
template <class Self>
bool pace_wait(Self self) {
  auto& st = self->state;
  if constexpr (requires(decltype(st) s) { s.pace_pending; }) {  // only a decode worker paces
    const double pace = st.opts.steps.pace_ms();
    if (pace <= 0 || st.core->has_arrivals() || !st.we->eng->other_groups_busy()) return false;
    const auto due = st.last_start + std::chrono::microseconds(int64_t(pace * 1000));
    const auto now = std::chrono::steady_clock::now();
    if (due <= now + std::chrono::microseconds(200)) return false;
    if (!st.pace_pending) {
      st.pace_pending = true;
      self->delayed_send(self, due - now, tick_atom::value);
    }
    return true;
  } else {
    return false;
  }
}

// The engine is idle (and pacing allows): the core starts what waits for it.
template <class Self>
void kick(Self self) {
  if (self->state.core->busy() || pace_wait(self)) return;
  on_event(self, wk::ev::plan{});
}

// The step that came back: recorded, then the core's (the one place a step's result is applied).
template <class Self>
void apply(Self self, step_result& r) {
  auto& st = self->state;
  const bool prompts = st.opts.kind != worker_kind::decode;
  st.we->returned(st.opts, r, int32_t(st.opts.kind == worker_kind::prefill ? r.created_seqs.size() : r.tokens.size()));
  if (prompts)
    record_prefix_cache(st.opts, *st.we->eng, st.prefix_last, r.error.ok() ? st.core->planned_prompt_tokens() : 0);
  on_event(self, wk::ev::step_returned{&r});
}

// The step handler every worker has: the result applied, the next step planned, the load told.
template <class Self>
auto step_handler(Self self) {
  return [=](step_atom, step_result_ptr& r) {
    apply(self, *r);
    kick(self);
    // No next step: the cores this worker kept go to the others (in a core share). A worker
    // with more work started its next step in kick and so never gave them up in between.
    if (!self->state.we->busy) self->state.we->eng->set_busy(false);
    report_load(self);
  };
}

// The core's settings for this worker, from its options and its engine.
inline sched::worker::config core_config(const worker_options& o, const engine& eng) {
  const tokenizer& tok = eng.get_model().tok();
  sched::worker::config c;
  c.kind = o.kind;
  c.n_ctx = eng.config().n_ctx;
  c.block_size = o.kv.block_size;
  c.total_blocks = eng.kv_pool().total_blocks();
  c.max_batch = o.steps.max_batch;
  c.prefix_salt = eng.prefix_salt();
  c.store = o.store != nullptr;
  c.token_budget = o.token_budget();
  c.chunk_size = o.steps.chunk_size;
  c.stream_kv = o.kv.stream;
  c.stream_layer_group = o.kv.stream_layer_group;
  if (o.kind == worker_kind::colocated && o.steps.tpot_target_ms > 0)
    c.step_target_ms = o.steps.tpot_target_ms * step_settings::colocated_step_share;
  if (o.kind == worker_kind::decode && o.steps.local_prefill)
    c.local_prefill_target_ms = o.steps.local_prefill_target_ms();
  c.prefill_token_budget = o.steps.prefill_token_budget;
  c.ends_generation = [&tok](const request_spec& s, token_id t) {
    return ends_generation(s.sampling, s.ignore_eos, tok, t);
  };
  c.faults = o.faults;
  c.metrics = o.metrics.get();
  return c;
}

}  // namespace worker_actor

// What every worker state starts with: its options (of its kind), router, engine and core.
template <class State>
void init_worker(State& st, worker_kind kind, std::shared_ptr<const model> m, worker_options opts,
                 router_actor router) {
  st.opts = std::move(opts);
  st.opts.kind = kind;
  if (!st.opts.faults) st.opts.faults = no_faults();  // (null given: none)
  st.router = std::move(router);
  st.we = std::make_unique<worker_engine>(std::move(m), st.opts);
  st.port = std::make_unique<engine_adapter>(*st.we->eng);
  st.core = std::make_unique<sched::worker_core>(worker_actor::core_config(st.opts, *st.we->eng), st.port.get());
}

}  // namespace tandem
