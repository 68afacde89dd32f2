#pragma once
// What every worker actor shares: its state's base, the tokens it streams, the load it
// reports, its step handler and its start. Its options and engine are in worker_engine.h, its
// dealings with the host KV store in worker_store.h.
#include <memory>
#include <string>

#include "actors/protocol.h"
#include "actors/worker_engine.h"
#include "actors/worker_store.h"
#include "runtime/scheduler/sequence.h"

namespace tandem {

// Output token #index of a request to its request actor, with its log-probabilities when its
// sampling asked for them.
template <class Self>
void send_token(Self* self, const request_actor& req, int32_t index, token_id tok,
                const std::shared_ptr<const token_logprobs>& lp) {
  if (lp) self->send(req, token_atom::value, index, tok, *lp);
  else self->send(req, token_atom::value, index, tok);
}

// Takes a token sampled for e into it by the one stop rule (sched::take_token), streams it to
// e's request and tells the request when it ended; returns how (none: it goes on).
template <class Self, class Entry>
finish_reason stream_token(Self* self, const engine& eng, Entry& e, token_id tok,
                           const std::shared_ptr<const token_logprobs>& lp) {
  const bool eog = ends_generation(e.spec.sampling, e.spec.ignore_eos, eng.get_model().tok(), tok);
  const sched::token_outcome o = sched::take_token(e, tok, eog, eng.config().n_ctx);
  if (o.emit) send_token(self, e.req, o.index, tok, lp);
  if (o.end != finish_reason::none) self->send(e.req, done_atom::value, o.end);
  return o.end;
}

// A prefill or colocated worker's load for the router: its prompts still to compute.
template <class Self, class Table>
void report_prompt_load(Self* self, const router_actor& router, int32_t worker, const Table& prompts) {
  prefill_worker_load l;
  l.worker = worker;
  l.alive = true;
  const sched::prompt_load p = prompts.waiting_load();
  l.queued_tokens = p.tokens;
  l.queued_requests = p.requests;
  self->send(router, load_atom::value, l);
}

// What every worker's state holds: its options, router and engine, and the engine sequences
// to free at its next step.
struct worker_state_base {
  worker_options opts;
  router_actor router;
  std::unique_ptr<worker_engine> we;
  std::vector<seq_id> to_free;
};

// ...and a worker that computes prompts (prefill, colocated): the prompt blocks being computed
// (by request) and the engine's prefix-cache counters at the last report.
struct prompt_worker_state_base : worker_state_base {
  prefix_claims claims;
  prefix_cache_stats prefix_last;
};

// The step handler every worker has: the result applied, the next step planned, the load told.
template <class Self>
auto step_handler(Self self, void (*apply)(Self, step_result&), void (*kick)(Self), void (*report_load)(Self)) {
  return [=](step_atom, step_result_ptr& r) {
    apply(self, *r);
    kick(self);
    // No next step: the cores this worker kept go to the others (in a core share). A worker
    // with more work started its next step in kick and so never gave them up in between.
    if (!self->state.we->busy) self->state.we->eng->set_busy(false);
    report_load(self);
  };
}

// A prompt arrives at a prefill or colocated worker: queued in arrival order, counting what it
// expects to reuse of the prompts computing here (its load is only the rest).
template <class State, class Table>
auto& queue_prompt(State& st, Table& table, request_spec&& spec, request_actor&& req) {
  const int32_t expected = expected_reuse_at_arrival(*st.we->eng, st.claims, spec);
  auto& e = table.add(std::move(spec));
  e.req = std::move(req);
  e.reuse.expected_reuse = expected;
  return e;
}

// What every worker state starts with: its options (of its kind), router and engine, and the
// KV credits of a worker that decodes.
template <class State>
void init_worker(State& st, worker_kind kind, std::shared_ptr<const model> m, worker_options opts, router_actor router) {
  st.opts = std::move(opts);
  st.opts.kind = kind;
  if (!st.opts.faults) st.opts.faults = no_faults();  // (null given: none)
  st.router = std::move(router);
  st.we = std::make_unique<worker_engine>(std::move(m), st.opts);
  if constexpr (requires { st.ledger; })
    if (st.opts.decodes())
      st.ledger = std::make_unique<kv_credit_ledger>(st.we->eng->kv_pool().total_blocks(), st.opts.kv.block_size);
}

}  // namespace tandem
