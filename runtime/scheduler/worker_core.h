#pragma once
// A worker's requests as a plain state machine: events in, commands out, no actor in sight
// (shaped like router_core). The prefill, decode and colocated worker actors translate
// messages into events and commands into messages, replies and steps; what a worker decides
// about a request is decided here, so every recovery path is a table in
// tests/test_worker_core.cpp. The engine is asked through `engine_port`, between steps only.
//
// A request is in one phase at a time, with that phase's data in its alternative of
// `phase_data`. A prompt (prefill and colocated workers):
//   waiting     queued in arrival order, not started
//   fetching    the host store is asked for the blocks of its prompt this worker lacks
//   prefilling  started: its engine sequence holds its cached prefix, chunks compute the rest
//   decoding    (colocated) its prompt done, one token per step until the stop rule ends it
//   leased      (prefill) its prompt done, its KV held until a decode worker has it
//   shipping    (prefill) a transfer of its KV is in flight over a link
// A failed transfer leaves it leased with the whole set to send again (its streamed pieces may
// be lost or corrupted); the router decides where (ev::ship) or that it moves on (release).
// On a decode worker:
//   reserved    its KV credits are held; streamed pieces of its KV are staged
//   fetching    sent straight here (its prompt is in the host store): the store is asked
//   arriving    its KV (or the store's blocks and the prompt's tail) waits for the next step
//   importing   the step in flight imports it and samples its next token
//   decoding    in the batch
// A transfer that arrives while the same request is arriving or importing (a retry after its
// first link died) is a duplicate try: it gets the first try's outcome. Every try that wants an
// answer comes with a ticket (the actor's, naming its reply), and `cmd::answer` names it.
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "runtime/errors.h"
#include "runtime/fault_injection.h"
#include "runtime/kinds.h"
#include "runtime/kv/prefix_cache.h"
#include "runtime/metrics.h"
#include "runtime/request_types.h"
#include "runtime/scheduler/policy.h"
#include "runtime/scheduler/step_cost.h"
#include "runtime/engine/step.h"

