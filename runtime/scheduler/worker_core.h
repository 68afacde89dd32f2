#pragma once
// A worker's requests as a plain state machine: events in, commands out, no actor in sight
// (shaped like router_core). The worker actors translate messages into events and commands
// into messages, replies and steps; what they decide about a request's KV is decided here, so
// every recovery path is a table in tests/test_worker_core.cpp.
//
// A request is in one phase at a time, with that phase's data in its alternative of
// `phase_data`. On a decode worker:
//   reserved   its KV credits are held here; streamed pieces of its KV are staged
//   fetching   sent straight here (its prompt is in the host store): the store is asked
//   arriving   its KV (or the store's blocks and the prompt's tail) waits for the next step
//   importing  the step in flight imports it and samples its next token
//   decoding   in the batch: one token per step until the stop rule ends it
// A transfer that arrives while the same request is arriving or importing (a retry after its
// first link died) is a duplicate try: it gets the first try's outcome. Every try that wants an
// answer comes with a ticket (the actor's, naming its reply), and `cmd::answer` names it.
// On a prefill worker, once its prompt is done (the prompts before that are the actor's
// sequence_table, sequence.h):
//   leased     its KV is held here until a decode worker has it; no transfer in flight
//   shipping   a transfer of its KV is in flight over a link (answers over others are stale)
// A failed transfer leaves it leased with the whole set to send again (its streamed pieces may
// be lost or corrupted); the router decides where (ev::ship) or that it moves on (release).
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
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
#include "runtime/scheduler/sequence.h"
#include "runtime/scheduler/step_cost.h"
#include "runtime/engine/step.h"

