#include "actors/decode_worker.h"

#include "actors/error.h"

namespace tandem {
namespace {

using self_ptr = decode_worker_actor::stateful_pointer<decode_worker_state>;
namespace wk = sched::worker;

void on_event(self_ptr self, const wk::event& e);

void report_load(self_ptr self) {
  auto& st = self->state;
  self->send(st.router, load_atom::value, st.core->load(st.opts.index));
}

request_actor request_of(self_ptr self, request_id id) {
  auto it = self->state.requests.find(id);
  return it == self->state.requests.end() ? request_actor{} : it->second;
}

// A reply the core will give by ticket (now or after a step).
uint64_t await_answer(self_ptr self, caf::typed_response_promise<bool> rp) {
  auto& st = self->state;
  const uint64_t ticket = st.next_ticket++;
  st.replies.emplace(ticket, std::move(rp));
  return ticket;
}

// Pacing with shared cores: while a prompt computes beside this worker, decode steps start at
// most every pace_ms(), and the cores are the prompt's in between (this worker is not
// busy then). True: the next step waits for a tick. Arrivals are never held back.
bool pace_wait(self_ptr self) {
  auto& st = self->state;
  const double pace = st.opts.steps.pace_ms();
  if (pace <= 0 || st.core->has_arrivals() || !st.we->eng->other_groups_busy()) return false;
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
  if (self->state.core->busy() || pace_wait(self)) return;
  on_event(self, wk::ev::plan{});
}

// Carries out one of the core's commands.
void execute(self_ptr self, wk::command& command) {
  auto& st = self->state;
  std::visit(
      [&](auto& c) {
        using C = std::decay_t<decltype(c)>;
        if constexpr (std::is_same_v<C, wk::cmd::answer>) {
          auto it = st.replies.find(c.ticket);
          if (it == st.replies.end()) return;
          if (c.outcome.ok()) it->second.deliver(true);
          else it->second.deliver(to_caf_error(c.outcome));
          st.replies.erase(it);
        } else if constexpr (std::is_same_v<C, wk::cmd::ask_store>) {
          const uint64_t ticket = c.ticket;
          if (!fetch_from_store(self, st.opts, std::move(c.keys), [self, ticket](const std::vector<block_key>&, kv_blocks_ptr b) {
                on_event(self, wk::ev::store_answer{ticket, std::move(b)});
              }))
            on_event(self, wk::ev::store_answer{ticket, nullptr});  // no store: all of it computed here, or refused
        } else if constexpr (std::is_same_v<C, wk::cmd::start_step>) {
          st.last_start = std::chrono::steady_clock::now();
          st.we->start(self, std::move(c.work));
        } else if constexpr (std::is_same_v<C, wk::cmd::token>) {
          send_token(self, request_of(self, c.id), c.index, c.tok, c.logprobs);
        } else if constexpr (std::is_same_v<C, wk::cmd::done>) {
          self->send(request_of(self, c.id), done_atom::value, c.reason);
        } else if constexpr (std::is_same_v<C, wk::cmd::fail>) {
          self->send(request_of(self, c.id), fail_atom::value, c.code, std::move(c.message));
        } else if constexpr (std::is_same_v<C, wk::cmd::tell_request>) {
          self->send(request_of(self, c.id), state_atom::value, c.state, st.opts.name(), c.cached_tokens);
        } else if constexpr (std::is_same_v<C, wk::cmd::tell_router>) {
          self->send(st.router, state_atom::value, c.id, c.state);
        } else if constexpr (std::is_same_v<C, wk::cmd::publish>) {
          publish_to_store(st.opts, *st.we->eng, c.seq, c.from_block);
        } else if constexpr (std::is_same_v<C, wk::cmd::report_load>) {
          report_load(self);
        } else if constexpr (std::is_same_v<C, wk::cmd::forget>) {
          st.requests.erase(c.id);
        } else {
          static_assert(sizeof(C) == 0, "a command the decode worker does not carry out");
        }
      },
      command);
}

void on_event(self_ptr self, const wk::event& e) {
  for (auto& c : self->state.core->on(e)) execute(self, c);
}

void apply(self_ptr self, step_result& r) {
  auto& st = self->state;
  st.we->returned(st.opts, r, int32_t(r.tokens.size()));
  on_event(self, wk::ev::step_returned{&r});
}

sched::worker::config core_config(const decode_worker_state& st) {
  const engine& eng = *st.we->eng;  // salt, block size and pool: fixed at construction
  const tokenizer& tok = eng.get_model().tok();
  sched::worker::config c;
  c.n_ctx = eng.config().n_ctx;
  c.block_size = st.opts.kv.block_size;
  c.total_blocks = eng.kv_pool().total_blocks();
  c.max_batch = st.opts.steps.max_batch;
  c.prefix_salt = eng.prefix_salt();
  c.store = st.opts.store != nullptr;
  if (st.opts.steps.local_prefill) c.local_prefill_target_ms = st.opts.steps.local_prefill_target_ms();
  c.prefill_token_budget = st.opts.steps.prefill_token_budget;
  c.ends_generation = [&tok](const request_spec& s, token_id t) { return ends_generation(s.sampling, s.ignore_eos, tok, t); };
  c.faults = st.opts.faults;
  c.metrics = st.opts.metrics.get();
  return c;
}

}  // namespace

decode_worker_actor::behavior_type decode_worker_behavior(self_ptr self, std::shared_ptr<const model> m,
                                                          worker_options opts, router_actor router) {
  init_worker(self->state, worker_kind::decode, std::move(m), std::move(opts), std::move(router));
  self->state.core = std::make_unique<sched::worker_core>(core_config(self->state));
  report_load(self);
  return {
      [self](reserve_atom, request_id id, int32_t max_total_tokens) -> caf::result<bool> {
        auto rp = self->make_response_promise<bool>();
        on_event(self, wk::ev::reserve{await_answer(self, rp), id, max_total_tokens});
        return rp;
      },
      [self](arrive_atom, request_spec& spec, request_actor& req, kv_blocks_ptr& kv,
             std::vector<token_id>& generated) -> caf::result<bool> {
        auto rp = self->make_response_promise<bool>();
        const request_id id = spec.id;
        const uint64_t ticket = await_answer(self, rp);
        self->state.requests.insert_or_assign(id, req);
        on_event(self, wk::ev::transfer{ticket, std::move(spec), std::move(kv), std::move(generated)});
        if (!self->state.core->find(id)) self->state.requests.erase(id);  // refused without a reservation
        kick(self);
        return rp;
      },
      [self](fetch_atom, request_spec& spec, request_actor& req) -> caf::result<bool> {
        auto rp = self->make_response_promise<bool>();
        const request_id id = spec.id;
        const uint64_t ticket = await_answer(self, rp);
        self->state.requests.insert_or_assign(id, req);
        on_event(self, wk::ev::fetch{ticket, std::move(spec)});
        if (!self->state.core->find(id)) self->state.requests.erase(id);
        kick(self);
        return rp;
      },
      [self](kv_piece_atom, request_id id, uint32_t epoch, kv_blocks_ptr& kv) {
        on_event(self, wk::ev::kv_piece{id, epoch, std::move(kv)});
      },
      [self](cancel_atom, request_id id) {
        on_event(self, wk::ev::cancel{id});
        kick(self);
      },
      [self](pause_atom, request_id id, bool pause) {
        on_event(self, wk::ev::pause{id, pause});
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
        return st.we->stats(st.opts, &st.core->ledger(), st.core->holding());
      },
  };
}

}  // namespace tandem
