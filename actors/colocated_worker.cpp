#include "actors/colocated_worker.h"

namespace tandem {
namespace {

using self_ptr = prefill_worker_actor::stateful_pointer<colocated_worker_state>;

void report_load(self_ptr self) {
  auto& st = self->state;
  report_prompt_load(self, st.router, st.opts.index, st.seqs);
}

void drop(self_ptr self, request_id id) {
  auto& st = self->state;
  auto* e = st.seqs.find(id);
  if (!e) return;
  // Its blocks past those it started with go to the host store (only between steps).
  if (!st.we->busy && e->seq != 0 && st.we->eng->prefix_cache_enabled())
    publish_to_store(st.opts, *st.we->eng, e->seq, e->reuse.reused / st.we->eng->block_size());
  if (e->seq != 0) st.to_free.push_back(e->seq);
  if (e->reserved) st.ledger->release(int64_t(id));
  st.seqs.erase(id);
  st.claims.release(id);
}

void kick(self_ptr self);

// Tokens this step may hold: the configured budget, or with a TPOT target what the fitted step
// cost says fits in its share of the target (Sarathi-Serve), decodes first; at least one KV
// block of prefill besides them, so prompts progress however loaded decode is.
int32_t step_budget(const colocated_worker_state& st, int32_t running) {
  const int32_t budget = st.opts.token_budget();
  const double target = st.opts.steps.tpot_target_ms;
  if (target <= 0) return budget;
  return st.cost.tokens_within(target * step_settings::colocated_step_share, running + st.opts.kv.block_size,
                               std::max(budget, running + st.opts.kv.block_size));
}

void kick(self_ptr self) {
  auto& st = self->state;
  if (st.we->busy) return;
  step_work work;
  work.frees = std::move(st.to_free);
  st.to_free.clear();
  const int32_t running = st.seqs.add_decodes(work);
  // Admission by credits, in arrival order: a prompt waits until its whole request fits.
  std::vector<pending_prefill> pending;
  const int32_t n_ctx = st.we->eng->config().n_ctx;
  for (auto id : st.seqs.waiting()) {
    auto& e = *st.seqs.find(id);
    if (!e.reserved) {
      if (running + int32_t(pending.size()) >= st.opts.steps.max_batch) break;
      const int32_t total = std::min<int32_t>(e.spec.total_tokens(), n_ctx);
      if (!st.ledger->try_reserve(int64_t(id), total)) break;
      e.reserved = true;
    }
    if (e.seq == 0 && st.we->eng->prefix_cache_enabled()) {
      auto find = [self](uint64_t rid) -> prompt_reuse* {
        auto* q = self->state.seqs.find(rid);
        return q ? &q->reuse : nullptr;
      };
      e.seq = start_with_prefix(self, st.opts, *st.we->eng, st.claims, e.spec, e.reuse, find, kick);
      if (e.seq == 0) continue;
      e.prefilled = e.reuse.reused;
    }
    pending.push_back({int64_t(id), int32_t(e.spec.prompt.size()), e.prefilled});
  }
  const auto plan = plan_colocated_step(running, pending, step_budget(st, running), st.opts.steps.chunk_size);
  for (const auto& c : plan.prefill) {
    auto& e = *st.seqs.find(request_id(c.request));
    if (e.announce()) self->send(e.req, state_atom::value, request_state::prefilling, st.opts.name(), e.reuse.reused);
    work.chunks.push_back(sched::chunk_item(e, c));
  }
  if (work.chunks.empty() && work.decodes.empty() && work.frees.empty()) return;
  st.we->start(self, std::move(work));
}

void apply(self_ptr self, step_result& r) {
  auto& st = self->state;
  st.we->returned(st.opts, r, int32_t(r.tokens.size()));
  if (r.error.ok()) st.cost.observe(r.batch_tokens, r.ms);
  record_prefix_cache(st.opts, *st.we->eng, st.prefix_last, r.error.ok() ? st.seqs.planned_prompt_tokens() : 0);
  for (const auto& c : r.created_seqs)
    if (auto* e = st.seqs.find(c.id)) e->seq = c.seq;
    else st.to_free.push_back(c.seq);
  for (auto id : st.seqs.release_step()) {
    auto& e = *st.seqs.find(id);
    if (e.cancelled) {
      drop(self, id);
    } else if (!r.error.ok()) {
      self->send(e.req, fail_atom::value, r.error.code(), r.error.message());
      drop(self, id);
    }
  }
  if (!r.error.ok()) return;
  for (const auto& t : r.tokens) {
    auto* e = st.seqs.find(t.id);
    if (!e) continue;
    if (!e->decoding) {  // its prompt just completed: token 0
      st.seqs.start_decoding(*e);
      st.claims.release(t.id);
      self->send(e->req, state_atom::value, request_state::decoding, st.opts.name(), e->reuse.reused);
      self->send(st.router, state_atom::value, t.id, request_state::decoding);
    }
    if (stream_token(self, *st.we->eng, *e, t.token, t.logprobs) != finish_reason::none) drop(self, t.id);
  }
}

}  // namespace

prefill_worker_actor::behavior_type colocated_worker_behavior(self_ptr self, std::shared_ptr<const model> m,
                                                              worker_options opts, router_actor router) {
  init_worker(self->state, worker_kind::colocated, std::move(m), std::move(opts), std::move(router));
  return {
      [self](prefill_atom, request_spec& spec, request_actor& req) {
        auto& st = self->state;
        const int32_t n_ctx = st.we->eng->config().n_ctx;
        const int32_t total = std::min<int32_t>(spec.total_tokens(), n_ctx);
        if (blocks_for_tokens(total, st.opts.kv.block_size) > st.ledger->total_blocks()) {
          self->send(req, fail_atom::value, errc::out_of_kv_blocks,
                     std::string("request needs more KV blocks than the worker has"));
          return;
        }
        queue_prompt(st, st.seqs, std::move(spec), std::move(req));
        kick(self);
        report_load(self);
      },
      [](ship_atom, request_id, kv_link_actor&) {},  // colocated: the KV never leaves
      [](release_atom, request_id) {},
      [](release_atom, request_id, uint32_t) {},  // no leases: its KV never leaves it
      [](down_atom, kv_link_actor&) {},
      [self](cancel_atom, request_id id) {
        if (self->state.seqs.cancel(id) == sched::cancel_outcome::now) drop(self, id);
        kick(self);
        report_load(self);
      },
      [self](pause_atom, request_id id, bool pause) {
        self->state.seqs.pause(id, pause);
        kick(self);
      },
      step_handler(self, apply, kick, report_load),
      [self](stats_atom) {
        auto& st = self->state;
        return st.we->stats(st.opts, st.ledger.get(), int32_t(st.seqs.size()));
      },
  };
}

}  // namespace tandem