namespace tandem::sched {

namespace worker {

enum class phase : uint8_t { reserved, fetching, arriving, importing, decoding, leased, shipping };
std::string_view to_string(phase p);

// Streamed pieces of one prefill attempt (epoch); an older attempt's pieces are dropped.
struct staged_kv {
  uint32_t epoch = 0;
  std::vector<kv_blocks_ptr> pieces;
};

struct reserved {
  staged_kv staged;
};
struct fetching {
  uint64_t asked = 0;            // the store ask (its answer names this ticket)
  std::vector<uint64_t> tickets;  // the fetch, and any repeat of it: answered alike
};
// What an import needs: the KV (pieces, then the closing transfer's blocks) and the tokens so
// far, or (sent straight here) the store's blocks and the prompt's tail to compute after them.
struct arrival {
  std::vector<kv_blocks_ptr> kv;
  std::vector<token_id> generated;  // from prefill: every token so far (the last is fed next)
  std::vector<token_id> feed;       // from the store: the prompt's tokens past kv_tokens
  int32_t kv_tokens = 0;
  std::vector<uint64_t> tickets;    // the try that brought it, then its duplicate tries
  staged_kv late;                   // pieces that came meanwhile (kept if the import fails)
  prompt_ptr penalty_prompt;        // made once, at its import step
};
struct arriving : arrival {};
struct importing : arrival {
  bool cancelled = false;  // cancelled meanwhile: it does not decode here
};
struct decoding {
  seq_id seq = 0;
  int32_t generated = 0;         // output tokens sent
  std::vector<token_id> output;  // those tokens, kept only when the sampling needs them
  prompt_ptr penalty_prompt;
  token_id last = 0;             // the next step's input
  bool paused = false;           // its subscriber is behind: skipped in steps
  bool in_step = false;          // the step in flight holds it
  bool cancelled = false;        // cancelled while in a step: dropped when the step returns
};
using link_id = uint64_t;  // the actor's name for a KV link (0: none)
// A finished prompt's KV on its prefill worker.
struct lease {
  seq_id seq = 0;
  kv_blocks_ptr kv;                 // the whole set, or null while it streamed to `streamed_to`
  std::vector<token_id> generated;  // every token so far: the resumed ones and token 0
  link_id streamed_to = 0;          // the link holding its streamed pieces
  bool resend_all = false;          // a try failed: the next one exports the whole set again
  link_id waiting_idle = 0;         // a transfer over this link waits for the engine to be idle
};
struct leased : lease {};
struct shipping : lease {
  link_id link = 0;  // the transfer in flight
};
using phase_data = std::variant<reserved, fetching, arriving, importing, decoding, leased, shipping>;

struct entry {
  request_spec spec;  // empty until its KV or fetch arrives (a reservation names only its id)
  phase_data where;
  phase current() const { return phase(where.index()); }
};

// ---- events: what happened ----
namespace ev {
struct reserve { uint64_t ticket; request_id id; int32_t total_tokens; };  // credits for its whole length
struct transfer {  // its KV arrives (a prefill worker's closing transfer over a link)
  uint64_t ticket;
  request_spec spec;
  kv_blocks_ptr kv;
  std::vector<token_id> generated;
};
struct fetch { uint64_t ticket; request_spec spec; };  // sent straight here: fetch its prompt
struct store_answer { uint64_t ticket; kv_blocks_ptr blocks; };  // null: no answer, or no store
struct kv_piece { request_id id; uint32_t epoch; kv_blocks_ptr kv; };
struct cancel { request_id id; };
struct pause { request_id id; bool pause; };
struct plan {};  // the engine is idle: a decode step, or the transfers that wait for it, start
struct step_started {};  // a prefill worker started its step (the engine is busy until it returns)
struct step_returned { const step_result* result; };  // read during on() only
// Prefill: a prompt is done (token 0 taken); its KV is leased (finished: it ended already), and
// shipped over `link` at once if its decode worker is known.
struct prompt_done { request_spec spec; lease kv; link_id link; bool finished; };
struct ship { request_id id; link_id link; };  // send its KV over this link
struct transfer_answer { request_id id; link_id link; status outcome; };  // ok: the decode side has it
struct link_down { link_id link; };      // its transfers in flight will never be answered
struct release { request_id id; std::optional<uint32_t> epoch; };  // decode has it (of that attempt)
}  // namespace ev
using event = std::variant<ev::reserve, ev::transfer, ev::fetch, ev::store_answer, ev::kv_piece, ev::cancel,
                           ev::pause, ev::plan, ev::step_started, ev::step_returned, ev::prompt_done, ev::ship,
                           ev::transfer_answer, ev::link_down, ev::release>;

// ---- commands: what to do about it (in order) ----
namespace cmd {
struct answer { uint64_t ticket; status outcome; };  // ok: true; else the error, with why
struct ask_store { uint64_t ticket; std::vector<block_key> keys; };  // -> ev::store_answer
struct start_step { step_work work; };  // -> ev::step_returned
struct token { request_id id; int32_t index; token_id tok; std::shared_ptr<const token_logprobs> logprobs; };
struct done { request_id id; finish_reason reason; };
struct fail { request_id id; errc code; std::string message; };
struct tell_request { request_id id; request_state state; int32_t cached_tokens; };  // with this worker's name
struct tell_router { request_id id; request_state state; };
struct publish { seq_id seq; int32_t from_block; };  // its full blocks from there to the host store
struct report_load {};
struct forget { request_id id; };  // nothing of it is left here (its request handle may go)
struct prefilled { request_id id; bool finished; };  // to the router
struct ship_started { request_id id; };  // to the router, before the transfer (a link delivers even if this worker dies)
struct transfer { request_id id; link_id link; request_spec spec; kv_blocks_ptr kv; std::vector<token_id> generated; };  // -> ev::transfer_answer
struct transfer_failed { request_id id; uint32_t epoch; link_id link; };  // to the router: ship again, or move on
}  // namespace cmd
using command = std::variant<cmd::answer, cmd::ask_store, cmd::start_step, cmd::token, cmd::done, cmd::fail,
                             cmd::tell_request, cmd::tell_router, cmd::publish, cmd::report_load, cmd::forget,
                             cmd::prefilled, cmd::ship_started, cmd::transfer, cmd::transfer_failed>;

struct config {
  worker_kind kind = worker_kind::decode;  // decode or prefill (the colocated worker has no core yet)
  int32_t n_ctx = 0;
  int32_t block_size = 16;
  int32_t total_blocks = 0;  // its KV pool: its credits
  int32_t max_batch = 0;     // reservations held at once (every one a future batch slot)
  uint64_t prefix_salt = 0;  // names the blocks of a prompt sent straight here
  bool store = false;        // a host store is attached (imports name their blocks for it)
  // Auto mode: it computes short prompts itself within a TPOT slack of this target (0: never),
  // at most prefill_token_budget tokens at a time.
  double local_prefill_target_ms = 0;
  int32_t prefill_token_budget = 0;
  // The tokenizer's half of the stop rule: does `tok` end this request's generation?
  std::function<bool(const request_spec&, token_id)> ends_generation;
  std::shared_ptr<fault_hooks> faults;  // null: none
  metrics::registry* metrics = nullptr;  // null: not counted
  // Prefill: a lease's whole KV set, exported again (only while the engine is idle).
  std::function<kv_blocks_ptr(seq_id, request_id, uint32_t epoch)> export_all;
};

}  // namespace worker

// A decode or prefill worker's core. One step runs at a time: the caller passes ev::plan while
// no step is in flight (a decode worker: and its pacing allows), and ev::step_returned when
// the step comes back (a prefill worker, which plans its steps itself, also ev::step_started).
class worker_core {
 public:
  explicit worker_core(worker::config config);