namespace tandem::sched {

// ---- the one stop rule ----

// What one sampled token does to its request.
struct token_outcome {
  bool emit = false;  // send it as output token number `index`
  int32_t index = 0;
  finish_reason end = finish_reason::none;  // none: the request goes on
};

// Takes `tok`, sampled for the request `spec` (`eog`: it ends the generation): it ends on EOS,
// max_tokens or a full context (the same in every mode and in `tandem generate`); generated,
// output (kept only when the sampling needs it) and last move on when it is emitted.
token_outcome take_token(const request_spec& spec, int32_t& generated, std::vector<token_id>& output, token_id& last,
                         token_id tok, bool eog, int32_t n_ctx);

// Prompt tokens and requests waiting to be prefilled (the load a worker reports).
struct prompt_load {
  int64_t tokens = 0;
  int32_t requests = 0;
};

// What a worker core asks of its engine, between steps only (the actor's adapter over
// tandem::engine; tests give a fake).
class engine_port {
 public:
  virtual ~engine_port() = default;
  virtual bool prefix_cache() const = 0;
  virtual int32_t cached_prefix_tokens(std::span<const token_id> prompt) const = 0;
  virtual void cache_blocks(std::span<const block_key> keys, const std::vector<kv_block_export>& blocks) = 0;
  // A new sequence with the prompt's cached prefix attached (reused: its tokens), or 0 while
  // another prompt computes its next block (reused: the tokens it will find).
  virtual seq_id start_prompt(request_id id, std::span<const token_id> prompt, prefix_claims& claims,
                              int32_t& reused) = 0;
  virtual int32_t available_blocks() const = 0;
  virtual int32_t blocks_needed(seq_id s, int32_t tokens) const = 0;  // s = 0: a new sequence
  virtual int32_t blocks_freed_by(seq_id s) const = 0;
  // Every layer of s's blocks, tagged as request id's, attempt epoch's.
  virtual kv_blocks_ptr export_all(seq_id s, request_id id, uint32_t epoch) const = 0;
};

namespace worker {

enum class phase : uint8_t { waiting, fetching, prefilling, decoding, leased, shipping, reserved, arriving, importing };
std::string_view to_string(phase p);

using link_id = uint64_t;  // the actor's name for a KV link (0: none)

// A prompt's progress on a prefill or colocated worker, from its arrival to its first token.
struct prompt_state {
  seq_id seq = 0;  // 0: not created yet (or the step in flight creates it)
  int32_t prefilled = 0;  // prompt tokens in the cache
  int32_t planned = 0;  // prompt tokens in the step in flight
  int32_t generated = 0;  // output tokens (a migrated request starts at spec.resumed)
  std::vector<token_id> output;  // those tokens, kept only when the sampling needs them
  prompt_ptr penalty_prompt;  // the prompt, shared by its steps, when the sampling repeats
  int32_t reused = 0;  // prompt tokens it started with from a cache
  int32_t expected_reuse = 0;  // while it waits for other prompts' blocks: what it will find
  bool asked_store = false;  // the host store was asked (or there was nothing to ask)
  kv_blocks_ptr fetched;  // what the store sent, cached before it starts
  std::vector<block_key> fetched_keys;
  bool reserved = false;  // colocated: its KV credits are held
  bool paused = false;  // its subscriber is behind: skipped in decode steps
  bool in_step = false;  // the step in flight holds it
  bool cancelled = false;  // cancelled while in a step: dropped when it returns
  bool announced = false;  // its request was told it is prefilling
  // Prefill: its decode worker was reserved before the prompt finished: the KV streams over
  // this link as it is made, from stream_next on.
  link_id link = 0;
  int32_t stream_next = 0;
  bool stream_broken = false;  // the link changed while a streamed step was in flight
};
struct waiting : prompt_state {};
struct fetching : prompt_state {
  uint64_t asked = 0;  // the store ask (its answer names it)
  std::vector<block_key> keys;  // the blocks asked for
  std::vector<uint64_t> tickets;  // decode: the fetch and any repeat of it, answered alike
};
struct prefilling : prompt_state {};
struct decoding {
  seq_id seq = 0;
  int32_t generated = 0;  // output tokens sent
  std::vector<token_id> output;  // those tokens, kept only when the sampling needs them
  prompt_ptr penalty_prompt;
  token_id last = 0;  // the next step's input
  int32_t publish_from = -1;  // at its end its blocks from this one go to the store (-1: none)
  bool paused = false;
  bool in_step = false;
  bool cancelled = false;
};
// A finished prompt's KV on its prefill worker.
struct lease {
  seq_id seq = 0;
  kv_blocks_ptr kv;  // the whole set, or null while it streamed to `streamed_to`
  std::vector<token_id> generated;  // every token so far: the resumed ones and token 0
  link_id streamed_to = 0;  // the link holding its streamed pieces
  bool resend_all = false;  // a try failed: the next one exports the whole set again
  link_id waiting_idle = 0;  // a transfer over this link waits for the engine to be idle
};
struct leased : lease {};
struct shipping : lease {
  link_id link = 0;  // the transfer in flight (answers over other links are stale)
};
// Streamed pieces of one prefill attempt (epoch); an older attempt's are dropped.
struct staged_kv {
  uint32_t epoch = 0;
  std::vector<kv_blocks_ptr> pieces;
};
struct reserved {
  staged_kv staged;
};
// What an import needs: the KV (pieces, then the closing transfer's blocks) and the tokens so
// far, or (sent straight here) the store's blocks and the prompt's tail to compute after them.
struct arrival {
  std::vector<kv_blocks_ptr> kv;
  std::vector<token_id> generated;  // from prefill: every token so far (the last is fed next)
  std::vector<token_id> feed;  // from the store: the prompt's tokens past kv_tokens
  int32_t kv_tokens = 0;
  std::vector<uint64_t> tickets;  // the try that brought it, then its duplicate tries
  staged_kv late;  // pieces that came meanwhile (kept if the import fails)
  prompt_ptr penalty_prompt;  // made once, at its import step
};
struct arriving : arrival {};
struct importing : arrival {
  bool cancelled = false;  // cancelled meanwhile: it does not decode here
};
using phase_data =
    std::variant<waiting, fetching, prefilling, decoding, leased, shipping, reserved, arriving, importing>;

struct entry {
  request_spec spec;  // a reservation's names only its id until its KV or fetch arrives
  phase_data where;
  phase current() const { return phase(where.index()); }
};

// ---- events: what happened ----
namespace ev {
struct prompt {
  request_spec spec;
};  // prefill or colocated: compute its prompt
struct reserve {
  uint64_t ticket;
  request_id id;
  int32_t total_tokens;
};  // credits for its whole length
struct transfer {  // its KV arrives (a prefill worker's closing transfer over a link)
  uint64_t ticket;
  request_spec spec;
  kv_blocks_ptr kv;
  std::vector<token_id> generated;
};
struct fetch {
  uint64_t ticket;
  request_spec spec;
};  // sent straight here: fetch its prompt
struct store_answer {
  uint64_t ask;
  kv_blocks_ptr blocks;
};  // null: no answer, or no store
struct kv_piece {
  request_id id;
  uint32_t epoch;
  kv_blocks_ptr kv;
};
struct ship {
  request_id id;
  link_id link;
};  // send its KV over this link (now, or once prefilled)
struct transfer_answer {
  request_id id;
  link_id link;
  status outcome;
};  // ok: the decode side has it
struct link_down {
  link_id link;
};  // its transfers in flight will never be answered
struct release {
  request_id id;
  std::optional<uint32_t> epoch;
};  // decode has it (of that attempt)
struct cancel {
  request_id id;
};
struct pause {
  request_id id;
  bool pause;
};
struct plan {};  // the engine is idle: what waits for it (a step, exports) may start
struct step_returned {
  const step_result* result;
};  // read during on() only
}  // namespace ev
using event =
    std::variant<ev::prompt, ev::reserve, ev::transfer, ev::fetch, ev::store_answer, ev::kv_piece, ev::ship,
                 ev::transfer_answer, ev::link_down, ev::release, ev::cancel, ev::pause, ev::plan, ev::step_returned>;

// ---- commands: what to do about it (in order) ----
namespace cmd {
struct answer {
  uint64_t ticket;
  status outcome;
};  // ok: true; else the error, with why
struct ask_store {
  uint64_t ask;
  std::vector<block_key> keys;
};  // -> ev::store_answer
struct start_step {  // -> ev::step_returned
  step_work work;
  std::vector<std::pair<request_id, link_id>> streams;  // prefill: where streamed pieces go
};
struct token {
  request_id id;
  int32_t index;
  token_id tok;
  std::shared_ptr<const token_logprobs> logprobs;
};
struct done {
  request_id id;
  finish_reason reason;
};
struct fail {
  request_id id;
  errc code;
  std::string message;
};
struct tell_request {
  request_id id;
  request_state state;
  int32_t cached_tokens;
};  // with this worker's name
struct tell_router {
  request_id id;
  request_state state;
};
struct publish {
  seq_id seq;
  int32_t from_block;
};  // its full blocks from there to the host store
struct report_load {};
struct prefilled {
  request_id id;
  bool finished;
};  // to the router
struct ship_started {
  request_id id;
};  // to the router, first: if this worker dies, the link still delivers
struct transfer {  // -> ev::transfer_answer
  request_id id;
  link_id link;
  request_spec spec;
  kv_blocks_ptr kv;
  std::vector<token_id> generated;
};
struct transfer_failed {
  request_id id;
  uint32_t epoch;
  link_id link;
};  // to the router: ship again, or move on
struct forget {
  request_id id;
};  // nothing of it is left here (its request handle may go)
}  // namespace cmd
using command = std::variant<cmd::answer, cmd::ask_store, cmd::start_step, cmd::token, cmd::done, cmd::fail,
                             cmd::tell_request, cmd::tell_router, cmd::publish, cmd::report_load, cmd::prefilled,
                             cmd::ship_started, cmd::transfer, cmd::transfer_failed, cmd::forget>;

struct config {
  worker_kind kind = worker_kind::decode;
  int32_t n_ctx = 0;
  int32_t block_size = 16;
  int32_t total_blocks = 0;  // its KV pool (a decode or colocated worker: its credits)
  int32_t max_batch = 0;  // decode: reservations held at once; colocated: sequences in a step
  uint64_t prefix_salt = 0;  // names a prompt's blocks
  bool store = false;  // a host store is attached
  int32_t token_budget = 0;  // prefill or colocated: tokens per step
  int32_t chunk_size = 0;
  bool stream_kv = false;  // prefill: KV streams to a reserved decode worker as it is made
  int32_t stream_layer_group = 4;
  // Colocated: a step's predicted time (0: the budget alone sizes it).
  double step_target_ms = 0;
  // Decode, auto mode: it computes short prompts itself within a TPOT slack of this target
  // (0: never), at most prefill_token_budget tokens at a time.
  double local_prefill_target_ms = 0;
  int32_t prefill_token_budget = 0;
  // The tokenizer's half of the stop rule: does `tok` end this request's generation?
  std::function<bool(const request_spec&, token_id)> ends_generation;
  std::shared_ptr<fault_hooks> faults;  // null: none
  metrics::registry* metrics = nullptr;  // null: not counted
};

}  // namespace worker

// A worker's core. One step runs at a time: the caller passes ev::plan while no step is in
// flight (a decode worker: and its pacing allows), and ev::step_returned when it comes back.
class worker_core {
 public:
  worker_core(worker::config config, engine_port* engine);

