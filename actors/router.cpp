#include "actors/router.h"

#include "runtime/oplog.h"

#include "actors/error.h"

#include <spdlog/spdlog.h>

namespace tandem {

namespace {

using self_ptr = router_actor::stateful_pointer<router_state>;
using sched::pool_side;

// How long a stats ask waits for a worker before its last answer stands in (see stats_atom).
constexpr auto stats_answer_within = std::chrono::milliseconds(250);

void on_event(self_ptr self, const sched::event& e);

template <class Handle>
bool is_remote(self_ptr self, const Handle& h) {
  return h && h.node() != self->node();
}

template <class Pool>
auto handle_at(const Pool& pool, int32_t i) -> typename Pool::value_type {
  return i >= 0 && size_t(i) < pool.size() ? pool[size_t(i)] : typename Pool::value_type{};
}

caf::actor worker_at(self_ptr self, pool_side side, int32_t i) {
  auto& st = self->state;
  return side == pool_side::prefill ? caf::actor_cast<caf::actor>(handle_at(st.prefill, i))
                                    : caf::actor_cast<caf::actor>(handle_at(st.decode, i));
}

request_actor request_of(self_ptr self, request_id id) {
  auto it = self->state.requests.find(id);
  return it == self->state.requests.end() ? request_actor{} : it->second;
}

// A message from a worker in another process that the router no longer counts as alive (its
// node was declared lost while it was only cut off, and it speaks again): what it reports was
// recovered elsewhere already. In one process a dead worker's messages all arrive before its
// down message; across a partition they can come after it.
bool from_lost_worker(self_ptr self) {
  const auto& sender = self->current_sender();
  return sender && sender->node() != self->node() &&
         self->state.watched.count(caf::actor_cast<caf::actor_addr>(sender)) == 0 &&
         self->state.all_links->count(caf::actor_cast<caf::actor_addr>(sender)) == 0;
}

// A link between workers of other processes lives in the prefill worker's process (its KV
// never passes through here): the cluster asks that node to spawn it.
void ask_link(self_ptr self, size_t p, size_t d) {
  auto& st = self->state;
  const uint64_t ask = st.next_link_ask++;
  st.link_asks[{p, d}] = ask;
  const uint32_t pg = st.core->gen(pool_side::prefill, int32_t(p)), dg = st.core->gen(pool_side::decode, int32_t(d));
  auto current = [self, p, d, ask, pg, dg] {
    auto& st = self->state;
    auto it = st.link_asks.find({p, d});
    return it != st.link_asks.end() && it->second == ask && st.core->alive(pool_side::prefill, int32_t(p)) &&
           st.core->alive(pool_side::decode, int32_t(d)) && st.core->gen(pool_side::prefill, int32_t(p)) == pg &&
           st.core->gen(pool_side::decode, int32_t(d)) == dg;
  };
  self->request(st.opts.cluster, std::chrono::seconds(10), link_atom::value, int32_t(p), int32_t(d), st.decode[d])
      .then(
          [self, p, d, current](kv_link_actor& link) {
            auto& st = self->state;
            if (!current()) {
              caf::anon_send_exit(link, caf::exit_reason::user_shutdown);
              return;
            }
            st.link_asks.erase({p, d});
            st.links[p][d] = link;
            self->monitor(link);
            st.link_slots[link.address()] = {p, d};
            st.all_links->emplace(link.address(), caf::actor_cast<caf::actor>(link));
            on_event(self, sched::ev::link_up{int32_t(p), int32_t(d)});
          },
          [self, p, d, ask, current](caf::error& e) {
            if (!current()) return;
            spdlog::warn("router: no KV link p{}->d{} yet ({}); asking again", p, d, to_string(e));
            self->delayed_send(self, std::chrono::milliseconds(500), link_atom::value, int32_t(p), int32_t(d), ask);
          });
}

// Links are monitored by the router and end with it. One replaced towards a new decode worker
// has nothing left to do: stopped. One from a replaced prefill worker may still be delivering
// KV it holds: it retires (ends once idle).
void open_link(self_ptr self, size_t p, size_t d, bool decode_side_replaced) {
  auto& st = self->state;
  auto& link = st.links[p][d];
  if (link) {
    st.link_slots.erase(link.address());
    st.retiring_links.emplace(link.address(), link);  // its exit is expected, not a failure
    if (decode_side_replaced) caf::anon_send_exit(link, caf::exit_reason::user_shutdown);
    else self->send(link, release_atom::value);
  }
  link = nullptr;
  st.link_asks.erase({p, d});
  if (st.opts.cluster && (is_remote(self, st.prefill[p]) || is_remote(self, st.decode[d]))) {
    ask_link(self, p, d);
    return;
  }
  link = self->spawn<caf::monitored>(kv_link_behavior, st.decode[d],
                                     kv_link_options{.name = link_name(int32_t(p), int32_t(d)),
                                                     .transport = st.opts.kv_transport,
                                                     .metrics = st.opts.request_ctx.metrics,
                                                     .faults = st.opts.faults});
  st.link_slots[link.address()] = {p, d};
  st.all_links->emplace(link.address(), caf::actor_cast<caf::actor>(link));
  on_event(self, sched::ev::link_up{int32_t(p), int32_t(d)});
}

// A lost node's worker: stopped with its links (which would wait on it until their
// timeouts); its transfers fail back to their leases now. Its later down message, if any,
// changes nothing; if it is alive behind a partition it is told to stop.
void isolate(self_ptr self, pool_side side, int32_t index) {
  auto& st = self->state;
  const uint32_t gen = st.core->gen(side, index);
  for (auto it = st.watched.begin(); it != st.watched.end(); ++it)
    if (it->second.side == side && it->second.worker == sched::worker_ref{index, gen}) {
      self->demonitor(it->first);
      st.watched.erase(it);
      break;
    }
  if (auto w = worker_at(self, side, index)) caf::anon_send_exit(w, caf::exit_reason::kill);
  for (size_t p = 0; p < st.links.size(); ++p)
    for (size_t k = 0; k < st.links[p].size(); ++k) {
      if ((side == pool_side::prefill ? p : k) != size_t(index) || !st.links[p][k]) continue;
      auto l = st.links[p][k];
      st.link_slots.erase(l.address());
      st.retiring_links.emplace(l.address(), l);
      caf::anon_send_exit(l, caf::exit_reason::kill);
      if (st.prefill[p]) self->send(st.prefill[p], down_atom::value, l);
      st.links[p][k] = nullptr;
    }
  if (side == pool_side::prefill) st.prefill[size_t(index)] = nullptr;
  else st.decode[size_t(index)] = nullptr;
}

// Carries out one of the core's commands. `sub`: the submitter, for a submit's admit/refuse.
void execute(self_ptr self, sched::command& command, const subscriber_actor* sub = nullptr) {
  auto& st = self->state;
  namespace cmd = sched::cmd;
  std::visit(
      [&](auto& c) {
        using C = std::decay_t<decltype(c)>;
        if constexpr (std::is_same_v<C, cmd::admit>) {
          const request_id id = c.spec.id;
          auto req = self->spawn(request_behavior, c.spec, *sub, caf::actor_cast<router_actor>(self),
                                 st.opts.request_ctx, c.position);
          self->monitor(req);
          st.request_actors.emplace(req.address(), id);
          st.requests[id] = req;
        } else if constexpr (std::is_same_v<C, cmd::refuse>) {
          request_event err = make_event(event_kind::error);
          err.id = c.id;
          err.code = c.code;
          err.message = std::move(c.message);
          err.retry_after_ms = c.retry_after_ms;
          self->send(*sub, std::move(err));
        } else if constexpr (std::is_same_v<C, cmd::set_state>) {
          if (auto r = request_of(self, c.id)) self->send(r, state_atom::value, c.state);
        } else if constexpr (std::is_same_v<C, cmd::fail>) {
          if (auto r = request_of(self, c.id)) self->send(r, fail_atom::value, c.code, std::move(c.message));
        } else if constexpr (std::is_same_v<C, cmd::ask_resume>) {
          const request_id id = c.id;
          auto r = request_of(self, id);
          if (!r) return on_event(self, sched::ev::resume_answer{id, std::nullopt});
          self->request(r, std::chrono::seconds(10), resume_atom::value)
              .then(
                  [self, id](std::vector<token_id>& generated) {
                    on_event(self, sched::ev::resume_answer{id, std::move(generated)});
                  },
                  [self, id](caf::error&) {
                    on_event(self, sched::ev::resume_answer{id, std::nullopt});
                  });
        } else if constexpr (std::is_same_v<C, cmd::ask_store>) {
          const request_id id = c.id;
          auto store = st.opts.store ? st.opts.store->get() : kv_store_actor{};
          if (!store) return on_event(self, sched::ev::store_answer{id, 0});
          self->request(store, std::chrono::seconds(1), lookup_atom::value,
                        std::vector<uint64_t>(c.keys.begin(), c.keys.end()))
              .then(
                  [self, id](int32_t n) {
                    on_event(self, sched::ev::store_answer{id, n});
                  },
                  [self, id](caf::error&) {
                    on_event(self, sched::ev::store_answer{id, 0});
                  });
        } else if constexpr (std::is_same_v<C, cmd::prefill>) {
          if (auto w = handle_at(st.prefill, c.worker))
            self->send(w, prefill_atom::value, c.spec, request_of(self, c.spec.id));
        } else if constexpr (std::is_same_v<C, cmd::reserve>) {
          const auto [d, id, ticket] = std::tuple{c.worker, c.id, c.ticket};
          auto reply = [self, d, id, ticket](sched::ev::reply r, errc why) {
            on_event(self, sched::ev::reserve_answer{ticket, d, id, r, why});
          };
          auto w = handle_at(st.decode, d);
          if (!w) return reply(sched::ev::reply::failed, errc::worker_failed);
          self->request(w, std::chrono::seconds(30), reserve_atom::value, id, c.total_tokens)
              .then(
                  [reply](bool ok) {
                    reply(ok ? sched::ev::reply::granted : sched::ev::reply::refused, ok ? errc::ok : errc::refused);
                  },
                  [reply](caf::error& e) {
                    // Refused (no credits, no batch room): try again on a fresh report; no answer
                    // (dead, stuck, unreachable): left out until it reports.
                    const errc why = from_caf_error(e).code();
                    reply(why == errc::refused ? sched::ev::reply::refused : sched::ev::reply::failed, why);
                  });
        } else if constexpr (std::is_same_v<C, cmd::fetch>) {
          auto w = handle_at(st.decode, c.worker);
          if (!w) return;  // its down message requeues the request
          const request_id id = c.spec.id;
          const uint32_t epoch = c.spec.epoch;
          self->request(w, std::chrono::seconds(30), fetch_atom::value, c.spec, request_of(self, id))
              .then(
                  [self, id, epoch](bool ok) {
                    on_event(self, sched::ev::fetch_answer{id, epoch, ok});
                  },
                  // Refused (the store lost the blocks, no reservation) or no answer (the
                  // worker died: its down message reclaims the credits too): prefilled instead.
                  [self, id, epoch](caf::error&) {
                    on_event(self, sched::ev::fetch_answer{id, epoch, false});
                  });
        } else if constexpr (std::is_same_v<C, cmd::ship>) {
          auto w = handle_at(st.prefill, c.p);
          if (w && size_t(c.p) < st.links.size() && size_t(c.d) < st.links[size_t(c.p)].size())
            self->send(w, ship_atom::value, c.id, st.links[size_t(c.p)][size_t(c.d)]);
        } else if constexpr (std::is_same_v<C, cmd::cancel>) {
          if (c.side == pool_side::prefill) {
            if (auto w = handle_at(st.prefill, c.worker)) self->send(w, cancel_atom::value, c.id);
          } else if (auto w = handle_at(st.decode, c.worker)) {
            self->send(w, cancel_atom::value, c.id);
          }
        } else if constexpr (std::is_same_v<C, cmd::release>) {
          auto w = handle_at(st.prefill, c.worker);
          if (!w) return;
          if (c.epoch) self->send(w, release_atom::value, c.id, *c.epoch);
          else self->send(w, release_atom::value, c.id);
        } else if constexpr (std::is_same_v<C, cmd::pause>) {
          if (c.side == pool_side::prefill) {
            if (auto w = handle_at(st.prefill, c.worker)) self->send(w, pause_atom::value, c.id, c.pause);
          } else if (auto w = handle_at(st.decode, c.worker)) {
            self->send(w, pause_atom::value, c.id, c.pause);
          }
        } else if constexpr (std::is_same_v<C, cmd::ask_load>) {
          auto w = handle_at(st.decode, c.worker);
          if (!w) return;
          if (c.after.count() == 0) self->send(w, load_atom::value);
          else self->delayed_send(w, c.after, load_atom::value);
        } else if constexpr (std::is_same_v<C, cmd::open_link>) {
          open_link(self, size_t(c.p), size_t(c.d), c.decode_side_replaced);
        } else if constexpr (std::is_same_v<C, cmd::link_lost>) {
          auto& link = st.links[size_t(c.p)][size_t(c.d)];
          if (auto w = handle_at(st.prefill, c.p)) self->send(w, down_atom::value, link);
          link = nullptr;
        } else if constexpr (std::is_same_v<C, cmd::kill_link>) {
          auto& link = st.links[size_t(c.p)][size_t(c.d)];
          if (!link) return;
          st.link_slots.erase(link.address());
          caf::anon_send_exit(link, caf::exit_reason::kill);
        } else if constexpr (std::is_same_v<C, cmd::kill_worker>) {
          if (st.core->gen(c.side, c.worker.index) != c.worker.gen) return;
          if (auto w = worker_at(self, c.side, c.worker.index)) caf::anon_send_exit(w, caf::exit_reason::kill);
        } else if constexpr (std::is_same_v<C, cmd::isolate>) {
          isolate(self, c.side, c.index);
        } else if constexpr (std::is_same_v<C, cmd::check_orphan>) {
          self->delayed_send(self, c.after, orphan_atom::value, c.id, c.epoch);
        } else if constexpr (std::is_same_v<C, cmd::check_stranded>) {
          self->delayed_send(self, c.after, stranded_atom::value);
        } else {
          static_assert(sizeof(C) == 0, "a command without its translation");
        }
      },
      command);
}

void on_event(self_ptr self, const sched::event& e) {
  auto commands = self->state.core->on(e);
  for (auto& c : commands) execute(self, c);
}

// A watched worker's latest stats (what the stats ask gives for it when it is slow to answer).
void remember_stats(self_ptr self, const caf::actor_addr& addr, const worker_stats& s) {
  if (auto it = self->state.watched.find(addr); it != self->state.watched.end()) it->second.last = s;
}

// Asks every worker for its progress; one that does not answer within the stall timeout is
// stalled too (its actor, not only its step, is stuck). Links too: one that does not answer
// in time is replaced at once (its transfers fail back to their leases and ship again over the
// new one) and killed.
void heartbeat(self_ptr self) {
  auto& st = self->state;
  const auto timeout = st.opts.core.stall_timeout;
  self->delayed_send(self, std::max(std::chrono::milliseconds(20), timeout / 4), heartbeat_atom::value);
  for (const auto& [addr, w] : st.watched) {
    auto worker = worker_at(self, w.side, w.worker.index);
    if (!worker || worker.address() != addr) continue;
    const auto side = w.side;
    const auto ref = w.worker;
    self->request(worker, timeout, stats_atom::value)
        .then(
            [self, side, ref, addr = addr](worker_stats& s) {
              remember_stats(self, addr, s);
              on_event(self, sched::ev::heartbeat{side, ref, s.busy, s.finished_steps});
            },
            [self, side, ref](caf::error&) {
              on_event(self, sched::ev::heartbeat_missed{side, ref});
            });
  }
  for (size_t p = 0; p < st.links.size(); ++p)
    for (size_t d = 0; d < st.links[p].size(); ++d) {
      auto link = st.links[p][d];
      if (!link) continue;
      self->request(link, timeout, heartbeat_atom::value)
          .then([](bool) {},
                [self, p, d, link](caf::error&) {
                  auto& st = self->state;
                  if (p >= st.links.size() || d >= st.links[p].size() || st.links[p][d] != link)
                    return;  // gone already
                  on_event(self, sched::ev::link_stuck{int32_t(p), int32_t(d)});
                });
    }
}

// Where the current message comes from, if it is a worker the router watches.
const router_state::watched_worker* sender_worker(self_ptr self) {
  auto it = self->state.watched.find(caf::actor_cast<caf::actor_addr>(self->current_sender()));
  return it == self->state.watched.end() ? nullptr : &it->second;
}

template <class Handle>
void join(self_ptr self, pool_side side, int32_t index, Handle& w, std::vector<Handle>& pool) {
  auto& st = self->state;
  if (index < 0) return;
  if (size_t(index) >= pool.size()) pool.resize(size_t(index) + 1);
  if (side == pool_side::prefill) {
    if (st.links.size() < st.prefill.size())
      st.links.resize(st.prefill.size(), std::vector<kv_link_actor>(st.decode.size()));
  } else {
    for (auto& row : st.links) row.resize(st.decode.size());
  }
  // A restart may announce itself before the old worker's down message arrives here.
  pool[size_t(index)] = w;
  const std::string name = worker_name(st.core->kind_of(side), index).str();
  if (auto d = st.down_since.find(name); d != st.down_since.end()) {
    oplog::event(oplog::level::info, "worker_joined",
                 {{"worker", name},
                  {"recovery_ms",
                   std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - d->second).count()}});
    st.down_since.erase(d);
  }
  auto commands = st.core->on(sched::ev::joined{side, index});
  st.watched[w.address()] = {side, {index, st.core->gen(side, index)}};
  self->monitor(w);
  for (auto& c : commands) execute(self, c);
}

}  // namespace

