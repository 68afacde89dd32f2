#include "actors/router.h"

#include <spdlog/spdlog.h>

namespace tandem {

std::string_view to_string(serving_mode m) {
  switch (m) {
    case serving_mode::disaggregated: return "disaggregated";
    case serving_mode::colocated: return "colocated";
  }
  return "?";
}

namespace {

using self_ptr = router_actor::stateful_pointer<router_state>;

metrics::registry& reg(self_ptr self) { return *self->state.opts.request_ctx.metrics; }

int32_t prompt_len(const router_state::entry& e) { return int32_t(e.spec.prompt.size()); }

// Whether slot i of a pool holds a live worker.
template <class Pool>
bool alive(const Pool& pool, int32_t i) {
  return i >= 0 && size_t(i) < pool.size() && pool[size_t(i)];
}

// Whether a pool has no live worker (restarting, degraded, or none joined yet).
template <class Pool>
bool none_alive(const Pool& pool) {
  return std::none_of(pool.begin(), pool.end(), [](const auto& w) { return bool(w); });
}

// What the prefill-side pool is called in metrics and messages.
const char* prefill_kind(self_ptr self) {
  return self->state.opts.mode == serving_mode::colocated ? "colocated" : "prefill";
}

void set_state(self_ptr self, router_state::entry& e, request_state s) {
  e.state = s;
  self->send(e.req, state_atom::value, s);
}

void update_queue_gauges(self_ptr self) {
  auto& st = self->state;
  const std::string help = "Requests waiting in a router queue";
  reg(self).get_gauge("tandem_router_queue", help, {{"queue", "prefill"}}).set(double(st.prefill_queue.size()));
  reg(self).get_gauge("tandem_router_queue", help, {{"queue", "decode"}}).set(double(st.decode_queue.size()));
}

void dispatch_decode(self_ptr self);

// Sends queued prompts to workers with room, chosen by the prefill placement policy. In
// disaggregated mode a dispatched prompt also queues for decode credits right away: reserved
// before its prefill ends, its KV streams to the decode worker while it is being computed.
void dispatch_prefill(self_ptr self);

// Full blocks of a prompt before its last token (what a cache can hold for it).
int32_t usable_full_tokens(const router_state& st, const router_state::entry& e) {
  if (e.spec.prompt.empty()) return 0;
  return int32_t(e.spec.prompt.size() - 1) / st.opts.block_size * st.opts.block_size;
}

// Asks the host store how much of a new prompt it holds (the router's metadata query).
void ask_store(self_ptr self, request_id id) {
  auto& st = self->state;
  auto& e = st.requests.at(id);
  if (!st.opts.store || st.opts.mode != serving_mode::disaggregated || e.spec.resumed != 0 ||
      usable_full_tokens(st, e) == 0)
    return;
  auto store = st.opts.store->get();
  if (!store) return;
  const auto keys = prompt_block_keys(st.opts.prefix_salt, e.spec.prompt, st.opts.block_size);
  e.store_asking = true;
  auto done = [self, id](int32_t blocks) {
    auto it = self->state.requests.find(id);
    if (it == self->state.requests.end() || !it->second.store_asking) return;
    it->second.store_asking = false;
    it->second.store_tokens = blocks * self->state.opts.block_size;
    dispatch_prefill(self);
  };
  self->request(store, std::chrono::seconds(1), lookup_atom::value, std::vector<uint64_t>(keys.begin(), keys.end()))
      .then([done](int32_t n) { done(n); }, [done](caf::error&) { done(0); });
}

void dispatch_prefill(self_ptr self) {
  auto& st = self->state;
  while (!st.prefill_queue.empty()) {
    const request_id id = st.prefill_queue.front();
    auto& e = st.requests.at(id);
    if (e.store_asking) break;  // first come, first served: wait for the store's answer
    if (st.opts.mode == serving_mode::disaggregated && !e.direct_tried && e.spec.resumed == 0 &&
        e.store_tokens > 0 && e.store_tokens >= usable_full_tokens(st, e)) {
      // Its whole prompt (but the tail) is in the host store: a decode worker fetches it and
      // computes the tail; no prefill worker, no KV link.
      st.prefill_queue.pop_front();
      st.prefill_queue_tokens -= prompt_len(e);
      e.direct = true;
      e.prefill_worker = -1;
      ++e.spec.epoch;
      e.dispatched = steady::now();
      e.transfer_retries = 0;
      if (!e.decode_claimed) {
        e.decode_claimed = true;
        st.decode_queue.push_back(id);
      }
      reg(self).get_counter("tandem_router_direct_to_decode_total",
                            "Requests sent straight to a decode worker: their prompt's blocks were in the host store")
          .inc();
      continue;
    }
    std::vector<prefill_worker_load> eligible = st.prefill_load;
    // The blocks a worker could reuse.
    std::vector<block_key> keys;
    if (st.prefixes) keys = prompt_block_keys(st.opts.prefix_salt, e.spec.prompt, st.opts.block_size);
    for (size_t i = 0; i < eligible.size(); ++i) {
      if (!st.prefill[i] || eligible[i].queued_tokens >= st.opts.dispatch_tokens) eligible[i].alive = false;
      if (st.prefixes) eligible[i].cached_tokens = st.prefixes->overlap(int32_t(i), keys) * st.opts.block_size;
    }
    const int32_t w = st.opts.prefill_policy->choose(eligible, prompt_len(e));
    if (w < 0) break;  // every worker is full: the request waits here, where admission sees it
    st.prefill_queue.pop_front();
    st.prefill_queue_tokens -= prompt_len(e);
    const int32_t cached = eligible[size_t(w)].cached_tokens;
    if (st.prefixes) {
      st.prefixes->record(w, keys);
      reg(self).get_counter("tandem_router_prefix_routed_tokens_total",
                            "Prompt tokens sent to a worker believed to have them cached.").inc(cached);
    }
    st.prefill_load[size_t(w)].queued_tokens += std::max(1, prompt_len(e) - cached);
    ++st.prefill_load[size_t(w)].queued_requests;
    e.prefill_worker = w;
    e.prefill_gen = st.prefill_gen[size_t(w)];
    ++e.spec.epoch;  // a new prefill attempt: its KV blocks carry this tag
    if (st.opts.mode == serving_mode::disaggregated && !e.decode_claimed) {
      e.decode_claimed = true;
      st.decode_queue.push_back(id);
    }
    e.dispatched = steady::now();
    e.transfer_retries = 0;
    if (st.prefill_busy_since[size_t(w)] == steady::time_point{}) st.prefill_busy_since[size_t(w)] = e.dispatched;
    self->send(st.prefill[size_t(w)], prefill_atom::value, e.spec, e.req);
  }
  update_queue_gauges(self);
  if (st.opts.mode == serving_mode::disaggregated) dispatch_decode(self);
}

void requeue_front(self_ptr self, router_state::entry& e, request_id id);

// A direct request's decode worker fetches its blocks from the store; if it cannot (they
// left the store, or the store died), the request goes to a prefill worker after all.
void direct_to_decode(self_ptr self, request_id id, int32_t d) {
  auto& st = self->state;
  auto& e = st.requests.at(id);
  const uint32_t epoch = e.spec.epoch;
  self->request(st.decode[size_t(d)], std::chrono::seconds(30), fetch_atom::value, e.spec, e.req)
      .then(
          [self, id, epoch](bool ok) {
            auto it = self->state.requests.find(id);
            if (ok || it == self->state.requests.end()) return;
            auto& e = it->second;
            if (!e.direct || e.spec.epoch != epoch || e.state == request_state::decoding) return;
            e.direct_tried = true;
            reg(self).get_counter("tandem_router_direct_fallbacks_total",
                                  "Direct-to-decode requests prefilled after all (blocks gone from the store)")
                .inc();
            requeue_front(self, e, id);
            dispatch_prefill(self);
          },
          [](caf::error&) {});  // the decode worker died: its down message requeues the request
}

// Reserves credits on the chosen decode worker, then tells the prefill worker to ship the KV
// (at once if the prompt is done, else streamed as the prefill goes).
void dispatch_decode(self_ptr self) {
  auto& st = self->state;
  if (st.reserving || st.decode_queue.empty()) return;
  const request_id id = st.decode_queue.front();
  auto& e = st.requests.at(id);
  const int32_t total = std::min(e.spec.total_tokens(), st.opts.context_length);
  const int32_t blocks = blocks_for_tokens(total, st.opts.block_size);
  std::vector<decode_worker_load> eligible = st.decode_load;
  for (size_t i = 0; i < eligible.size(); ++i)
    if (!st.decode[i]) eligible[i].alive = false;
  const int32_t d = st.opts.decode_policy->choose(eligible, blocks);
  if (d < 0) return;  // no credits anywhere: wait for a load report
  st.decode_queue.pop_front();
  st.reserving = true;
  const uint64_t ticket = ++st.reserve_ticket;
  st.reserving_worker = d;
  st.reserving_id = id;
  // Optimistic until the worker's next report: the reservation is about to take these.
  st.decode_load[size_t(d)].free_blocks -= blocks;
  ++st.decode_load[size_t(d)].batch_size;
  auto worker = st.decode[size_t(d)];
  const uint32_t epoch = e.spec.epoch;
  self->request(worker, std::chrono::seconds(30), reserve_atom::value, id, total)
      .then(
          [self, id, d, worker, epoch, ticket](bool ok) {
            auto& st = self->state;
            if (ticket != st.reserve_ticket) {  // given up when its worker died
              if (ok) self->send(worker, cancel_atom::value, id);
              return;
            }
            st.reserving = false;
            auto it = st.requests.find(id);
            // Still wanted: not ended, not requeued or finished in prefill meanwhile.
            const bool wanted = it != st.requests.end() && it->second.decode_claimed &&
                                it->second.spec.epoch == epoch && it->second.state != request_state::decoding;
            if (!ok) {
              if (wanted) st.decode_queue.push_front(id);
              // Stale view: wait for a fresh report (asked for, as an idle worker sends none:
              // a refused reservation once waited forever).
              st.decode_load[size_t(d)].free_blocks = 0;
              self->delayed_send(worker, std::chrono::milliseconds(50), load_atom::value);
            } else if (!wanted) {
              self->send(worker, cancel_atom::value, id);  // give the credits back
            } else {
              auto& e = it->second;
              e.decode_worker = d;
              const auto now = steady::now();
              if (st.last_admit != steady::time_point{})
                st.decode_admits.add(1000.0 / std::max(1.0, std::chrono::duration<double, std::milli>(now - st.last_admit).count()));
              st.last_admit = now;
              const int32_t p = e.prefill_worker;
              e.decode_gen = st.decode_gen[size_t(d)];
              if (e.direct) {
                direct_to_decode(self, id, d);
              } else if (p >= 0 && size_t(p) < st.prefill.size() && st.prefill[size_t(p)] && st.links[size_t(p)][size_t(d)])
                self->send(st.prefill[size_t(p)], ship_atom::value, id, st.links[size_t(p)][size_t(d)]);
              else if (p >= 0 && size_t(p) < st.prefill.size() && st.prefill[size_t(p)] &&
                       st.link_asks.count({size_t(p), size_t(d)}))
                e.awaiting_link = true;  // its link comes from the cluster: shipped then
              else if (e.state == request_state::transferring)
                self->send(e.req, fail_atom::value, errc::worker_failed,
                           std::string("the prefill worker holding the request's KV is gone"));
              // else: its prefill worker died and worker_down requeues it (and the credits)
            }
            dispatch_decode(self);
            update_queue_gauges(self);
          },
          [self, id, d, epoch, ticket](caf::error&) {
            // The worker is gone or stuck: leave it out until it reports again (a restart
            // joins with a fresh report) and try the request elsewhere.
            auto& st = self->state;
            if (ticket != st.reserve_ticket) return;  // given up when its worker died
            st.reserving = false;
            st.decode_load[size_t(d)].free_blocks = 0;
            auto it = st.requests.find(id);
            if (it != st.requests.end() && it->second.decode_claimed && it->second.spec.epoch == epoch)
              st.decode_queue.push_front(id);
            dispatch_decode(self);
          });
}

load_snapshot snapshot(self_ptr self) {
  auto& st = self->state;
  load_snapshot s;
  s.prefill_queue = int32_t(st.prefill_queue.size());
  s.prefill_queue_tokens = st.prefill_queue_tokens;
  int32_t live = 0;
  for (size_t i = 0; i < st.prefill.size(); ++i) {
    if (!st.prefill[i]) continue;
    ++live;
    s.prefill_queue += st.prefill_load[i].queued_requests;
    s.prefill_queue_tokens += st.prefill_load[i].queued_tokens;
  }
  s.prefill_workers = live;
  s.decode_queue = int32_t(st.decode_queue.size());
  s.prefill_tokens_per_s = st.prefill_rate.has_value() ? st.prefill_rate.value() : 0;
  s.decode_step_ms = st.tpot.has_value() ? st.tpot.value() : 0;
  s.context_length = st.opts.context_length;
  s.decode_admits_per_s = st.decode_admits.has_value() ? st.decode_admits.value() : 0;
  return s;
}

template <class Handle>
bool is_remote(self_ptr self, const Handle& h) {
  return h && h.node() != self->node();
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
// never passes through here): the cluster asks that node to spawn it. Until it comes, requests
// whose decode credits are held on that slot wait (awaiting_link); then they are shipped.
void ask_link(self_ptr self, size_t p, size_t d) {
  auto& st = self->state;
  const uint64_t ask = st.next_link_ask++;
  st.link_asks[{p, d}] = ask;
  const uint32_t pg = st.prefill_gen[p], dg = st.decode_gen[d];
  auto current = [self, p, d, ask, pg, dg] {
    auto& st = self->state;
    auto it = st.link_asks.find({p, d});
    return it != st.link_asks.end() && it->second == ask && p < st.prefill.size() && d < st.decode.size() &&
           st.prefill[p] && st.decode[d] && st.prefill_gen[p] == pg && st.decode_gen[d] == dg;
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
            for (auto& [id, e] : st.requests)
              if (e.awaiting_link && e.prefill_worker == int32_t(p) && e.decode_worker == int32_t(d)) {
                e.awaiting_link = false;
                self->send(st.prefill[p], ship_atom::value, id, link);
              }
          },
          [self, p, d, ask, current](caf::error& e) {
            if (!current()) return;
            spdlog::warn("router: no KV link p{}->d{} yet ({}); asking again", p, d, to_string(e));
            self->delayed_send(self, std::chrono::milliseconds(500), link_atom::value, int32_t(p), int32_t(d), ask);
          });
}

// Links are monitored by the router and end with it; one that dies (or is killed) is replaced.
// Towards
// a dead decode worker a link has nothing left to do: stopped. From a dead prefill worker it
// may still be delivering KV it already holds: it retires (ends once idle).
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
                                     kv_link_options{.name = "p" + std::to_string(p) + "->d" + std::to_string(d),
                                                     .transport = st.opts.kv_transport,
                                                     .metrics = st.opts.request_ctx.metrics,
                                                     .faults = st.opts.faults});
  st.link_slots[link.address()] = {p, d};
  st.all_links->emplace(link.address(), caf::actor_cast<caf::actor>(link));
}