  std::vector<worker::command> on(const worker::event& e);

  const worker::entry* find(request_id id) const;
  bool busy() const { return busy_; }                  // a step is in flight
  bool has_arrivals() const { return !arrivals_.empty(); }  // imports wait for the next step
  int32_t holding() const;  // requests arriving, importing, decoding or leased (the stats' "active")
  // Engine sequences to free at the next step a prefill worker plans (taken: cleared here).
  std::vector<seq_id> take_frees();
  const kv_credit_ledger& ledger() const { return ledger_; }
  // The prompt tokens it may compute itself now (auto mode; 0 otherwise).
  int32_t local_prefill_tokens() const;
  // Its load for the router; what it says of local prefill is remembered (see on_step_returned).
  decode_worker_load load(int32_t index);

 private:
  void handle(const worker::ev::reserve&);
  void handle(const worker::ev::transfer&);
  void handle(const worker::ev::fetch&);
  void handle(const worker::ev::store_answer&);
  void handle(const worker::ev::kv_piece&);
  void handle(const worker::ev::cancel&);
  void handle(const worker::ev::pause&);
  void handle(const worker::ev::plan&);
  void handle(const worker::ev::step_started&) { busy_ = true; }
  void handle(const worker::ev::step_returned&);
  void handle(const worker::ev::prompt_done&);
  void handle(const worker::ev::ship&);
  void handle(const worker::ev::transfer_answer&);
  void handle(const worker::ev::link_down&);
  void handle(const worker::ev::release&);

  worker::entry* get(request_id id);
  void answer(uint64_t ticket, status outcome) { emit(worker::cmd::answer{ticket, std::move(outcome)}); }
  void answer_all(const worker::arrival& a, const status& outcome);
  void imported(request_id id, worker::entry& e, const step_result& r);
  void stream(request_id id, worker::entry& e, worker::decoding& d, const step_result::sampled& t);
  void retire(request_id id);  // ends it here: blocks to the store and freed, credits back
  static worker::lease* lease_of(worker::entry& e);
  void ship(request_id id, worker::entry& e, worker::link_id link);
  void transfer_failed(request_id id, worker::link_id link, const status& why);
  void end_lease(request_id id);
  void drop(request_id id);    // forgets it with its credits (nothing of it in the engine)
  template <class C>
  void emit(C c) { out_.emplace_back(std::move(c)); }

  worker::config cfg_;
  std::vector<worker::command> out_;
  kv_credit_ledger ledger_;
  std::map<request_id, worker::entry> entries_;
  std::vector<request_id> arrivals_;   // arriving, in arrival order
  std::vector<request_id> importing_;  // importing, in the order the step holds them
  std::map<uint64_t, request_id> store_asks_;  // fetch tickets whose store answer is awaited
  std::vector<seq_id> to_free_;        // engine sequences freed at the next step
  bool busy_ = false;
  // Auto mode: its steps' fitted cost and its TPOT slack; the figure last reported.
  step_cost_model cost_;
  std::optional<tpot_slack> slack_;
  int32_t reported_local_ = 0;
};

// Counts prompt tokens computed, served from a cache (hits) and looked up in one, and sets
// tandem_prefix_cache_hit_ratio (hits / lookups, all workers, since start: the counters' ratio
// as a gauge for dashboards without PromQL).
void count_prefix_use(metrics::registry& m, double computed, double hits, double lookups);

}  // namespace tandem::sched