  std::vector<worker::command> on(const worker::event& e);

  const worker::config& config() const { return cfg_; }
  const worker::entry* find(request_id id) const;  // a prompt or decode request, else a lease
  bool busy() const { return busy_; }  // a step is in flight
  bool has_arrivals() const { return !arrivals_.empty(); }  // imports wait for the next step
  int32_t holding() const;  // the requests its stats count (decode: arriving, importing, decoding)
  const kv_credit_ledger& ledger() const { return ledger_; }
  prompt_load waiting_load() const;  // prompts still to compute (a prefill worker's report)
  int64_t planned_prompt_tokens() const;  // prompt tokens the step in flight computes
  int32_t local_prefill_tokens() const;  // decode, auto mode: prompt tokens it may compute now
  // A decode worker's load for the router (what it says of local prefill is remembered).
  decode_worker_load decode_load(int32_t index);

 private:
  void handle(const worker::ev::prompt&);
  void handle(const worker::ev::reserve&);
  void handle(const worker::ev::transfer&);
  void handle(const worker::ev::fetch&);
  void handle(const worker::ev::store_answer&);
  void handle(const worker::ev::kv_piece&);
  void handle(const worker::ev::ship&);
  void handle(const worker::ev::transfer_answer&);
  void handle(const worker::ev::link_down&);
  void handle(const worker::ev::release&);
  void handle(const worker::ev::cancel&);
  void handle(const worker::ev::pause&);
  void handle(const worker::ev::plan&);
  void handle(const worker::ev::step_returned&);

