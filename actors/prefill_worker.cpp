#include "actors/prefill_worker.h"

#include "actors/error.h"

#include <spdlog/spdlog.h>

#include <optional>

namespace tandem {
namespace {

using self_ptr = prefill_worker_actor::stateful_pointer<prefill_worker_state>;
namespace wk = sched::worker;

void on_event(self_ptr self, const wk::event& e);

// Every layer of a sequence's blocks, tagged with its request and attempt (the engine is idle).
kv_blocks_ptr export_all(const engine& eng, seq_id s, request_id id, uint32_t epoch) {
  auto all = std::make_shared<std::vector<kv_block_export>>();
  (void)eng.export_kv(s, 0, eng.config().n_layer, 0, *all, id, epoch);
  return all;
}

void report_load(self_ptr self) {
  report_prompt_load(self, self->state.router, self->state.opts.index, self->state.queue);
}

// Ends job j (the worker erases it from its queue): its sequence and its claims go.
void drop_job(self_ptr self, prefill_worker_state::job& j) {
  if (j.seq != 0) self->state.to_free.push_back(j.seq);
  self->state.claims.release(j.spec.id);
}

void fail_job(self_ptr self, prefill_worker_state::job& j, errc code, const std::string& msg) {
  self->send(j.req, fail_atom::value, code, msg);
  drop_job(self, j);
}

void kick(self_ptr self);

// Plans the next step from the queue and posts it, if there is anything to do.
void kick(self_ptr self) {
  auto& st = self->state;
  if (st.we->busy) return;
  engine& eng = *st.we->eng;
  // Prefix reuse: a prompt starts with its cached blocks attached (the engine is idle here),
  // or waits while another prompt computes the block it needs next.
  if (eng.prefix_cache_enabled()) {
    auto find = [self](uint64_t id) -> prompt_reuse* {
      auto* q = self->state.queue.find(id);
      return q ? &q->reuse : nullptr;
    };
    for (auto id : st.queue.waiting())
      if (auto& j = *st.queue.find(id); j.seq == 0) {
        j.seq = start_with_prefix(self, st.opts, eng, st.claims, j.spec, j.reuse, find, kick);
        if (j.seq != 0) j.prefilled = j.reuse.reused;
      }
  }
  std::vector<pending_prefill> pending;
  for (auto id : st.queue.waiting())
    if (const auto& j = *st.queue.find(id); j.seq != 0 || !eng.prefix_cache_enabled())
      pending.push_back({int64_t(id), int32_t(j.spec.prompt.size()), j.prefilled});
  auto plan = plan_prefill_step(pending, st.opts.token_budget(), st.opts.steps.chunk_size);

  // Blocks are the limit the planner does not see: keep the chunks that fit the pool now;
  // what does not fit waits for leases to end.
  int32_t free = eng.available_blocks();
  step_work work;
  // Streamed pieces leave from the compute thread, straight to their link.
  auto streams = std::make_shared<std::map<request_id, std::pair<kv_link_actor, request_actor>>>();
  work.frees = std::move(st.to_free);
  st.to_free.clear();
  for (seq_id s : st.core->take_frees()) work.frees.push_back(s);  // ended leases
  for (seq_id s : work.frees) free += eng.blocks_freed_by(s);  // freed before the forward pass
  for (const auto& c : plan) {
    auto* j = st.queue.find(request_id(c.request));
    if (!j) continue;
    const int32_t need = j->seq == 0 ? eng.blocks_needed(0, c.length) : eng.blocks_needed(j->seq, c.length);
    if (need > free) {
      if (st.core->holding() == 0 && work.chunks.empty() && j->prefilled == 0 &&
          eng.kv_pool().total_blocks() < eng.blocks_needed(0, int32_t(j->spec.prompt.size()))) {
        fail_job(self, *j, errc::out_of_kv_blocks, "prompt needs more KV blocks than the prefill worker has");
        st.queue.erase(j->spec.id);
      }
      break;
    }
    free -= need;
    step_work::chunk_item ci = sched::chunk_item(*j, c);
    const bool stream = j->link && st.opts.kv.stream;
    ci.export_kv = c.last && !stream;
    if (stream) {
      j->stream_broken = false;  // this step streams from stream_next (0 after a new link)
      ci.stream_from = j->stream_next;
      j->stream_next = c.begin + c.length;
      streams->emplace(j->spec.id, std::make_pair(j->link, j->req));
    }
    if (j->announce()) self->send(j->req, state_atom::value, request_state::prefilling, st.opts.name(), j->reuse.reused);
    work.chunks.push_back(std::move(ci));
  }
  if (work.chunks.empty() && work.frees.empty()) return;
  if (!streams->empty()) {
    work.stream_layer_group = st.opts.kv.stream_layer_group;
    work.on_kv_piece = [streams](work_id id, kv_blocks_ptr piece) {
      auto it = streams->find(id);
      if (it == streams->end() || piece->empty()) return;
      caf::anon_send(it->second.first, kv_piece_atom::value, request_id(id), piece->front().epoch,
                     it->second.second, std::move(piece));
    };
  }
  st.we->start(self, std::move(work));
  on_event(self, wk::ev::step_started{});
}

// The link's name in the core (links are few: replaced ones keep their names).
wk::link_id link_id_of(self_ptr self, const kv_link_actor& link) {
  if (!link) return 0;
  auto& st = self->state;
  auto [it, fresh] = st.link_ids.try_emplace(link.address(), st.links.size() + 1);
  if (fresh) st.links.push_back(link);
  return it->second;
}

kv_link_actor link_of(self_ptr self, wk::link_id id) {
  auto& links = self->state.links;
  return id > 0 && id <= links.size() ? links[id - 1] : kv_link_actor{};
}

request_actor request_of(self_ptr self, request_id id) {
  auto it = self->state.requests.find(id);
  return it == self->state.requests.end() ? request_actor{} : it->second;
}

// A try of a transfer answered: delivered, or failed (the link or its decode worker died, or
// decode refused a corrupted or incomplete set).
void transfer_answered(self_ptr self, request_id id, wk::link_id link, const status& outcome) {
  if (!outcome.ok())
    spdlog::debug("prefill-{}: the KV transfer of request {} failed: {}", self->state.opts.index, id, outcome.to_string());
  on_event(self, wk::ev::transfer_answer{id, link, outcome});
  kick(self);  // an ended lease freed blocks that waiting prompts may need
}

// Carries out one of the core's commands (a prefill worker's core holds its leases).
void execute(self_ptr self, wk::command& command) {
  auto& st = self->state;
  std::visit(
      [&](auto& c) {
        using C = std::decay_t<decltype(c)>;
        if constexpr (std::is_same_v<C, wk::cmd::prefilled>) {
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
                    transfer_answered(self, id, link, ok ? status{} : status{errc::refused, "the decode side refused the KV"});
                  },
                  [self, id, link](caf::error& e) { transfer_answered(self, id, link, from_caf_error(e)); });
        } else if constexpr (std::is_same_v<C, wk::cmd::transfer_failed>) {
          self->send(st.router, transfer_atom::value, c.id, c.epoch, link_of(self, c.link));
        } else if constexpr (std::is_same_v<C, wk::cmd::forget>) {
          st.requests.erase(c.id);
        } else if constexpr (std::is_same_v<C, wk::cmd::report_load>) {
          report_load(self);
        } else if constexpr (std::is_same_v<C, wk::cmd::answer> || std::is_same_v<C, wk::cmd::ask_store> ||
                             std::is_same_v<C, wk::cmd::start_step> || std::is_same_v<C, wk::cmd::token> ||
                             std::is_same_v<C, wk::cmd::done> || std::is_same_v<C, wk::cmd::fail> ||
                             std::is_same_v<C, wk::cmd::tell_request> || std::is_same_v<C, wk::cmd::tell_router> ||
                             std::is_same_v<C, wk::cmd::publish>) {
          // A decode worker's: its core never gives them for leases.
        } else {
          static_assert(sizeof(C) == 0, "a command the prefill worker does not carry out");
        }
      },
      command);
}