router_actor::behavior_type router_behavior(self_ptr self, router_options opts) {
  auto& st = self->state;
  st.opts = std::move(opts);
  sched::router_core_config core = st.opts.core;
  core.store = bool(st.opts.store);
  st.core = std::make_unique<sched::router_core>(std::move(core), st.opts.request_ctx.metrics.get());
  if (st.opts.core.stall_timeout.count() > 0) heartbeat(self);
  // Links end with the router (they are monitored, not linked: one that dies must not take the
  // router down).
  self->attach_functor([links = st.all_links] {
    for (auto& [addr, l] : *links) caf::anon_send_exit(l, caf::exit_reason::user_shutdown);
  });
  // Messages a worker sent before dying arrive before its down message (same sender), so what
  // worker_down sees of its requests is final.
  self->set_down_handler([self](caf::down_msg& dm) {
    auto& st = self->state;
    if (st.all_links->erase(dm.source) > 0) {
      if (st.retiring_links.erase(dm.source) > 0) return;
      if (auto it = st.link_slots.find(dm.source); it != st.link_slots.end()) {
        const auto [p, d] = it->second;
        st.link_slots.erase(it);
        if (st.links[p][d] && st.links[p][d].address() == dm.source)
          on_event(self, sched::ev::link_down{int32_t(p), int32_t(d)});
      }
      return;
    }
    if (auto r = st.request_actors.find(dm.source); r != st.request_actors.end()) {
      const request_id id = r->second;
      st.request_actors.erase(r);
      if (auto q = st.requests.find(id); q != st.requests.end() && q->second.address() == dm.source)
        st.requests.erase(q);
      on_event(self, sched::ev::ended{id, request_state::failed, 0});  // a no-op after a normal end
      return;
    }
    auto it = st.watched.find(dm.source);
    if (it == st.watched.end()) return;
    const auto w = it->second;
    st.watched.erase(it);
    if (st.core->gen(w.side, w.worker.index) == w.worker.gen) {  // not replaced yet
      if (w.side == pool_side::prefill) st.prefill[size_t(w.worker.index)] = nullptr;
      else st.decode[size_t(w.worker.index)] = nullptr;
    }
    const std::string name = worker_name(st.core->kind_of(w.side), w.worker.index).str();
    oplog::event(oplog::level::warn, "worker_down", {{"worker", name}, {"reason", exit_reason_text(dm.reason)}});
    st.down_since.emplace(name, std::chrono::steady_clock::now());
    on_event(self, sched::ev::worker_down{w.side, w.worker});
  });
  return {
      [self](submit_atom, request_spec& spec, subscriber_actor& sub, uint64_t seq) {
        auto& st = self->state;
        if (st.opts.submits_taken) st.opts.submits_taken->store(seq);
        auto commands = st.core->on(sched::ev::submit{std::move(spec)});
        for (auto& c : commands) execute(self, c, &sub);
      },
      [self](rejoin_atom, request_spec& spec, std::vector<token_id>& generated, request_actor& req) {
        // From a request whose router died: admitted before, it queues again.
        auto& st = self->state;
        if (st.core->find(spec.id)) return;
        self->monitor(req);
        st.request_actors.emplace(req.address(), spec.id);
        st.requests[spec.id] = req;
        on_event(self, sched::ev::rejoin{std::move(spec), std::move(generated)});
      },
      [self](prefilled_atom, request_id id, int32_t worker, bool finished) {
        if (from_lost_worker(self)) return;
        on_event(self, sched::ev::prefilled{id, worker, finished});
      },
      [self](load_atom, prefill_worker_load& l) { on_event(self, sched::ev::prefill_load{l}); },
      [self](load_atom, decode_worker_load& l) { on_event(self, sched::ev::decode_load{l}); },
      [self](forget_atom, request_id id, request_state end, double tpot_ms) {
        self->state.requests.erase(id);
        on_event(self, sched::ev::ended{id, end, tpot_ms});
      },
      [self](kill_atom, request_id id, int64_t deadline_ns) {
        if (past(deadline_ns)) return false;
        auto r = request_of(self, id);
        if (!r) return false;
        caf::anon_send_exit(r, caf::exit_reason::kill);
        return true;
      },
      [self](state_atom, request_id id, request_state s) {
        if (from_lost_worker(self)) return;
        if (auto w = sender_worker(self)) on_event(self, sched::ev::worker_state{id, w->side, w->worker, s});
      },
      [self](transfer_atom, request_id id, uint32_t epoch, kv_link_actor&) {
        if (from_lost_worker(self)) return;
        // A dead worker's lease died with it: only a watched prefill worker's report counts.
        if (auto w = sender_worker(self); w && w->side == pool_side::prefill)
          on_event(self, sched::ev::transfer_failed{id, epoch, w->worker.index});
      },
      [self](cancel_atom, request_id id) {
        if (auto r = request_of(self, id)) self->send(r, cancel_atom::value);
      },
      [self](pause_atom, request_id id, bool pause) {
        on_event(self, sched::ev::pause{id, pause});
      },
      [self](join_atom, int32_t index, prefill_worker_actor& w) {
        join(self, pool_side::prefill, index, w, self->state.prefill);
      },
      [self](join_atom, int32_t index, decode_worker_actor& w) {
        join(self, pool_side::decode, index, w, self->state.decode);
      },
      [self](down_atom, int32_t index, bool prefill_side) {
        // A worker known dead without its down message (its node was lost: heartbeats stopped).
        on_event(self, sched::ev::worker_lost{prefill_side ? pool_side::prefill : pool_side::decode, index});
      },
      [self](link_atom, int32_t p, int32_t d, uint64_t ask) {
        auto& st = self->state;
        auto it = st.link_asks.find({size_t(p), size_t(d)});
        if (it == st.link_asks.end() || it->second != ask) return;  // answered, or asked anew since
        if (st.core->alive(pool_side::prefill, p) && st.core->alive(pool_side::decode, d) &&
            !st.links[size_t(p)][size_t(d)])
          ask_link(self, size_t(p), size_t(d));
      },
      [self](ship_atom, request_id id) {
        if (from_lost_worker(self)) return;
        on_event(self, sched::ev::ship_started{id});
      },
      [self](kill_atom, actor_kind kind, int32_t index, int32_t decode, int64_t deadline_ns) -> std::string {
        if (past(deadline_ns)) return std::string();
        auto& st = self->state;
        // The candidates of that kind, alive now, with their names; a link named by (p, d) is
        // the only candidate then.
        std::vector<std::pair<caf::actor, std::string>> found;
        const bool colocated = st.opts.core.mode == serving_mode::colocated;
        auto workers = [&](worker_kind k, const auto& pool) {
          for (size_t i = 0; i < pool.size(); ++i)
            found.emplace_back(caf::actor_cast<caf::actor>(pool[i]), worker_name(k, int32_t(i)).str());
        };
        switch (kind) {
          case actor_kind::prefill:
            if (!colocated) workers(worker_kind::prefill, st.prefill);
            break;
          case actor_kind::colocated:
            if (colocated) workers(worker_kind::colocated, st.prefill);
            break;
          case actor_kind::decode: workers(worker_kind::decode, st.decode); break;
          case actor_kind::kv_link:
            for (size_t p = 0; p < st.links.size(); ++p)
              for (size_t d = 0; d < st.links[p].size(); ++d)
                if (decode < 0 || (int32_t(p) == index && int32_t(d) == decode))
                  found.emplace_back(caf::actor_cast<caf::actor>(st.links[p][d]),
                                     link_name(int32_t(p), int32_t(d)).str());
            if (decode >= 0) index = -1;
            break;
          case actor_kind::request:
            for (const auto& [id, r] : st.requests)
              found.emplace_back(caf::actor_cast<caf::actor>(r), request_name(id).str());
            break;
          case actor_kind::router:
          case actor_kind::kv_store: break;  // not the router's to kill (pipeline::kill)
        }
        std::vector<std::pair<caf::actor, std::string>> target;
        if (index >= 0 && size_t(index) < found.size() && found[size_t(index)].first)
          target.push_back(found[size_t(index)]);
        if (index < 0)
          for (auto& f : found)
            if (f.first) target.push_back(f);
        if (target.empty()) return std::string();
        auto& victim = target[st.chaos_rng() % target.size()];
        caf::anon_send_exit(victim.first, caf::exit_reason::kill);
        return victim.second;
      },
      [self](heartbeat_atom) { heartbeat(self); },
      [self](orphan_atom, request_id id, uint32_t epoch) {
        on_event(self, sched::ev::orphan_check{id, epoch});
      },
      [self](stranded_atom) { on_event(self, sched::ev::stranded_check{}); },
      [self](state_atom, int32_t listed) {
        auto v = self->state.core->view(listed);
        v.retiring_links = int32_t(self->state.retiring_links.size());
        return v;
      },
      [self](stats_atom) -> caf::result<std::vector<worker_stats>> {
        auto& st = self->state;
        auto rp = self->make_response_promise<std::vector<worker_stats>>();
        auto out = std::make_shared<std::vector<worker_stats>>();
        auto pending = std::make_shared<size_t>(0);
        // A worker that does not answer soon (starting, busy, or far) is given as it last
        // answered: an observer's snapshot (/health, /admin/state, the dashboard, the gauges)
        // must not wait seconds for one remote worker. One that never answered is left out.
        auto ask = [self, rp, out, pending](auto handle) mutable {
          ++*pending;
          const auto addr = handle.address();
          self->request(handle, stats_answer_within, stats_atom::value)
              .then(
                  [self, rp, out, pending, addr](worker_stats& s) mutable {
                    remember_stats(self, addr, s);
                    out->push_back(std::move(s));
                    if (--*pending == 0) rp.deliver(*out);
                  },
                  [self, rp, out, pending, addr](caf::error&) mutable {
                    if (auto it = self->state.watched.find(addr); it != self->state.watched.end() && it->second.last)
                      out->push_back(*it->second.last);
                    if (--*pending == 0) rp.deliver(*out);
                  });
        };
        for (auto& w : st.prefill)
          if (w) ask(w);
        for (auto& w : st.decode)
          if (w) ask(w);
        if (*pending == 0) rp.deliver(*out);
        return rp;
      },
  };
}

}  // namespace tandem
