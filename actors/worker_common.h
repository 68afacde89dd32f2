#pragma once
// What every worker actor shares: its options, its engine and the runner it computes on.
#include <memory>
#include <string>

#include "actors/compute_runner.h"
#include "actors/kv_store.h"
#include "actors/protocol.h"
#include "runtime/engine/engine.h"
#include "runtime/fault_injection.h"
#include "runtime/kinds.h"
#include "runtime/serving_config.h"
#include "runtime/scheduler/sequence.h"
#include "runtime/scheduler/worker_core.h"
#include "runtime/engine/step.h"

namespace tandem {

// What one process gives each of its workers (the rest is the deployment's and shared).
struct worker_resources {
  int n_threads = 1;  // its own cores, or its floor in a core share
  int32_t kv_blocks = 0;  // 0: as many as kv_memory_bytes holds
  int64_t kv_memory_bytes = 256ll << 20;
  // Cores shared with the process's other workers (null: it owns n_threads): it computes on
  // every core the others' floors leave while they are busy (kernels/thread_pool.h).
  std::shared_ptr<kernels::core_share> cores;
};

struct worker_options {
  worker_kind kind = worker_kind::prefill;
  int32_t index = 0;
  worker_resources resources;
  kv_settings kv;       // the deployment's, the same for every worker (the cluster sends both
  step_settings steps;  // to joining nodes whole)
  // The host KV store (null: none): prompts fetch their cached prefix from it, and finished
  // prompts and answers publish their full blocks to it.
  std::shared_ptr<kv_store_directory> store;
  std::chrono::milliseconds store_timeout{1000};  // a fetch not answered by then is given up
  std::shared_ptr<metrics::registry> metrics;
  std::shared_ptr<fault_hooks> faults = no_faults();  // what faults this worker meets

  // Tokens per step: a prefill or colocated step's budget (a decode step is its batch).
  int32_t token_budget() const {
    switch (kind) {
      case worker_kind::prefill: return steps.prefill_token_budget;
      case worker_kind::colocated: return steps.colocated_token_budget;
      case worker_kind::decode: return 0;
    }
    return 0;
  }
  bool decodes() const { return kind != worker_kind::prefill; }  // it holds KV credits
  std::string name() const { return worker_name(kind, index).str(); }  // "decode-1"
};

// Engine + runner, destroyed runner first (it joins the step that uses the engine).
struct worker_engine {
  std::unique_ptr<engine> eng;
  std::unique_ptr<compute_runner> runner;
  bool busy = false;
  uint64_t steps = 0;      // steps started
  uint64_t finished = 0;   // steps whose result came back (progress, as heartbeats report it)
  int32_t free_at_start = -1;  // the pool's free blocks when the step in flight began
  // The step in flight (or the last one): its sequences, and the prompt tokens it computes.
  int32_t step_sequences = 0, step_prefill_tokens = 0;
  std::shared_ptr<fault_hooks> faults;
  std::shared_ptr<std::atomic<bool>> stopping = std::make_shared<std::atomic<bool>>(false);
  worker_engine(std::shared_ptr<const model> m, const worker_options& o) : faults(o.faults) {  // (never null: init_worker)
    engine_options eo;
    eo.n_threads = o.resources.n_threads;
    eo.cores = o.resources.cores;
    eo.core_group = int(o.kind);  // a decode worker paces for prefill workers, not for its peers
    eo.matmul = o.steps.matmul;
    eo.kv_dtype = o.kv.dtype;
    eo.block_size = o.kv.block_size;
    eo.n_kv_blocks = o.resources.kv_blocks;
    eo.kv_memory_bytes = o.resources.kv_memory_bytes;
    eo.prefix_cache = o.kv.prefix_cache;
    eng = std::make_unique<engine>(std::move(m), eo);
    runner = std::make_unique<compute_runner>();
  }
  ~worker_engine() {
    stopping->store(true);  // a stalled step (fault injection) gives up its wait
    runner.reset();
  }
  worker_engine(worker_engine&&) = default;
  worker_engine& operator=(worker_engine&&) = default;

  // Posts the step; its result comes back to `self` as (step_atom, step_result_ptr).
  template <class Handle>
  void start(Handle self, step_work work) {
    free_at_start = eng->available_blocks();  // what stats() shows while the step owns the pool
    // (A step that only frees sequences leaves the last computing step's figures shown.)
    if (const auto n = work.imports.size() + work.decodes.size() + work.chunks.size(); n > 0) {
      step_sequences = int32_t(n);
      step_prefill_tokens = 0;
      for (const auto& c : work.chunks) step_prefill_tokens += int32_t(c.tokens.size());
      for (const auto& im : work.imports) step_prefill_tokens += int32_t(im.feed.size());
    }
    busy = true;
    eng->set_busy(true);  // in a core share: the others leave this worker its floor from now
    ++steps;
    engine* e = eng.get();
    caf::weak_actor_ptr weak = caf::actor_cast<caf::weak_actor_ptr>(self);
    // Fault injection: this step hangs before it computes (the actor stays responsive).
    const auto stall = faults->step_stall();
    runner->post([e, weak, stall, stop = stopping, w = std::move(work)]() mutable {
      for (auto until = std::chrono::steady_clock::now() + stall; std::chrono::steady_clock::now() < until && !*stop;)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      if (*stop) return;
      auto r = std::make_shared<step_result>(run_step(*e, std::move(w)));
      if (auto strong = caf::actor_cast<caf::strong_actor_ptr>(weak))
        caf::anon_send(caf::actor_cast<Handle>(strong), step_atom::value, std::move(r));
    });
  }

