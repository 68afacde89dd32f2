#pragma once
// One configuration for a deployment, grouped as a user thinks of it and passed whole: the
// flags of `tandem serve` fill it, the pipeline reads it, and a router sends the groups every
// worker must share (kv, steps) to the processes that join it, whole (actors/wire.h inspects
// them). The HTTP server's own settings (address, keys, limits) are tools/server's
// server_config; nothing below the server needs them.
//
//   tandem::serving_config c;
//   c.model.path = "model.gguf";
//   c.pools.mode = tandem::serving_mode::colocated;
//   c.kv.dtype = tandem::kernels::dtype::q8_0;
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "kernels/cpu/matmul.h"
#include "kernels/tensor_types.h"
#include "runtime/kinds.h"
#include "runtime/scheduler/policy.h"

namespace tandem {

class model;

struct model_settings {
  std::string path;  // empty: the built-in default model
  std::shared_ptr<const model> loaded;  // or an already loaded one (shared by every worker)
};

// How many workers of each kind, what each gets, and how they are supervised.
struct pool_settings {
  serving_mode mode = serving_mode::disaggregated;
  int prefill_workers = 1;
  int decode_workers = 1;
  int colocated_workers = 1;
  int threads_per_worker = 1;
  // Disaggregated, in one process: the workers share the cores of all of them (kernels/
  // thread_pool.h, core_share) instead of owning threads_per_worker each. A busy worker keeps
  // threads_per_worker; the rest go to whoever is busy, so prefill computes on every core while
  // decode is idle, and decode on every core while no prompt computes.
  bool share_cores = false;
  int32_t kv_blocks_per_worker = 0;  // 0: from kv_memory_bytes_per_worker
  int64_t kv_memory_bytes_per_worker = 256ll << 20;
  // Each pool restarts its workers (one for one) at most this many times per window; past that
  // the pool is degraded (tandem_pool_degraded, /health), the requests that need it end with
  // worker_failed (HTTP 503) and new ones are refused, until the pool starts its workers again
  // after recover_after.
  int32_t max_worker_restarts = 5;
  std::chrono::milliseconds restart_window{10000};
  // The router is restarted (with the pools below it; requests rejoin it) at most this many
  // times in 10 s; past that the pipeline is degraded and requests end with an error, until
  // the root starts it again after recover_after.
  int32_t max_router_restarts = 3;
  // How long a degraded pool (workers, the KV store, the router) waits before it starts again,
  // as a crash-looping service is restarted with a backoff: doubled while degradations keep
  // following recoveries, up to recover_after_max.
  std::chrono::milliseconds recover_after{30000};
  std::chrono::milliseconds recover_after_max{300000};
  // Liveness: a worker busy with one step this long without finishing it (alive, not
  // progressing) is treated as failed and restarted. 0: not checked.
  std::chrono::milliseconds stall_timeout{30000};
  int scheduler_threads = 2;  // CAF threads for the actors (compute has its own)
};

// The KV cache: its layout (the same in every worker of a deployment: links and the store
// refuse another), its reuse, the host store, and how links move it.
struct kv_settings {
  // Element type of every worker's KV cache, of what KV links move and the host store holds:
  // f16 (half of f32's bytes), bf16, q8_0 or f32 (runtime/kv/kv_cache.h).
  kernels::dtype dtype = kernels::dtype::f16;
  int32_t block_size = 16;
  // Prefix reuse in prefill and colocated workers: a prompt that starts like an earlier one
  // (whole blocks of it) takes that one's KV blocks instead of computing them again.
  bool prefix_cache = true;
  // Stream a prompt's KV to its (already reserved) decode worker layer group by layer group
  // while prefill runs, instead of all at once after it.
  bool stream = true;
  int32_t stream_layer_group = 4;  // layers per streamed piece
  // The host KV store (actors/kv_store.h), with the prefix cache: finished prompts and answers
  // publish their full blocks; prompts fetch what their worker lacks. Memory budget (0: no
  // store) and an optional disk tier (a file of this size at this path, removed at exit).
  int64_t store_memory_bytes = 512ll << 20;
  std::string store_disk_path;
  int64_t store_disk_bytes = 0;
  // Links inside this process (a router process's links to other processes are channels).
  kv_transport_kind transport = kv_transport_kind::local;
};

// What one worker step may hold, and how it computes: the same for every worker.
struct step_settings {
  // batch_invariant: recovery by re-prefill is exact for every weight type (a token's logits do
  // not depend on its batch); fastest: GEMM prefill, faster, but a recovered greedy request
  // may differ after a near-tie (kernels/cpu/matmul.h).
  kernels::cpu::matmul_mode matmul = kernels::cpu::matmul_mode::batch_invariant;
  int32_t chunk_size = 256;  // longest piece of one prompt per step
  int32_t prefill_token_budget = 512;  // tokens per prefill step
  int32_t colocated_token_budget = 256;  // tokens per colocated step (decodes + prefill chunks)
  int32_t max_batch = 64;  // sequences decoding at once per worker
  // The time per output token to hold (0: none). Colocated workers size each step's prefill
  // from their fitted step cost (runtime/scheduler/step_cost.h) so that the step, its decodes
  // included, is predicted to take colocated_step_share of it; with shared cores a decode
  // worker paces its steps at decode_pace_share of it (unless decode_pace_ms is given).
  double tpot_target_ms = 0;
  // Shared cores (pool_settings::share_cores): while a prompt computes beside it, a decode
  // worker starts a step at most every decode_pace_ms and leaves the cores to prefill in
  // between (its tokens then come at about this interval: keep it under the TPOT target).
  // 0: from tpot_target_ms, or back to back without one.
  double decode_pace_ms = 0;
  // Auto mode: decode workers compute short prompts themselves within their TPOT slack
  // (runtime/scheduler/step_cost.h, tpot_slack) of local_prefill_share of tpot_target_ms, or of
  // auto_tpot_target_ms without one: the slack is kept against less than the target, so that
  // spending all of it leaves the p90 room (the short trace, spent to the full target, put TPOT
  // p90 at 24 of 25 ms).
  bool local_prefill = false;
  static constexpr double auto_tpot_target_ms = 50;
  static constexpr double local_prefill_share = 0.8;
  double local_prefill_target_ms() const {
    return local_prefill_share * (tpot_target_ms > 0 ? tpot_target_ms : auto_tpot_target_ms);
  }

