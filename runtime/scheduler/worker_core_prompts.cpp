// A prefill or colocated worker's prompts: queued, fetching their prefix, chunked into steps,
// and after their first token leased (prefill) or decoding (colocated).
#include "runtime/scheduler/worker_core.h"

#include <algorithm>

namespace tandem::sched {

using namespace worker;

void worker_core::handle(const ev::prompt& p) {
  const request_id id = p.spec.id;
  if (cfg_.kind == worker_kind::colocated) {
    const int32_t total = std::min<int32_t>(p.spec.total_tokens(), cfg_.n_ctx);
    if (blocks_for_tokens(total, cfg_.block_size) > ledger_.total_blocks())
      return emit(cmd::fail{id, errc::out_of_kv_blocks, "request needs more KV blocks than the worker has"});
  }
  waiting w;
  w.generated = p.spec.resumed;
  if (p.spec.sampling.needs_output()) w.output = p.spec.resumed_output();
  w.penalty_prompt = p.spec.prompt_for_penalty();
  // What it will reuse of blocks other prompts here are computing: its load counts only the
  // rest from the start.
  if (engine_->prefix_cache())
    w.expected_reuse = claims_.claimed_run(prompt_block_keys(cfg_.prefix_salt, p.spec.prompt, cfg_.block_size), 0, id) *
                       cfg_.block_size;
  const bool fresh = entries_.count(id) == 0;  // a retried prefill of the same id keeps its place
  entries_.insert_or_assign(id, entry{p.spec, std::move(w)});
  if (fresh) queue_.push_back(id);
}

// Between steps: starts e's prompt on a new sequence with its cached prefix attached, or
// returns 0 while it waits — for the host store, asked first for the blocks this worker
// lacks, or for another prompt computing (or fetching) its next block. A prompt that asks the
// store claims what it lacks, so prompts like it wait for this one rather than fetch or
// compute the same.
seq_id worker_core::start_prompt(entry& e) {
  const request_id id = e.spec.id;
  auto& w = std::get<waiting>(e.where);
  if (w.fetched) {
    engine_->cache_blocks(w.fetched_keys, *w.fetched);
    w.fetched = nullptr;
  }
  if (!w.asked_store) {
    w.asked_store = true;
    auto keys = prompt_block_keys(cfg_.prefix_salt, e.spec.prompt, cfg_.block_size);
    const size_t cached = size_t(engine_->cached_prefix_tokens(e.spec.prompt) / cfg_.block_size);
    if (cached < keys.size() && !claims_.blocked(id, keys, int32_t(cached))) {
      claims_.claim(id, std::span(keys).subspan(cached));
      keys.erase(keys.begin(), keys.begin() + std::ptrdiff_t(cached));
      if (cfg_.store) {
        fetching q{w};
        q.keys = std::move(keys);
        q.asked = ask_store(q.keys);
        store_asks_[q.asked] = id;
        e.where = std::move(q);
        return 0;
      }
    }
  }
  int32_t reused = 0;
  const seq_id s = engine_->start_prompt(id, e.spec.prompt, claims_, reused);
  if (s == 0) {
    w.expected_reuse = reused;
    return 0;
  }
  prefilling p{w};
  p.seq = s;
  p.reused = reused;
  p.prefilled = reused;
  e.where = std::move(p);
  return s;
}

namespace {
// The step item for chunk `c` of e's prompt (the last chunk samples token spec.resumed); the
// step holds it from now on.
step_work::chunk_item chunk_of(const request_spec& spec, prompt_state& p, const prefill_chunk& c) {
  step_work::chunk_item ci;
  ci.id = spec.id;
  ci.seq = p.seq;
  ci.tokens.assign(spec.prompt.begin() + c.begin, spec.prompt.begin() + c.begin + c.length);
  ci.last = c.last;
  ci.sampling = spec.sampling;
  ci.epoch = spec.epoch;
  ci.first_index = spec.resumed;
  if (c.last) {  // only the last chunk samples
    ci.output = p.output;
    ci.prompt = p.penalty_prompt;
  }
  p.in_step = true;
  p.planned = c.length;
  return ci;
}

// A waiting prompt that a step computes is prefilling from now on.
prompt_state& started(entry& e) {
  if (e.current() == phase::waiting) e.where = prefilling{std::get<waiting>(e.where)};
  return std::get<prefilling>(e.where);
}
}  // namespace

void worker_core::plan_prefill(step_work& work, std::vector<std::pair<request_id, link_id>>& streams) {
  // Prefix reuse: a prompt starts with its cached blocks attached, or waits while another
  // prompt computes the block it needs next.
  const bool prefix = engine_->prefix_cache();
  if (prefix)
    for (request_id id : std::vector<request_id>(queue_.begin(), queue_.end()))
      if (entry& e = entries_.at(id); e.current() == phase::waiting) start_prompt(e);
  std::vector<pending_prefill> pending;
  for (request_id id : queue_)
    if (const prompt_state* p = prompt_of(entries_.at(id)); p->seq != 0 || !prefix)
      pending.push_back({int64_t(id), int32_t(entries_.at(id).spec.prompt.size()), p->prefilled});
  const auto plan = plan_prefill_step(pending, cfg_.token_budget, cfg_.chunk_size);
  // Blocks are the limit the planner does not see: keep the chunks that fit the pool now;
  // what does not fit waits for leases to end.
  int32_t free = engine_->available_blocks();
  work.frees = std::move(to_free_);
  to_free_.clear();
  for (seq_id s : work.frees) free += engine_->blocks_freed_by(s);  // freed before the forward pass
  for (const auto& c : plan) {
    const request_id id = request_id(c.request);
    entry& e = entries_.at(id);
    const prompt_state& before = *prompt_of(e);
    const int32_t need = engine_->blocks_needed(before.seq, c.length);
    if (need > free) {
      if (leases_.empty() && work.chunks.empty() && before.prefilled == 0 &&
          cfg_.total_blocks < engine_->blocks_needed(0, int32_t(e.spec.prompt.size())))
        fail_prompt(id, errc::out_of_kv_blocks, "prompt needs more KV blocks than the prefill worker has");
      break;
    }
    free -= need;
    prompt_state& p = started(e);
    step_work::chunk_item ci = chunk_of(e.spec, p, c);
    const bool stream = p.link != 0 && cfg_.stream_kv;
    ci.export_kv = c.last && !stream;
    if (stream) {
      p.stream_broken = false;  // this step streams from stream_next (0 after a new link)
      ci.stream_from = p.stream_next;
      p.stream_next = c.begin + c.length;
      streams.emplace_back(id, p.link);
    }
    if (!p.announced) {
      p.announced = true;
      emit(cmd::tell_request{id, request_state::prefilling, p.reused});
    }
    work.chunks.push_back(std::move(ci));
  }
}

// Tokens a colocated step may hold: the budget, or with a target what the fitted step cost
// says fits in it (Sarathi-Serve), decodes first; at least one KV block of prefill besides
// them, so prompts progress however loaded decode is.
int32_t worker_core::step_budget(int32_t running) const {
  if (cfg_.step_target_ms <= 0) return cfg_.token_budget;
  return cost_.tokens_within(cfg_.step_target_ms, running + cfg_.block_size,
                             std::max(cfg_.token_budget, running + cfg_.block_size));
}

void worker_core::plan_colocated(step_work& work) {
  work.frees = std::move(to_free_);
  to_free_.clear();
  const int32_t running = add_decodes(work);
  const bool prefix = engine_->prefix_cache();
  // Admission by credits, in arrival order: a prompt waits until its whole request fits.
  std::vector<pending_prefill> pending;
  for (request_id id : std::vector<request_id>(queue_.begin(), queue_.end())) {
    entry& e = entries_.at(id);
    prompt_state& p = *prompt_of(e);
    if (!p.reserved) {
      if (running + int32_t(pending.size()) >= cfg_.max_batch) break;
      if (!ledger_.try_reserve(int64_t(id), std::min<int32_t>(e.spec.total_tokens(), cfg_.n_ctx))) break;
      p.reserved = true;
    }
    if (e.current() == phase::fetching) continue;
    if (p.seq == 0 && prefix && start_prompt(e) == 0) continue;
    pending.push_back({int64_t(id), int32_t(e.spec.prompt.size()), prompt_of(e)->prefilled});
  }
  const auto plan = plan_colocated_step(running, pending, step_budget(running), cfg_.chunk_size);
  for (const auto& c : plan.prefill) {
    const request_id id = request_id(c.request);
    entry& e = entries_.at(id);
    prompt_state& p = started(e);
    if (!p.announced) {
      p.announced = true;
      emit(cmd::tell_request{id, request_state::prefilling, p.reused});
    }
    work.chunks.push_back(chunk_of(e.spec, p, c));
  }
}

void worker_core::prompts_returned(const step_result& r) {
  const bool colocated = cfg_.kind == worker_kind::colocated;
  if (colocated && r.error.ok()) cost_.observe(r.batch_tokens, r.ms);
  for (const auto& c : r.created_seqs) {
    entry* e = get(c.id);
    if (prompt_state* p = e ? prompt_of(*e) : nullptr) p->seq = c.seq;
    else if (colocated) to_free_.push_back(c.seq);
  }
  const std::vector<request_id> held = release_step();
  for (request_id id : held) {
    entry& e = entries_.at(id);
    const bool cancelled =
        e.current() == phase::decoding ? std::get<decoding>(e.where).cancelled : prompt_of(e)->cancelled;
    if (!cancelled && r.error.ok()) continue;
    // All-or-nothing failed: every request in the step fails rather than retrying forever.
    if (!cancelled) emit(cmd::fail{id, r.error.code(), r.error.message()});
    if (e.current() == phase::decoding) retire(id);
    else drop_prompt(id);
  }
  if (!r.error.ok()) return;
  if (!colocated) {
    // A completed prompt produced token 0 (output token spec.resumed) and its KV blocks.
    for (request_id id : held)
      if (auto t = std::find_if(r.tokens.begin(), r.tokens.end(), [&](const auto& x) { return x.id == id; });
          t != r.tokens.end() && entries_.count(id))
        prompt_done(id, entries_.at(id), r, *t);
    return;
  }
  for (const auto& t : r.tokens) {
    entry* e = get(t.id);
    if (!e) continue;
    if (e->current() != phase::decoding) {  // its prompt just completed: token 0
      const prompt_state& p = *prompt_of(*e);
      decoding d;
      d.seq = p.seq;
      d.generated = p.generated;
      d.output = p.output;
      d.penalty_prompt = p.penalty_prompt;
      d.paused = p.paused;
      // Its blocks past those it started with go to the host store when it ends.
      d.publish_from = engine_->prefix_cache() ? p.reused / cfg_.block_size : -1;
      const int32_t reused = p.reused;
      e->where = std::move(d);
      std::erase(queue_, t.id);
      claims_.release(t.id);
      emit(cmd::tell_request{t.id, request_state::decoding, reused});
      emit(cmd::tell_router{t.id, request_state::decoding});
    }
    auto& d = std::get<decoding>(e->where);
    if (stream(t.id, e->spec, d.generated, d.output, d.last, t) != finish_reason::none) retire(t.id);
  }
}

// Token 0 of a prompt done on a prefill worker: streamed; its computed blocks published; its
// KV leased (and shipped at once when its decode worker is known), unless it ended already.
void worker_core::prompt_done(request_id id, entry& e, const step_result& r, const step_result::sampled& t) {
  prompt_state& p = *prompt_of(e);
  token_id last = 0;
  const bool finished = stream(id, e.spec, p.generated, p.output, last, t) != finish_reason::none;
  // The blocks it computed (not those it started with) go to the host store for others.
  if (engine_->prefix_cache()) emit(cmd::publish{p.seq, p.reused / cfg_.block_size});
  if (finished) {
    to_free_.push_back(p.seq);
    emit(cmd::prefilled{id, true});
  } else {
    leased l;
    l.seq = p.seq;
    auto ex = std::find_if(r.exports.begin(), r.exports.end(), [&](const auto& x) { return x.id == id; });
    l.kv = ex != r.exports.end() ? ex->kv : nullptr;
    // Its last pieces went to a link that was replaced meanwhile: the whole set instead.
    if (!l.kv && p.stream_broken) l.kv = engine_->export_all(p.seq, id, e.spec.epoch);
    // Decode goes on from every token so far: the resumed ones (the prompt's tail) and this.
    l.generated.assign(e.spec.prompt.end() - e.spec.resumed, e.spec.prompt.end());
    l.generated.push_back(t.token);
    l.streamed_to = l.kv ? 0 : p.link;
    const link_id link = p.link;
    entry& le = leases_[id] = entry{e.spec, std::move(l)};
    emit(cmd::prefilled{id, false});
    if (link != 0) ship(id, le, link);
  }
  claims_.release(id);
  std::erase(queue_, id);
  entries_.erase(id);
  if (finished) forget_if_gone(id);
}

// Ends a prompt here (cancelled, failed, or its request gone): its sequence and claims go.
void worker_core::drop_prompt(request_id id) {
  const prompt_state& p = *prompt_of(entries_.at(id));
  if (cfg_.kind == worker_kind::colocated && !busy_ && p.seq != 0 && engine_->prefix_cache())
    emit(cmd::publish{p.seq, p.reused / cfg_.block_size});  // what it computed, for others
  if (p.seq != 0) to_free_.push_back(p.seq);
  ledger_.release(int64_t(id));
  claims_.release(id);
  std::erase(queue_, id);
  entries_.erase(id);
  forget_if_gone(id);
}

void worker_core::fail_prompt(request_id id, errc code, const std::string& message) {
  emit(cmd::fail{id, code, message});
  drop_prompt(id);
}

}  // namespace tandem::sched