// A live link died (killed, or crashed): a fresh one takes its place. Transfers it carried
// fail back to their prefill workers, which still hold the KV under lease and report it; the
// router then ships it again over the new link.
void link_down(self_ptr self, size_t p, size_t d) {
  auto& st = self->state;
  if (p < st.prefill.size() && st.prefill[p]) self->send(st.prefill[p], down_atom::value, st.links[p][d]);
  st.links[p][d] = nullptr;
  reg(self).get_counter("tandem_restarts_total", "Worker restarts by kind", {{"kind", "kv_link"}}).inc();
  if (p < st.prefill.size() && d < st.decode.size() && st.prefill[p] && st.decode[d]) open_link(self, p, d, false);
}

// Puts a request back at the front of the prefill queue (a new attempt from scratch).
void requeue_front(self_ptr self, router_state::entry& e, request_id id) {
  auto& st = self->state;
  e.direct = false;
  e.awaiting_link = false;
  if (alive(st.decode, e.decode_worker))
    self->send(st.decode[size_t(e.decode_worker)], cancel_atom::value, id);  // give back its credits
  e.decode_worker = -1;
  e.prefill_worker = -1;
  e.transfer_started = false;
  if (auto q = std::find(st.decode_queue.begin(), st.decode_queue.end(), id); q != st.decode_queue.end())
    st.decode_queue.erase(q);
  e.decode_claimed = false;
  set_state(self, e, request_state::queued);
  if (std::find(st.prefill_queue.begin(), st.prefill_queue.end(), id) != st.prefill_queue.end()) return;  // once
  st.prefill_queue.push_front(id);
  st.prefill_queue_tokens += prompt_len(e);
}