void on_event(self_ptr self, const wk::event& e) {
  for (auto& c : self->state.core->on(e)) execute(self, c);
}

void apply(self_ptr self, step_result& r) {
  auto& st = self->state;
  st.we->returned(st.opts, r, int32_t(r.created_seqs.size()));
  on_event(self, wk::ev::step_returned{&r});
  record_prefix_cache(st.opts, *st.we->eng, st.prefix_last, r.error.ok() ? st.queue.planned_prompt_tokens() : 0);
  for (const auto& c : r.created_seqs)
    if (auto* j = st.queue.find(c.id)) j->seq = c.seq;
  for (auto id : st.queue.release_step()) {
    auto& j = *st.queue.find(id);
    if (j.cancelled || !r.error.ok()) {
      // All-or-nothing failed: every job in the step fails rather than retrying forever.
      if (j.cancelled) drop_job(self, j);
      else fail_job(self, j, r.error.code(), r.error.message());
      st.queue.erase(id);
      continue;
    }
    // A completed prompt produced token 0 (output token spec.resumed) and its KV blocks.
    auto tok = std::find_if(r.tokens.begin(), r.tokens.end(), [&](auto& t) { return t.id == id; });
    if (tok == r.tokens.end()) continue;
    const bool finished = stream_token(self, *st.we->eng, j, tok->token, tok->logprobs) != finish_reason::none;
    // The blocks it computed (not those it started with) go to the host store for others.
    if (st.we->eng->prefix_cache_enabled())
      publish_to_store(st.opts, *st.we->eng, j.seq, j.reuse.reused / st.we->eng->block_size());
    wk::lease lease{j.seq, nullptr, {}, 0, false, 0};
    if (!finished) {
      auto ex = std::find_if(r.exports.begin(), r.exports.end(), [&](auto& e) { return e.id == id; });
      lease.kv = ex != r.exports.end() ? ex->kv : nullptr;
      if (!lease.kv && j.stream_broken) {
        // Its last pieces went to a link that was replaced meanwhile: send the whole set
        // instead (the engine is idle between steps).
        lease.kv = export_all(*st.we->eng, j.seq, id, j.spec.epoch);
      }
      // Decode goes on from every token so far: the resumed ones (the prompt's tail) and this.
      lease.generated.assign(j.spec.prompt.end() - j.spec.resumed, j.spec.prompt.end());
      lease.generated.push_back(tok->token);
      lease.streamed_to = lease.kv ? 0 : link_id_of(self, j.link);
      st.requests[id] = j.req;
    }
    const wk::link_id link = finished ? 0 : link_id_of(self, j.link);
    on_event(self, wk::ev::prompt_done{j.spec, std::move(lease), link, finished});
    st.claims.release(id);
    st.queue.erase(id);
  }
  // Transfers that waited for the engine to be idle (it is, between steps).
  on_event(self, wk::ev::plan{});
}

}  // namespace

