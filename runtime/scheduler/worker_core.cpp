#include "runtime/scheduler/worker_core.h"

#include <algorithm>
#include <cstdlib>

namespace tandem::sched {

namespace worker {
std::string_view to_string(phase p) {
  switch (p) {
    case phase::reserved: return "reserved";
    case phase::fetching: return "fetching";
    case phase::arriving: return "arriving";
    case phase::importing: return "importing";
    case phase::decoding: return "decoding";
    case phase::leased: return "leased";
    case phase::shipping: return "shipping";
  }
  return "?";
}
}  // namespace worker

using namespace worker;

namespace {
status refused(std::string why) { return {errc::refused, std::move(why)}; }
}  // namespace

worker_core::worker_core(worker::config config)
    : cfg_(std::move(config)), ledger_(cfg_.total_blocks, cfg_.block_size) {
  if (!cfg_.faults) cfg_.faults = no_faults();
  if (cfg_.local_prefill_target_ms > 0) slack_.emplace(cfg_.local_prefill_target_ms);
}

std::vector<command> worker_core::on(const event& e) {
  out_.clear();
  std::visit([this](const auto& x) { handle(x); }, e);
  return std::move(out_);
}

// ---- queries ----

const entry* worker_core::find(request_id id) const {
  auto it = entries_.find(id);
  return it == entries_.end() ? nullptr : &it->second;
}

entry* worker_core::get(request_id id) {
  auto it = entries_.find(id);
  return it == entries_.end() ? nullptr : &it->second;
}

int32_t worker_core::holding() const {
  int32_t n = 0;
  for (const auto& [id, e] : entries_) {
    switch (e.current()) {
      case phase::arriving:
      case phase::importing:
      case phase::decoding:
      case phase::leased:
      case phase::shipping: ++n; break;
      case phase::reserved:
      case phase::fetching: break;
    }
  }
  return n;
}

std::vector<seq_id> worker_core::take_frees() {
  std::vector<seq_id> f = std::move(to_free_);
  to_free_.clear();
  return f;
}

// Auto mode: its TPOT slack over its fitted cost per token, at most one prefill step's budget;
// before its steps are measured, two blocks' worth.
int32_t worker_core::local_prefill_tokens() const {
  if (!slack_) return 0;
  const int32_t cap = cfg_.prefill_token_budget;
  if (!cost_.ready() || cost_.per_token_ms() <= 0) return std::min(cap, 2 * cfg_.block_size);
  return std::min(cap, slack_->tokens(cost_.per_token_ms()));
}

decode_worker_load worker_core::load(int32_t index) {
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

// ---- events ----

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
  if (ok && !entries_.count(r.id)) entries_[r.id].spec.id = r.id;  // reserved, nothing staged
  emit(cmd::report_load{});
  if (!ok)
    return answer(r.ticket, refused("not enough free KV blocks: " + std::to_string(blocks_for_tokens(cap, ledger_.block_size())) +
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
      case phase::leased:
      case phase::shipping: return answer(t.ticket, {errc::invalid_argument, "a prefill worker takes no KV"});
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
      case phase::leased:
      case phase::shipping: return answer(f.ticket, {errc::invalid_argument, "a prefill worker fetches no prompt for decode"});
    }
  }
  if (!e) return answer(f.ticket, refused("no reservation for request " + std::to_string(id)));
  if (f.spec.prompt.size() < 2) return answer(f.ticket, {errc::invalid_argument, "a fetched prompt has two tokens or more"});
  e->spec = f.spec;
  e->where = fetching{f.ticket, {f.ticket}};
  store_asks_[f.ticket] = id;
  emit(cmd::ask_store{f.ticket, prompt_block_keys(cfg_.prefix_salt, f.spec.prompt, cfg_.block_size)});
}

// With the store's blocks (if any), this worker computes the rest of the prompt when it is a
// tail of two blocks at most, or (auto mode) fits in its TPOT slack; otherwise a prefill
// worker computes it, not this worker's decode steps.
void worker_core::handle(const ev::store_answer& s) {
  auto asked = store_asks_.find(s.ticket);
  if (asked == store_asks_.end()) return;
  const request_id id = asked->second;
  store_asks_.erase(asked);
  entry* e = get(id);
  const bool current = e && e->current() == phase::fetching && std::get<fetching>(e->where).asked == s.ticket;
  if (!current) return answer(s.ticket, refused("request " + std::to_string(id) + " was cancelled while the store was asked"));
  std::vector<uint64_t> tickets = std::move(std::get<fetching>(e->where).tickets);
  const int32_t bs = cfg_.block_size;
  const size_t want = prompt_block_keys(cfg_.prefix_salt, e->spec.prompt, bs).size();
  const size_t have = s.blocks ? s.blocks->size() : 0;
  const int32_t missing = int32_t(e->spec.prompt.size()) - int32_t(have) * bs;
  const int32_t may = std::max(2 * bs, local_prefill_tokens());
  if (missing > may) {
    e->where = reserved{};
    for (uint64_t t : tickets)
      answer(t, refused("the store holds " + std::to_string(have) + " of the prompt's " + std::to_string(want) +
                        " blocks; " + std::to_string(missing) + " tokens are more than this worker computes now (" +
                        std::to_string(may) + ")"));
    return;
  }
  arriving a;
  if (have > 0) a.kv.push_back(s.blocks);
  a.kv_tokens = int32_t(have) * bs;
  a.feed.assign(e->spec.prompt.begin() + a.kv_tokens, e->spec.prompt.end());
  a.tickets = std::move(tickets);
  e->where = std::move(a);
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

void worker_core::handle(const ev::cancel& c) {
  entry* e = get(c.id);
  if (e) {
    switch (e->current()) {
      case phase::decoding: {
        auto& d = std::get<decoding>(e->where);
        if (d.in_step) d.cancelled = true;  // dropped when the step returns
        else retire(c.id);
        break;
      }
      case phase::arriving:
        answer_all(std::get<arriving>(e->where),
                   refused("request " + std::to_string(c.id) + " was cancelled while its KV arrived"));
        std::erase(arrivals_, c.id);
        drop(c.id);
        break;
      case phase::importing: {  // its credits go when the import returns
        auto& im = std::get<importing>(e->where);
        im.cancelled = true;
        im.late = {};
        break;
      }
      case phase::reserved:
      case phase::fetching: drop(c.id); break;  // a fetch's store answer is refused when it comes
      case phase::leased:
      case phase::shipping: end_lease(c.id); break;
    }
  }
  if (cfg_.kind == worker_kind::decode) emit(cmd::report_load{});  // its credits changed
}

void worker_core::handle(const ev::pause& p) {
  if (entry* e = get(p.id); e && e->current() == phase::decoding) std::get<decoding>(e->where).paused = p.pause;
}

void worker_core::handle(const ev::plan&) {
  if (busy_) return;
  if (cfg_.kind != worker_kind::decode) {  // a prefill worker's transfers that wait to export
    std::vector<std::pair<request_id, link_id>> waiting;
    for (auto& [id, e] : entries_)
      if (const lease* l = lease_of(e); l && l->waiting_idle != 0) waiting.emplace_back(id, l->waiting_idle);
    for (auto [id, link] : waiting) ship(id, entries_.at(id), link);
    return;
  }
  step_work work;
  work.frees = std::move(to_free_);
  to_free_.clear();
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
  for (auto& [id, e] : entries_) {
    if (e.current() != phase::decoding) continue;
    auto& d = std::get<decoding>(e.where);
    if (d.paused || d.cancelled) continue;
    d.in_step = true;
    work.decodes.push_back({id, d.seq, d.last, d.generated, e.spec.sampling, d.output, d.penalty_prompt});
  }
  if (work.imports.empty() && work.decodes.empty() && work.frees.empty()) return;
  busy_ = true;
  emit(cmd::start_step{std::move(work)});
}

void worker_core::handle(const ev::step_returned& s) {
  const step_result& r = *s.result;
  busy_ = false;
  if (cfg_.kind != worker_kind::decode) return;  // its prompts are the actor's (sequence.h)
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
  // Released from the step: in id order, as tokens are matched to them below.
  std::vector<request_id> held;
  for (auto& [id, e] : entries_)
    if (e.current() == phase::decoding && std::get<decoding>(e.where).in_step) {
      std::get<decoding>(e.where).in_step = false;
      held.push_back(id);
    }
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
    if (entry* e = get(t.id); e && e->current() == phase::decoding && std::binary_search(held.begin(), held.end(), t.id))
      stream(t.id, *e, std::get<decoding>(e->where), t);
  if (slack_) {
    int32_t decoding_now = 0;
    for (const auto& [id, e] : entries_) decoding_now += e.current() == phase::decoding;
    if (decoding_now == 0) slack_->idle();
    // The router spent the figure on the prompts it sent here: a fresh one after computing them.
    if (fed > 0 || std::abs(local_prefill_tokens() - reported_local_) >= cfg_.block_size) emit(cmd::report_load{});
  }
}

// ---- a prefill worker's leases ----

void worker_core::handle(const ev::prompt_done& p) {
  const request_id id = p.spec.id;
  if (p.finished) {  // ended with its first token: nothing to lease
    to_free_.push_back(p.kv.seq);
    emit(cmd::prefilled{id, true});
    return;
  }
  entry& e = entries_[id];
  e.spec = p.spec;
  e.where = leased{p.kv};
  emit(cmd::prefilled{id, false});
  if (p.link != 0) ship(id, e, p.link);
}

void worker_core::handle(const ev::ship& s) {
  if (entry* e = get(s.id); e && lease_of(*e)) ship(s.id, *e, s.link);
}

void worker_core::handle(const ev::transfer_answer& a) {
  if (!a.outcome.ok()) return transfer_failed(a.id, a.link, a.outcome);
  entry* e = get(a.id);
  if (e && e->current() == phase::shipping && std::get<shipping>(e->where).link == a.link) end_lease(a.id);
}

// A link died: a transfer it had taken will never be answered (its promise died with it), so
// it fails now rather than at the timeout.
void worker_core::handle(const ev::link_down& d) {
  std::vector<request_id> ids;
  for (auto& [id, e] : entries_)
    if (e.current() == phase::shipping && std::get<shipping>(e.where).link == d.link) ids.push_back(id);
  for (request_id id : ids) transfer_failed(id, d.link, {errc::worker_failed, "its KV link died"});
}

void worker_core::handle(const ev::release& r) {
  entry* e = get(r.id);
  if (e && lease_of(*e) && (!r.epoch || e->spec.epoch == *r.epoch)) end_lease(r.id);
}

lease* worker_core::lease_of(entry& e) {
  switch (e.current()) {
    case phase::leased: return &std::get<leased>(e.where);
    case phase::shipping: return &std::get<shipping>(e.where);
    case phase::reserved:
    case phase::fetching:
    case phase::arriving:
    case phase::importing:
    case phase::decoding: return nullptr;
  }
  return nullptr;
}

// Hands the KV (all of it, or only the closing message when it streamed to this link) to the
// link; the lease ends when the decode worker holds it.
void worker_core::ship(request_id id, entry& e, link_id link) {
  lease l = *lease_of(e);
  if (!l.kv && ((l.streamed_to != 0 && l.streamed_to != link) || l.resend_all)) {
    // Its pieces went to a link that was replaced (its decode worker or the link died), or a
    // try failed (a piece lost or corrupted): the decode side cannot build on them, so the
    // whole set goes again, exported while the engine is idle.
    if (busy_) {
      lease_of(e)->waiting_idle = link;
      return;
    }
    l.kv = cfg_.export_all(l.seq, id, e.spec.epoch);
    l.streamed_to = 0;
    l.resend_all = false;
  }
  l.waiting_idle = 0;
  kv_blocks_ptr kv = l.kv ? l.kv : std::make_shared<const std::vector<kv_block_export>>();
  std::vector<token_id> generated = l.generated;
  e.where = shipping{l, link};
  emit(cmd::ship_started{id});  // told first: if this worker dies later, the link still delivers
  emit(cmd::transfer{id, link, e.spec, std::move(kv), std::move(generated)});
}

// A try over `link` failed: the lease stays, and the router decides (ship again, or move on).
void worker_core::transfer_failed(request_id id, link_id link, const status& why) {
  if (cfg_.metrics)
    cfg_.metrics
        ->get_counter("tandem_kv_transfer_failures_total", "KV transfers that failed back to their lease, by code",
                      {{"code", std::string(to_string(why.code()))}})
        .inc();
  entry* e = get(id);
  if (!e || e->current() != phase::shipping || std::get<shipping>(e->where).link != link) return;
  leased l{static_cast<lease&>(std::get<shipping>(e->where))};
  l.resend_all = true;
  e->where = std::move(l);
  emit(cmd::transfer_failed{id, e->spec.epoch, link});
}

void worker_core::end_lease(request_id id) {
  to_free_.push_back(lease_of(entries_.at(id))->seq);
  entries_.erase(id);
  emit(cmd::forget{id});
}

// ---- helpers ----

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
      cfg_.metrics->get_counter("tandem_kv_imports_refused_total", "KV block sets a decode worker refused (checksum, incomplete)")
          .inc();
    const status why = im == r.imports.end()
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
  d.in_step = true;  // the import step sampled its next token
  d.cancelled = a.cancelled;
  e.where = std::move(d);
  // Cancelled while it imported (it was moved on, or it ended): it does not decode here, and
  // saying it does would tell the router a stale "decoding" after it has requeued it.
  if (!std::get<decoding>(e.where).cancelled) {
    emit(cmd::tell_request{id, request_state::decoding, 0});
    emit(cmd::tell_router{id, request_state::decoding});
  }
}

// A token sampled for d, by the one stop rule: streamed, and its end told (then it retires).
void worker_core::stream(request_id id, entry& e, decoding& d, const step_result::sampled& t) {
  const bool eog = cfg_.ends_generation && cfg_.ends_generation(e.spec, t.token);
  const token_outcome o = take_token(e.spec, d.generated, d.output, d.last, t.token, eog, cfg_.n_ctx);
  if (o.emit) emit(cmd::token{id, o.index, t.token, t.logprobs});
  if (o.end == finish_reason::none) return;
  emit(cmd::done{id, o.end});
  retire(id);
}

void worker_core::retire(request_id id) {
  entry* e = get(id);
  if (!e) return;
  if (e->current() == phase::decoding) {
    const seq_id seq = std::get<decoding>(e->where).seq;
    // A finished answer's blocks (past the prompt's, which its prefill worker published) go to
    // the host store: the conversation's next turn starts with all of it. Only between steps.
    if (!busy_ && seq != 0) emit(cmd::publish{seq, int32_t(e->spec.prompt.size()) / cfg_.block_size});
    to_free_.push_back(seq);
  }
  drop(id);
}

void worker_core::drop(request_id id) {
  ledger_.release(int64_t(id));
  entries_.erase(id);
  emit(cmd::forget{id});
}

// ---- metrics ----

void count_prefix_use(metrics::registry& m, double computed, double hits, double lookups) {
  m.get_counter("tandem_prompt_tokens_computed_total", "Prompt tokens run through the model (cached prefixes are not).")
      .inc(computed);
  auto& h = m.get_counter("tandem_prefix_cache_hit_tokens_total", "Prompt tokens whose KV came from the prefix cache.");
  auto& l = m.get_counter("tandem_prefix_cache_lookup_tokens_total", "Prompt tokens looked up in the prefix cache.");
  h.inc(hits);
  l.inc(lookups);
  m.get_gauge("tandem_prefix_cache_hit_ratio", "Prompt tokens served from a prefix cache / prompt tokens looked up, since start")
      .set(l.value() > 0 ? h.value() / l.value() : 0.0);
}

}  // namespace tandem::sched