// Its worker died while it decoded: the sequence is gone, the tokens are not (its actor holds
// every one). Prefill the prompt plus those tokens again and go on from the next one; with
// greedy or seeded sampling the output is the same as without the fault.
void migrate(self_ptr self, request_id id) {
  auto& st = self->state;
  auto& e = st.requests.at(id);
  if (e.migrating) return;
  if (e.migrations >= st.opts.max_migrations) {
    self->send(e.req, fail_atom::value, errc::worker_failed,
               "its worker failed while it was decoding, " + std::to_string(e.migrations + 1) +
                   " times (the migration limit is " + std::to_string(st.opts.max_migrations) + ")");
    return;
  }
  ++e.migrations;
  e.migrating = true;
  e.awaiting_link = false;
  // A lease its prefill worker may still hold for it (prefilled, waiting for a transfer) ends.
  const int32_t p = e.prefill_worker;
  if (st.opts.mode == serving_mode::disaggregated && alive(st.prefill, p) && st.prefill_gen[size_t(p)] == e.prefill_gen)
    self->send(st.prefill[size_t(p)], release_atom::value, id);
  // Credits it holds on a live decode worker (a failed transfer) go back; a dead worker's
  // died with it.
  const int32_t d = e.decode_worker;
  if (alive(st.decode, d) && st.decode_gen[size_t(d)] == e.decode_gen)
    self->send(st.decode[size_t(d)], cancel_atom::value, id);
  e.decode_worker = -1;
  e.prefill_worker = -1;
  e.transfer_started = false;
  e.decode_claimed = false;
  if (auto q = std::find(st.decode_queue.begin(), st.decode_queue.end(), id); q != st.decode_queue.end())
    st.decode_queue.erase(q);
  reg(self).get_counter("tandem_migrations_total", "Requests moved off a worker that died while they decoded").inc();
  // Tokens the dead worker sent before it died reach the request before this question does.
  self->request(e.req, std::chrono::seconds(10), resume_atom::value)
      .then(
          [self, id](std::vector<token_id>& generated) {
            auto& st = self->state;
            auto it = st.requests.find(id);
            if (it == st.requests.end()) return;  // it ended meanwhile (cancelled)
            auto& e = it->second;
            e.migrating = false;
            if (generated.empty()) return;  // ended: its forget is on the way
            std::vector<token_id> prompt(e.spec.prompt.begin(), e.spec.prompt.end() - e.spec.resumed);
            prompt.insert(prompt.end(), generated.begin(), generated.end());
            e.spec.prompt = std::move(prompt);
            e.spec.resumed = int32_t(generated.size());
            requeue_front(self, e, id);
            dispatch_prefill(self);
            dispatch_decode(self);
            update_queue_gauges(self);
          },
          [self, id](caf::error&) {
            if (auto it = self->state.requests.find(id); it != self->state.requests.end()) it->second.migrating = false;
          });
}

