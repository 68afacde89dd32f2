#include "runtime/scheduler/router_core.h"

#include "runtime/oplog.h"

#include <algorithm>

#include "runtime/kv/prefix_cache.h"

namespace tandem {

namespace sched {

std::string_view to_string(pool_side s) {
  switch (s) {
    case pool_side::prefill: return "prefill";
    case pool_side::decode: return "decode";
  }
  return "?";
}

std::string_view to_string(phase p) {
  switch (p) {
    case phase::waiting: return "waiting";
    case phase::prefilling: return "prefilling";
    case phase::direct: return "direct";
    case phase::decoding: return "decoding";
    case phase::migrating: return "migrating";
    case phase::parked: return "parked";
  }
  return "?";
}

request_state entry::shown_state() const {
  switch (current()) {
    case phase::waiting:
    case phase::migrating:
    case phase::parked:
    case phase::direct: return request_state::queued;
    case phase::prefilling:
      return std::get<prefilling>(where).prefilled ? request_state::transferring : request_state::prefilling;
    case phase::decoding: return request_state::decoding;
  }
  return request_state::queued;
}

namespace {
template <class... F>
struct overloaded : F... {
  using F::operator()...;
};
template <class... F>
overloaded(F...) -> overloaded<F...>;

int32_t prompt_len(const entry& e) { return int32_t(e.spec.prompt.size()); }

void erase_from(std::deque<request_id>& q, request_id id) {
  if (auto it = std::find(q.begin(), q.end(), id); it != q.end()) q.erase(it);
}
}  // namespace

router_core::router_core(router_core_config config, metrics::registry* metrics, clock_fn now)
    : cfg_(std::move(config)), metrics_(metrics), now_(std::move(now)) {
  if (!metrics_) {
    own_metrics_ = std::make_unique<metrics::registry>();
    metrics_ = own_metrics_.get();
  }
  if (!now_) now_ = [] { return clock::now(); };
  if (!cfg_.admission_policy_impl) cfg_.admission_policy_impl = std::make_shared<admission_policy>();
  if (!cfg_.prefill_policy) cfg_.prefill_policy = std::make_shared<prefill_placement>();
  if (!cfg_.decode_policy) cfg_.decode_policy = std::make_shared<decode_placement>();
  if (cfg_.prefix_salt != 0) prefixes_ = std::make_unique<prefix_view>(cfg_.prefix_capacity_blocks);
}

std::vector<command> router_core::on(const event& e) {
  out_.clear();
  std::visit([this](const auto& x) { handle(x); }, e);
  update_gauges();
  return std::move(out_);
}

// ---- queries ----

const entry* router_core::find(request_id id) const {
  auto it = requests_.find(id);
  return it == requests_.end() ? nullptr : &it->second;
}

bool router_core::alive(pool_side side, int32_t index) const {
  const auto& p = pool(side);
  return index >= 0 && size_t(index) < p.size() && p[size_t(index)].alive;
}

bool router_core::alive(pool_side side, const worker_ref& w) const {
  return alive(side, w.index) && pool(side)[size_t(w.index)].gen == w.gen;
}

uint32_t router_core::gen(pool_side side, int32_t index) const {
  const auto& p = pool(side);
  return index >= 0 && size_t(index) < p.size() ? p[size_t(index)].gen : 0;
}

bool router_core::none_alive(pool_side side) const {
  const auto& p = pool(side);
  return std::none_of(p.begin(), p.end(), [](const slot& s) { return s.alive; });
}

worker_kind router_core::kind_of(pool_side side) const {
  switch (side) {
    case pool_side::prefill:
      return cfg_.mode == serving_mode::colocated ? worker_kind::colocated : worker_kind::prefill;
    case pool_side::decode: return worker_kind::decode;
  }
  return worker_kind::decode;
}

router_core::link_state& router_core::link(int32_t p, int32_t d) { return links_[size_t(p)][size_t(d)]; }

bool router_core::link_ready(int32_t p, int32_t d) const {
  return p >= 0 && d >= 0 && size_t(p) < links_.size() && size_t(d) < links_[size_t(p)].size() &&
         links_[size_t(p)][size_t(d)] == link_state::up;
}

decode_claim* router_core::claim_of(entry& e) {
  switch (e.current()) {
    case phase::prefilling: return &std::get<prefilling>(e.where).decode;
    case phase::direct: return &std::get<direct>(e.where).decode;
    case phase::waiting:
    case phase::decoding:
    case phase::migrating:
    case phase::parked: return nullptr;
  }
  return nullptr;
}

// Tokens in the blocks a cache can hold for this prompt (prefix_cache.h states the rule).
int32_t router_core::usable_full_tokens(const entry& e) const {
  return reusable_prompt_blocks(e.spec.prompt.size(), cfg_.block_size) * cfg_.block_size;
}

load_snapshot router_core::load() const {
  load_snapshot s;
  s.prefill_queue = int32_t(prefill_queue_.size());
  s.prefill_queue_tokens = prefill_queue_tokens_;
  int32_t live = 0;
  for (size_t i = 0; i < prefill_.size(); ++i) {
    if (!prefill_[i].alive) continue;
    ++live;
    s.prefill_queue += prefill_load_[i].queued_requests;
    s.prefill_queue_tokens += prefill_load_[i].queued_tokens;
  }
  s.prefill_workers = live;
  s.decode_queue = int32_t(decode_queue_.size());
  s.prefill_tokens_per_s = prefill_rate_.has_value() ? prefill_rate_.value() : 0;
  s.decode_step_ms = tpot_.has_value() ? tpot_.value() : 0;
  s.context_length = cfg_.context_length;
  s.decode_admits_per_s = decode_admits_.has_value() ? decode_admits_.value() : 0;
  if (cfg_.mode == serving_mode::automatic)
    for (size_t i = 0; i < decode_load_.size() && i < decode_.size(); ++i)
      if (decode_[i].alive)
        s.local_prefill_tokens = std::max(s.local_prefill_tokens, decode_load_[i].local_prefill_tokens);
  return s;
}

router_view router_core::view(int32_t listed) const {
  router_view v;
  v.prefill_queue = int32_t(prefill_queue_.size());
  v.decode_queue = int32_t(decode_queue_.size());
  v.by_state.assign(size_t(request_state::cancelled) + 1, 0);
  for (const auto& [id, e] : requests_) {
    const request_state s = e.shown_state();
    ++v.by_state[size_t(s)];
    if (int32_t(v.requests.size()) >= listed) continue;
    router_view::request r{id, s, -1, -1, prompt_len(e), e.spec.max_tokens};
    std::visit(overloaded{[](const waiting&) {}, [](const migrating&) {}, [](const parked&) {},
                          [&](const prefilling& p) {
                            r.prefill_worker = p.worker.index;
                            if (p.decode.state == claim_state::held) r.decode_worker = p.decode.worker.index;
                          },
                          [&](const direct& d) {
                            if (d.decode.state == claim_state::held) r.decode_worker = d.decode.worker.index;
                          },
                          [&](const decoding& d) {
                            (d.side == pool_side::prefill ? r.prefill_worker : r.decode_worker) = d.worker.index;
                            if (d.side == pool_side::decode) r.prefill_worker = d.prefill.index;
                          }},
               e.where);
    v.requests.push_back(r);
  }
  for (const auto& row : links_)
    for (auto l : row) v.links += l == link_state::up;
  return v;
}

// ---- bookkeeping ----

void router_core::count(const std::string& name, const std::string& help, metrics::labels l, double n) {
  metrics_->get_counter(name, help, l).inc(n);
}

void router_core::update_gauges() {
  const std::string help = "Requests waiting in a router queue";
  metrics_->get_gauge("tandem_router_queue", help, {{"queue", "prefill"}}).set(double(prefill_queue_.size()));
  metrics_->get_gauge("tandem_router_queue", help, {{"queue", "decode"}}).set(double(decode_queue_.size()));
}

// ---- admission ----

void router_core::handle(const ev::submit& s) {
  // A pool that stayed empty (degraded past its restart intensity) cannot serve: say so now
  // (HTTP 503) rather than queue without bound. One that is restarting (its supervisor
  // restarts a worker at once) or not joined yet (start-up) queues requests.
  const std::optional<pool_side> down =
      prefill_gone_ && none_alive(pool_side::prefill)                             ? std::optional(pool_side::prefill)
      : splits_phases(cfg_.mode) && decode_gone_ && none_alive(pool_side::decode) ? std::optional(pool_side::decode)
                                                                                  : std::nullopt;
  if (down) {
    count("tandem_rejections_total", "Requests refused by admission control", {{"reason", "no_healthy_worker"}});
    emit(cmd::refuse{
        s.spec.id, errc::worker_failed,
        "no healthy " + std::string(to_string(kind_of(*down))) + " worker: the pool failed past its restart intensity",
        1000});
    return;
  }
  const auto decision = cfg_.admission_policy_impl->decide(cfg_.admission, load(), int32_t(s.spec.prompt.size()));
  if (!decision.admitted) {
    count("tandem_rejections_total", "Requests refused by admission control",
          {{"reason", std::string(to_string(decision.reason))}});
    emit(cmd::refuse{s.spec.id,
                     decision.reason == reject_reason::prompt_too_long ? errc::context_overflow : errc::overloaded,
                     decision.message, decision.retry_after_ms});
    return;
  }
  entry e;
  e.spec = s.spec;
  if (e.spec.id == 0) e.spec.id = next_id_++;
  emit(cmd::admit{e.spec, int32_t(prefill_queue_.size())});
  enqueue(e.spec.id, std::move(e), true);
}

void router_core::handle(const ev::rejoin& r) {
  // Admitted before, it queues again (first among the new ones) with every token it has as the
  // end of its prompt.
  if (requests_.count(r.spec.id)) return;
  entry e;
  e.spec = r.spec;
  e.spec.prompt.insert(e.spec.prompt.end(), r.generated.begin(), r.generated.end());
  e.spec.resumed = int32_t(r.generated.size());
  count("tandem_router_rejoins_total", "Requests that joined a restarted router");
  enqueue(e.spec.id, std::move(e), false);
}

void router_core::enqueue(request_id id, entry e, bool ask_the_store) {
  prefill_queue_tokens_ += prompt_len(e);
  auto& stored = requests_.emplace(id, std::move(e)).first->second;
  prefill_queue_.push_back(id);
  if (ask_the_store) ask_store(id, stored);
  dispatch_prefill();
}

// Asks the host store how much of a new prompt it holds (the router's metadata query).
void router_core::ask_store(request_id id, entry& e) {
  if (!cfg_.store || !splits_phases(cfg_.mode) || e.spec.resumed != 0 || usable_full_tokens(e) == 0) return;
  std::get<waiting>(e.where).asking_store = true;
  emit(cmd::ask_store{id, prompt_block_keys(cfg_.prefix_salt, e.spec.prompt, cfg_.block_size)});
}

void router_core::handle(const ev::store_answer& a) {
  auto it = requests_.find(a.id);
  if (it == requests_.end() || it->second.current() != phase::waiting) return;
  auto& w = std::get<waiting>(it->second.where);
  if (!w.asking_store) return;
  w.asking_store = false;
  it->second.store_tokens = a.blocks * cfg_.block_size;
  dispatch_prefill();
}

// ---- dispatch ----

// Auto mode: the decode worker (alive, with the most room) that would compute this prompt's
// uncached part itself now, or -1 (the prefill pool computes it). Not for a request that was
// refused there once, nor for a migrated one (its prompt carries its output: long).
// Any prompt that fits goes there, also while the prefill pool is idle: keeping prompts that
// fit off the prefill pool while a decode worker was decoding (unless the pool had twice the
// prompt's tokens ahead of it) gave the same goodput and a higher TTFT p50 in interleaved
// rounds (docs/benchmarks.md, "`auto`, the default, in interleaved rounds"); the slack's
// headroom is what bounds the stall.
int32_t router_core::local_prefill_room(const entry& e) const {
  if (cfg_.mode != serving_mode::automatic || e.direct_tried || e.spec.resumed != 0) return -1;
  const int32_t uncached = prompt_len(e) - e.store_tokens;
  int32_t best = -1;
  for (size_t i = 0; i < decode_load_.size() && i < decode_.size(); ++i) {
    const int32_t room = decode_load_[i].local_prefill_tokens;
    if (decode_[i].alive && room >= uncached && (best < 0 || room > decode_load_[size_t(best)].local_prefill_tokens))
      best = int32_t(i);
  }
  return best;
}

// Out of the prefill queue (at `pos`) straight to a decode worker: a new attempt, queued for
// decode credits; the worker it gets fetches the store's blocks and computes the rest.
void router_core::send_direct(std::deque<request_id>::iterator pos, request_id id, entry& e) {
  prefill_queue_.erase(pos);
  prefill_queue_tokens_ -= prompt_len(e);
  ++e.spec.epoch;
  e.dispatched = now_();
  e.where = direct{decode_claim{claim_state::queued}};
  decode_queue_.push_back(id);
}

// Sends queued prompts to workers with room, chosen by the prefill placement policy. In
// disaggregated mode a dispatched prompt also queues for decode credits right away: reserved
// before its prefill ends, its KV streams to the decode worker while it is being computed.
void router_core::dispatch_prefill() {
  const bool disaggregated = splits_phases(cfg_.mode);
  park_paused();
  std::map<uint64_t, int32_t> in_service;
  if (!prefill_queue_.empty()) in_service = clients_in_service();
  while (!prefill_queue_.empty()) {
    const auto pos = next_waiting(in_service);
    const request_id id = *pos;
    auto& e = requests_.at(id);
    if (std::get<waiting>(e.where).asking_store) break;  // its turn: wait for the store's answer
    if (e.spec.client != 0) ++in_service[e.spec.client];  // (placed below, or nothing is)
    if (const int32_t d = local_prefill_room(e); d >= 0) {
      // Auto: its uncached part fits in a decode worker's TPOT slack: that worker computes it
      // in its own steps (no prefill queue, no KV link); the figure is spent until it reports.
      decode_load_[size_t(d)].local_prefill_tokens -= prompt_len(e) - e.store_tokens;
      send_direct(pos, id, e);
      count("tandem_router_local_prefill_total",
            "Requests whose prompt a decode worker computed itself (auto mode: a short uncached part, within its TPOT "
            "slack)");
      continue;
    }
    if (disaggregated && !e.direct_tried && e.spec.resumed == 0 && e.store_tokens > 0 &&
        e.store_tokens >= usable_full_tokens(e)) {
      // Its whole prompt (but the tail) is in the host store: a decode worker fetches it and
      // computes the tail; no prefill worker, no KV link.
      send_direct(pos, id, e);
      count("tandem_router_direct_to_decode_total",
            "Requests sent straight to a decode worker: their prompt's blocks were in the host store");
      continue;
    }
    std::vector<prefill_worker_load> eligible = prefill_load_;
    std::vector<block_key> keys;  // the blocks a worker could reuse
    if (prefixes_) keys = prompt_block_keys(cfg_.prefix_salt, e.spec.prompt, cfg_.block_size);
    for (size_t i = 0; i < eligible.size(); ++i) {
      if (!prefill_[i].alive || eligible[i].queued_tokens >= cfg_.dispatch_tokens) eligible[i].alive = false;
      if (prefixes_) eligible[i].cached_tokens = prefixes_->overlap(int32_t(i), keys) * cfg_.block_size;
    }
    const int32_t w = cfg_.prefill_policy->choose(eligible, prompt_len(e));
    if (w < 0) break;  // every worker is full: the request waits here, where admission sees it
    prefill_queue_.erase(pos);
    prefill_queue_tokens_ -= prompt_len(e);
    const int32_t cached = eligible[size_t(w)].cached_tokens;
    if (prefixes_) {
      prefixes_->record(w, keys);
      count("tandem_router_prefix_routed_tokens_total", "Prompt tokens sent to a worker believed to have them cached.",
            {}, cached);
    }
    prefill_load_[size_t(w)].queued_tokens += std::max(1, prompt_len(e) - cached);
    ++prefill_load_[size_t(w)].queued_requests;
    ++e.spec.epoch;  // a new prefill attempt: its KV blocks carry this tag
    e.dispatched = now_();
    prefilling p;
    p.worker = {w, prefill_[size_t(w)].gen};
    if (disaggregated) {
      p.decode.state = claim_state::queued;
      decode_queue_.push_back(id);
    }
    e.where = p;
    if (prefill_busy_since_[size_t(w)] == clock::time_point{}) prefill_busy_since_[size_t(w)] = e.dispatched;
    emit(cmd::prefill{w, e.spec});
  }
  if (disaggregated) dispatch_decode();
}

// Reserves credits on the chosen decode worker; when they are held the prefill worker is told
// to ship the KV (at once if the prompt is done, else streamed as the prefill goes).
void router_core::dispatch_decode() {
  if (reserving_ || decode_queue_.empty()) return;
  park_paused();
  const request_id id = decode_queue_.front();
  auto& e = requests_.at(id);
  decode_claim* c = claim_of(e);
  const int32_t total = std::min(e.spec.total_tokens(), cfg_.context_length);
  const int32_t blocks = blocks_for_tokens(total, cfg_.block_size);
  std::vector<decode_worker_load> eligible = decode_load_;
  for (size_t i = 0; i < eligible.size(); ++i)
    if (!decode_[i].alive) eligible[i].alive = false;
  const int32_t d = cfg_.decode_policy->choose(eligible, blocks);
  if (d < 0) return;  // no credits anywhere: wait for a load report
  decode_queue_.pop_front();
  const uint64_t ticket = next_ticket_++;
  reserving_ = reservation{ticket, d, id};
  *c = decode_claim{claim_state::reserving, ticket, {d, decode_[size_t(d)].gen}, false};
  // Optimistic until the worker's next report: the reservation is about to take these.
  decode_load_[size_t(d)].free_blocks -= blocks;
  ++decode_load_[size_t(d)].batch_size;
  emit(cmd::reserve{d, id, total, ticket});
}

void router_core::handle(const ev::reserve_answer& a) {
  if (a.answer != ev::reply::granted)
    count("tandem_router_reservation_errors_total", "Decode credit reservations refused or unanswered, by code",
          {{"code", std::string(to_string(a.why == errc::ok ? errc::refused : a.why))}});
  if (!reserving_ || reserving_->ticket != a.ticket) {  // given up when its worker died
    if (a.answer == ev::reply::granted) emit(cmd::cancel{pool_side::decode, a.worker, a.id});
    return;
  }
  reserving_.reset();
  auto it = requests_.find(a.id);
  decode_claim* c = it == requests_.end() ? nullptr : claim_of(it->second);
  // Still wanted: not ended, requeued, migrated or finished in prefill meanwhile.
  const bool wanted = c && c->state == claim_state::reserving && c->ticket == a.ticket;
  auto requeue = [&] {
    c->state = claim_state::queued;
    decode_queue_.push_front(a.id);
  };
  switch (a.answer) {
    case ev::reply::refused:
      if (wanted) requeue();
      // Stale view: wait for a fresh report (asked for, as an idle worker sends none).
      decode_load_[size_t(a.worker)].free_blocks = 0;
      emit(cmd::ask_load{a.worker, std::chrono::milliseconds(50)});
      break;
    case ev::reply::failed:
      // The worker is gone or stuck: left out until it reports again (a restart joins with a
      // fresh report); the request tries elsewhere.
      decode_load_[size_t(a.worker)].free_blocks = 0;
      if (wanted) requeue();
      break;
    case ev::reply::granted: {
      if (!wanted) {
        emit(cmd::cancel{pool_side::decode, a.worker, a.id});  // give the credits back
        break;
      }
      auto& e = it->second;
      c->state = claim_state::held;
      const auto now = now_();
      if (last_admit_ != clock::time_point{})
        decode_admits_.add(1000.0 /
                           std::max(1.0, std::chrono::duration<double, std::milli>(now - last_admit_).count()));
      last_admit_ = now;
      if (e.current() == phase::direct) {
        emit(cmd::fetch{a.worker, e.spec});
        break;
      }
      const auto& p = std::get<prefilling>(e.where);
      if (alive(pool_side::prefill, p.worker)) {
        const link_state l = link(p.worker.index, a.worker);
        if (l == link_state::up) emit(cmd::ship{p.worker.index, a.worker, a.id});
        else c->awaiting_link = true;  // its link is coming (from the cluster, or replaced): shipped then
      } else if (p.prefilled) {
        emit(cmd::fail{a.id, errc::worker_failed, "the prefill worker holding the request's KV is gone"});
      }
      // else: its prefill worker died and worker_down requeues it (and the credits)
      break;
    }
  }
  dispatch_decode();
}

// A direct request's decode worker fetches its blocks from the store; if it cannot (they left
// the store, or the store died), the request goes to a prefill worker after all.
void router_core::handle(const ev::fetch_answer& a) {
  if (a.ok) return;
  auto it = requests_.find(a.id);
  if (it == requests_.end()) return;
  auto& e = it->second;
  if (e.current() != phase::direct || e.spec.epoch != a.epoch) return;
  e.direct_tried = true;
  count("tandem_router_direct_fallbacks_total",
        "Direct-to-decode requests prefilled after all (blocks gone from the store)");
  requeue_front(a.id, e);
  dispatch_prefill();
}

// ---- progress reports ----

void router_core::handle(const ev::prefilled& m) {
  const int32_t w = m.worker;
  auto it = requests_.find(m.id);
  if (w >= 0 && size_t(w) < prefill_busy_since_.size()) {
    // Service rate of the worker: prompt tokens over the time it has been busy with them.
    auto& since = prefill_busy_since_[size_t(w)];
    const auto now = now_();
    if (it != requests_.end() && since != clock::time_point{}) {
      const double s = std::chrono::duration<double>(now - std::max(since, it->second.dispatched)).count();
      if (s > 0) prefill_rate_.add(double(prompt_len(it->second)) / s);
    }
    since = prefill_load_[size_t(w)].queued_requests > 1 ? now : clock::time_point{};
  }
  if (it == requests_.end()) {
    if (!m.finished && alive(pool_side::prefill, w)) emit(cmd::release{w, m.id, std::nullopt});  // nobody wants its KV
    return;
  }
  if (cfg_.mode == serving_mode::colocated) return;
  auto& e = it->second;
  switch (e.current()) {
    case phase::prefilling: {
      auto& p = std::get<prefilling>(e.where);
      if (p.worker.index != w) break;  // an earlier attempt's worker: handled below
      if (m.finished) {  // done in prefill (stop token or one token): decode credits back
        drop_claim(m.id, p.decode);
        return;
      }
      p.prefilled = true;
      emit(cmd::set_state{m.id, request_state::transferring});
      if (p.decode.state == claim_state::none) {
        p.decode.state = claim_state::queued;
        decode_queue_.push_back(m.id);
      }
      dispatch_decode();
      return;
    }
    case phase::decoding:  // a re-prefill raced a delivered transfer
    case phase::waiting:
    case phase::direct:
    case phase::migrating:
    case phase::parked: break;
  }
  // A prefill the request no longer waits for (it moved on): that KV is wanted nowhere.
  if (!m.finished && alive(pool_side::prefill, w)) emit(cmd::release{w, m.id, std::nullopt});
}

void router_core::handle(const ev::ship_started& s) {
  // Only for the attempt that is transferring: a late one from an earlier attempt's lease
  // (shipped just before the request was moved on) once marked a requeued request as handed
  // over, and then a death of its new prefill worker did not requeue it.
  auto it = requests_.find(s.id);
  if (it == requests_.end() || it->second.current() != phase::prefilling) return;
  auto& p = std::get<prefilling>(it->second.where);
  if (p.prefilled) p.shipping = true;
}

// A migrated request decodes again: where to, with how many of its tokens carried over, and how
// long the move took (from its worker's death to decoding again).
void router_core::moved(request_id id, entry& e, pool_side side, const worker_ref& to) {
  if (e.moved_from.empty()) return;
  oplog::event(oplog::level::info, "migrated",
               {{"id", int64_t(id)},
                {"from", e.moved_from},
                {"to", worker_name(kind_of(side), to.index).str()},
                {"tokens_carried", e.spec.resumed},
                {"recovery_ms", std::chrono::duration<double, std::milli>(now_() - e.moved_at).count()}});
  e.moved_from.clear();
}

void router_core::handle(const ev::worker_state& m) {
  if (m.state != request_state::decoding) return;  // the only state workers report here
  auto it = requests_.find(m.id);
  if (it == requests_.end()) return;
  auto& e = it->second;
  if (m.side == pool_side::prefill) {  // a colocated worker: prefilled and decoding in one place
    if (e.current() == phase::prefilling && std::get<prefilling>(e.where).worker == m.worker) {
      e.where = decoding{pool_side::prefill, m.worker, {}};
      moved(m.id, e, m.side, m.worker);
    }
    return;
  }
  worker_ref prefill_worker;
  switch (e.current()) {
    case phase::migrating:
    case phase::parked:
    case phase::decoding: return;  // a late report from where it no longer is
    case phase::waiting:
      erase_from(prefill_queue_, m.id);
      prefill_queue_tokens_ -= prompt_len(e);
      break;
    case phase::prefilling: prefill_worker = std::get<prefilling>(e.where).worker; [[fallthrough]];
    case phase::direct: {
      auto& c = *claim_of(e);
      if (c.state == claim_state::held && c.worker != m.worker) return;  // it was moved on
      if (c.state == claim_state::queued) erase_from(decode_queue_, m.id);
      break;
    }
  }
  e.where = decoding{pool_side::decode, m.worker, prefill_worker};
  moved(m.id, e, m.side, m.worker);
}

void router_core::handle(const ev::prefill_load& m) {
  const int32_t w = m.load.worker;
  if (!alive(pool_side::prefill, w)) return;
  prefill_load_[size_t(w)] = m.load;
  if (m.load.queued_requests == 0) prefill_busy_since_[size_t(w)] = clock::time_point{};
  dispatch_prefill();
}

void router_core::handle(const ev::decode_load& m) {
  const int32_t w = m.load.worker;
  if (!alive(pool_side::decode, w)) return;
  decode_load_[size_t(w)] = m.load;
  dispatch_decode();
}

// The request ended (or its actor died): free what its workers hold for it, drop it.
void router_core::handle(const ev::ended& m) {
  auto it = requests_.find(m.id);
  if (it == requests_.end()) return;
  auto& e = it->second;
  if (m.tpot_ms > 0) tpot_.add(m.tpot_ms);
  const bool unfinished = m.end != request_state::finished;  // the workers still hold it: free it there
  auto cancel = [&](pool_side side, const worker_ref& w) {
    if (unfinished && alive(side, w)) emit(cmd::cancel{side, w.index, m.id});
  };
  switch (e.current()) {
    case phase::waiting:
      erase_from(prefill_queue_, m.id);
      prefill_queue_tokens_ -= prompt_len(e);
      break;
    case phase::prefilling: {
      auto& p = std::get<prefilling>(e.where);
      cancel(pool_side::prefill, p.worker);
      // Finished while the router sees it prefilling: its prefill worker ended it (a stop token
      // or one token), and the end overtook that worker's `prefilled` report, which would have
      // given the decode credits back. The decode worker holds only a reservation it cannot
      // know is stale: cancelled whether finished or not.
      if (p.decode.state == claim_state::held && alive(pool_side::decode, p.decode.worker))
        emit(cmd::cancel{pool_side::decode, p.decode.worker.index, m.id});
      if (p.decode.state == claim_state::queued) erase_from(decode_queue_, m.id);
      break;
    }
    case phase::direct: {
      auto& c = std::get<direct>(e.where).decode;
      if (c.state == claim_state::held) cancel(pool_side::decode, c.worker);
      if (c.state == claim_state::queued) erase_from(decode_queue_, m.id);
      break;
    }
    case phase::decoding: {
      auto& d = std::get<decoding>(e.where);
      cancel(d.side, d.worker);
      if (d.side == pool_side::decode) cancel(pool_side::prefill, d.prefill);
      break;
    }
    case phase::migrating:
    case phase::parked: break;
  }
  if (e.paused) --paused_;
  requests_.erase(it);
  dispatch_prefill();
  dispatch_decode();
}

void router_core::handle(const ev::pause& m) {
  auto it = requests_.find(m.id);
  if (it == requests_.end()) return;
  auto& e = it->second;
  if (e.paused != m.pause) paused_ += m.pause ? 1 : -1;
  e.paused = m.pause;
  if (!m.pause && e.current() == phase::parked) {
    // Its client caught up: its actor says which tokens it has (ev::resume_answer), and it is
    // prefilled again with them, as a migration is, without counting as one.
    e.where = migrating{};
    emit(cmd::ask_resume{m.id});
    return;
  }
  auto send = [&](pool_side side, const worker_ref& w) {
    if (alive(side, w)) emit(cmd::pause{side, w.index, m.id, m.pause});
  };
  switch (e.current()) {
    case phase::prefilling: {
      auto& p = std::get<prefilling>(e.where);
      if (cfg_.mode == serving_mode::colocated) send(pool_side::prefill, p.worker);
      else if (p.decode.state == claim_state::held) send(pool_side::decode, p.decode.worker);
      break;
    }
    case phase::direct: {
      auto& c = std::get<direct>(e.where).decode;
      if (c.state == claim_state::held) send(pool_side::decode, c.worker);
      break;
    }
    case phase::decoding: send(std::get<decoding>(e.where).side, std::get<decoding>(e.where).worker); break;
    case phase::waiting:
    case phase::migrating:
    case phase::parked: break;
  }
  if (m.pause) park_paused();
}

// ---- sharing between clients ----

// Requests in service (placed on a worker, or decoding) per client; lone requests (client 0)
// are clients of their own and are not counted.
std::map<uint64_t, int32_t> router_core::clients_in_service() const {
  std::map<uint64_t, int32_t> n;
  for (const auto& [id, e] : requests_) {
    if (e.spec.client == 0) continue;
    switch (e.current()) {
      case phase::prefilling:
      case phase::direct:
      case phase::decoding: ++n[e.spec.client]; break;
      case phase::waiting:
      case phase::migrating:
      case phase::parked: break;
    }
  }
  return n;
}

// The next waiting request to place: the first of the client with the fewest requests in
// service (max-min fairness: a client that holds many slots gets the next one only when nobody
// with fewer waits). A lone request counts as a client with none.
std::deque<request_id>::iterator router_core::next_waiting(const std::map<uint64_t, int32_t>& in_service) {
  auto best = prefill_queue_.end();
  int32_t best_n = 0;
  for (auto it = prefill_queue_.begin(); it != prefill_queue_.end(); ++it) {
    const uint64_t c = requests_.at(*it).spec.client;
    const auto found = c == 0 ? in_service.end() : in_service.find(c);
    const int32_t n = found == in_service.end() ? 0 : found->second;
    if (best == prefill_queue_.end() || n < best_n) {
      best = it;
      best_n = n;
      if (n == 0) break;
    }
  }
  return best;
}

// Work waits for a slot: prompts in the router's queue, prefilled (or prefilling) requests
// queued for decode credits, or (colocated) prompts placed on a worker that are not decoding
// yet. (The workers' reported queues lag behind the router's own optimistic count.)
bool router_core::work_waits() const {
  if (!prefill_queue_.empty() || !decode_queue_.empty()) return true;
  if (cfg_.mode == serving_mode::colocated)
    for (const auto& [id, e] : requests_)
      if (e.current() == phase::prefilling) return true;
  return false;
}

// A client that stops reading must not hold the pools (its requests pause: their workers skip
// them, but they keep their slots and KV). While other work waits, each paused request that
// decodes is taken off its worker (cancelled there: slot, credits and KV freed, its blocks
// published to the host store where one is attached) and parked until its client catches up.
void router_core::park_paused() {
  if (paused_ == 0 || !work_waits()) return;
  std::vector<int32_t> freed;  // decode workers asked for a fresh load report
  for (auto& [id, e] : requests_) {
    if (!e.paused || e.current() != phase::decoding) continue;
    const auto d = std::get<decoding>(e.where);
    if (d.side == pool_side::decode && alive(d.side, d.worker) &&
        std::find(freed.begin(), freed.end(), d.worker.index) == freed.end())
      freed.push_back(d.worker.index);
    leave_worker(id, d);
    e.where = parked{};
    count("tandem_router_parked_total",
          "Paused requests (their client reads too slowly) taken off their worker while other work waited");
  }
  for (int32_t w : freed) emit(cmd::ask_load{w, std::chrono::milliseconds(0)});
}

// ---- recovery ----

// A decoding request leaves its worker (it migrates, or is parked): dropped there, and the
// lease its prefill worker may still hold for it ends.
void router_core::leave_worker(request_id id, const decoding& d) {
  if (alive(d.side, d.worker)) emit(cmd::cancel{d.side, d.worker.index, id});
  if (d.side == pool_side::decode && alive(pool_side::prefill, d.prefill))
    emit(cmd::release{d.prefill.index, id, std::nullopt});
}

// Gives a claim up: out of the decode queue, credits back (an in-flight reservation's answer
// finds it unwanted and gives them back itself).
void router_core::drop_claim(request_id id, decode_claim& c) {
  switch (c.state) {
    case claim_state::none:
    case claim_state::reserving: break;
    case claim_state::queued: erase_from(decode_queue_, id); break;
    case claim_state::held:
      if (alive(pool_side::decode, c.worker)) emit(cmd::cancel{pool_side::decode, c.worker.index, id});
      break;
  }
  c = decode_claim{};
}

// Puts a request back at the front of the prefill queue (a new attempt from scratch).
void router_core::requeue_front(request_id id, entry& e) {
  if (e.current() == phase::waiting) return;  // queued already
  if (decode_claim* c = claim_of(e)) drop_claim(id, *c);
  e.where = waiting{};
  emit(cmd::set_state{id, request_state::queued});
  prefill_queue_.push_front(id);
  prefill_queue_tokens_ += prompt_len(e);
}

// Its worker died while it decoded: the sequence is gone, the tokens are not (its actor holds
// every one). Prefill the prompt plus those tokens again and go on from the next one; with
// greedy or seeded sampling the output is the same as without the fault.
void router_core::migrate(request_id id) {
  auto& e = requests_.at(id);
  if (e.current() == phase::migrating) return;
  if (e.migrations >= cfg_.max_migrations) {
    emit(cmd::fail{id, errc::worker_failed,
                   "its worker failed while it was decoding, " + std::to_string(e.migrations + 1) +
                       " times (the migration limit is " + std::to_string(cfg_.max_migrations) + ")"});
    return;
  }
  ++e.migrations;
  if (const auto* d = std::get_if<decoding>(&e.where)) {
    e.moved_from = worker_name(kind_of(d->side), d->worker.index).str();
    e.moved_at = now_();
    oplog::event(oplog::level::info, "migrate",
                 {{"id", int64_t(id)},
                  {"from", e.moved_from},
                  {"attempt", e.migrations},
                  {"prompt_tokens", int32_t(e.spec.prompt.size()) - e.spec.resumed}});
  }
  // A lease its prefill worker may still hold for it ends; credits it holds on a live decode
  // worker (a failed transfer) go back. A dead worker's died with it.
  const bool disaggregated = splits_phases(cfg_.mode);
  switch (e.current()) {
    case phase::prefilling: {
      auto& p = std::get<prefilling>(e.where);
      if (disaggregated && alive(pool_side::prefill, p.worker)) emit(cmd::release{p.worker.index, id, std::nullopt});
      drop_claim(id, p.decode);
      break;
    }
    case phase::direct: drop_claim(id, std::get<direct>(e.where).decode); break;
    case phase::decoding: leave_worker(id, std::get<decoding>(e.where)); break;
    case phase::waiting:
      erase_from(prefill_queue_, id);
      prefill_queue_tokens_ -= prompt_len(e);
      break;
    case phase::migrating:
    case phase::parked: break;
  }
  e.where = migrating{};
  count("tandem_migrations_total", "Requests moved off a worker that died while they decoded");
  // Tokens the dead worker sent before it died reach the request before this question does.
  emit(cmd::ask_resume{id});
}

void router_core::handle(const ev::resume_answer& a) {
  auto it = requests_.find(a.id);
  if (it == requests_.end() || it->second.current() != phase::migrating) return;  // ended meanwhile
  auto& e = it->second;
  // No answer (its actor is gone) or no tokens (it ended): its end is on the way.
  if (!a.generated || a.generated->empty()) return;
  std::vector<token_id> prompt(e.spec.prompt.begin(), e.spec.prompt.end() - e.spec.resumed);
  prompt.insert(prompt.end(), a.generated->begin(), a.generated->end());
  e.spec.prompt = std::move(prompt);
  e.spec.resumed = int32_t(a.generated->size());
  requeue_front(a.id, e);
  dispatch_prefill();
  dispatch_decode();
}

void router_core::handle(const ev::transfer_failed& m) {
  // A transfer failed; its prefill worker still holds the KV under lease (it reports only its
  // latest try). Stale here (a later attempt exists, or the request moved on): that lease ends.
  auto stale = [&] { emit(cmd::release{m.reporter, m.id, m.epoch}); };
  auto it = requests_.find(m.id);
  if (it == requests_.end()) return stale();
  auto& e = it->second;
  if (e.spec.epoch != m.epoch || e.current() != phase::prefilling) return stale();
  auto& p = std::get<prefilling>(e.where);
  if (!p.prefilled) return stale();
  const auto& c = p.decode;
  const bool path = c.state == claim_state::held && alive(pool_side::prefill, p.worker) &&
                    alive(pool_side::decode, c.worker) && link_ready(p.worker.index, c.worker.index);
  if (path && p.transfer_retries < cfg_.max_transfer_retries) {
    ++p.transfer_retries;
    count("tandem_kv_transfer_retries_total", "KV transfers shipped again from the prefill side's lease");
    emit(cmd::ship{p.worker.index, c.worker.index, m.id});
    return;
  }
  migrate(m.id);  // past the retries (or nowhere to ship to): prefilled again
}

void router_core::handle(const ev::orphan_check& m) {
  auto it = requests_.find(m.id);
  if (it == requests_.end()) return;
  auto& e = it->second;
  if (e.spec.epoch != m.epoch || e.current() != phase::prefilling || !std::get<prefilling>(e.where).prefilled) return;
  count("tandem_orphaned_transfers_total", "KV transfers whose prefill worker died and that never arrived");
  migrate(m.id);  // a late arrival of that attempt finds no reservation and is refused
}

// A worker died: the supervisor restarts it and it joins again. What it held is recovered:
// requests not decoding yet start their prefill again, decoding ones migrate.
void router_core::handle(const ev::worker_down& m) {
  const pool_side side = m.side;
  auto& slots = pool(side);
  if (m.worker.index < 0 || size_t(m.worker.index) >= slots.size()) return;
  if (slots[size_t(m.worker.index)].gen == m.worker.gen) {  // not replaced yet
    slots[size_t(m.worker.index)].alive = false;
    if (side == pool_side::prefill) prefill_load_[size_t(m.worker.index)] = {m.worker.index, false, 0, 0};
    else decode_load_[size_t(m.worker.index)].alive = false;
  }
  if (side == pool_side::decode && reserving_ && reserving_->worker == m.worker.index) {
    // Its answer may never come (a worker in another process): the request goes back to the
    // front of the decode queue now, and that answer is ignored if it comes.
    auto it = requests_.find(reserving_->id);
    if (it != requests_.end())
      if (decode_claim* c = claim_of(it->second);
          c && c->state == claim_state::reserving && c->ticket == reserving_->ticket) {
        c->state = claim_state::queued;
        decode_queue_.push_front(reserving_->id);
      }
    reserving_.reset();
  }
  count("tandem_restarts_total", "Worker restarts by kind", {{"kind", std::string(to_string(kind_of(side)))}});
  // What the dead worker held. Not decoding yet (queued there, mid-prefill, or KV under its
  // lease): nothing was lost that a new prefill cannot redo, so back to the front of the prefill
  // queue (a repeated token 0 is dropped by the request actor). Decoding (or with its KV sent to
  // a decode worker that died): migrated.
  std::vector<request_id> requeue, reclaim, moved;
  for (auto& [id, e] : requests_) {
    switch (e.current()) {
      case phase::waiting:
      case phase::migrating:
      case phase::parked: break;
      case phase::prefilling: {
        auto& p = std::get<prefilling>(e.where);
        if (side == pool_side::prefill && p.worker == m.worker) {
          // Shipping: the link delivers the KV it already holds; but a failure would go to the
          // dead worker, and no lease is left to ship from. Checked again soon: still
          // transferring then, it is prefilled again.
          if (p.shipping) emit(cmd::check_orphan{id, e.spec.epoch, std::chrono::seconds(2)});
          else requeue.push_back(id);
        } else if (side == pool_side::decode && p.decode.state == claim_state::held && p.decode.worker == m.worker) {
          // Still prefilling, its KV streaming to the dead worker: reserved elsewhere (the new
          // link makes the prefill worker send everything again). Prefilled: prefilled again.
          if (!p.prefilled && !p.shipping) reclaim.push_back(id);
          else moved.push_back(id);
        }
        break;
      }
      case phase::direct: {
        auto& c = std::get<direct>(e.where).decode;
        if (side == pool_side::decode && c.state == claim_state::held && c.worker == m.worker) reclaim.push_back(id);
        break;
      }
      case phase::decoding: {
        auto& d = std::get<decoding>(e.where);
        if (d.side == side && d.worker == m.worker) moved.push_back(id);
        break;
      }
    }
  }
  for (auto it = reclaim.rbegin(); it != reclaim.rend(); ++it) {
    auto& c = *claim_of(requests_.at(*it));
    c = decode_claim{claim_state::queued};
    decode_queue_.push_front(*it);
  }
  for (auto it = requeue.rbegin(); it != requeue.rend(); ++it) {
    requeue_front(*it, requests_.at(*it));
    count("tandem_reprefills_total", "Requests prefilled again because their prefill worker died");
  }
  for (auto id : moved) migrate(id);
  // A pool left with no worker is restarting (a supervisor restarts at once) or degraded (past
  // its restart intensity: it stays empty). Look again soon; what is stranded then ends.
  if (none_alive(side)) emit(cmd::check_stranded{std::chrono::seconds(2)});
  // The replacement may have joined already and sits idle: hand it the requeued work now.
  dispatch_prefill();
  dispatch_decode();
}

void router_core::handle(const ev::worker_lost& m) {
  // Known dead without its down message (its node was lost: heartbeats stopped). Its links
  // are stopped; a later down message of it changes nothing (that incarnation is gone).
  const auto& slots = pool(m.side);
  if (m.index < 0 || size_t(m.index) >= slots.size()) return;
  const worker_ref w{m.index, slots[size_t(m.index)].gen};
  emit(cmd::isolate{m.side, m.index});
  for (size_t p = 0; p < links_.size(); ++p)
    for (size_t d = 0; d < links_[p].size(); ++d)
      if ((m.side == pool_side::prefill ? p : d) == size_t(m.index)) links_[p][d] = link_state::absent;
  handle(ev::worker_down{m.side, w});
}

void router_core::handle(const ev::stranded_check&) {
  // A pool still empty seconds after its last worker died will not come back (degraded): the
  // requests that need it end with an error (HTTP 503) instead of waiting forever.
  const bool no_prefill = none_alive(pool_side::prefill);
  const bool no_decode = splits_phases(cfg_.mode) && none_alive(pool_side::decode);
  if (!no_prefill && !no_decode) return;
  prefill_gone_ = prefill_gone_ || no_prefill;
  decode_gone_ = decode_gone_ || no_decode;
  const std::string message = std::string("no healthy ") +
                              std::string(to_string(kind_of(no_decode ? pool_side::decode : pool_side::prefill))) +
                              " worker: the pool failed past its restart intensity";
  for (auto& [id, e] : requests_) {
    // Without prefill workers, only requests past prefill can still finish.
    bool stranded = no_decode;
    switch (e.current()) {
      case phase::waiting:
      case phase::migrating:
      case phase::parked:
      case phase::direct: stranded = true; break;
      case phase::prefilling: stranded = stranded || !std::get<prefilling>(e.where).prefilled; break;
      case phase::decoding: break;
    }
    if (stranded) emit(cmd::fail{id, errc::worker_failed, message});
  }
}

// ---- membership, links, liveness ----

void router_core::handle(const ev::joined& m) {
  if (m.index < 0) return;
  const size_t i = size_t(m.index);
  const auto now = now_();
  if (m.side == pool_side::prefill) {
    if (i >= prefill_.size()) {
      prefill_.resize(i + 1);
      prefill_load_.resize(i + 1);
      prefill_busy_since_.resize(i + 1);
      links_.resize(i + 1, std::vector<link_state>(decode_.size(), link_state::absent));
    }
    auto& s = prefill_[i];
    s = slot{true, s.gen + 1, 0, now};
    prefill_gone_ = false;
    prefill_load_[i] = {m.index, true, 0, 0};
    if (prefixes_) prefixes_->forget(m.index);  // a new worker: an empty cache
    if (splits_phases(cfg_.mode))
      for (size_t d = 0; d < decode_.size(); ++d)
        if (decode_[d].alive) open_link(m.index, int32_t(d), false);
    dispatch_prefill();
    return;
  }
  if (i >= decode_.size()) {
    decode_.resize(i + 1);
    decode_load_.resize(i + 1);
    for (auto& row : links_) row.resize(i + 1, link_state::absent);
  }
  // A restart may announce itself before the old worker's down message arrives here.
  auto& s = decode_[i];
  s = slot{true, s.gen + 1, 0, now};
  decode_gone_ = false;
  decode_load_[i] = {m.index, true, 0, 0, 0, 0};
  for (size_t p = 0; p < prefill_.size(); ++p)
    if (prefill_[p].alive) open_link(int32_t(p), m.index, true);
  // Its credits: asked for now, since its own first report may have come before this join.
  emit(cmd::ask_load{m.index, std::chrono::milliseconds(0)});
}

// Towards a replaced decode worker a link has nothing left to do: stopped. From a replaced
// prefill worker it may still be delivering KV it holds: it retires (ends once idle).
void router_core::open_link(int32_t p, int32_t d, bool decode_side_replaced) {
  link(p, d) = link_state::opening;
  emit(cmd::open_link{p, d, decode_side_replaced});
}

void router_core::handle(const ev::link_up& m) {
  if (m.p < 0 || m.d < 0 || size_t(m.p) >= links_.size() || size_t(m.d) >= links_[size_t(m.p)].size()) return;
  link(m.p, m.d) = link_state::up;
  for (auto& [id, e] : requests_) {
    if (e.current() != phase::prefilling) continue;
    auto& p = std::get<prefilling>(e.where);
    if (p.worker.index == m.p && p.decode.state == claim_state::held && p.decode.worker.index == m.d &&
        p.decode.awaiting_link) {
      p.decode.awaiting_link = false;
      emit(cmd::ship{m.p, m.d, id});
    }
  }
}

// A live link died (killed, or crashed): a fresh one takes its place. Transfers it carried fail
// back to their prefill workers, which still hold the KV under lease and report it; the router
// then ships it again over the new link.
void router_core::handle(const ev::link_down& m) {
  if (m.p < 0 || m.d < 0 || size_t(m.p) >= links_.size() || size_t(m.d) >= links_[size_t(m.p)].size()) return;
  emit(cmd::link_lost{m.p, m.d});
  link(m.p, m.d) = link_state::absent;
  count("tandem_restarts_total", "Worker restarts by kind", {{"kind", "kv_link"}});
  if (alive(pool_side::prefill, m.p) && alive(pool_side::decode, m.d)) open_link(m.p, m.d, false);
}

void router_core::handle(const ev::link_stuck& m) {
  count("tandem_stalls_detected_total", "Actors found alive but not progressing, and restarted", {{"kind", "kv_link"}});
  emit(cmd::kill_link{m.p, m.d});
  handle(ev::link_down{m.p, m.d});
}

// A worker that is alive but not progressing is treated as dead: killed, so that its
// supervisor restarts it and its requests are recovered as for any failure.
void router_core::stalled(pool_side side, const worker_ref& w) {
  if (!alive(side, w)) return;
  count("tandem_stalls_detected_total", "Actors found alive but not progressing, and restarted",
        {{"kind", std::string(to_string(kind_of(side)))}});
  emit(cmd::kill_worker{side, w});
}

void router_core::handle(const ev::heartbeat& m) {
  if (!alive(m.side, m.worker)) return;
  auto& s = pool(m.side)[size_t(m.worker.index)];
  const auto now = now_();
  if (!m.busy || m.finished_steps != s.finished_steps) {
    s.finished_steps = m.finished_steps;
    s.progress_at = now;
  } else if (cfg_.stall_timeout.count() > 0 && now - s.progress_at > cfg_.stall_timeout) {
    stalled(m.side, m.worker);
  }
}

void router_core::handle(const ev::heartbeat_missed& m) { stalled(m.side, m.worker); }

}  // namespace sched
}  // namespace tandem