  worker::entry* get(request_id id);
  static worker::prompt_state* prompt_of(worker::entry& e);
  static const worker::prompt_state* prompt_of(const worker::entry& e) {
    return prompt_of(const_cast<worker::entry&>(e));
  }
  static worker::lease* lease_of(worker::entry& e);
  // prompts (worker_core_prompts.cpp)
  seq_id start_prompt(worker::entry& e);
  void plan_prefill(step_work& work, std::vector<std::pair<request_id, worker::link_id>>& streams);
  void plan_colocated(step_work& work);
  int32_t step_budget(int32_t running) const;
  void prompts_returned(const step_result& r);
  void prompt_done(request_id id, worker::entry& e, const step_result& r, const step_result::sampled& t);
  void drop_prompt(request_id id);
  void fail_prompt(request_id id, errc code, const std::string& message);
  // decode (worker_core_decode.cpp)
  void plan_decode(step_work& work);
  void fetched(request_id id, worker::entry& e, const kv_blocks_ptr& blocks);
  void decode_returned(const step_result& r);
  void imported(request_id id, worker::entry& e, const step_result& r);
  void answer_all(const worker::arrival& a, const status& outcome);
  void retire(request_id id);
  void drop(request_id id);  // forgets it with its credits
  // leases
  void ship(request_id id, worker::entry& e, worker::link_id link);
  void transfer_failed(request_id id, worker::link_id link, const status& why);
  void end_lease(request_id id);
  // shared
  int32_t add_decodes(step_work& work);
  std::vector<request_id> release_step();
  finish_reason stream(request_id id, const request_spec& spec, int32_t& generated, std::vector<token_id>& output,
                       token_id& last, const step_result::sampled& t);
  void answer(uint64_t ticket, status outcome) { emit(worker::cmd::answer{ticket, std::move(outcome)}); }
  uint64_t ask_store(std::vector<block_key> keys);
  void forget_if_gone(request_id id);  // its request handle may go when neither map holds it
  template <class C>
  void emit(C c) {
    out_.emplace_back(std::move(c));
  }

  worker::config cfg_;
  engine_port* engine_;  // null for a decode worker (it asks its engine nothing between steps)
  std::vector<worker::command> out_;
  kv_credit_ledger ledger_;
  prefix_claims claims_;
  std::map<request_id, worker::entry> entries_;  // prompts and a decode worker's requests
  std::map<request_id, worker::entry> leases_;  // a prefill worker's (an id may be in both)
  std::deque<request_id> queue_;  // prompts not fully prefilled, first come first
  std::vector<request_id> arrivals_;  // arriving, in arrival order
  std::vector<request_id> importing_;  // importing, in the order the step holds them
  std::map<uint64_t, request_id> store_asks_;  // asks whose answer is awaited
  std::map<uint64_t, std::vector<uint64_t>> abandoned_;  // decode: fetches cancelled meanwhile, by ask
  uint64_t next_ask_ = 1;
  std::vector<seq_id> to_free_;  // engine sequences freed at the next step
  bool busy_ = false;
  step_cost_model cost_;  // colocated, and decode in auto mode: its steps' cost
  std::optional<tpot_slack> slack_;  // decode, auto mode
  int32_t reported_local_ = 0;
};

// Counts prompt tokens computed, served from a cache (hits) and looked up in one, and sets
// tandem_prefix_cache_hit_ratio (hits / lookups, all workers, since start: the counters' ratio
// as a gauge for dashboards without PromQL).
void count_prefix_use(metrics::registry& m, double computed, double hits, double lookups);

}  // namespace tandem::sched
