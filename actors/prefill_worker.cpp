#include "actors/prefill_worker.h"

#include "actors/error.h"

#include <spdlog/spdlog.h>

#include <optional>

namespace tandem {
namespace {

using self_ptr = prefill_worker_actor::stateful_pointer<prefill_worker_state>;

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
  for (seq_id s : work.frees) free += eng.blocks_freed_by(s);  // freed before the forward pass
  for (const auto& c : plan) {
    auto* j = st.queue.find(request_id(c.request));
    if (!j) continue;
    const int32_t need = j->seq == 0 ? eng.blocks_needed(0, c.length) : eng.blocks_needed(j->seq, c.length);
    if (need > free) {
      if (st.leases.empty() && work.chunks.empty() && j->prefilled == 0 &&
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
}

// The lease of request `id` ends (of attempt `epoch` only, when given): its blocks are freed
// before the next step.
void end_lease(self_ptr self, request_id id, std::optional<uint32_t> epoch = std::nullopt) {
  auto& st = self->state;
  auto it = st.leases.find(id);
  if (it == st.leases.end() || (epoch && it->second.spec.epoch != *epoch)) return;
  st.to_free.push_back(it->second.seq);
  st.leases.erase(it);
  kick(self);
}

// A try over `link` failed: the lease stays, and the router decides (ship again, or move on).
void transfer_failed(self_ptr self, request_id id, const kv_link_actor& link, const status& why) {
  if (self->state.opts.metrics)
    self->state.opts.metrics
        ->get_counter("tandem_kv_transfer_failures_total", "KV transfers that failed back to their lease, by code",
                      {{"code", std::string(to_string(why.code()))}})
        .inc();
  spdlog::debug("prefill-{}: the KV transfer of request {} failed: {}", self->state.opts.index, id, why.to_string());
  auto it = self->state.leases.find(id);
  if (it == self->state.leases.end() || it->second.sending != link) return;
  it->second.sending = nullptr;
  it->second.resend_all = true;
  self->send(self->state.router, transfer_atom::value, id, it->second.spec.epoch, link);
}

// Hands a finished prompt's KV (all of it, or only the closing message when it was streamed)
// to the link; the lease ends when the decode worker holds it.
void start_transfer(self_ptr self, request_id id, kv_link_actor link) {
  auto it = self->state.leases.find(id);
  if (it == self->state.leases.end()) return;
  auto& l = it->second;
  if (!l.kv && ((l.streamed_to && l.streamed_to != link) || l.resend_all)) {
    // Its pieces went to a link that was replaced (its decode worker or the link died), or a
    // try failed (a piece lost or corrupted): the decode side cannot build on them, so the
    // whole set goes again, exported while the engine is idle.
    if (self->state.we->busy) {
      l.pending = link;
      return;
    }
    auto all = std::make_shared<std::vector<kv_block_export>>();
    const engine& eng = *self->state.we->eng;
    (void)eng.export_kv(l.seq, 0, eng.config().n_layer, 0, *all, id, l.spec.epoch);
    l.kv = std::move(all);
    l.streamed_to = nullptr;
    l.resend_all = false;
  }
  l.pending = nullptr;
  l.sending = link;
  // Told before the transfer starts: if this worker dies later, the link still delivers.
  self->send(self->state.router, ship_atom::value, id);
  kv_blocks_ptr kv = l.kv ? l.kv : std::make_shared<const std::vector<kv_block_export>>();
  // The lease stays until decode confirms. A failed try (the link or its decode worker died,
  // or decode refused a corrupted or incomplete set) goes to the router, which ships it again
  // from this lease or moves the request on (and releases the lease).
  auto failed = [self, id, link](const status& why) { transfer_failed(self, id, link, why); };
  self->request(link, std::chrono::seconds(60), transfer_atom::value, l.spec, l.req, kv, l.generated)
      .then(
          [self, id, link, failed](bool ok) {
            if (!ok) return failed({errc::refused, "the decode side refused the KV"});
            auto it = self->state.leases.find(id);
            if (it != self->state.leases.end() && it->second.sending == link) end_lease(self, id);
          },
          [failed](caf::error& e) { failed(from_caf_error(e)); });
}

// Transfers that waited for the engine to be idle (it is, between steps).
void start_pending(self_ptr self) {
  std::vector<std::pair<request_id, kv_link_actor>> pending;
  for (auto& [id, l] : self->state.leases)
    if (l.pending) pending.emplace_back(id, l.pending);
  for (auto& [id, link] : pending) start_transfer(self, id, link);
}

void apply(self_ptr self, step_result& r) {
  auto& st = self->state;
  st.we->returned(st.opts, r, int32_t(r.created_seqs.size()));
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
    if (finished) {
      st.to_free.push_back(j.seq);
    } else {
      auto ex = std::find_if(r.exports.begin(), r.exports.end(), [&](auto& e) { return e.id == id; });
      kv_blocks_ptr kv = ex != r.exports.end() ? ex->kv : nullptr;
      if (!kv && j.stream_broken) {
        // Its last pieces went to a link that was replaced meanwhile: send the whole set
        // instead (the engine is idle between steps).
        auto all = std::make_shared<std::vector<kv_block_export>>();
        const engine& eng = *st.we->eng;
        (void)eng.export_kv(j.seq, 0, eng.config().n_layer, 0, *all, id, j.spec.epoch);
        kv = std::move(all);
      }
      // Decode goes on from every token so far: the resumed ones (the prompt's tail) and this.
      std::vector<token_id> generated(j.spec.prompt.end() - j.spec.resumed, j.spec.prompt.end());
      generated.push_back(tok->token);
      kv_link_actor streamed_to = kv ? kv_link_actor{} : j.link;
      st.leases[id] = {j.spec, j.req, j.seq, std::move(kv), std::move(generated), std::move(streamed_to), {}, {}};
    }
    self->send(st.router, prefilled_atom::value, id, st.opts.index, finished);
    if (!finished && j.link) start_transfer(self, id, j.link);
    st.claims.release(id);
    st.queue.erase(id);
  }
  start_pending(self);
}

}  // namespace

prefill_worker_actor::behavior_type prefill_worker_behavior(self_ptr self, std::shared_ptr<const model> m,
                                                            worker_options opts, router_actor router) {
  init_worker(self->state, worker_kind::prefill, std::move(m), std::move(opts), std::move(router));
  return {
      [self](prefill_atom, request_spec& spec, request_actor& req) {
        auto& st = self->state;
        queue_prompt(st, st.queue, std::move(spec), std::move(req));
        kick(self);
        report_load(self);
      },
      [self](ship_atom, request_id id, kv_link_actor& link) {
        auto& st = self->state;
        if (st.leases.count(id)) {
          start_transfer(self, id, link);
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
      [self](release_atom, request_id id) { end_lease(self, id); },
      [self](down_atom, kv_link_actor& link) {
        // A link died: a transfer it had taken will never be answered (its promise died
        // with it), so it fails now rather than at the timeout.
        std::vector<request_id> ids;
        for (auto& [id, l] : self->state.leases)
          if (l.sending == link) ids.push_back(id);
        for (auto id : ids) transfer_failed(self, id, link, {errc::worker_failed, "its KV link died"});
      },
      [self](release_atom, request_id id, uint32_t epoch) { end_lease(self, id, epoch); },
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
        if (auto l = st.leases.find(id); l != st.leases.end()) {
          st.to_free.push_back(l->second.seq);
          st.leases.erase(l);
        }
        kick(self);
        report_load(self);
      },
      [](pause_atom, request_id, bool) {},  // prefill emits one token: nothing to pause
      step_handler(self, apply, kick, report_load),
      [self](stats_atom) {
        auto& st = self->state;
        return st.we->stats(st.opts, nullptr, int32_t(st.queue.size() + st.leases.size()));
      },
  };
}

}  // namespace tandem
