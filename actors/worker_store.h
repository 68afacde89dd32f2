#pragma once
// A worker and the host KV store: publishing computed blocks, fetching blocks a prompt lacks,
// and the prefix-cache figures. All of it between steps, on the actor thread (the engine is
// idle then); what to fetch and when is the worker core's.
#include <chrono>
#include <memory>
#include <span>
#include <vector>

#include "actors/worker_engine.h"
#include "runtime/kv/prefix_cache.h"
#include "runtime/scheduler/worker_core.h"

namespace tandem {

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
      metrics
          ->get_histogram("tandem_kv_store_fetch_seconds", "Time to fetch a prompt's cached blocks from the KV store",
                          metrics::latency_seconds_buckets())
          .observe(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  };
  std::vector<uint64_t> ask(keys.begin(), keys.end());
  self->request(store, o.store_timeout, fetch_atom::value, std::move(ask))
      .then(
          [keys, done, observe](kv_blocks_ptr& b) mutable {
            observe();
            done(keys, std::move(b));
          },
          [keys, done](caf::error&) mutable { done(keys, nullptr); });
  return true;
}

// Prefix-cache metrics: the engine's counters since `last` (updated), and the prompt tokens the
// step computed. Called on the actor thread between steps (the engine is idle).
inline void record_prefix_cache(const worker_options& o, const engine& eng, prefix_cache_stats& last,
                                int64_t computed_prompt_tokens) {
  if (!o.metrics) return;
  auto& m = *o.metrics;
  if (!eng.prefix_cache_enabled()) {
    m.get_counter("tandem_prompt_tokens_computed_total",
                  "Prompt tokens run through the model (cached prefixes are not).")
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
