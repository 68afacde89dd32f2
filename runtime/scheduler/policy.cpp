#include "runtime/scheduler/policy.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace tandem {

namespace {

// Numbers in messages: whole where that loses nothing a reader cares about, else one decimal.
std::string num(double x) {
  if (std::abs(x - std::round(x)) < 0.05) return std::to_string(std::llround(x));
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", x);
  return buf;
}

// Hints are whole milliseconds (they end up in a Retry-After) and never below the floor.
double retry_hint(double ms) { return std::max(admission_policy::min_retry_ms, std::ceil(ms)); }

admission_decision reject(reject_reason reason, double retry_after_ms, double predicted_ttft_ms, std::string message) {
  message += retry_after_ms > 0 ? "; retry in " + num(retry_after_ms) + " ms" : "; retrying will not help";
  return {false, reason, retry_after_ms, predicted_ttft_ms, std::move(message)};
}

}  // namespace

admission_decision admission_policy::decide(const admission_config& config, const load_snapshot& load,
                                            int32_t prompt_tokens) const {
  const int64_t prompt = std::max(prompt_tokens, 0);
  const int64_t queued = std::max<int64_t>(load.prefill_queue_tokens, 0);

  // Permanent: the request itself cannot be served, so it is judged before any load.
  int32_t limit = 0;
  std::string limit_source;
  if (config.max_prompt_tokens > 0) limit = config.max_prompt_tokens, limit_source = "max_prompt_tokens";
  if (load.context_length > 0 && (limit == 0 || load.context_length < limit))
    limit = load.context_length, limit_source = "the model context";
  if (limit > 0 && prompt > limit)
    return reject(reject_reason::prompt_too_long, 0, 0,
                  "prompt has " + num(double(prompt)) + " tokens (limit " + num(limit) + ", " + limit_source + ")");

  // The prefill pool drains its queue at the measured per-worker rate times the live workers.
  const double pool_rate =
      load.prefill_tokens_per_s > 0 ? load.prefill_tokens_per_s * std::max(load.prefill_workers, 1) : 0;
  const auto prefill_ms = [&](double tokens) { return tokens / pool_rate * 1000.0; };
  const bool local = load.local_prefill_tokens > 0 && prompt <= load.local_prefill_tokens;
  const double predicted = pool_rate <= 0 ? 0
                           : local        ? std::min(prefill_ms(double(queued + prompt)),
                                                     prefill_ms(double(prompt)) + std::max(load.decode_step_ms, 0.0))
                                          : prefill_ms(double(queued + prompt));

  // Prefill queue: the hint is the time to prefill the tokens that must leave before this fits.
  bool prefill_full = false;
  double drain_tokens = 0;
  std::string why;
  if (config.max_prefill_queue > 0 && load.prefill_queue >= config.max_prefill_queue) {
    prefill_full = true;
    const int64_t excess_requests = int64_t(load.prefill_queue) - config.max_prefill_queue + 1;
    const double tokens_per_request = load.prefill_queue > 0 ? double(queued) / load.prefill_queue : 0;
    drain_tokens = double(excess_requests) * tokens_per_request;
    why = "prefill queue holds " + num(load.prefill_queue) + " requests (bound " + num(config.max_prefill_queue) + ")";
  }
  if (config.max_prefill_queue_tokens > 0 && queued > 0 && queued + prompt > config.max_prefill_queue_tokens) {
    prefill_full = true;
    // A prompt above the bound on its own fits once the queue is empty (see decide's contract).
    drain_tokens = std::max(drain_tokens, double(std::min(queued, queued + prompt - config.max_prefill_queue_tokens)));
    if (!why.empty()) why += "; ";
    why += "prefill queue holds " + num(double(queued)) + " prompt tokens and this prompt adds " + num(double(prompt)) +
           " (bound " + num(double(config.max_prefill_queue_tokens)) + ")";
  }
  if (prefill_full)
    return reject(reject_reason::prefill_queue_full,
                  retry_hint(pool_rate > 0 ? prefill_ms(drain_tokens) : default_retry_ms), predicted, why);

  // Decode queue: admitting now would only add a request that waits behind it for a slot.
  if (config.max_decode_queue > 0 && load.decode_queue >= config.max_decode_queue) {
    const double excess = double(load.decode_queue) - config.max_decode_queue + 1;
    const double hint = load.decode_admits_per_s > 0 ? excess / load.decode_admits_per_s * 1000.0 : default_retry_ms;
    return reject(
        reject_reason::decode_queue_full, retry_hint(hint), predicted,
        "decode queue holds " + num(load.decode_queue) + " requests (bound " + num(config.max_decode_queue) + ")");
  }

  if (config.ttft_budget_ms > 0 && pool_rate > 0 && predicted > config.ttft_budget_ms) {
    std::string message =
        "predicted time to first token " + num(predicted) + " ms exceeds the " + num(config.ttft_budget_ms) +
        " ms budget (" +
        (local ? std::string("computed by a decode worker: ") : num(double(queued)) + " queued prompt tokens + ") +
        num(double(prompt)) + " for this prompt at " + num(pool_rate) + " tokens/s)";
    // Even on an idle pool this prompt would miss the budget: waiting cannot help.
    if (prefill_ms(double(prompt)) > config.ttft_budget_ms)
      return reject(reject_reason::ttft_budget, 0, predicted, std::move(message));
    // Once predicted - budget worth of queue has drained, the prediction meets the budget.
    return reject(reject_reason::ttft_budget, retry_hint(predicted - config.ttft_budget_ms), predicted,
                  std::move(message));
  }

  // Step time falls only as running sequences finish, which the snapshot does not measure.
  if (config.tpot_budget_ms > 0 && load.decode_step_ms > 0 && load.decode_step_ms > config.tpot_budget_ms)
    return reject(reject_reason::tpot_budget, retry_hint(default_retry_ms), predicted,
                  "decode step takes " + num(load.decode_step_ms) + " ms, over the " + num(config.tpot_budget_ms) +
                      " ms time-per-output-token budget");

  admission_decision admitted;
  admitted.predicted_ttft_ms = predicted;
  return admitted;
}

