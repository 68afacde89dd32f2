#pragma once
// A worker's options and its engine: the engine with the thread it computes on, the per-step
// metrics and the stats answer every worker gives.
#include <atomic>
#include <chrono>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "actors/compute_runner.h"
#include "actors/kv_store.h"
#include "actors/protocol.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/step.h"
#include "runtime/fault_injection.h"
#include "runtime/kinds.h"
#include "runtime/scheduler/worker_core.h"
#include "runtime/serving_config.h"

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
  kv_settings kv;  // the deployment's, the same for every worker (the cluster sends both
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
  uint64_t steps = 0;  // steps started
  uint64_t finished = 0;  // steps whose result came back (progress, as heartbeats report it)
  int32_t free_at_start = -1;  // the pool's free blocks when the step in flight began
  // The step in flight (or the last one): its sequences, and the prompt tokens it computes.
  int32_t step_sequences = 0, step_prefill_tokens = 0;
  std::shared_ptr<fault_hooks> faults;
  std::shared_ptr<std::atomic<bool>> stopping = std::make_shared<std::atomic<bool>>(false);
  worker_engine(std::shared_ptr<const model> m, const worker_options& o)
      : faults(o.faults) {  // (never null: init_worker)
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

// Per-step metrics every worker records.
inline void record_step(const worker_options& o, const step_result& r, int32_t batch_size) {
  if (!o.metrics) return;
  const metrics::labels l{{"worker", o.name()}};
  o.metrics
      ->get_histogram("tandem_worker_step_seconds", "Compute time of one worker step",
                      metrics::latency_seconds_buckets(), l)
      .observe(r.ms / 1000.0);
  o.metrics
      ->get_histogram("tandem_worker_batch_size", "Sequences in one worker step",
                      metrics::exponential_buckets(1, 2, 10), l)
      .observe(batch_size);
  o.metrics
      ->get_histogram("tandem_worker_step_tokens", "Tokens in one worker step", metrics::exponential_buckets(1, 2, 14),
                      l)
      .observe(r.batch_tokens);
  o.metrics->get_counter("tandem_worker_busy_seconds_total", "Seconds spent computing (busy fraction: its rate)", l)
      .inc(r.ms / 1000.0);
  o.metrics
      ->get_gauge("tandem_worker_kv_free_blocks",
                  "KV blocks free to take in the worker's pool (free, or kept only by the prefix cache)", l)
      .set(r.free_blocks);
  o.metrics
      ->get_gauge("tandem_worker_kv_cached_blocks",
                  "Of the free KV blocks, those the prefix cache keeps for reuse (evicted on demand)", l)
      .set(r.cached_only_blocks);
}

inline void worker_engine::returned(const worker_options& o, const step_result& r, int32_t batch) {
  busy = false;
  ++finished;
  record_step(o, r, batch);
}

// The worker core's view of the engine (asked between steps only, on the actor thread).
class engine_adapter final : public sched::engine_port {
 public:
  explicit engine_adapter(engine& e) : e_(e) {}
  bool prefix_cache() const override { return e_.prefix_cache_enabled(); }
  int32_t cached_prefix_tokens(std::span<const token_id> prompt) const override {
    return e_.cached_prefix_tokens(prompt);
  }
  void cache_blocks(std::span<const block_key> keys, const std::vector<kv_block_export>& blocks) override {
    (void)e_.cache_blocks(keys, blocks);
  }
  seq_id start_prompt(request_id id, std::span<const token_id> prompt, prefix_claims& claims,
                      int32_t& reused) override {
    return e_.start_prompt(id, prompt, claims, reused);
  }
  int32_t available_blocks() const override { return e_.available_blocks(); }
  int32_t blocks_needed(seq_id s, int32_t tokens) const override { return e_.blocks_needed(s, tokens); }
  int32_t blocks_freed_by(seq_id s) const override { return e_.blocks_freed_by(s); }
  kv_blocks_ptr export_all(seq_id s, request_id id, uint32_t epoch) const override {
    auto all = std::make_shared<std::vector<kv_block_export>>();
    (void)e_.export_kv(s, 0, e_.config().n_layer, 0, *all, id, epoch);
    return all;
  }

 private:
  engine& e_;
};

}  // namespace tandem
