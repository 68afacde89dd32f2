#include "actors/colocated_worker.h"

namespace tandem {
namespace {

using self_ptr = prefill_worker_actor::stateful_pointer<colocated_worker_state>;

void report_load(self_ptr self) {
  auto& st = self->state;
  prefill_worker_load l;
  l.worker = st.opts.index;
  l.alive = true;
  for (auto id : st.waiting) {
    const auto& e = st.seqs.at(id);
    l.queued_tokens += int64_t(e.spec.prompt.size()) - std::max(e.prefilled, e.seq == 0 ? e.reuse.expected_reuse : 0);
    ++l.queued_requests;
  }
  self->send(st.router, load_atom::value, l);
}

void drop(self_ptr self, request_id id) {
  auto& st = self->state;
  auto it = st.seqs.find(id);
  if (it == st.seqs.end()) return;
  // Its blocks past those it started with go to the host store (only between steps).
  if (!st.we->busy && it->second.seq != 0 && st.we->eng->prefix_cache_enabled())
    publish_to_store(st.opts, *st.we->eng, it->second.seq, it->second.reuse.reused / st.we->eng->block_size());
  if (it->second.seq != 0) st.to_free.push_back(it->second.seq);
  if (it->second.reserved) st.ledger->release(int64_t(id));
  st.waiting.erase(std::remove(st.waiting.begin(), st.waiting.end(), id), st.waiting.end());
  st.seqs.erase(it);
  st.claims.release(id);
}

void kick(self_ptr self);

void kick(self_ptr self) {
  auto& st = self->state;
  if (st.we->busy) return;
  step_work work;
  work.frees = std::move(st.to_free);
  st.to_free.clear();
  int32_t running = 0;
  for (auto& [id, e] : st.seqs) {
    if (!e.decoding || e.paused) continue;
    e.in_step = true;
    ++running;
    work.decodes.push_back({id, e.seq, e.last, e.generated, e.spec.sampling, e.output, e.penalty_prompt});
  }
  // Admission by credits, in arrival order: a prompt waits until its whole request fits.
  std::vector<pending_prefill> pending;
  const int32_t n_ctx = st.we->eng->config().n_ctx;
  for (auto id : st.waiting) {
    auto& e = st.seqs.at(id);
    if (!e.reserved) {
      if (running + int32_t(pending.size()) >= st.opts.max_batch) break;
      const int32_t total = std::min<int32_t>(e.spec.total_tokens(), n_ctx);
      if (!st.ledger->try_reserve(int64_t(id), total)) break;
      e.reserved = true;
    }
    if (e.seq == 0 && st.we->eng->prefix_cache_enabled()) {
      auto find = [self](uint64_t rid) -> prompt_reuse* {
        auto it = self->state.seqs.find(rid);
        return it == self->state.seqs.end() ? nullptr : &it->second.reuse;
      };
      e.seq = start_with_prefix(self, st.opts, *st.we->eng, st.claims, e.spec, e.reuse, find, kick);
      if (e.seq == 0) continue;
      e.prefilled = e.reuse.reused;
    }
    pending.push_back({int64_t(id), int32_t(e.spec.prompt.size()), e.prefilled});
  }
  const auto plan = plan_colocated_step(running, pending, st.opts.token_budget, st.opts.chunk_size);
  for (const auto& c : plan.prefill) {
    auto& e = st.seqs.at(request_id(c.request));
    step_work::chunk_item ci;
    ci.id = e.spec.id;
    ci.seq = e.seq;
    ci.tokens.assign(e.spec.prompt.begin() + c.begin, e.spec.prompt.begin() + c.begin + c.length);
    ci.last = c.last;
    ci.export_kv = false;
    ci.sampling = e.spec.sampling;
    ci.first_index = e.spec.resumed;
    ci.output = e.output;  // empty unless the request penalizes repeats
    ci.prompt = e.penalty_prompt;
    if (!e.announced) {
      e.announced = true;
      self->send(e.req, state_atom::value, request_state::prefilling);
    }
    e.in_step = true;
    e.planned = c.length;
    work.chunks.push_back(std::move(ci));
  }
  if (work.chunks.empty() && work.decodes.empty() && work.frees.empty()) return;
  st.we->start(self, std::move(work));
}

void on_token(self_ptr self, colocated_worker_state::seq_entry& e, token_id tok,
              const std::shared_ptr<const token_logprobs>& lp) {
  const request_id id = e.spec.id;
  const bool eog = ends_generation(e.spec.sampling, e.spec.ignore_eos, self->state.we->eng->get_model().tok(), tok);
  const finish_reason end = finish_after(e.spec, e.generated + 1, eog, self->state.we->eng->config().n_ctx);
  if (end != finish_reason::stop) {
    send_token(self, e.req, e.generated, tok, lp);
    ++e.generated;
    if (e.spec.sampling.penalizes()) e.output.push_back(tok);
    e.last = tok;
  }
  if (end != finish_reason::none) {
    self->send(e.req, done_atom::value, end);
    drop(self, id);
  }
}

void apply(self_ptr self, step_result& r) {
  auto& st = self->state;
  st.we->busy = false;
  ++st.we->finished;
  record_step(st.opts, "colocated", r, int32_t(r.tokens.size()));
  int64_t computed = 0;
  for (const auto& [id, e] : st.seqs)
    if (e.in_step && !e.decoding && r.error.ok()) computed += e.planned;
  record_prefix_cache(st.opts, "colocated", *st.we->eng, st.prefix_last, computed);
  for (const auto& c : r.created_seqs)
    if (auto it = st.seqs.find(c.id); it != st.seqs.end()) it->second.seq = c.seq;
    else st.to_free.push_back(c.seq);
  std::vector<request_id> in_step;
  for (auto& [id, e] : st.seqs)
    if (e.in_step) in_step.push_back(id);
  for (auto id : in_step) {
    auto& e = st.seqs.at(id);
    e.in_step = false;
    if (e.cancelled) {
      drop(self, id);
      continue;
    }
    if (!r.error.ok()) {
      self->send(e.req, fail_atom::value, r.error.code(), r.error.message());
      drop(self, id);
      continue;
    }
    if (!e.decoding) e.prefilled += e.planned;
    e.planned = 0;
  }
  if (!r.error.ok()) return;
  for (const auto& t : r.tokens) {
    auto it = st.seqs.find(t.id);
    if (it == st.seqs.end()) continue;
    auto& e = it->second;
    if (!e.decoding) {  // its prompt just completed: token 0
      e.decoding = true;
      st.waiting.erase(std::remove(st.waiting.begin(), st.waiting.end(), t.id), st.waiting.end());
      st.claims.release(t.id);
      self->send(e.req, state_atom::value, request_state::decoding);
      self->send(st.router, state_atom::value, t.id, request_state::decoding);
    }
    on_token(self, e, t.token, t.logprobs);
  }
}

}  // namespace

prefill_worker_actor::behavior_type colocated_worker_behavior(self_ptr self, std::shared_ptr<const model> m,
                                                              worker_options opts, router_actor router) {
  auto& st = self->state;
  st.opts = std::move(opts);
  st.router = std::move(router);
  st.we = std::make_unique<worker_engine>(std::move(m), st.opts);
  st.ledger = std::make_unique<kv_credit_ledger>(st.we->eng->kv_pool().total_blocks(), st.opts.block_size);
  return {
      [self](prefill_atom, request_spec& spec, request_actor& req) {
        auto& st = self->state;
        const int32_t n_ctx = st.we->eng->config().n_ctx;
        const int32_t total = std::min<int32_t>(spec.total_tokens(), n_ctx);
        if (blocks_for_tokens(total, st.opts.block_size) > st.ledger->total_blocks()) {
          self->send(req, fail_atom::value, errc::out_of_kv_blocks,
                     std::string("request needs more KV blocks than the worker has"));
          return;
        }
        const request_id id = spec.id;
        colocated_worker_state::seq_entry e;
        e.generated = spec.resumed;  // a migrated request goes on from there
        if (spec.sampling.penalizes()) e.output = spec.resumed_output();
        e.penalty_prompt = spec.prompt_for_penalty();
        e.reuse.expected_reuse = expected_reuse_at_arrival(*st.we->eng, st.claims, spec);
        e.spec = std::move(spec);
        e.req = std::move(req);
        st.seqs.emplace(id, std::move(e));
        st.waiting.push_back(id);
        kick(self);
        report_load(self);
      },
      [](ship_atom, request_id, kv_link_actor&) {},  // colocated: the KV never leaves
      [](release_atom, request_id) {},
      [](release_atom, request_id, uint32_t) {},  // no leases: its KV never leaves it
      [](down_atom, kv_link_actor&) {},
      [self](cancel_atom, request_id id) {
        auto it = self->state.seqs.find(id);
        if (it == self->state.seqs.end()) return;
        if (it->second.in_step) it->second.cancelled = true;
        else drop(self, id);
        kick(self);
        report_load(self);
      },
      [self](pause_atom, request_id id, bool pause) {
        if (auto it = self->state.seqs.find(id); it != self->state.seqs.end()) it->second.paused = pause;
        kick(self);
      },
      [self](step_atom, step_result_ptr& r) {
        apply(self, *r);
        kick(self);
        report_load(self);
      },
      [self](stats_atom) {
        auto& st = self->state;
        return st.we->stats("colocated", st.opts, st.ledger.get(), int32_t(st.seqs.size()));
      },
  };
}

}  // namespace tandem