// A worker died: the supervisor restarts it and it joins again. What it held is recovered:
// requests not decoding yet start their prefill again, decoding ones migrate.
// `gen` is the incarnation that died: its replacement may have joined already.
void worker_down(self_ptr self, int32_t index, bool prefill_side, uint32_t gen) {
  auto& st = self->state;
  if (prefill_side) {
    if (size_t(index) >= st.prefill.size()) return;
    if (st.prefill_gen[size_t(index)] == gen) {
      st.prefill[size_t(index)] = nullptr;
      st.prefill_load[size_t(index)] = {index, false, 0, 0};
    }
  } else {
    if (size_t(index) >= st.decode.size()) return;
    if (st.decode_gen[size_t(index)] == gen) {
      st.decode[size_t(index)] = nullptr;
      st.decode_load[size_t(index)].alive = false;
    }
    if (st.reserving && st.reserving_worker == index) {
      // Its answer may never come (a worker in another process): the request goes back to
      // the front of the decode queue now, and that answer is ignored if it comes.
      st.reserving = false;
      ++st.reserve_ticket;
      auto it = st.requests.find(st.reserving_id);
      if (it != st.requests.end() && it->second.decode_claimed && it->second.decode_worker < 0 &&
          std::find(st.decode_queue.begin(), st.decode_queue.end(), st.reserving_id) == st.decode_queue.end())
        st.decode_queue.push_front(st.reserving_id);
    }
  }
  reg(self).get_counter("tandem_restarts_total", "Worker restarts by kind",
                        {{"kind", prefill_side ? prefill_kind(self) : "decode"}})
      .inc();
  // Requests the dead worker held. Not decoding yet (queued there, mid-prefill, or KV under its
  // lease): nothing was lost that a new prefill cannot redo, so they go back to the front of the
  // prefill queue (a repeated token 0 is dropped by the request actor). Decoding (or with
  // their KV sent to a decode worker that died): they migrate.
  std::vector<request_id> requeue, moved;
  for (auto& [id, e] : st.requests) {
    const bool held = prefill_side ? e.prefill_worker == index && e.prefill_gen == gen
                                   : e.decode_worker == index && e.decode_gen == gen;
    if (!held || e.migrating) continue;
    if (!prefill_side && e.state == request_state::queued && !e.transfer_started) {
      // Still prefilling, its KV streaming to the dead worker: reserve elsewhere; the new link
      // makes the prefill worker send everything again.
      e.decode_worker = -1;
      e.awaiting_link = false;
      st.decode_queue.push_front(id);
      continue;
    }
    if (prefill_side && e.transfer_started) {
      // The link delivers the KV it already holds; but a failure (the link dies, or retires
      // before it takes the transfer; the decode side refuses the set) would go to the dead
      // worker, and no lease is left to ship from. Checked again soon: still transferring
      // then, it is prefilled again.
      self->delayed_send(self, std::chrono::seconds(2), orphan_atom::value, id, e.spec.epoch);
      continue;
    }
    if (prefill_side && e.state != request_state::decoding) {
      requeue.push_back(id);
      continue;
    }
    moved.push_back(id);
  }
  for (auto it = requeue.rbegin(); it != requeue.rend(); ++it) {
    requeue_front(self, st.requests.at(*it), *it);
    reg(self).get_counter("tandem_reprefills_total", "Requests prefilled again because their prefill worker died").inc();
  }
  for (auto id : moved) migrate(self, id);
  // A pool left with no worker is restarting (a supervisor restarts at once) or degraded
  // (past its restart intensity: it stays empty). Look again soon; what is stranded then ends.
  if (prefill_side ? none_alive(st.prefill) : none_alive(st.decode))
    self->delayed_send(self, std::chrono::seconds(2), stranded_atom::value);
  // The replacement may have joined already and sits idle: hand it the requeued work now.
  dispatch_prefill(self);
  dispatch_decode(self);
}

// The request ended (or its actor died): free what its workers hold for it, drop it.
void forget(self_ptr self, request_id id, request_state end, double tpot_ms) {
  auto& st = self->state;
  auto it = st.requests.find(id);
  if (it == st.requests.end()) return;
  auto& e = it->second;
  if (tpot_ms > 0) st.tpot.add(tpot_ms);
  if (end != request_state::finished) {  // the workers still hold it: free it there
    if (alive(st.prefill, e.prefill_worker))
      self->send(st.prefill[size_t(e.prefill_worker)], cancel_atom::value, id);
    if (alive(st.decode, e.decode_worker)) self->send(st.decode[size_t(e.decode_worker)], cancel_atom::value, id);
  }
  if (auto q = std::find(st.prefill_queue.begin(), st.prefill_queue.end(), id); q != st.prefill_queue.end()) {
    st.prefill_queue.erase(q);
    st.prefill_queue_tokens -= prompt_len(e);
  }
  if (auto q = std::find(st.decode_queue.begin(), st.decode_queue.end(), id); q != st.decode_queue.end())
    st.decode_queue.erase(q);
  st.requests.erase(it);
  dispatch_prefill(self);
  dispatch_decode(self);
}