  // The step in flight came back with r (`batch` sequences in it): recorded, the engine idle.
  void returned(const worker_options& o, const step_result& r, int32_t batch);

  // What a worker answers to stats_atom (the dashboard's row, the router's heartbeat). Its
  // pool's free blocks are read only between steps: during one (the compute thread owns the
  // pool then) it says what they were when the step began. `ledger`: its credits, if any.
  worker_stats stats(const worker_options& o, const kv_credit_ledger* ledger, int32_t active) const {
    worker_stats s;
    s.name = o.name();
    s.kv_total_blocks = eng->kv_pool().total_blocks();
    s.kv_free_blocks = busy ? free_at_start : eng->available_blocks();
    if (ledger) s.reserved_blocks = ledger->reserved_blocks();
    s.active = active;
    if (ledger) s.max_batch = o.steps.max_batch;
    s.steps = steps;
    s.busy = busy;
    s.finished_steps = finished;
    s.step_sequences = step_sequences;
    s.step_prefill_tokens = step_prefill_tokens;
    return s;
  }
};

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

// Per-step metrics every worker records.
inline void record_step(const worker_options& o, const step_result& r, int32_t batch_size) {
  if (!o.metrics) return;
  const metrics::labels l{{"worker", o.name()}};
  o.metrics->get_histogram("tandem_worker_step_seconds", "Compute time of one worker step", metrics::latency_seconds_buckets(), l)
      .observe(r.ms / 1000.0);
  o.metrics->get_histogram("tandem_worker_batch_size", "Sequences in one worker step",
                           metrics::exponential_buckets(1, 2, 10), l)
      .observe(batch_size);
  o.metrics->get_histogram("tandem_worker_step_tokens", "Tokens in one worker step",
                           metrics::exponential_buckets(1, 2, 14), l)
      .observe(r.batch_tokens);
  o.metrics->get_counter("tandem_worker_busy_seconds_total", "Seconds spent computing (busy fraction: its rate)", l)
      .inc(r.ms / 1000.0);
  o.metrics->get_gauge("tandem_worker_kv_free_blocks",
                       "KV blocks free to take in the worker's pool (free, or kept only by the prefix cache)", l)
      .set(r.free_blocks);
  o.metrics->get_gauge("tandem_worker_kv_cached_blocks",
                       "Of the free KV blocks, those the prefix cache keeps for reuse (evicted on demand)", l)
      .set(r.cached_only_blocks);
}

inline void worker_engine::returned(const worker_options& o, const step_result& r, int32_t batch) {
  busy = false;
  ++finished;
  record_step(o, r, batch);
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

// Sends the full blocks of s from block `from_block` on to the host store (fire and forget).
// The engine must be idle (actor thread, between steps).
inline void publish_to_store(const worker_options& o, const engine& eng, seq_id s, int32_t from_block) {
  if (!o.store) return;
  auto store = o.store->get();
  if (!store) return;
  auto keys = eng.sequence_keys(s);
  if (from_block < 0 || int32_t(keys.size()) <= from_block) return;
  auto blocks = std::make_shared<std::vector<kv_block_export>>();
  if (!eng.export_kv(s, 0, eng.config().n_layer, from_block * eng.block_size(), *blocks).ok()) return;
  keys.erase(keys.begin(), keys.begin() + from_block);
  if (blocks->size() < keys.size()) return;
  blocks->resize(keys.size());  // the full blocks: a partial last one has no key
  caf::anon_send(store, publish_atom::value, std::vector<uint64_t>(keys.begin(), keys.end()),
                 kv_blocks_ptr(std::move(blocks)));
}

// Asks the host store for the blocks named by `keys`; `done(keys, blocks)` runs on the actor
// with what came (null: no store answer in time, or the store died). False: no store to ask.
template <class Self, class Done>
bool fetch_from_store(Self self, const worker_options& o, std::vector<block_key> keys, Done done) {
  if (!o.store || keys.empty()) return false;
  auto store = o.store->get();
  if (!store) return false;
  const auto t0 = std::chrono::steady_clock::now();
  auto observe = [metrics = o.metrics, t0] {
    if (metrics)
      metrics->get_histogram("tandem_kv_store_fetch_seconds", "Time to fetch a prompt's cached blocks from the KV store",
                             metrics::latency_seconds_buckets())
          .observe(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  };
  std::vector<uint64_t> ask(keys.begin(), keys.end());
  self->request(store, o.store_timeout, fetch_atom::value, std::move(ask))
      .then([keys, done, observe](kv_blocks_ptr& b) mutable { observe(); done(keys, std::move(b)); },
            [keys, done](caf::error&) mutable { done(keys, nullptr); });
  return true;
}

using sched::prompt_reuse;  // what a prompt has of the prefix cache and the host store

// On arrival, what a prompt will reuse of blocks other prompts here are computing: its load
// counts only the rest from the start (the engine's own cache is read only between steps;
// its salt and block size are fixed at construction).
inline int32_t expected_reuse_at_arrival(const engine& eng, const prefix_claims& claims, const request_spec& spec) {
  if (!eng.prefix_cache_enabled()) return 0;
  const auto keys = prompt_block_keys(eng.prefix_salt(), spec.prompt, eng.block_size());
  return claims.claimed_run(keys, 0, spec.id) * eng.block_size();
}

// Between steps (the engine is idle): starts `spec`'s prompt on a new sequence with its cached
// prefix attached (r.reused), or returns 0 while it waits — for the host store, asked first
// for the blocks this worker lacks, or for another prompt computing (or fetching) its next
// block. A prompt that asks the store claims what it lacks, so prompts like it wait for this
// one rather than fetch or compute the same. `find(id)` locates r again when the store
// answers (null: the request left); `kick(self)` plans again then.
template <class Self, class Find, class Kick>
seq_id start_with_prefix(Self self, const worker_options& o, engine& eng, prefix_claims& claims,
                         const request_spec& spec, prompt_reuse& r, Find find, Kick kick) {
  if (r.fetched) {
    (void)eng.cache_blocks(r.fetched_keys, *r.fetched);
    r.fetched = nullptr;
  }
  if (r.fetch == 0) {
    r.fetch = 2;
    auto keys = prompt_block_keys(eng.prefix_salt(), spec.prompt, eng.block_size());
    const size_t cached = size_t(eng.cached_prefix_tokens(spec.prompt) / eng.block_size());
    if (cached < keys.size() && !claims.blocked(spec.id, keys, int32_t(cached))) {
      claims.claim(spec.id, std::span(keys).subspan(cached));
      keys.erase(keys.begin(), keys.begin() + std::ptrdiff_t(cached));
      const uint64_t id = spec.id;
      if (fetch_from_store(self, o, std::move(keys),
                           [self, id, find, kick](const std::vector<block_key>& asked, kv_blocks_ptr blocks) {
                             if (prompt_reuse* q = find(id); q && q->fetch == 1) {
                               q->fetch = 2;
                               if (blocks && !blocks->empty()) {
                                 q->fetched = std::move(blocks);
                                 q->fetched_keys = asked;
                               }
                             }
                             kick(self);
                           }))
        r.fetch = 1;
    }
  }
  if (r.fetch == 1) return 0;  // waiting for the store's answer
  int32_t reused = 0;
  const seq_id s = eng.start_prompt(spec.id, spec.prompt, claims, reused);
  (s == 0 ? r.expected_reuse : r.reused) = reused;
  return s;
}

// Prefix-cache metrics: the engine's counters since `last` (updated), and the prompt tokens the
// step computed. Called on the actor thread between steps (the engine is idle).
inline void record_prefix_cache(const worker_options& o, const engine& eng,
                                prefix_cache_stats& last, int64_t computed_prompt_tokens) {
  if (!o.metrics) return;
  auto& m = *o.metrics;
  if (!eng.prefix_cache_enabled()) {
    m.get_counter("tandem_prompt_tokens_computed_total", "Prompt tokens run through the model (cached prefixes are not).")
        .inc(double(computed_prompt_tokens));
    return;
  }
  const prefix_cache_stats now = eng.prefix_stats();
  sched::count_prefix_use(m, double(computed_prompt_tokens), double(now.hit_tokens - last.hit_tokens),
                   double(now.lookup_tokens - last.lookup_tokens));
  m.get_counter("tandem_prefix_cache_published_blocks_total", "KV blocks named in a worker's prefix cache.")
      .inc(double(now.published_blocks - last.published_blocks));
  m.get_counter("tandem_prefix_cache_evicted_blocks_total", "Unused cached KV blocks evicted for room.")
      .inc(double(now.evicted_blocks - last.evicted_blocks));
  const metrics::labels l{{"worker", o.name()}};
  m.get_gauge("tandem_prefix_cache_blocks", "KV blocks a worker's prefix cache names now (in use or not).", l)
      .set(now.cached_blocks);
  m.get_gauge("tandem_prefix_cache_bytes", "Bytes of KV blocks a worker's prefix cache names now.", l)
      .set(double(now.cached_blocks) * double(eng.kv_pool().layout().bytes_per_block()));
  last = now;
}

}  // namespace tandem
