#pragma once
// What the prefill and colocated workers share of the requests they run, as plain data and
// functions with no actors in them: which requests they hold, in what order their prompts
// came, what the next step computes of each, what a step's result does to them, and when one
// ends (the one stop rule, which the decode worker's core, worker_core.h, applies too).
#include <cstdint>
#include <deque>
#include <map>
#include <vector>

#include "runtime/scheduler/policy.h"
#include "runtime/kv/prefix_cache.h"
#include "runtime/request_types.h"
#include "runtime/engine/step.h"

namespace tandem::sched {

// What a prompt has of the prefix cache and the host store (prefill and colocated workers).
struct prompt_reuse {
  // The host store is asked once before the prompt starts: 0 not asked, 1 asking, 2 answered
  // (or nothing to ask). What came is cached when the engine is idle.
  int8_t fetch = 0;
  kv_blocks_ptr fetched;
  std::vector<block_key> fetched_keys;
  int32_t reused = 0;          // prompt tokens it started with from the cache
  int32_t expected_reuse = 0;  // while it waits for other prompts' blocks: what it will find
};

// One request a worker runs.
struct sequence {
  request_spec spec;
  seq_id seq = 0;                // 0: its engine sequence is not created yet
  int32_t prefilled = 0;         // prompt tokens in the cache
  int32_t planned = 0;           // prompt tokens in the step in flight
  int32_t generated = 0;         // output tokens sent (a migrated request starts at spec.resumed)
  std::vector<token_id> output;  // those tokens, kept only when spec.sampling.needs_output()
  prompt_ptr penalty_prompt;     // the prompt, shared by its steps, when spec.sampling.repeats()
  token_id last = 0;             // the last token sent: the next decode step's input
  bool decoding = false;         // past its prompt
  bool paused = false;           // its subscriber is behind: skipped in steps
  bool in_step = false;          // the step in flight holds it
  bool cancelled = false;        // cancelled while in a step: dropped when the step returns
  bool announced = false;        // told its request it is prefilling
  prompt_reuse reuse;

  // Prompt tokens still to compute, as the router's load figures count them: a prompt that
  // waits for blocks another prompt is computing will not compute them itself.
  int32_t prompt_tokens_left() const {
    return int32_t(spec.prompt.size()) - std::max(prefilled, seq == 0 ? reuse.expected_reuse : 0);
  }
  // True once, the first time it is planned: its request is told it is prefilling.
  bool announce() {
    if (announced) return false;
    announced = true;
    return true;
  }
};

// What one sampled token does to its sequence (the stop rule, finish_after).
struct token_outcome {
  bool emit = false;     // send it as output token number `index`
  int32_t index = 0;
  finish_reason end = finish_reason::none;  // none: the sequence goes on
};

// Takes `tok`, sampled for s (`eog`: it ends the generation), into s: generated, output and
// last move on when it is emitted.
token_outcome take_token(sequence& s, token_id tok, bool eog, int32_t n_ctx);
// The same for a request's output kept elsewhere (the decode worker's core).
token_outcome take_token(const request_spec& spec, int32_t& generated, std::vector<token_id>& output, token_id& last,
                         token_id tok, bool eog, int32_t n_ctx);

// The next step's decode item for a running s; the step holds s from now on.
step_work::decode_item decode_item(sequence& s);
// The next step's item for chunk `c` of s's prompt (the last chunk samples token
// spec.resumed); the step holds s from now on. Transfers (export, streaming) are the prefill
// worker's to add.
step_work::chunk_item chunk_item(sequence& s, const prefill_chunk& c);
// The step that held s came back: its planned prompt tokens are in the cache now.
void step_returned(sequence& s);

enum class cancel_outcome {
  unknown,     // not here
  now,         // not in a step: the worker drops it now
  after_step,  // the step in flight holds it: marked, dropped when the step returns
};
std::string_view to_string(cancel_outcome c);

// Prompt tokens and requests waiting to be prefilled (the load a worker reports).
struct prompt_load {
  int64_t tokens = 0;
  int32_t requests = 0;
};

// The requests a worker holds, by id, with the prompts not fully prefilled in arrival order.
// Entry is a sequence plus what the worker keeps with it (its request handle, transfers).
template <class Entry>
class sequence_table {
 public:
  // A new request; `decoding`: its prompt is computed already (a decode worker's import).
  Entry& add(request_spec spec, bool decoding = false) {
    const request_id id = spec.id;
    Entry e;
    e.generated = spec.resumed;
    if (spec.sampling.needs_output()) e.output = spec.resumed_output();
    e.penalty_prompt = spec.prompt_for_penalty();
    e.decoding = decoding;
    e.spec = std::move(spec);
    auto [it, fresh] = by_id_.insert_or_assign(id, std::move(e));
    if (!decoding && fresh) waiting_.push_back(id);
    return it->second;
  }
  Entry* find(request_id id) {
    auto it = by_id_.find(id);
    return it == by_id_.end() ? nullptr : &it->second;
  }
  bool contains(request_id id) const { return by_id_.count(id) > 0; }
  size_t size() const { return by_id_.size(); }
  bool empty() const { return by_id_.empty(); }
  auto begin() { return by_id_.begin(); }
  auto end() { return by_id_.end(); }
  auto begin() const { return by_id_.begin(); }
  auto end() const { return by_id_.end(); }
  // Prompts not fully prefilled, first come first.
  const std::deque<request_id>& waiting() const { return waiting_; }

  void erase(request_id id) {
    by_id_.erase(id);
    leave_waiting(id);
  }
  // Its prompt is done (token 0 sampled): it decodes from now on.
  void start_decoding(Entry& e) {
    e.decoding = true;
    leave_waiting(e.spec.id);
  }
  cancel_outcome cancel(request_id id) {
    Entry* e = find(id);
    if (!e) return cancel_outcome::unknown;
    if (!e->in_step) return cancel_outcome::now;
    e->cancelled = true;
    return cancel_outcome::after_step;
  }
  bool pause(request_id id, bool paused) {
    Entry* e = find(id);
    if (!e) return false;
    e->paused = paused;
    return true;
  }
  // Adds a decode item for every running, unpaused sequence; returns how many.
  int32_t add_decodes(step_work& w) {
    int32_t n = 0;
    for (auto& [id, e] : by_id_)
      if (e.decoding && !e.paused && !e.cancelled) {
        w.decodes.push_back(decode_item(e));
        ++n;
      }
    return n;
  }
  // The step in flight came back: the ids it held, each released (step_returned).
  std::vector<request_id> release_step() {
    std::vector<request_id> held;
    for (auto& [id, e] : by_id_)
      if (e.in_step) {
        step_returned(e);
        held.push_back(id);
      }
    return held;
  }
  // Prompt tokens the step in flight computes (the prefix-cache figures' "computed").
  int64_t planned_prompt_tokens() const {
    int64_t n = 0;
    for (const auto& [id, e] : by_id_)
      if (e.in_step && !e.decoding) n += e.planned;
    return n;
  }
  prompt_load waiting_load() const {
    prompt_load l;
    for (auto id : waiting_) {
      l.tokens += by_id_.at(id).prompt_tokens_left();
      ++l.requests;
    }
    return l;
  }

 private:
  void leave_waiting(request_id id) {
    for (auto it = waiting_.begin(); it != waiting_.end(); ++it)
      if (*it == id) {
        waiting_.erase(it);
        return;
      }
  }
  std::map<request_id, Entry> by_id_;
  std::deque<request_id> waiting_;
};

}  // namespace tandem::sched
