#include "actors/decode_worker.h"

#include "actors/error.h"

namespace tandem {
namespace {

using self_ptr = decode_worker_actor::stateful_pointer<decode_worker_state>;

// Auto mode: the prompt tokens this worker may compute itself now (its TPOT slack over its
// fitted cost per token), at most one prefill step's budget; before its steps are measured,
// two blocks' worth.
int32_t local_prefill_tokens(const decode_worker_state& st) {
  if (!st.slack) return 0;
  const int32_t cap = st.opts.steps.prefill_token_budget;
  if (!st.cost.ready() || st.cost.per_token_ms() <= 0) return std::min(cap, 2 * st.opts.kv.block_size);
  return std::min(cap, st.slack->tokens(st.cost.per_token_ms()));
}

void report_load(self_ptr self) {
  auto& st = self->state;
  decode_worker_load l;
  l.worker = st.opts.index;
  l.alive = true;
  l.free_blocks = st.ledger->free_blocks();
  l.total_blocks = st.ledger->total_blocks();
  l.batch_size = st.ledger->holders();  // reserved slots, streaming or decoding
  l.max_batch = st.opts.steps.max_batch;
  l.local_prefill_tokens = st.reported_local = local_prefill_tokens(st);
  self->send(st.router, load_atom::value, l);
}

void retire(self_ptr self, request_id id) {
  auto& st = self->state;
  auto* a = st.active.find(id);
  if (!a) return;
  // A finished answer's blocks (past the prompt's, which its prefill worker published) go to
  // the host store: the conversation's next turn starts with all of it. Only between steps.
  if (!st.we->busy && a->seq != 0)
    publish_to_store(st.opts, *st.we->eng, a->seq, int32_t(a->spec.prompt.size()) / st.we->eng->block_size());
  st.to_free.push_back(a->seq);
  st.ledger->release(int64_t(id));
  st.active.erase(id);
  st.staged.erase(id);  // a piece that came late (a delayed or retried transfer)
}

// The outcome of a transfer, to its try and to any later try of the same request.
// Answers an arrival (and the duplicate tries of it): delivered, or refused with why.
void answer(self_ptr self, request_id id, const status& why, caf::typed_response_promise<bool>& first) {
  auto deliver = [&](caf::typed_response_promise<bool>& rp) {
    if (why.ok()) rp.deliver(true);
    else rp.deliver(to_caf_error(why));
  };
  deliver(first);
  auto [b, e] = self->state.duplicate_tries.equal_range(id);
  for (auto it = b; it != e; ++it) deliver(it->second);
  self->state.duplicate_tries.erase(id);
}

caf::error refused(const std::string& why) { return to_caf_error({errc::refused, why}); }

// Pacing with shared cores: while a prompt computes beside this worker, decode steps start at
// most every pace_ms(), and the cores are the prompt's in between (this worker is not
// busy then). True: the next step waits for a tick. Arrivals are never held back.
bool pace_wait(self_ptr self) {
  auto& st = self->state;
  const double pace = st.opts.steps.pace_ms();
  if (pace <= 0 || !st.arrivals.empty() || !st.we->eng->other_groups_busy()) return false;
  const auto due = st.last_start + std::chrono::microseconds(int64_t(pace * 1000));
  const auto now = std::chrono::steady_clock::now();
  if (due <= now + std::chrono::microseconds(200)) return false;
  if (!st.pace_pending) {
    st.pace_pending = true;
    self->delayed_send(self, due - now, tick_atom::value);
  }
  return true;
}

void kick(self_ptr self) {
  auto& st = self->state;
  if (st.we->busy || pace_wait(self)) return;
  step_work work;
  work.frees = std::move(st.to_free);
  st.to_free.clear();
  for (auto& a : st.arrivals) {
    step_work::import_item im;
    im.id = a.spec.id;
    im.kv = a.kv;
    im.sampling = a.spec.sampling;
    // Both paths sample from the whole prompt's logits: repetition_penalty reads it either way.
    a.penalty_prompt = a.spec.prompt_for_penalty();
    im.prompt = a.penalty_prompt;
    if (a.feed.empty()) {
      im.last = a.generated.back();
      im.index = int32_t(a.generated.size());
      im.kv_tokens = int32_t(a.spec.prompt.size());
      if (im.sampling.needs_output()) im.output = a.generated;
    } else {
      im.feed = a.feed;
      im.index = 0;
      im.kv_tokens = a.kv_tokens;
    }
    if (st.opts.store || !a.feed.empty()) im.tokens = a.spec.prompt;  // its blocks can be named and published
    work.imports.push_back(std::move(im));
  }
  st.importing = std::move(st.arrivals);
  st.arrivals.clear();
  st.active.add_decodes(work);
  if (work.imports.empty() && work.decodes.empty() && work.frees.empty()) return;
  st.last_start = std::chrono::steady_clock::now();
  st.we->start(self, std::move(work));
}

void apply(self_ptr self, step_result& r) {
  auto& st = self->state;
  st.we->returned(st.opts, r, int32_t(r.tokens.size()));
  int32_t fed = 0;  // prompts computed here: no output token waited on them yet
  if (st.slack && r.error.ok()) {  // auto: what this step cost, and the slack its decodes have left
    st.cost.observe(r.batch_tokens, r.ms);
    for (const auto& a : st.importing) fed += !a.feed.empty();
    st.slack->step(int32_t(r.tokens.size()) - fed, r.ms);
  }
  // Imports first: a refused block set ends its request and returns its credits.
  for (auto& a : st.importing) {
    auto im = std::find_if(r.imports.begin(), r.imports.end(), [&](auto& x) { return x.id == a.spec.id; });
    const request_id id = a.spec.id;
    if (im == r.imports.end() || !im->st.ok()) {
      // Refused (corrupted or incomplete): nothing of it stays here but the reservation,
      // which the retry from the prefill side's lease will use (or the router cancels).
      if (st.cancelled_importing.erase(id) > 0) st.ledger->release(int64_t(id));
      if (st.opts.metrics)
        st.opts.metrics->get_counter("tandem_kv_imports_refused_total", "KV block sets a decode worker refused (checksum, incomplete)")
            .inc();
      answer(self, id,
             im == r.imports.end() ? status{errc::incompatible_kv, "the KV block set of request " + std::to_string(id) + " was incomplete"}
                                   : im->st,
             a.promise);
      continue;
    }
    answer(self, id, {}, a.promise);  // the prefill side may drop its lease
    const int32_t kv_tokens = a.kv_tokens;
    const size_t feed = a.feed.size();
    auto& s = st.active.add(std::move(a.spec), true);
    s.req = a.req;
    s.seq = im->seq;
    s.generated = int32_t(a.generated.size());
    s.output = s.spec.sampling.needs_output() && a.feed.empty() ? a.generated : std::vector<token_id>{};
    s.penalty_prompt = std::move(a.penalty_prompt);
    s.last = a.feed.empty() ? a.generated.back() : a.feed.back();
    if (feed > 0 && st.opts.metrics)  // a prompt served from the store: its cache figures
      count_prefix_use(*st.opts.metrics, double(feed), double(kv_tokens), double(s.spec.prompt.size()));
    s.in_step = true;  // the import step sampled its next token
    s.cancelled = st.cancelled_importing.erase(id) > 0;
    // Cancelled while it imported (it was moved on, or it ended): it does not decode here, and
    // saying it does would tell the router a stale "decoding" after it has requeued it.
    if (!s.cancelled) {
      self->send(s.req, state_atom::value, request_state::decoding, st.opts.name(), int32_t(0));
      self->send(st.router, state_atom::value, id, request_state::decoding);
    }
  }
  st.importing.clear();
  const auto held = st.active.release_step();
  for (auto id : held) {
    auto& a = *st.active.find(id);
    if (a.cancelled) {
      retire(self, id);
    } else if (!r.error.ok()) {  // credits make this unreachable in normal operation: end them clearly
      self->send(a.req, fail_atom::value, r.error.code(), r.error.message());
      retire(self, id);
    }
  }
  if (!r.error.ok()) return;
  for (const auto& t : r.tokens)
    if (auto* a = st.active.find(t.id); a && std::binary_search(held.begin(), held.end(), t.id))
      if (stream_token(self, *st.we->eng, *a, t.token, t.logprobs) != finish_reason::none) retire(self, t.id);
  if (st.slack) {
    if (st.active.size() == 0) st.slack->idle();
    // The router spent the figure on the prompts it sent here: a fresh one after computing them.
    if (fed > 0 || std::abs(local_prefill_tokens(st) - st.reported_local) >= st.opts.kv.block_size) report_load(self);
  }
}

}  // namespace

decode_worker_actor::behavior_type decode_worker_behavior(self_ptr self, std::shared_ptr<const model> m,
                                                          worker_options opts, router_actor router) {
  init_worker(self->state, worker_kind::decode, std::move(m), std::move(opts), std::move(router));
  if (self->state.opts.steps.local_prefill) self->state.slack.emplace(self->state.opts.steps.local_prefill_target_ms());
  report_load(self);
  return {
      [self](reserve_atom, request_id id, int32_t max_total_tokens) -> caf::result<bool> {
        auto& st = self->state;
        // Every reservation is a future batch slot (streamed ones arrive while prefill runs).
        if (st.ledger->holders() >= st.opts.steps.max_batch && !st.ledger->holds(int64_t(id)))
          return refused("the decode batch is full (" + std::to_string(st.opts.steps.max_batch) + " sequences)");
        if (st.opts.faults->refuse_reservation()) {
          report_load(self);
          return refused("fault injected: fail_alloc");  // as if the pool were full: tried again later or elsewhere
        }
        const int32_t cap = std::min(max_total_tokens, st.we->eng->config().n_ctx);
        const int32_t free_blocks = st.ledger->free_blocks();
        const bool ok = st.ledger->try_reserve(int64_t(id), cap);
        report_load(self);
        if (!ok)
          return refused("not enough free KV blocks: " + std::to_string(blocks_for_tokens(cap, st.ledger->block_size())) +
                         " needed, " + std::to_string(free_blocks) + " free");
        return true;
      },
      [self](arrive_atom, request_spec& spec, request_actor& req, kv_blocks_ptr& kv,
             std::vector<token_id>& generated) -> caf::result<bool> {
        auto& st = self->state;
        std::vector<kv_blocks_ptr> pieces;
        if (auto it = st.staged.find(spec.id); it != st.staged.end()) {
          if (it->second.epoch == spec.epoch) pieces = std::move(it->second.pieces);
          st.staged.erase(it);
        }
        auto same = [&](const auto& a) { return a.spec.id == spec.id; };
        if (st.active.contains(spec.id)) return true;  // an earlier try delivered it: the lease may end
        if (std::any_of(st.arrivals.begin(), st.arrivals.end(), same) ||
            std::any_of(st.importing.begin(), st.importing.end(), same)) {
          auto rp = self->make_response_promise<bool>();
          st.duplicate_tries.emplace(spec.id, rp);
          return rp;
        }
        if (!generated.empty() && kv && !st.ledger->holds(int64_t(spec.id)))
          return refused("no reservation for request " + std::to_string(spec.id) + " (cancelled, or moved on)");
        if (generated.empty() || !kv)
          return to_caf_error({errc::invalid_argument, "an arrival needs its KV and its first token"});
        // A set that comes whole (not the closing message of a streamed one) is complete by
        // itself: pieces staged from an earlier try of the same attempt are superseded.
        if (!kv->empty()) pieces.clear();
        pieces.push_back(std::move(kv));
        // Every block must be this request's, from this prefill attempt (the tags are under
        // the checksum the engine verifies on import).
        for (const auto& p : pieces)
          for (const auto& b : *p)
            if (b.request != spec.id || b.epoch != spec.epoch)  // not this attempt's: refused
              return to_caf_error({errc::incompatible_kv, "KV blocks of another request or prefill attempt"});
        auto rp = self->make_response_promise<bool>();
        st.arrivals.push_back({std::move(spec), std::move(req), std::move(pieces), std::move(generated), rp});
        kick(self);
        return rp;
      },
      [self](fetch_atom, request_spec& spec, request_actor& req) -> caf::result<bool> {
        auto& st = self->state;
        const request_id id = spec.id;
        auto same = [&](const auto& a) { return a.spec.id == id; };
        if (st.active.contains(id) || std::any_of(st.arrivals.begin(), st.arrivals.end(), same) ||
            std::any_of(st.importing.begin(), st.importing.end(), same))
          return true;  // already here
        if (!st.ledger->holds(int64_t(id))) return refused("no reservation for request " + std::to_string(id));
        if (spec.prompt.size() < 2) return to_caf_error({errc::invalid_argument, "a fetched prompt has two tokens or more"});
        const engine& eng = *st.we->eng;  // salt and block size: fixed at construction
        const int32_t bs = eng.block_size();
        auto keys = prompt_block_keys(eng.prefix_salt(), spec.prompt, bs);
        const size_t want = keys.size();
        auto rp = self->make_response_promise<bool>();
        auto sp = std::make_shared<request_spec>(std::move(spec));
        // With the store's blocks (if any): this worker computes the rest of the prompt when it
        // is a tail of two blocks at most, or (auto mode) fits in its TPOT slack; otherwise a
        // prefill worker computes it, not this worker's decode steps.
        auto accept = [self, sp, req, rp, want, bs](kv_blocks_ptr blocks) mutable {
          auto& st = self->state;
          const size_t have = blocks ? blocks->size() : 0;
          const int32_t missing = int32_t(sp->prompt.size()) - int32_t(have) * bs;
          const int32_t may = std::max(2 * bs, local_prefill_tokens(st));
          if (!st.ledger->holds(int64_t(sp->id)) || missing > may) {
            rp.deliver(refused("the store holds " + std::to_string(have) + " of the prompt's " + std::to_string(want) +
                               " blocks; " + std::to_string(missing) + " tokens are more than this worker computes now (" +
                               std::to_string(may) + ")"));
            return;
          }
          decode_worker_state::arrival a;
          a.spec = *sp;
          a.req = req;
          if (have > 0) a.kv.push_back(std::move(blocks));
          a.kv_tokens = int32_t(have) * bs;
          // This worker computes its prompt (the part the store lacks): its request says so,
          // with the tokens the store served as cached (usage, the log's request line).
          self->send(req, state_atom::value, request_state::prefilling, st.opts.name(), a.kv_tokens);
          a.feed.assign(sp->prompt.begin() + a.kv_tokens, sp->prompt.end());
          a.promise = rp;
          st.arrivals.push_back(std::move(a));
          kick(self);
        };
        if (!fetch_from_store(self, st.opts, std::move(keys),
                              [accept](const std::vector<block_key>&, kv_blocks_ptr blocks) mutable { accept(std::move(blocks)); }))
          accept(nullptr);  // no store: all of it computed here, or refused
        return rp;
      },
      [self](kv_piece_atom, request_id id, uint32_t epoch, kv_blocks_ptr& kv) {
        auto& st = self->state;
        if (!kv || !st.ledger->holds(int64_t(id)) || st.active.contains(id)) return;  // stale: no reservation
        auto& sk = st.staged[id];
        if (epoch < sk.epoch) return;  // from an attempt that was replaced
        if (epoch > sk.epoch) {
          sk.epoch = epoch;
          sk.pieces.clear();
        }
        sk.pieces.push_back(std::move(kv));
      },
      [self](cancel_atom, request_id id) {
        auto& st = self->state;
        st.staged.erase(id);
        if (st.active.cancel(id) == sched::cancel_outcome::now) retire(self, id);
        for (auto it = st.arrivals.begin(); it != st.arrivals.end(); ++it) {
          if (it->spec.id != id) continue;
          answer(self, id, {errc::refused, "request " + std::to_string(id) + " was cancelled while its KV arrived"}, it->promise);
          st.arrivals.erase(it);
          break;
        }
        bool importing = false;
        for (auto& a : st.importing) importing = importing || a.spec.id == id;
        if (importing) st.cancelled_importing.insert(id);
        if (!importing && !st.active.contains(id)) st.ledger->release(int64_t(id));
        kick(self);
        report_load(self);
      },
      [self](pause_atom, request_id id, bool pause) {
        self->state.active.pause(id, pause);
        kick(self);
      },
      step_handler(self, apply, kick, report_load),
      [self](load_atom) { report_load(self); },
      [self](tick_atom) {
        auto& st = self->state;
        st.pace_pending = false;
        kick(self);
        if (!st.we->busy) st.we->eng->set_busy(false);
      },
      [self](stats_atom) {
        auto& st = self->state;
        return st.we->stats(st.opts, st.ledger.get(),
                            int32_t(st.active.size() + st.arrivals.size() + st.importing.size()));
      },
  };
}

}  // namespace tandem