int32_t prefill_placement::choose(std::span<const prefill_worker_load> workers, int32_t prompt_tokens) const {
  auto cost = [&](const prefill_worker_load& w) {
    const double uncached = std::max(0, prompt_tokens - std::clamp(w.cached_tokens, 0, std::max(prompt_tokens, 0)));
    return load_weight_ * double(w.queued_tokens) + overlap_weight_ * uncached;
  };
  int32_t best = -1;
  double best_cost = 0;
  for (size_t i = 0; i < workers.size(); ++i) {
    const auto& w = workers[i];
    if (!w.alive) continue;
    const double c = cost(w);
    // Strict comparisons keep the lowest index on a full tie.
    if (best < 0 || c < best_cost || (c == best_cost && w.queued_requests < workers[size_t(best)].queued_requests)) {
      best = int32_t(i);
      best_cost = c;
    }
  }
  return best;
}

int32_t decode_placement::choose(std::span<const decode_worker_load> workers, int32_t blocks_needed) const {
  blocks_needed = std::max(blocks_needed, 0);
  int32_t best = -1;
  for (size_t i = 0; i < workers.size(); ++i) {
    const auto& w = workers[i];
    if (!w.alive || w.free_blocks < blocks_needed) continue;
    if (w.max_batch > 0 && w.batch_size >= w.max_batch) continue;
    // blocks_needed is the same for every candidate, so "most free after" is "most free now".
    if (best < 0 || w.free_blocks > workers[size_t(best)].free_blocks ||
        (w.free_blocks == workers[size_t(best)].free_blocks && w.batch_size < workers[size_t(best)].batch_size))
      best = int32_t(i);
  }
  return best;
}

std::vector<prefill_chunk> plan_prefill_step(std::span<const pending_prefill> queue, int32_t token_budget,
                                             int32_t chunk_size) {
  std::vector<prefill_chunk> chunks;
  int32_t left = std::max(token_budget, 1);
  for (const auto& p : queue) {
    if (left == 0) break;
    const int32_t begin = std::max(p.done_tokens, 0);
    const int32_t remaining = p.prompt_tokens - begin;
    if (remaining <= 0) continue;
    int32_t length = std::min(remaining, left);
    if (chunk_size > 0) length = std::min(length, chunk_size);
    chunks.push_back({p.request, begin, length, length == remaining});
    left -= length;
  }
  return chunks;
}

colocated_plan plan_colocated_step(int32_t running_decodes, std::span<const pending_prefill> queue,
                                   int32_t token_budget, int32_t chunk_size) {
  colocated_plan plan;
  plan.decode_tokens = std::max(running_decodes, 0);
  // With no decodes plan_prefill_step's floor of one token guarantees progress.
  if (plan.decode_tokens == 0) plan.prefill = plan_prefill_step(queue, token_budget, chunk_size);
  else if (token_budget > plan.decode_tokens)
    plan.prefill = plan_prefill_step(queue, token_budget - plan.decode_tokens, chunk_size);
  return plan;
}

int32_t blocks_for_tokens(int32_t n_tokens, int32_t block_size) {
  if (block_size <= 0)
    throw failure(errc::invalid_argument, "block_size must be positive, got " + std::to_string(block_size));
  if (n_tokens <= 0) return 0;
  return int32_t((int64_t(n_tokens) + block_size - 1) / block_size);
}

kv_credit_ledger::kv_credit_ledger(int32_t total_blocks, int32_t block_size)
    : total_(total_blocks), block_size_(block_size) {
  if (total_blocks < 0)
    throw failure(errc::invalid_argument, "total_blocks must not be negative, got " + std::to_string(total_blocks));
  if (block_size <= 0)
    throw failure(errc::invalid_argument, "block_size must be positive, got " + std::to_string(block_size));
}

bool kv_credit_ledger::try_reserve(int64_t request, int32_t max_tokens_total) {
  const int32_t needed = blocks_for_tokens(max_tokens_total, block_size_);
  const auto it = held_.find(request);
  if (it != held_.end() && needed <= it->second) return true;  // already covered; never shrinks
  const int32_t have = it == held_.end() ? 0 : it->second;
  const int32_t extra = needed - have;
  if (extra > free_blocks()) return false;
  held_[request] = needed;
  reserved_ += extra;
  return true;
}

void kv_credit_ledger::release(int64_t request) {
  const auto it = held_.find(request);
  if (it == held_.end()) return;
  reserved_ -= it->second;
  held_.erase(it);
}

int32_t kv_credit_ledger::held_blocks(int64_t request) const {
  const auto it = held_.find(request);
  return it == held_.end() ? 0 : it->second;
}

ewma::ewma(double alpha) : alpha_(alpha) {
  if (!(alpha > 0 && alpha <= 1))
    throw failure(errc::invalid_argument, "ewma alpha must be in (0, 1], got " + std::to_string(alpha));
}

void ewma::add(double x) {
  if (!std::isfinite(x)) return;
  value_ = has_value_ ? alpha_ * x + (1 - alpha_) * value_ : x;
  has_value_ = true;
}

}  // namespace tandem