prefill_worker_actor::behavior_type prefill_worker_behavior(self_ptr self, std::shared_ptr<const model> m,
                                                            worker_options opts, router_actor router) {
  init_worker(self->state, worker_kind::prefill, std::move(m), std::move(opts), std::move(router));
  sched::worker::config c;
  c.kind = worker_kind::prefill;
  c.block_size = self->state.opts.kv.block_size;
  c.metrics = self->state.opts.metrics.get();
  c.export_all = [eng = self->state.we->eng.get()](seq_id s, request_id id, uint32_t epoch) {
    return export_all(*eng, s, id, epoch);
  };
  self->state.core = std::make_unique<sched::worker_core>(std::move(c));
  return {
      [self](prefill_atom, request_spec& spec, request_actor& req) {
        auto& st = self->state;
        queue_prompt(st, st.queue, std::move(spec), std::move(req));
        kick(self);
        report_load(self);
      },
      [self](ship_atom, request_id id, kv_link_actor& link) {
        auto& st = self->state;
        if (st.core->find(id)) {  // leased: the transfer starts now
          on_event(self, wk::ev::ship{id, link_id_of(self, link)});
          return;
        }
        // Still prefilling: its decode worker is already reserved. The KV streams from now on
        // (with stream_kv), or goes as a whole as soon as the prompt is done.
        if (auto* j = st.queue.find(id)) {
          if (j->link && j->link != link) {  // its decode worker changed: start over on the new one
            j->stream_next = 0;
            j->stream_broken = j->in_step;
          }
          j->link = link;
        }
      },
      [self](release_atom, request_id id) {
        on_event(self, wk::ev::release{id, std::nullopt});
        kick(self);
      },
      [self](down_atom, kv_link_actor& link) {
        if (auto it = self->state.link_ids.find(link.address()); it != self->state.link_ids.end())
          on_event(self, wk::ev::link_down{it->second});
      },
      [self](release_atom, request_id id, uint32_t epoch) {
        on_event(self, wk::ev::release{id, epoch});
        kick(self);
      },
      [self](cancel_atom, request_id id) {
        auto& st = self->state;
        switch (st.queue.cancel(id)) {
          case sched::cancel_outcome::after_step: return;  // dropped when the step returns
          case sched::cancel_outcome::now:
            drop_job(self, *st.queue.find(id));
            st.queue.erase(id);
            break;
          case sched::cancel_outcome::unknown: break;
        }
        on_event(self, wk::ev::cancel{id});  // its lease, if it has one
        kick(self);
        report_load(self);
      },
      [](pause_atom, request_id, bool) {},  // prefill emits one token: nothing to pause
      step_handler(self, apply, kick, report_load),
      [self](stats_atom) {
        auto& st = self->state;
        return st.we->stats(st.opts, nullptr, int32_t(st.queue.size()) + st.core->holding());
      },
  };
}

}  // namespace tandem