void count_stall(self_ptr self, const char* kind) {
  reg(self).get_counter("tandem_stalls_detected_total", "Actors found alive but not progressing, and restarted",
                        {{"kind", kind}})
      .inc();
}

// A worker that is alive but not progressing is treated as dead: killed, so that its
// supervisor restarts it and its requests are recovered as for any failure.
void stalled(self_ptr self, const caf::actor_addr& addr, const caf::actor& worker) {
  auto& st = self->state;
  auto it = st.watched.find(addr);
  if (it == st.watched.end()) return;
  const bool prefill = it->second.prefill_side;
  count_stall(self, prefill ? prefill_kind(self) : "decode");
  caf::anon_send_exit(worker, caf::exit_reason::kill);
}

// One heartbeat's answer: progress (a step came back), idle, or the same step still running.
void on_heartbeat(self_ptr self, const caf::actor_addr& addr, const caf::actor& worker, const worker_stats& s) {
  auto& st = self->state;
  auto it = st.watched.find(addr);
  if (it == st.watched.end()) return;
  auto& w = it->second;
  const auto now = steady::now();
  if (!s.busy || s.finished_steps != w.finished_steps) {
    w.finished_steps = s.finished_steps;
    w.progress_at = now;
  } else if (now - w.progress_at > st.opts.stall_timeout) {
    stalled(self, addr, worker);
  }
}

// Asks every worker for its progress; one that does not answer within the stall timeout is
// stalled too (its actor, not only its step, is stuck).
void heartbeat(self_ptr self) {
  auto& st = self->state;
  const auto interval = std::max(std::chrono::milliseconds(20), st.opts.stall_timeout / 4);
  self->delayed_send(self, interval, heartbeat_atom::value);
  auto ask = [self](auto handle) {
    if (!handle) return;
    const auto addr = handle.address();
    const auto worker = caf::actor_cast<caf::actor>(handle);
    self->request(handle, self->state.opts.stall_timeout, stats_atom::value)
        .then([self, addr, worker](worker_stats& s) { on_heartbeat(self, addr, worker, s); },
              [self, addr, worker](caf::error&) { stalled(self, addr, worker); });
  };
  for (auto& w : st.prefill) ask(w);
  for (auto& w : st.decode) ask(w);
  // Links too: one that does not answer in time is stuck. It is replaced at once (its
  // transfers fail back to their leases and ship again over the new one) and killed.
  for (size_t p = 0; p < st.links.size(); ++p)
    for (size_t d = 0; d < st.links[p].size(); ++d) {
      auto link = st.links[p][d];
      if (!link) continue;
      self->request(link, st.opts.stall_timeout, heartbeat_atom::value)
          .then([](bool) {},
                [self, p, d, link](caf::error&) {
                  auto& st = self->state;
                  if (p >= st.links.size() || d >= st.links[p].size() || st.links[p][d] != link) return;  // gone already
                  count_stall(self, "kv_link");
                  st.link_slots.erase(link.address());
                  caf::anon_send_exit(link, caf::exit_reason::kill);
                  link_down(self, p, d);
                });
    }
}

}  // namespace

