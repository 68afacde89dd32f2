// The worker core: what all three kinds share (dispatch, cancel, steps, the stop rule) and a
// prefill worker's leases. Prompts: worker_core_prompts.cpp; a decode worker's requests:
// worker_core_decode.cpp.
#include "runtime/scheduler/worker_core.h"

#include <algorithm>

namespace tandem::sched {

namespace worker {
std::string_view to_string(phase p) {
  switch (p) {
    case phase::waiting: return "waiting";
    case phase::fetching: return "fetching";
    case phase::prefilling: return "prefilling";
    case phase::decoding: return "decoding";
    case phase::leased: return "leased";
    case phase::shipping: return "shipping";
    case phase::reserved: return "reserved";
    case phase::arriving: return "arriving";
    case phase::importing: return "importing";
  }
  return "?";
}
}  // namespace worker

using namespace worker;

worker_core::worker_core(worker::config config, engine_port* engine)
    : cfg_(std::move(config)), engine_(engine), ledger_(cfg_.total_blocks, cfg_.block_size) {
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
  if (auto it = entries_.find(id); it != entries_.end()) return &it->second;
  auto it = leases_.find(id);
  return it == leases_.end() ? nullptr : &it->second;
}

entry* worker_core::get(request_id id) {
  auto it = entries_.find(id);
  return it == entries_.end() ? nullptr : &it->second;
}

int32_t worker_core::holding() const {
  switch (cfg_.kind) {
    case worker_kind::prefill: return int32_t(entries_.size() + leases_.size());
    case worker_kind::colocated: return int32_t(entries_.size());
    case worker_kind::decode: break;
  }
  int32_t n = 0;  // a decode worker's reservations are credits, not requests it holds yet
  for (const auto& [id, e] : entries_)
    n += e.current() == phase::arriving || e.current() == phase::importing || e.current() == phase::decoding;
  return n;
}

// Prompt tokens still to compute, as the router's load figures count them: a prompt that
// waits for blocks another prompt is computing will not compute them itself.
prompt_load worker_core::waiting_load() const {
  prompt_load l;
  for (request_id id : queue_) {
    const entry& e = entries_.at(id);
    const prompt_state& p = *prompt_of(e);
    l.tokens += int32_t(e.spec.prompt.size()) - std::max(p.prefilled, p.seq == 0 ? p.expected_reuse : 0);
    ++l.requests;
  }
  return l;
}

int64_t worker_core::planned_prompt_tokens() const {
  int64_t n = 0;
  for (const auto& [id, e] : entries_)
    if (const prompt_state* p = prompt_of(e); p && p->in_step) n += p->planned;
  return n;
}

prompt_state* worker_core::prompt_of(entry& e) {
  switch (e.current()) {
    case phase::waiting: return &std::get<waiting>(e.where);
    case phase::fetching: return &std::get<fetching>(e.where);
    case phase::prefilling: return &std::get<prefilling>(e.where);
    case phase::decoding:
    case phase::leased:
    case phase::shipping:
    case phase::reserved:
    case phase::arriving:
    case phase::importing: return nullptr;
  }
  return nullptr;
}

lease* worker_core::lease_of(entry& e) {
  switch (e.current()) {
    case phase::leased: return &std::get<leased>(e.where);
    case phase::shipping: return &std::get<shipping>(e.where);
    case phase::waiting:
    case phase::fetching:
    case phase::prefilling:
    case phase::decoding:
    case phase::reserved:
    case phase::arriving:
    case phase::importing: return nullptr;
  }
  return nullptr;
}

// ---- events every kind has ----

void worker_core::handle(const ev::store_answer& s) {
  auto asked = store_asks_.find(s.ask);
  if (asked == store_asks_.end()) return;
  const request_id id = asked->second;
  store_asks_.erase(asked);
  entry* e = get(id);
  if (!e || e->current() != phase::fetching || std::get<fetching>(e->where).asked != s.ask) {
    // Gone meanwhile: a decode worker's fetch is refused now (a prompt's claims went with it).
    if (auto it = abandoned_.find(s.ask); it != abandoned_.end()) {
      for (uint64_t t : it->second)
        answer(t, {errc::refused, "request " + std::to_string(id) + " was cancelled while the store was asked"});
      abandoned_.erase(it);
    }
    return;
  }
  if (cfg_.kind == worker_kind::decode) return fetched(id, *e, s.blocks);
  auto& q = std::get<fetching>(e->where);
  waiting w{q};  // cached before it starts (the engine is idle then)
  if (s.blocks && !s.blocks->empty()) {
    w.fetched = s.blocks;
    w.fetched_keys = std::move(q.keys);
  }
  e->where = std::move(w);
}

void worker_core::handle(const ev::cancel& c) {
  if (entry* e = get(c.id)) {
    switch (e->current()) {
      case phase::fetching:
        if (cfg_.kind == worker_kind::decode) {  // its store answer, when it comes, is refused
          auto& q = std::get<fetching>(e->where);
          abandoned_[q.asked] = std::move(q.tickets);
        }
        [[fallthrough]];
      case phase::waiting:
      case phase::prefilling:
        if (prompt_state* p = prompt_of(*e); p->in_step) {
          p->cancelled = true;  // dropped when the step returns
          if (cfg_.kind == worker_kind::prefill) return;  // (its lease, if any, is another attempt's)
        } else {
          drop_prompt(c.id);
        }
        break;
      case phase::decoding:
        if (auto& d = std::get<decoding>(e->where); d.in_step) d.cancelled = true;
        else retire(c.id);
        break;
      case phase::reserved: drop(c.id); break;
      case phase::arriving:
        answer_all(std::get<arriving>(e->where),
                   {errc::refused, "request " + std::to_string(c.id) + " was cancelled while its KV arrived"});
        std::erase(arrivals_, c.id);
        drop(c.id);
        break;
      case phase::importing: {  // its credits go when the import returns
        auto& im = std::get<importing>(e->where);
        im.cancelled = true;
        im.late = {};
        break;
      }
      case phase::leased:
      case phase::shipping: break;  // (leases are in leases_)
    }
  }
  if (leases_.count(c.id)) end_lease(c.id);
  if (cfg_.kind == worker_kind::decode) emit(cmd::report_load{});  // its credits changed
}

void worker_core::handle(const ev::pause& p) {
  entry* e = get(p.id);
  if (!e) return;
  if (e->current() == phase::decoding) std::get<decoding>(e->where).paused = p.pause;
  else if (prompt_state* s = prompt_of(*e); s && cfg_.kind == worker_kind::colocated) s->paused = p.pause;
}

void worker_core::handle(const ev::plan&) {
  if (busy_) return;
  step_work work;
  std::vector<std::pair<request_id, link_id>> streams;
  switch (cfg_.kind) {
    case worker_kind::decode:
      work.frees = std::move(to_free_);
      to_free_.clear();
      plan_decode(work);
      break;
    case worker_kind::prefill: {
      // Transfers that waited for the engine to be idle (to export their whole set) go first.
      std::vector<std::pair<request_id, link_id>> waiting_idle;
      for (auto& [id, e] : leases_)
        if (const lease* l = lease_of(e); l->waiting_idle != 0) waiting_idle.emplace_back(id, l->waiting_idle);
      for (auto [id, link] : waiting_idle) ship(id, leases_.at(id), link);
      plan_prefill(work, streams);
      break;
    }
    case worker_kind::colocated: plan_colocated(work); break;
  }
  if (work.imports.empty() && work.decodes.empty() && work.chunks.empty() && work.frees.empty()) return;
  if (!streams.empty()) work.stream_layer_group = cfg_.stream_layer_group;
  busy_ = true;
  emit(cmd::start_step{std::move(work), std::move(streams)});
}

void worker_core::handle(const ev::step_returned& s) {
  busy_ = false;
  if (cfg_.kind == worker_kind::decode) decode_returned(*s.result);
  else prompts_returned(*s.result);
}

// ---- steps ----

// A decode item for every running, unpaused sequence; returns how many.
int32_t worker_core::add_decodes(step_work& work) {
  int32_t n = 0;
  for (auto& [id, e] : entries_) {
    if (e.current() != phase::decoding) continue;
    auto& d = std::get<decoding>(e.where);
    if (d.paused || d.cancelled) continue;
    d.in_step = true;
    work.decodes.push_back({id, d.seq, d.last, d.generated, e.spec.sampling, d.output, d.penalty_prompt});
    ++n;
  }
  return n;
}

// The step in flight came back: the ids it held (in id order), each released; a prompt's
// planned tokens are in the cache now.
std::vector<request_id> worker_core::release_step() {
  std::vector<request_id> held;
  for (auto& [id, e] : entries_) {
    if (prompt_state* p = prompt_of(e); p && p->in_step) {
      p->in_step = false;
      p->prefilled += p->planned;
      p->planned = 0;
      held.push_back(id);
    } else if (e.current() == phase::decoding && std::get<decoding>(e.where).in_step) {
      std::get<decoding>(e.where).in_step = false;
      held.push_back(id);
    }
  }
  return held;
}

// A token sampled for a request, by the one stop rule: streamed, and its end told.
finish_reason worker_core::stream(request_id id, const request_spec& spec, int32_t& generated,
                                  std::vector<token_id>& output, token_id& last, const step_result::sampled& t) {
  const bool eog = cfg_.ends_generation && cfg_.ends_generation(spec, t.token);
  const token_outcome o = take_token(spec, generated, output, last, t.token, eog, cfg_.n_ctx);
  if (o.emit) emit(cmd::token{id, o.index, t.token, t.logprobs});
  if (o.end != finish_reason::none) emit(cmd::done{id, o.end});
  return o.end;
}

uint64_t worker_core::ask_store(std::vector<block_key> keys) {
  const uint64_t ask = next_ask_++;
  emit(cmd::ask_store{ask, std::move(keys)});
  return ask;
}

void worker_core::forget_if_gone(request_id id) {
  if (!entries_.count(id) && !leases_.count(id)) emit(cmd::forget{id});
}

// ---- a prefill worker's leases ----

void worker_core::handle(const ev::ship& s) {
  if (auto it = leases_.find(s.id); it != leases_.end()) return ship(s.id, it->second, s.link);
  // Still prefilling: its decode worker is already reserved. The KV streams from now on (with
  // stream_kv), or goes as a whole as soon as the prompt is done.
  entry* e = get(s.id);
  prompt_state* p = e ? prompt_of(*e) : nullptr;
  if (!p) return;
  if (p->link != 0 && p->link != s.link) {  // its decode worker changed: start over on the new one
    p->stream_next = 0;
    p->stream_broken = p->in_step;
  }
  p->link = s.link;
}

void worker_core::handle(const ev::transfer_answer& a) {
  if (!a.outcome.ok()) return transfer_failed(a.id, a.link, a.outcome);
  auto it = leases_.find(a.id);
  if (it != leases_.end() && it->second.current() == phase::shipping &&
      std::get<shipping>(it->second.where).link == a.link)
    end_lease(a.id);
}

// A link died: a transfer it had taken will never be answered (its promise died with it), so
// it fails now rather than at the timeout.
void worker_core::handle(const ev::link_down& d) {
  std::vector<request_id> ids;
  for (auto& [id, e] : leases_)
    if (e.current() == phase::shipping && std::get<shipping>(e.where).link == d.link) ids.push_back(id);
  for (request_id id : ids) transfer_failed(id, d.link, {errc::worker_failed, "its KV link died"});
}

void worker_core::handle(const ev::release& r) {
  auto it = leases_.find(r.id);
  if (it != leases_.end() && (!r.epoch || it->second.spec.epoch == *r.epoch)) end_lease(r.id);
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
    l.kv = engine_->export_all(l.seq, id, e.spec.epoch);
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
  auto it = leases_.find(id);
  if (it == leases_.end() || it->second.current() != phase::shipping ||
      std::get<shipping>(it->second.where).link != link)
    return;
  entry& e = it->second;
  leased l{static_cast<lease&>(std::get<shipping>(e.where))};
  l.resend_all = true;
  e.where = std::move(l);
  emit(cmd::transfer_failed{id, e.spec.epoch, link});
}

void worker_core::end_lease(request_id id) {
  to_free_.push_back(lease_of(leases_.at(id))->seq);
  leases_.erase(id);
  forget_if_gone(id);
}

// ---- the stop rule ----

token_outcome take_token(const request_spec& spec, int32_t& generated, std::vector<token_id>& output, token_id& last,
                         token_id tok, bool eog, int32_t n_ctx) {
  token_outcome o;
  o.index = generated;
  o.end = finish_after(spec, generated + 1, eog, n_ctx);
  o.emit = o.end != finish_reason::stop;  // a stop token ends the output; it is not part of it
  if (o.emit) {
    ++generated;
    if (spec.sampling.needs_output()) output.push_back(tok);
    last = tok;
  }
  return o;
}

// ---- metrics ----

void count_prefix_use(metrics::registry& m, double computed, double hits, double lookups) {
  m.get_counter("tandem_prompt_tokens_computed_total", "Prompt tokens run through the model (cached prefixes are not).")
      .inc(computed);
  auto& h = m.get_counter("tandem_prefix_cache_hit_tokens_total", "Prompt tokens whose KV came from the prefix cache.");
  auto& l = m.get_counter("tandem_prefix_cache_lookup_tokens_total", "Prompt tokens looked up in the prefix cache.");
  h.inc(hits);
  l.inc(lookups);
  m.get_gauge("tandem_prefix_cache_hit_ratio",
              "Prompt tokens served from a prefix cache / prompt tokens looked up, since start")
      .set(l.value() > 0 ? h.value() / l.value() : 0.0);
}

}  // namespace tandem::sched
