// A decode worker's requests: reservations, arriving KV, imports and decode steps.
#include "runtime/scheduler/worker_core.h"

#include <algorithm>
#include <cstdlib>

namespace tandem::sched {

using namespace worker;

namespace {
status refused(std::string why) { return {errc::refused, std::move(why)}; }
}  // namespace

// Auto mode: its TPOT slack over its fitted cost per token, at most one prefill step's budget;
// before its steps are measured, two blocks' worth.
int32_t worker_core::local_prefill_tokens() const {
  if (!slack_) return 0;
  const int32_t cap = cfg_.prefill_token_budget;
  if (!cost_.ready() || cost_.per_token_ms() <= 0) return std::min(cap, 2 * cfg_.block_size);
  return std::min(cap, slack_->tokens(cost_.per_token_ms()));
}

decode_worker_load worker_core::decode_load(int32_t index) {
  decode_worker_load l;
  l.worker = index;
  l.alive = true;
  l.free_blocks = ledger_.free_blocks();
  l.total_blocks = ledger_.total_blocks();
  l.batch_size = ledger_.holders();  // reserved slots, streaming or decoding
  l.max_batch = cfg_.max_batch;
  l.local_prefill_tokens = reported_local_ = local_prefill_tokens();
  return l;
}

void worker_core::handle(const ev::reserve& r) {
  // Every reservation is a future batch slot (streamed ones arrive while prefill runs).
  if (ledger_.holders() >= cfg_.max_batch && !ledger_.holds(int64_t(r.id)))
    return answer(r.ticket, refused("the decode batch is full (" + std::to_string(cfg_.max_batch) + " sequences)"));
  if (cfg_.faults->refuse_reservation()) {
    emit(cmd::report_load{});
    return answer(r.ticket, refused("fault injected: fail_alloc"));  // as if the pool were full
  }
  const int32_t cap = std::min(r.total_tokens, cfg_.n_ctx);
  const int32_t free_blocks = ledger_.free_blocks();
  const bool ok = ledger_.try_reserve(int64_t(r.id), cap);
  if (ok && !entries_.count(r.id)) {
    entry& e = entries_[r.id];
    e.spec.id = r.id;  // the rest comes with its KV or its fetch
    e.where = reserved{};
  }
  emit(cmd::report_load{});
  if (!ok)
    return answer(r.ticket,
                  refused("not enough free KV blocks: " + std::to_string(blocks_for_tokens(cap, ledger_.block_size())) +
                          " needed, " + std::to_string(free_blocks) + " free"));
  answer(r.ticket, {});
}

void worker_core::handle(const ev::transfer& t) {
  const request_id id = t.spec.id;
  entry* e = get(id);
  // Staged pieces go to this try (of this attempt) or nowhere: a duplicate try does not keep them.
  std::vector<kv_blocks_ptr> pieces;
  if (e) {
    switch (e->current()) {
      case phase::reserved: {
        auto& staged = std::get<reserved>(e->where).staged;
        if (staged.epoch == t.spec.epoch) pieces = std::move(staged.pieces);
        staged = {};
        break;
      }
      case phase::fetching: break;
      case phase::arriving:
      case phase::importing: {  // a duplicate try: answered with the first's outcome
        arrival& a = e->current() == phase::arriving ? static_cast<arrival&>(std::get<arriving>(e->where))
                                                     : std::get<importing>(e->where);
        a.late = {};
        a.tickets.push_back(t.ticket);
        return;
      }
      case phase::decoding: return answer(t.ticket, {});  // an earlier try delivered it: the lease may end
      case phase::waiting:
      case phase::prefilling:
      case phase::leased:
      case phase::shipping: return answer(t.ticket, {errc::invalid_argument, "a prompt here takes no KV"});
    }
  }
  if (!t.generated.empty() && t.kv && !e)
    return answer(t.ticket, refused("no reservation for request " + std::to_string(id) + " (cancelled, or moved on)"));
  if (t.generated.empty() || !t.kv)
    return answer(t.ticket, {errc::invalid_argument, "an arrival needs its KV and its first token"});
  // A set that comes whole (not the closing message of a streamed one) is complete by itself:
  // pieces staged from an earlier try of the same attempt are superseded.
  if (!t.kv->empty()) pieces.clear();
  pieces.push_back(t.kv);
  // Every block must be this request's, from this prefill attempt (the tags are under the
  // checksum the engine verifies on import).
  for (const auto& p : pieces)
    for (const auto& b : *p)
      if (b.request != id || b.epoch != t.spec.epoch)
        return answer(t.ticket, {errc::incompatible_kv, "KV blocks of another request or prefill attempt"});
  arriving a;
  a.kv = std::move(pieces);
  a.generated = t.generated;
  a.tickets.push_back(t.ticket);
  e->spec = t.spec;
  e->where = std::move(a);
  arrivals_.push_back(id);
}

void worker_core::handle(const ev::fetch& f) {
  const request_id id = f.spec.id;
  entry* e = get(id);
  if (e) {
    switch (e->current()) {
      case phase::arriving:
      case phase::importing:
      case phase::decoding: return answer(f.ticket, {});  // already here
      case phase::fetching:  // asked already: this try gets the same answer
        return std::get<fetching>(e->where).tickets.push_back(f.ticket);
      case phase::reserved: break;
      case phase::waiting:
      case phase::prefilling:
      case phase::leased:
      case phase::shipping:
        return answer(f.ticket, {errc::invalid_argument, "a prompt here is not fetched for decode"});
    }
  }
  if (!e) return answer(f.ticket, refused("no reservation for request " + std::to_string(id)));
  if (f.spec.prompt.size() < 2)
    return answer(f.ticket, {errc::invalid_argument, "a fetched prompt has two tokens or more"});
  e->spec = f.spec;
  fetching q;
  q.keys = prompt_block_keys(cfg_.prefix_salt, f.spec.prompt, cfg_.block_size);
  q.tickets.push_back(f.ticket);
  q.asked = ask_store(q.keys);
  store_asks_[q.asked] = id;
  e->where = std::move(q);
}

// The store answered a decode worker's fetch. With the store's blocks (if any), this worker
// computes the rest of the prompt when it is a tail of two blocks at most, or (auto mode) fits
// in its TPOT slack; otherwise a prefill worker computes it, not this worker's decode steps.
void worker_core::fetched(request_id id, entry& e, const kv_blocks_ptr& blocks) {
  auto& q = std::get<fetching>(e.where);
  std::vector<uint64_t> tickets = std::move(q.tickets);
  const int32_t bs = cfg_.block_size;
  const size_t want = q.keys.size();
  const size_t have = blocks ? blocks->size() : 0;
  const int32_t missing = int32_t(e.spec.prompt.size()) - int32_t(have) * bs;
  const int32_t may = std::max(2 * bs, local_prefill_tokens());
  if (missing > may) {
    e.where = reserved{};
    for (uint64_t t : tickets)
      answer(t, refused("the store holds " + std::to_string(have) + " of the prompt's " + std::to_string(want) +
                        " blocks; " + std::to_string(missing) + " tokens are more than this worker computes now (" +
                        std::to_string(may) + ")"));
    return;
  }
  arriving a;
  if (have > 0) a.kv.push_back(blocks);
  a.kv_tokens = int32_t(have) * bs;
  a.feed.assign(e.spec.prompt.begin() + a.kv_tokens, e.spec.prompt.end());
  a.tickets = std::move(tickets);
  e.where = std::move(a);
  arrivals_.push_back(id);
  // It computes its prompt here (the part the store lacks): its request says so, with the
  // tokens the store served as cached (usage, the log's request line).
  emit(cmd::tell_request{id, request_state::prefilling, int32_t(have) * bs});
}

void worker_core::handle(const ev::kv_piece& p) {
  entry* e = get(p.id);
  if (!p.kv || !e) return;  // stale: no reservation
  staged_kv* sk = nullptr;
  switch (e->current()) {
    case phase::reserved: sk = &std::get<reserved>(e->where).staged; break;
    case phase::arriving: sk = &std::get<arriving>(e->where).late; break;
    case phase::importing: sk = &std::get<importing>(e->where).late; break;
    case phase::fetching:
    case phase::decoding:  // its KV is here or comes from the store
    case phase::waiting:
    case phase::prefilling:
    case phase::leased:
    case phase::shipping: return;
  }
  if (p.epoch < sk->epoch) return;  // from an attempt that was replaced
  if (p.epoch > sk->epoch) {
    sk->epoch = p.epoch;
    sk->pieces.clear();
  }
  sk->pieces.push_back(p.kv);
}

void worker_core::plan_decode(step_work& work) {
  for (request_id id : arrivals_) {
    entry& e = entries_.at(id);
    auto& a = std::get<arriving>(e.where);
    step_work::import_item im;
    im.id = id;
    im.kv = a.kv;
    im.sampling = e.spec.sampling;
    // Both paths sample from the whole prompt's logits: repetition_penalty reads it either way.
    a.penalty_prompt = e.spec.prompt_for_penalty();
    im.prompt = a.penalty_prompt;
    if (a.feed.empty()) {
      im.last = a.generated.back();
      im.index = int32_t(a.generated.size());
      im.kv_tokens = int32_t(e.spec.prompt.size());
      if (im.sampling.needs_output()) im.output = a.generated;
    } else {
      im.feed = a.feed;
      im.index = 0;
      im.kv_tokens = a.kv_tokens;
    }
    if (cfg_.store || !a.feed.empty()) im.tokens = e.spec.prompt;  // its blocks can be named and published
    work.imports.push_back(std::move(im));
    e.where = importing{std::move(a)};
  }
  importing_ = std::move(arrivals_);
  arrivals_.clear();
  add_decodes(work);
}

void worker_core::decode_returned(const step_result& r) {
  int32_t fed = 0;  // prompts computed here: no output token waited on them yet
  if (slack_ && r.error.ok()) {  // auto: what this step cost, and the slack its decodes have left
    cost_.observe(r.batch_tokens, r.ms);
    for (request_id id : importing_) fed += !std::get<importing>(entries_.at(id).where).feed.empty();
    slack_->step(int32_t(r.tokens.size()) - fed, r.ms);
  }
  // Imports first: a refused block set ends its try (the prefill side may try again).
  const auto imports = std::move(importing_);
  importing_.clear();
  for (request_id id : imports) imported(id, entries_.at(id), r);
  const std::vector<request_id> held = release_step();  // in id order
  for (request_id id : held) {
    auto& d = std::get<decoding>(entries_.at(id).where);
    if (d.cancelled) {
      retire(id);
    } else if (!r.error.ok()) {  // credits make this unreachable in normal operation: end them clearly
      emit(cmd::fail{id, r.error.code(), r.error.message()});
      retire(id);
    }
  }
  if (!r.error.ok()) return;
  for (const auto& t : r.tokens)
    if (entry* e = get(t.id);
        e && e->current() == phase::decoding && std::binary_search(held.begin(), held.end(), t.id)) {
      auto& d = std::get<decoding>(e->where);
      if (stream(t.id, e->spec, d.generated, d.output, d.last, t) != finish_reason::none) retire(t.id);
    }
  if (slack_) {
    int32_t decoding_now = 0;
    for (const auto& [id, e] : entries_) decoding_now += e.current() == phase::decoding;
    if (decoding_now == 0) slack_->idle();
    // The router spent the figure on the prompts it sent here: a fresh one after computing them.
    if (fed > 0 || std::abs(local_prefill_tokens() - reported_local_) >= cfg_.block_size) emit(cmd::report_load{});
  }
}

void worker_core::answer_all(const arrival& a, const status& outcome) {
  for (uint64_t t : a.tickets) answer(t, outcome);
}

// The step that imported e came back: it decodes from now on, or (refused: corrupted or
// incomplete) nothing of it stays here but the reservation, which a retry from the prefill
// side's lease will use (or the router cancels).
void worker_core::imported(request_id id, entry& e, const step_result& r) {
  auto& a = std::get<importing>(e.where);
  auto im = std::find_if(r.imports.begin(), r.imports.end(), [&](const auto& x) { return x.id == id; });
  if (im == r.imports.end() || !im->st.ok()) {
    if (cfg_.metrics)
      cfg_.metrics
          ->get_counter("tandem_kv_imports_refused_total",
                        "KV block sets a decode worker refused (checksum, incomplete)")
          .inc();
    const status why =
        im == r.imports.end()
            ? status{errc::incompatible_kv, "the KV block set of request " + std::to_string(id) + " was incomplete"}
            : im->st;
    const bool cancelled = a.cancelled;
    answer_all(a, why);
    if (cancelled) drop(id);
    else e.where = reserved{std::move(a.late)};
    return;
  }
  answer_all(a, {});  // the prefill side may drop its lease
  if (!a.feed.empty() && cfg_.metrics)  // a prompt served from the store: its cache figures
    count_prefix_use(*cfg_.metrics, double(a.feed.size()), double(a.kv_tokens), double(e.spec.prompt.size()));
  decoding d;
  d.seq = im->seq;
  d.generated = int32_t(a.generated.size());
  if (e.spec.sampling.needs_output() && a.feed.empty()) d.output = a.generated;
  d.penalty_prompt = std::move(a.penalty_prompt);
  d.last = a.feed.empty() ? a.generated.back() : a.feed.back();
  // A finished answer's blocks (past the prompt's, which its prefill worker published) go to
  // the host store: the conversation's next turn starts with all of it.
  d.publish_from = int32_t(e.spec.prompt.size()) / cfg_.block_size;
  d.in_step = true;  // the import step sampled its next token
  d.cancelled = a.cancelled;
  const bool cancelled = a.cancelled;
  e.where = std::move(d);
  // Cancelled while it imported (it was moved on, or it ended): it does not decode here, and
  // saying it does would tell the router a stale "decoding" after it has requeued it.
  if (!cancelled) {
    emit(cmd::tell_request{id, request_state::decoding, 0});
    emit(cmd::tell_router{id, request_state::decoding});
  }
}

// Ends a decoding request here: its blocks to the store (only between steps) and freed at the
// next step, its credits back.
void worker_core::retire(request_id id) {
  entry* e = get(id);
  if (!e) return;
  if (e->current() == phase::decoding) {
    const auto& d = std::get<decoding>(e->where);
    if (!busy_ && d.seq != 0 && d.publish_from >= 0) emit(cmd::publish{d.seq, d.publish_from});
    to_free_.push_back(d.seq);
  }
  drop(id);
}

void worker_core::drop(request_id id) {
  ledger_.release(int64_t(id));
  claims_.release(id);
  entries_.erase(id);
  std::erase(queue_, id);
  emit(cmd::forget{id});
}

}  // namespace tandem::sched