  static constexpr double colocated_step_share = 0.8;  // room for the p90 and the fit's error
  // Room for a decode step slowed by a prefill kernel still finishing on another core.
  static constexpr double decode_pace_share = 0.6;
  double pace_ms() const { return decode_pace_ms > 0 ? decode_pace_ms : tpot_target_ms * decode_pace_share; }
};

// The router's decisions: admission, placement, recovery.
struct scheduling_settings {
  admission_config admission;  // queue bounds and TTFT/TPOT budgets
  // KV-aware prefill placement (runtime/scheduler/policy.h): a worker's cost is
  // load_weight * its queued tokens + overlap_weight * the prompt tokens it lacks cached.
  double route_overlap_weight = 1.0;
  double route_load_weight = 1.0;
  // A request whose worker dies while it decodes migrates (prefilled again with the tokens sent
  // so far, then decoding goes on elsewhere) at most this many times.
  int32_t max_migrations = 3;
  std::shared_ptr<const admission_policy> admission_policy_impl;  // replaceable policies
  std::shared_ptr<const prefill_placement> prefill_policy;
  std::shared_ptr<const decode_placement> decode_policy;
};

// Several processes (actors/cluster.h, actors/node.h): port >= 0 makes this a router process
// that publishes its cluster actor on this port (0: any free one) for prefill and decode
// processes to join (`tandem serve --role prefill|decode --join HOST:PORT`). Its workers are
// then all remote: the local worker counts are not used. Disaggregated only.
struct cluster_settings {
  int port = -1;
  std::string host = "127.0.0.1";
  channel_mode kv_channel = channel_mode::automatic;  // links between nodes
  std::chrono::milliseconds heartbeat_timeout{1500};  // a node silent this long is lost
};

struct serving_config {
  model_settings model;
  pool_settings pools;
  kv_settings kv;
  step_settings steps;
  scheduling_settings scheduling;
  cluster_settings cluster;
};

}  // namespace tandem
