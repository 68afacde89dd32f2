#pragma once
// Scheduling policies: admission (router), placement (router), step batching (workers) and KV
// block credits (decode workers). As in TensorRT-LLM's batch manager these are plain classes
// with no actor in sight, so every decision is unit-testable; actors only translate messages
// into calls on them. Nothing here holds a clock or a lock: callers pass in what they measured.
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "runtime/errors.h"

namespace tandem {

// ---- admission (router side) ----

enum class reject_reason : uint8_t { prefill_queue_full, decode_queue_full, ttft_budget, tpot_budget, prompt_too_long };

// Stable, lowercase names for logs and JSON errors.
constexpr std::string_view to_string(reject_reason r) {
  switch (r) {
    case reject_reason::prefill_queue_full: return "prefill_queue_full";
    case reject_reason::decode_queue_full: return "decode_queue_full";
    case reject_reason::ttft_budget: return "ttft_budget";
    case reject_reason::tpot_budget: return "tpot_budget";
    case reject_reason::prompt_too_long: return "prompt_too_long";
  }
  return "unknown";
}

struct admission_config {
  int32_t max_prefill_queue = 256;  // requests waiting for prefill (0 = unbounded)
  int64_t max_prefill_queue_tokens = 1 << 20;  // prompt tokens waiting for prefill (0 = unbounded)
  int32_t max_decode_queue = 256;  // prefilled requests waiting for a decode slot (0 = unbounded)
  double ttft_budget_ms = 0;  // 0 = no TTFT check
  double tpot_budget_ms = 0;  // 0 = no TPOT check
  int32_t max_prompt_tokens = 0;  // 0 = model context
};

// What the router knows at the moment of a decision.
struct load_snapshot {
  int32_t prefill_queue = 0;
  int64_t prefill_queue_tokens = 0;
  int32_t decode_queue = 0;
  int32_t prefill_workers = 1;  // live
  double prefill_tokens_per_s = 0;  // measured per worker (EWMA); 0 = unknown yet
  double decode_step_ms = 0;  // measured mean step time (EWMA); 0 = unknown yet
  int32_t context_length = 0;
  // Rate at which requests leave the decode queue for a decode slot (EWMA); 0 = unknown yet.
  // Only feeds the retry hint of decode_queue_full: without it that hint is the default.
  double decode_admits_per_s = 0;
  // Auto mode: the most prompt tokens a live decode worker would compute itself now (0: none).
  // A prompt within it skips the prefill queue, so its TTFT is not predicted through that queue.
  int32_t local_prefill_tokens = 0;
};

struct admission_decision {
  bool admitted = true;
  reject_reason reason{};  // meaningful only when !admitted
  double retry_after_ms = 0;  // when rejected: 0 = retrying cannot help (the request itself is the problem)
  double predicted_ttft_ms = 0;  // 0 = no prefill rate measured yet
  std::string message;  // empty when admitted
};

class admission_policy {
 public:
  // Retry hint when the rate that drains the full queue has not been measured yet.
  static constexpr double default_retry_ms = 1000;
  // Floor of every retry hint: sooner than this the snapshot will hardly have changed.
  static constexpr double min_retry_ms = 50;

  virtual ~admission_policy() = default;

  // Checks, first failing one wins: prompt_too_long (limit = the smaller of max_prompt_tokens and
  // context_length among those > 0; none when both are 0), prefill_queue_full, decode_queue_full,
  // ttft_budget, tpot_budget. Budgets are only checked once their rate has been measured, so a
  // cold router admits. Two cases a bound alone would reject forever are judged differently:
  //  - a prompt larger than max_prefill_queue_tokens is admitted when no prompt tokens are queued
  //    (the token bound limits queue build-up; prompt length is max_prompt_tokens' job);
  //  - a prompt whose own prefill, on an idle pool, takes longer than the TTFT budget is rejected
  //    with retry_after_ms = 0: no amount of waiting makes it meet the budget;
  //  - a prompt within load.local_prefill_tokens (auto mode) is predicted as its own prefill
  //    plus one decode step, not behind the queued prompt tokens it will not wait for.
  // Zero live prefill workers are predicted as one (the router queues until one is back).
  virtual admission_decision decide(const admission_config& config, const load_snapshot& load,
                                    int32_t prompt_tokens) const;
};

// ---- placement (router side) ----

struct prefill_worker_load {
  int32_t worker = 0;
  bool alive = true;
  int64_t queued_tokens = 0;
  int32_t queued_requests = 0;
  // Filled by the router per request: leading prompt tokens this worker is believed to have
  // cached (the router's prefix view), so they need not be computed there.
  int32_t cached_tokens = 0;
};

struct decode_worker_load {
  int32_t worker = 0;
  bool alive = true;
  int32_t free_blocks = 0;
  int32_t total_blocks = 0;
  int32_t batch_size = 0;
  int32_t max_batch = 0;  // <= 0: no batch limit
  // Auto mode: the prompt tokens it would compute itself now, inside its TPOT slack (a short
  // uncached prompt is sent straight to it instead of to the prefill pool). 0: none.
  int32_t local_prefill_tokens = 0;
};

class prefill_placement {
 public:
  // KV-aware placement (as Dynamo's KV router): the cost of a worker is
  //   load_weight * queued_tokens + overlap_weight * (prompt_tokens - cached_tokens),
  // the prompt tokens it must compute before this request's first token, its queue first.
  // Both 1: the estimate of time to first token in tokens. A larger overlap_weight follows the
  // cache harder (fewer recomputed prefixes, more queueing); a larger load_weight spreads load.
  explicit prefill_placement(double overlap_weight = 1.0, double load_weight = 1.0)
      : overlap_weight_(overlap_weight), load_weight_(load_weight) {}
  virtual ~prefill_placement() = default;
  // Index into `workers` of the chosen one, or -1 if none is alive.
  // Default: least cost (above); without cached tokens that is least queued tokens. Ties →
  // fewest queued requests → lowest index.
  virtual int32_t choose(std::span<const prefill_worker_load> workers, int32_t prompt_tokens) const;