router_actor::behavior_type router_behavior(self_ptr self, router_options opts) {
  self->state.opts = std::move(opts);
  if (!self->state.opts.admission_policy_impl) self->state.opts.admission_policy_impl = std::make_shared<admission_policy>();
  if (!self->state.opts.prefill_policy) self->state.opts.prefill_policy = std::make_shared<prefill_placement>();
  if (self->state.opts.prefix_salt != 0)
    self->state.prefixes = std::make_unique<prefix_view>(self->state.opts.prefix_capacity_blocks);
  if (!self->state.opts.decode_policy) self->state.opts.decode_policy = std::make_shared<decode_placement>();
  // Messages a worker sent before dying arrive before its down message (same sender), so what
  // worker_down sees of its requests is final.
  if (self->state.opts.stall_timeout.count() > 0) heartbeat(self);
  // Links end with the router (they are monitored, not linked: one that dies must not take
  // the router down).
  self->attach_functor([links = self->state.all_links] {
    for (auto& [addr, l] : *links) caf::anon_send_exit(l, caf::exit_reason::user_shutdown);
  });
  self->set_down_handler([self](caf::down_msg& dm) {
    auto& st = self->state;
    if (st.all_links->erase(dm.source) > 0) {
      if (st.retiring_links.erase(dm.source) > 0) return;
      if (auto it = st.link_slots.find(dm.source); it != st.link_slots.end()) {
        const auto [p, d] = it->second;
        st.link_slots.erase(it);
        if (st.links[p][d] && st.links[p][d].address() == dm.source) link_down(self, p, d);
      }
      return;
    }
    if (auto r = st.request_actors.find(dm.source); r != st.request_actors.end()) {
      const request_id id = r->second;
      st.request_actors.erase(r);
      forget(self, id, request_state::failed, 0);  // a no-op after a normal end (forgotten already)
      return;
    }
    auto it = st.watched.find(dm.source);
    if (it == st.watched.end()) return;
    const auto w = it->second;
    st.watched.erase(it);
    worker_down(self, w.index, w.prefill_side, w.gen);
  });
  return {
      [self](submit_atom, request_spec& spec, subscriber_actor& sub, uint64_t seq) {
        auto& st = self->state;
        if (st.opts.submits_taken) st.opts.submits_taken->store(seq);
        // A pool that stayed empty (degraded past its restart intensity) cannot serve: say so
        // now (HTTP 503) rather than queue without bound. One that is restarting (its
        // supervisor restarts a worker at once) or not joined yet (start-up) queues requests.
        auto gone = [](const auto& pool, bool flagged) { return flagged && none_alive(pool); };
        const char* down = gone(st.prefill, st.prefill_gone) ? prefill_kind(self)
                           : st.opts.mode == serving_mode::disaggregated && gone(st.decode, st.decode_gone) ? "decode"
                                                                                                             : nullptr;
        if (down) {
          reg(self).get_counter("tandem_rejections_total", "Requests refused by admission control",
                                {{"reason", "no_healthy_worker"}})
              .inc();
          request_event err = make_event(event_kind::error);
          err.id = spec.id;
          err.code = errc::worker_failed;
          err.message = std::string("no healthy ") + down + " worker: the pool failed past its restart intensity";
          err.retry_after_ms = 1000;
          self->send(sub, std::move(err));
          return;
        }
        const auto decision =
            st.opts.admission_policy_impl->decide(st.opts.admission, snapshot(self), int32_t(spec.prompt.size()));
        if (!decision.admitted) {
          reg(self).get_counter("tandem_rejections_total", "Requests refused by admission control",
                                {{"reason", std::string(to_string(decision.reason))}})
              .inc();
          request_event err = make_event(event_kind::error);
          err.id = spec.id;
          err.code = decision.reason == reject_reason::prompt_too_long ? errc::context_overflow : errc::overloaded;
          err.message = decision.message;
          err.retry_after_ms = decision.retry_after_ms;
          self->send(sub, std::move(err));
          return;
        }
        if (spec.id == 0) spec.id = st.next_id++;
        const request_id id = spec.id;
        const int32_t position = int32_t(st.prefill_queue.size());
        auto req = self->spawn(request_behavior, spec, sub, caf::actor_cast<router_actor>(self), st.opts.request_ctx,
                               position);
        self->monitor(req);
        st.request_actors.emplace(req.address(), id);
        router_state::entry e;
        e.req = req;
        e.spec = std::move(spec);
        st.prefill_queue_tokens += prompt_len(e);
        st.requests.emplace(id, std::move(e));
        st.prefill_queue.push_back(id);
        ask_store(self, id);
        dispatch_prefill(self);
      },
      [self](rejoin_atom, request_spec& spec, std::vector<token_id>& generated, request_actor& req) {
        // From a request whose router died: admitted before, it queues again (first among
        // the new ones) with every token it has as the end of its prompt.
        auto& st = self->state;
        const request_id id = spec.id;
        if (st.requests.count(id)) return;
        self->monitor(req);
        st.request_actors.emplace(req.address(), id);
        router_state::entry e;
        e.req = req;
        e.spec = std::move(spec);
        e.spec.prompt.insert(e.spec.prompt.end(), generated.begin(), generated.end());
        e.spec.resumed = int32_t(generated.size());
        st.prefill_queue_tokens += prompt_len(e);
        st.requests.emplace(id, std::move(e));
        st.prefill_queue.push_back(id);
        reg(self).get_counter("tandem_router_rejoins_total", "Requests that joined a restarted router").inc();
        dispatch_prefill(self);
      },
      [self](prefilled_atom, request_id id, int32_t worker, bool finished) {
        if (from_lost_worker(self)) return;
        auto& st = self->state;
        if (size_t(worker) < st.prefill_busy_since.size()) {
          // Service rate of the worker: prompt tokens over the time it has been busy with them.
          auto it = st.requests.find(id);
          auto& since = st.prefill_busy_since[size_t(worker)];
          const auto now = steady::now();
          if (it != st.requests.end() && since != steady::time_point{}) {
            const double s = std::chrono::duration<double>(now - std::max(since, it->second.dispatched)).count();
            if (s > 0) st.prefill_rate.add(double(prompt_len(it->second)) / s);
          }
          since = st.prefill_load[size_t(worker)].queued_requests > 1 ? now : steady::time_point{};
        }
        auto it = st.requests.find(id);
        if (it == st.requests.end()) {
          if (!finished && size_t(worker) < st.prefill.size() && st.prefill[size_t(worker)])
            self->send(st.prefill[size_t(worker)], release_atom::value, id);  // nobody wants its KV
          return;
        }
        auto& e = it->second;
        if (st.opts.mode == serving_mode::colocated) return;
        if (finished) {  // done in prefill (stop token or one token): decode credits back
          if (auto q = std::find(st.decode_queue.begin(), st.decode_queue.end(), id); q != st.decode_queue.end())
            st.decode_queue.erase(q);
          if (alive(st.decode, e.decode_worker))
            self->send(st.decode[size_t(e.decode_worker)], cancel_atom::value, id);
          e.decode_worker = -1;
          e.decode_claimed = false;
          return;
        }
        if (e.state == request_state::decoding) {  // a re-prefill raced a delivered transfer
          self->send(st.prefill[size_t(worker)], release_atom::value, id);
          return;
        }
        set_state(self, e, request_state::transferring);
        if (!e.decode_claimed) {
          e.decode_claimed = true;
          st.decode_queue.push_back(id);
        }
        dispatch_decode(self);
        update_queue_gauges(self);
      },
      [self](load_atom, prefill_worker_load& l) {
        auto& st = self->state;
        if (size_t(l.worker) >= st.prefill_load.size() || !st.prefill[size_t(l.worker)]) return;
        st.prefill_load[size_t(l.worker)] = l;
        if (l.queued_requests == 0) st.prefill_busy_since[size_t(l.worker)] = steady::time_point{};
        dispatch_prefill(self);
      },
      [self](load_atom, decode_worker_load& l) {
        auto& st = self->state;
        if (size_t(l.worker) >= st.decode_load.size() || !st.decode[size_t(l.worker)]) return;
        st.decode_load[size_t(l.worker)] = l;
        dispatch_decode(self);
      },
      [self](forget_atom, request_id id, request_state end, double tpot_ms) { forget(self, id, end, tpot_ms); },
      [self](kill_atom, request_id id) {
        auto it = self->state.requests.find(id);
        if (it == self->state.requests.end()) return false;
        caf::anon_send_exit(it->second.req, caf::exit_reason::kill);
        return true;
      },
      [self](state_atom, request_id id, request_state s) {
        if (from_lost_worker(self)) return;
        // Decoding where the worker says: what worker_down will look for if that one dies.
        auto& st = self->state;
        auto it = st.requests.find(id);
        if (it == st.requests.end()) return;
        auto& e = it->second;
        if (auto w = st.watched.find(caf::actor_cast<caf::actor_addr>(self->current_sender()));
            w != st.watched.end() && !w->second.prefill_side) {
          // A late report from where the request no longer is (it was moved on meanwhile, and
          // that worker was told to drop it) changes nothing.
          if (e.migrating || (e.decode_worker >= 0 && e.decode_worker != w->second.index)) return;
          e.decode_worker = w->second.index;
          e.decode_gen = w->second.gen;
        }
        e.state = s;
      },
      [self](transfer_atom, request_id id, uint32_t epoch, kv_link_actor&) {
        if (from_lost_worker(self)) return;
        // A transfer failed; its prefill worker still holds the KV under lease (it reports
        // only its latest try, so this is not stale there). Stale here: a later attempt
        // exists, or worker_down moved the request on already.
        auto& st = self->state;
        // Not retried: the lease of that attempt ends (the decode side got the KV before the
        // link died, or the request ended or moved on).
        auto stale = [self, id, epoch] {
          self->send(caf::actor_cast<prefill_worker_actor>(self->current_sender()), release_atom::value, id, epoch);
        };
        auto it = st.requests.find(id);
        if (it == st.requests.end()) return stale();
        auto& e = it->second;
        if (e.spec.epoch != epoch || e.migrating || e.state != request_state::transferring) return stale();
        const int32_t p = e.prefill_worker, d = e.decode_worker;
        const bool path = p >= 0 && d >= 0 && size_t(p) < st.prefill.size() && size_t(d) < st.decode.size() &&
                          st.prefill[size_t(p)] && st.decode[size_t(d)] && st.prefill_gen[size_t(p)] == e.prefill_gen &&
                          st.decode_gen[size_t(d)] == e.decode_gen && st.links[size_t(p)][size_t(d)];
        if (path && e.transfer_retries < st.opts.max_transfer_retries) {
          ++e.transfer_retries;
          reg(self).get_counter("tandem_kv_transfer_retries_total", "KV transfers shipped again from the prefill side's lease").inc();
          self->send(st.prefill[size_t(p)], ship_atom::value, id, st.links[size_t(p)][size_t(d)]);
          return;
        }
        migrate(self, id);  // past the retries (or nowhere to ship to): prefilled again
      },
      [self](cancel_atom, request_id id) {
        if (auto it = self->state.requests.find(id); it != self->state.requests.end())
          self->send(it->second.req, cancel_atom::value);
      },
      [self](pause_atom, request_id id, bool pause) {
        auto& st = self->state;
        auto it = st.requests.find(id);
        if (it == st.requests.end()) return;
        auto& e = it->second;
        if (st.opts.mode == serving_mode::colocated) {
          if (e.prefill_worker >= 0 && st.prefill[size_t(e.prefill_worker)])
            self->send(st.prefill[size_t(e.prefill_worker)], pause_atom::value, id, pause);
        } else if (e.decode_worker >= 0 && st.decode[size_t(e.decode_worker)]) {
          self->send(st.decode[size_t(e.decode_worker)], pause_atom::value, id, pause);
        }
      },
      [self](join_atom, int32_t index, prefill_worker_actor& w) {
        auto& st = self->state;
        if (index < 0) return;
        if (size_t(index) >= st.prefill.size()) {
          st.prefill.resize(size_t(index) + 1);
          st.prefill_load.resize(size_t(index) + 1);
          st.prefill_busy_since.resize(size_t(index) + 1);
          st.prefill_gen.resize(size_t(index) + 1);
          st.links.resize(size_t(index) + 1, std::vector<kv_link_actor>(st.decode.size()));
        }
        st.prefill[size_t(index)] = w;
        st.prefill_gone = false;
        st.watched[w.address()] = {index, true, ++st.prefill_gen[size_t(index)], 0, steady::now()};
        st.prefill_load[size_t(index)] = {index, true, 0, 0};
        if (st.prefixes) st.prefixes->forget(index);  // a new worker: an empty cache
        self->monitor(w);
        if (st.opts.mode == serving_mode::disaggregated)
          for (size_t d = 0; d < st.decode.size(); ++d)
            if (st.decode[d])
              open_link(self, size_t(index), d, /*decode_side_replaced=*/false);
        dispatch_prefill(self);
      },
      [self](join_atom, int32_t index, decode_worker_actor& w) {
        auto& st = self->state;
        if (index < 0) return;
        if (size_t(index) >= st.decode.size()) {
          st.decode.resize(size_t(index) + 1);
          st.decode_load.resize(size_t(index) + 1);
          st.decode_gen.resize(size_t(index) + 1);
          for (auto& row : st.links) row.resize(size_t(index) + 1);
        }
        // A restart may announce itself before the old worker's down message arrives here.
        st.decode[size_t(index)] = w;
        st.decode_gone = false;
        st.watched[w.address()] = {index, false, ++st.decode_gen[size_t(index)], 0, steady::now()};
        st.decode_load[size_t(index)] = {index, true, 0, 0, 0, 0};
        self->monitor(w);
        for (size_t p = 0; p < st.prefill.size(); ++p)
          if (st.prefill[p])
            open_link(self, p, size_t(index), /*decode_side_replaced=*/true);
        // Its credits: asked for now, since its own first report may have come before this join.
        self->send(w, load_atom::value);
      },
      [self](down_atom, int32_t index, bool prefill_side) {
        // A worker known dead without its down message (its node was lost: heartbeats
        // stopped). Its later down message, if any, changes nothing; if it is alive behind a
        // partition it is told to stop.
        auto& st = self->state;
        auto& gens = prefill_side ? st.prefill_gen : st.decode_gen;
        if (size_t(index) >= gens.size()) return;
        for (auto it = st.watched.begin(); it != st.watched.end(); ++it)
          if (it->second.index == index && it->second.prefill_side == prefill_side && it->second.gen == gens[size_t(index)]) {
            self->demonitor(it->first);
            st.watched.erase(it);
            break;
          }
        if (prefill_side && st.prefill[size_t(index)]) caf::anon_send_exit(st.prefill[size_t(index)], caf::exit_reason::kill);
        if (!prefill_side && st.decode[size_t(index)]) caf::anon_send_exit(st.decode[size_t(index)], caf::exit_reason::kill);
        // Its links (in the prefill processes) would wait on it until their timeouts: stopped.
        for (size_t p = 0; p < st.links.size(); ++p) {
          for (size_t k = 0; k < st.links[p].size(); ++k) {
            if ((prefill_side ? p : k) != size_t(index) || !st.links[p][k]) continue;
            auto l = st.links[p][k];
            st.link_slots.erase(l.address());
            st.retiring_links.emplace(l.address(), l);
            caf::anon_send_exit(l, caf::exit_reason::kill);
            // Its transfers fail back to their leases now, not at their timeouts.
            if (st.prefill[p]) self->send(st.prefill[p], down_atom::value, l);
            st.links[p][k] = nullptr;
          }
        }
        worker_down(self, index, prefill_side, gens[size_t(index)]);
      },
      [self](link_atom, int32_t p, int32_t d, uint64_t ask) {
        auto& st = self->state;
        auto it = st.link_asks.find({size_t(p), size_t(d)});
        if (it == st.link_asks.end() || it->second != ask) return;  // answered, or asked anew since
        if (size_t(p) < st.prefill.size() && size_t(d) < st.decode.size() && st.prefill[size_t(p)] &&
            st.decode[size_t(d)] && !st.links[size_t(p)][size_t(d)])
          ask_link(self, size_t(p), size_t(d));
      },
      [self](ship_atom, request_id id) {
        if (from_lost_worker(self)) return;
        // Only for the attempt that is transferring: a late one from an earlier attempt's lease
        // (shipped just before the request was moved on) once marked a requeued request as
        // handed over, and then a death of its new prefill worker did not requeue it.
        auto it = self->state.requests.find(id);
        if (it != self->state.requests.end() && it->second.state == request_state::transferring)
          it->second.transfer_started = true;
      },
      [self](kill_atom, const std::string& kind_or_link, int32_t index) -> std::string {
        auto& st = self->state;
        // A link by its name ("kv_link-p0-d3"), or an actor of a kind by its index.
        const bool link_name = kind_or_link.rfind("kv_link-p", 0) == 0;
        const std::string kind = link_name ? "kv_link" : kind_or_link;
        // The candidates of that kind, alive now, with their names.
        std::vector<std::pair<caf::actor, std::string>> found;
        const bool colocated = st.opts.mode == serving_mode::colocated;
        if (kind == "prefill" || kind == "colocated") {
          if (colocated == (kind == "colocated"))
            for (size_t i = 0; i < st.prefill.size(); ++i)
              found.emplace_back(caf::actor_cast<caf::actor>(st.prefill[i]), kind + "-" + std::to_string(i));
        } else if (kind == "decode") {
          for (size_t i = 0; i < st.decode.size(); ++i)
            found.emplace_back(caf::actor_cast<caf::actor>(st.decode[i]), "decode-" + std::to_string(i));
        } else if (kind == "kv_link") {
          for (size_t p = 0; p < st.links.size(); ++p)
            for (size_t d = 0; d < st.links[p].size(); ++d)
              found.emplace_back(caf::actor_cast<caf::actor>(st.links[p][d]),
                                 "kv_link-p" + std::to_string(p) + "-d" + std::to_string(d));
        } else if (kind == "request") {
          for (const auto& [id, e] : st.requests)
            found.emplace_back(caf::actor_cast<caf::actor>(e.req), "request-" + std::to_string(id));
        }
        if (link_name) std::erase_if(found, [&](const auto& f) { return f.second != kind_or_link; });
        std::vector<std::pair<caf::actor, std::string>> target;
        if (index >= 0 && size_t(index) < found.size() && found[size_t(index)].first) target.push_back(found[size_t(index)]);
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
        auto it = self->state.requests.find(id);
        if (it == self->state.requests.end()) return;
        const auto& e = it->second;
        if (e.spec.epoch != epoch || e.migrating || e.state != request_state::transferring) return;
        reg(self).get_counter("tandem_orphaned_transfers_total", "KV transfers whose prefill worker died and that never arrived").inc();
        migrate(self, id);  // a late arrival of that attempt finds no reservation and is refused
      },
      [self](stranded_atom) {
        // A pool still empty seconds after its last worker died will not come back (degraded):
        // the requests that need it end with an error (HTTP 503) instead of waiting forever.
        auto& st = self->state;
        const bool no_prefill = none_alive(st.prefill);
        const bool no_decode = st.opts.mode == serving_mode::disaggregated && none_alive(st.decode);
        if (!no_prefill && !no_decode) return;
        st.prefill_gone = st.prefill_gone || no_prefill;
        st.decode_gone = st.decode_gone || no_decode;
        const std::string pool = no_decode ? "decode" : prefill_kind(self);
        for (auto& [id, e] : st.requests) {
          // Without prefill workers, only requests already past prefill can still finish.
          if (!no_decode && e.state != request_state::queued && !e.migrating) continue;
          self->send(e.req, fail_atom::value, errc::worker_failed,
                     "no healthy " + pool + " worker: the pool failed past its restart intensity");
        }
      },
      [self](state_atom, int32_t listed) {
        auto& st = self->state;
        router_view v;
        v.prefill_queue = int32_t(st.prefill_queue.size());
        v.decode_queue = int32_t(st.decode_queue.size());
        v.by_state.assign(size_t(request_state::cancelled) + 1, 0);
        for (const auto& [id, e] : st.requests) {
          ++v.by_state[size_t(e.state)];
          if (int32_t(v.requests.size()) < listed)
            v.requests.push_back({id, e.state, e.prefill_worker, e.decode_worker, int32_t(e.spec.prompt.size()),
                                  e.spec.max_tokens});
        }
        for (const auto& row : st.links)
          for (const auto& l : row) v.links += bool(l);
        v.retiring_links = int32_t(st.retiring_links.size());
        return v;
      },
      [self](stats_atom) -> caf::result<std::vector<worker_stats>> {
        auto& st = self->state;
        auto rp = self->make_response_promise<std::vector<worker_stats>>();
        auto out = std::make_shared<std::vector<worker_stats>>();
        auto pending = std::make_shared<size_t>(0);
        std::vector<std::function<void()>> asks;
        auto ask = [self, rp, out, pending](auto handle) mutable {
          ++*pending;
          self->request(handle, std::chrono::seconds(10), stats_atom::value)
              .then(
                  [rp, out, pending](worker_stats& s) mutable {
                    out->push_back(std::move(s));
                    if (--*pending == 0) rp.deliver(*out);
                  },
                  [rp, out, pending](caf::error&) mutable {
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