 private:
  double overlap_weight_, load_weight_;
};

class decode_placement {
 public:
  virtual ~decode_placement() = default;
  // Index into `workers` of the chosen one, or -1 if no live worker has blocks_needed free
  // blocks and batch room (the request then waits in the decode queue).
  // Default: most free blocks after placement (spreads KV pressure), ties → smaller batch →
  // lowest index.
  virtual int32_t choose(std::span<const decode_worker_load> workers, int32_t blocks_needed) const;
};

// ---- batching (what one worker step computes) ----

struct pending_prefill {
  int64_t request = 0;
  int32_t prompt_tokens = 0;
  int32_t done_tokens = 0;  // already prefilled
};

struct prefill_chunk {
  int64_t request = 0;
  int32_t begin = 0;  // first prompt position of the chunk
  int32_t length = 0;
  bool last = false;  // this chunk finishes the prompt
};

// Prefill worker: takes queued prompts in FIFO order into one step, up to token_budget tokens.
// Each prompt gets at most one chunk per step, of at most chunk_size tokens (<= 0: no limit) and
// at most the budget left; what does not fit waits for later steps, and the budget a chunk limit
// leaves over goes to the prompts behind. Entries with nothing left to prefill are skipped.
// A token_budget below 1 counts as 1, so a misconfigured worker still makes progress.
std::vector<prefill_chunk> plan_prefill_step(std::span<const pending_prefill> queue, int32_t token_budget,
                                             int32_t chunk_size);

// Colocated worker (chunked prefill as in Sarathi-Serve): every running decode sequence gets its
// one token first, so decode is never starved, even past the budget (max_batch bounds decodes,
// not this). The rest of token_budget goes to prefill chunks as in plan_prefill_step.
// token_budget <= running_decodes → no prefill this step; with no running decodes at least one
// prefill token is planned (when any is pending) so work progresses.
struct colocated_plan {
  int32_t decode_tokens = 0;
  std::vector<prefill_chunk> prefill;
};
colocated_plan plan_colocated_step(int32_t running_decodes, std::span<const pending_prefill> queue,
                                   int32_t token_budget, int32_t chunk_size);

// ---- KV block credits (decode worker) ----

// Blocks a sequence of n_tokens occupies with block_size positions per block (0 for n <= 0).
// Throws failure(invalid_argument) for block_size <= 0.
int32_t blocks_for_tokens(int32_t n_tokens, int32_t block_size);

// Reservation ledger: a decode worker admits a sequence only if it can reserve every block the
// sequence will need up to its max length (prompt + max_tokens, capped at the context by the
// caller), so a running sequence never runs out mid-generation. Never over-commits:
// reserved_blocks() <= total_blocks() always.
class kv_credit_ledger {
 public:
  // Throws failure(invalid_argument) for total_blocks < 0 or block_size <= 0.
  kv_credit_ledger(int32_t total_blocks, int32_t block_size);

  // Makes `request` hold at least blocks_for_tokens(max_tokens_total) blocks. false (and no
  // change) if not enough are free. A request that already holds a reservation keeps it and only
  // grows by the difference (so a redelivered admit is harmless); it never shrinks here.
  bool try_reserve(int64_t request, int32_t max_tokens_total);
  // Returns the request's blocks; idempotent (unknown requests are ignored).
  void release(int64_t request);

  int32_t free_blocks() const { return total_ - reserved_; }
  int32_t reserved_blocks() const { return reserved_; }
  int32_t total_blocks() const { return total_; }
  int32_t block_size() const { return block_size_; }
  bool holds(int64_t request) const { return held_.count(request) != 0; }
  int32_t holders() const { return int32_t(held_.size()); }  // requests holding a reservation
  int32_t held_blocks(int64_t request) const;  // 0 when not held

 private:
  int32_t total_;
  int32_t block_size_;
  int32_t reserved_ = 0;
  std::unordered_map<int64_t, int32_t> held_;  // request → blocks reserved
};

// ---- measured rates ----

// Exponentially weighted moving average; the first sample is taken as is (no bias toward 0).
class ewma {
 public:
  // alpha in (0, 1]: the weight of each new sample. Throws failure(invalid_argument) otherwise.
  explicit ewma(double alpha = 0.2);
  // Non-finite samples (a rate over a zero interval) are ignored rather than poisoning the mean.
  void add(double x);
  double value() const { return value_; }  // 0 before the first sample
  bool has_value() const { return has_value_; }

 private:
  double alpha_;
  double value_ = 0;
  bool has_value_ = false;
};

}  // namespace tandem
