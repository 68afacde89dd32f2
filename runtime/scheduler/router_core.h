#pragma once
// The router's scheduler and request lifecycle as a plain state machine: events in, commands
// out, no actor in sight (as TensorRT-LLM's batch manager). actors/router.cpp translates
// messages into events and commands into sends; everything it decides is decided here, so
// every recovery path is testable with tables of (events in -> phases and commands out).
//
// A request is in one phase at a time; the data of each phase lives in its alternative of
// `phase_data`, so which facts go together is in the types, not in comments:
//   waiting     in the prefill queue, maybe asking the host store; placed client by client:
//               the client with the fewest requests in service first (first come, first
//               served within a client and between equals)
//   prefilling  on a prefill (or colocated) worker: queued there, computing, or prefilled with
//               its KV under the worker's lease until a decode worker has it
//   direct      sent straight to a decode worker that fetches its prompt's blocks from the store
//   decoding    a decode (or colocated) worker generates its tokens
//   migrating   its worker died while it decoded (or it resumes from parked): asking its
//               actor for the tokens so far
//   parked      paused (its client reads too slowly) while other work waited: taken off its
//               worker, its slot and KV freed; when its client catches up it is prefilled
//               again with its tokens and goes on exactly (as a migration)
// In disaggregated mode a prefilling or direct request also has a decode claim: queued for
// decode credits, reserving them (one reservation is in flight at a time), or holding them.
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "runtime/errors.h"
#include "runtime/kinds.h"
#include "runtime/metrics.h"
#include "runtime/scheduler/policy.h"
#include "runtime/scheduler/prefix_view.h"
#include "runtime/request_types.h"

namespace tandem {

namespace sched {

using clock = std::chrono::steady_clock;

// The two pools: prefill (prefill or colocated workers) and decode.
enum class pool_side : uint8_t { prefill, decode };
std::string_view to_string(pool_side s);

// A worker slot and the incarnation in it (a restart bumps gen).
struct worker_ref {
  int32_t index = -1;
  uint32_t gen = 0;
  bool operator==(const worker_ref&) const = default;
};

enum class phase : uint8_t { waiting, prefilling, direct, decoding, migrating, parked };
std::string_view to_string(phase p);

enum class claim_state : uint8_t { none, queued, reserving, held };

struct decode_claim {
  claim_state state = claim_state::none;
  uint64_t ticket = 0;  // reserving: the reservation's number
  worker_ref worker;  // reserving or held: where
  bool awaiting_link = false;  // held, its KV link (another process's) still coming
};

struct waiting {
  bool asking_store = false;  // the store's answer on its prompt's blocks is awaited
};
struct prefilling {
  worker_ref worker;
  bool prefilled = false;  // its KV is under the worker's lease (request_state::transferring)
  bool shipping = false;  // the worker handed the KV to a link
  int32_t transfer_retries = 0;  // of this attempt's KV transfer
  decode_claim decode;
};
struct direct {
  decode_claim decode;
};
struct decoding {
  pool_side side = pool_side::decode;  // prefill: a colocated worker
  worker_ref worker;
  worker_ref prefill;  // disaggregated: the worker it was prefilled on (its lease may linger)
};
struct migrating {};
struct parked {};
using phase_data = std::variant<waiting, prefilling, direct, decoding, migrating, parked>;

struct entry {
  request_spec spec;  // what workers are sent (prompt, sampling, limits); epoch = prefill attempt
  phase_data where;
  int32_t migrations = 0;  // times it was moved off a worker that died while it decoded
  int32_t store_tokens = 0;  // prompt tokens whose blocks the store holds (at its answer)
  bool direct_tried = false;  // sent straight to decode once, and that failed: prefill it
  bool paused = false;  // its client is behind (ev::pause): parked when other work waits
  // Moved off a worker that died (migrate): from where and since when, until it decodes again
  // (then the log's `migrated` event says where to, with the tokens carried and the time it took).
  std::string moved_from;
  clock::time_point moved_at{};
  clock::time_point dispatched{};
  phase current() const { return phase(where.index()); }
  // The request_state this phase shows as (the router's view; the request actor has its own).
  request_state shown_state() const;
};

// ---- events: what happened ----
namespace ev {
struct submit {
  request_spec spec;
};  // a new request (admission)
struct rejoin {
  request_spec spec;
  std::vector<token_id> generated;
};  // from a router that died
struct prefilled {
  request_id id;
  int32_t worker;
  bool finished;
};  // finished: done in prefill
struct prefill_load {
  prefill_worker_load load;
};
struct decode_load {
  decode_worker_load load;
};
struct ended {
  request_id id;
  request_state end;
  double tpot_ms;
};  // or its actor died (failed)
struct worker_state {
  request_id id;
  pool_side side;
  worker_ref worker;
  request_state state;
};
struct transfer_failed {
  request_id id;
  uint32_t epoch;
  int32_t reporter;
};  // reporter: prefill worker
struct ship_started {
  request_id id;
};
enum class reply : uint8_t { granted, refused, failed };  // failed: no answer (dead or stuck)
// `why`: the code of a refusal or failure (refused: no credits or batch room; timeout; ...).
struct reserve_answer {
  uint64_t ticket;
  int32_t worker;
  request_id id;
  reply answer;
  errc why = errc::ok;
};
struct fetch_answer {
  request_id id;
  uint32_t epoch;
  bool ok;
};
struct resume_answer {
  request_id id;
  std::optional<std::vector<token_id>> generated;
};  // nullopt: no answer
struct store_answer {
  request_id id;
  int32_t blocks;
};
struct joined {
  pool_side side;
  int32_t index;
};
struct worker_down {
  pool_side side;
  worker_ref worker;
};
struct worker_lost {
  pool_side side;
  int32_t index;
};  // known dead without a down message
struct link_up {
  int32_t p, d;
};
struct link_down {
  int32_t p, d;
};
struct link_stuck {
  int32_t p, d;
};  // a link that did not answer its heartbeat
struct heartbeat {
  pool_side side;
  worker_ref worker;
  bool busy;
  uint64_t finished_steps;
};
struct heartbeat_missed {
  pool_side side;
  worker_ref worker;
};
struct orphan_check {
  request_id id;
  uint32_t epoch;
};
struct stranded_check {};
struct pause {
  request_id id;
  bool pause;
};
}  // namespace ev
using event =
    std::variant<ev::submit, ev::rejoin, ev::prefilled, ev::prefill_load, ev::decode_load, ev::ended, ev::worker_state,
                 ev::transfer_failed, ev::ship_started, ev::reserve_answer, ev::fetch_answer, ev::resume_answer,
                 ev::store_answer, ev::joined, ev::worker_down, ev::worker_lost, ev::link_up, ev::link_down,
                 ev::link_stuck, ev::heartbeat, ev::heartbeat_missed, ev::orphan_check, ev::stranded_check, ev::pause>;

// ---- commands: what to do about it (in order) ----
namespace cmd {
struct admit {
  request_spec spec;
  int32_t position;
};  // start its request actor (position: in the queue)
struct refuse {
  request_id id;
  errc code;
  std::string message;
  double retry_after_ms;
};  // to the submitter
struct set_state {
  request_id id;
  request_state state;
};  // tell the request actor
struct fail {
  request_id id;
  errc code;
  std::string message;
};  // end the request
struct ask_resume {
  request_id id;
};  // -> ev::resume_answer
struct ask_store {
  request_id id;
  std::vector<block_key> keys;
};  // -> ev::store_answer
struct prefill {
  int32_t worker;
  request_spec spec;
};
struct reserve {
  int32_t worker;
  request_id id;
  int32_t total_tokens;
  uint64_t ticket;
};  // -> ev::reserve_answer
struct fetch {
  int32_t worker;
  request_spec spec;
};  // -> ev::fetch_answer
struct ship {
  int32_t p, d;
  request_id id;
};  // over link [p][d]
struct cancel {
  pool_side side;
  int32_t worker;
  request_id id;
};  // drop it, give back its credits
struct release {
  int32_t worker;
  request_id id;
  std::optional<uint32_t> epoch;
};  // end a KV lease
struct pause {
  pool_side side;
  int32_t worker;
  request_id id;
  bool pause;
};
struct ask_load {
  int32_t worker;
  std::chrono::milliseconds after;
};  // a decode worker's fresh report
struct open_link {
  int32_t p, d;
  bool decode_side_replaced;
};  // -> ev::link_up when it is there
struct link_lost {
  int32_t p, d;
};  // tell prefill worker p its link to d died (its transfers fail back)
struct kill_link {
  int32_t p, d;
};  // stuck: killed (its down is expected)
struct kill_worker {
  pool_side side;
  worker_ref worker;
};  // stalled: its supervisor restarts it
struct isolate {
  pool_side side;
  int32_t index;
};  // lost node: stop the worker and its links
struct check_orphan {
  request_id id;
  uint32_t epoch;
  std::chrono::milliseconds after;
};  // -> ev::orphan_check
struct check_stranded {
  std::chrono::milliseconds after;
};  // -> ev::stranded_check
}  // namespace cmd
using command = std::variant<cmd::admit, cmd::refuse, cmd::set_state, cmd::fail, cmd::ask_resume, cmd::ask_store,
                             cmd::prefill, cmd::reserve, cmd::fetch, cmd::ship, cmd::cancel, cmd::release, cmd::pause,
                             cmd::ask_load, cmd::open_link, cmd::link_lost, cmd::kill_link, cmd::kill_worker,
                             cmd::isolate, cmd::check_orphan, cmd::check_stranded>;

struct router_core_config {
  serving_mode mode = serving_mode::disaggregated;
  admission_config admission;
  int32_t block_size = 16;
  int32_t context_length = 0;
  int32_t dispatch_tokens = 1024;  // prompt tokens a worker may have queued before it gets more
  int32_t max_migrations = 3;
  int32_t max_transfer_retries = 2;
  std::chrono::milliseconds stall_timeout{30000};  // 0: not checked
  bool store = false;  // a host KV store is attached (direct-to-decode is possible)
  uint64_t prefix_salt = 0;  // 0: no KV-aware placement
  int32_t prefix_capacity_blocks = 0;
  std::shared_ptr<const admission_policy> admission_policy_impl;
  std::shared_ptr<const prefill_placement> prefill_policy;
  std::shared_ptr<const decode_placement> decode_policy;
};

// The router's own view (for `state`): its queues, its links and the requests it tracks.
struct router_view {
  struct request {
    request_id id = 0;
    request_state state = request_state::queued;
    int32_t prefill_worker = -1;  // prefill (or colocated) worker index; -1: none
    int32_t decode_worker = -1;
    int32_t prompt_tokens = 0;
    int32_t max_tokens = 0;
  };
  int32_t prefill_queue = 0, decode_queue = 0;
  std::vector<int32_t> by_state;  // requests per request_state value
  std::vector<request> requests;  // the first `listed` by id (oldest first)
  int32_t links = 0, retiring_links = 0;
};

class router_core {
 public:
  using clock_fn = std::function<clock::time_point()>;
  // `metrics`: where counters and gauges go (null: a registry of its own). `now`: the clock
  // (tests pass a fake one).
  explicit router_core(router_core_config config, metrics::registry* metrics = nullptr, clock_fn now = {});

  std::vector<command> on(const event& e);

  const router_core_config& config() const { return cfg_; }
  const entry* find(request_id id) const;
  size_t size() const { return requests_.size(); }
  const std::deque<request_id>& prefill_queue() const { return prefill_queue_; }
  const std::deque<request_id>& decode_queue() const { return decode_queue_; }
  bool alive(pool_side side, int32_t index) const;
  worker_kind kind_of(pool_side side) const;  // the workers in that pool
  uint32_t gen(pool_side side, int32_t index) const;  // of the slot's latest incarnation
  int32_t pool_size(pool_side side) const { return int32_t(pool(side).size()); }
  bool link_ready(int32_t p, int32_t d) const;
  load_snapshot load() const;
  router_view view(int32_t listed) const;

 private:
  struct slot {
    bool alive = false;
    uint32_t gen = 0;
    uint64_t finished_steps = 0;  // heartbeat: progress at the last answer that saw some
    clock::time_point progress_at{};
  };
  enum class link_state : uint8_t { absent, opening, up };

  std::vector<slot>& pool(pool_side s) { return s == pool_side::prefill ? prefill_ : decode_; }
  const std::vector<slot>& pool(pool_side s) const { return s == pool_side::prefill ? prefill_ : decode_; }
  bool alive(pool_side side, const worker_ref& w) const;  // that incarnation, still there
  bool none_alive(pool_side side) const;
  link_state& link(int32_t p, int32_t d);
  static decode_claim* claim_of(entry& e);
  int32_t usable_full_tokens(const entry& e) const;

  void handle(const ev::submit&);
  void handle(const ev::rejoin&);
  void handle(const ev::prefilled&);
  void handle(const ev::prefill_load&);
  void handle(const ev::decode_load&);
  void handle(const ev::ended&);
  void handle(const ev::worker_state&);
  void handle(const ev::transfer_failed&);
  void handle(const ev::ship_started&);
  void handle(const ev::reserve_answer&);
  void handle(const ev::fetch_answer&);
  void handle(const ev::resume_answer&);
  void handle(const ev::store_answer&);
  void handle(const ev::joined&);
  void handle(const ev::worker_down&);
  void handle(const ev::worker_lost&);
  void handle(const ev::link_up&);
  void handle(const ev::link_down&);
  void handle(const ev::link_stuck&);
  void handle(const ev::heartbeat&);
  void handle(const ev::heartbeat_missed&);
  void handle(const ev::orphan_check&);
  void handle(const ev::stranded_check&);
  void handle(const ev::pause&);

  void enqueue(request_id id, entry e, bool ask_the_store);
  std::deque<request_id>::iterator next_waiting(const std::map<uint64_t, int32_t>& in_service);
  std::map<uint64_t, int32_t> clients_in_service() const;
  bool work_waits() const;
  void park_paused();
  void ask_store(request_id id, entry& e);
  int32_t local_prefill_room(const entry& e) const;
  void send_direct(std::deque<request_id>::iterator pos, request_id id, entry& e);
  void dispatch_prefill();
  void dispatch_decode();
  void requeue_front(request_id id, entry& e);
  void migrate(request_id id);
  void leave_worker(request_id id, const decoding& d);
  void moved(request_id id, entry& e, pool_side side, const worker_ref& to);
  void drop_claim(request_id id, decode_claim& c);
  void open_link(int32_t p, int32_t d, bool decode_side_replaced);
  void stalled(pool_side side, const worker_ref& w);
  void count(const std::string& name, const std::string& help, metrics::labels l = {}, double n = 1);
  void update_gauges();
  template <class C>
  void emit(C c) {
    out_.emplace_back(std::move(c));
  }

  router_core_config cfg_;
  std::unique_ptr<metrics::registry> own_metrics_;
  metrics::registry* metrics_;
  clock_fn now_;
  std::vector<command> out_;

  std::map<request_id, entry> requests_;
  std::deque<request_id> prefill_queue_;  // waiting entries, in order
  std::deque<request_id> decode_queue_;  // entries whose claim is queued, in order
  int64_t prefill_queue_tokens_ = 0;
  struct reservation {
    uint64_t ticket;
    int32_t worker;
    request_id id;
  };
  std::optional<reservation> reserving_;  // the one in flight
  uint64_t next_ticket_ = 1;
  request_id next_id_ = 1;

  std::vector<slot> prefill_, decode_;
  std::vector<prefill_worker_load> prefill_load_;
  std::vector<decode_worker_load> decode_load_;
  std::vector<clock::time_point> prefill_busy_since_;
  std::vector<std::vector<link_state>> links_;  // [prefill][decode]
  std::unique_ptr<prefix_view> prefixes_;
  // A pool found still empty seconds after its last worker died (degraded: no restart comes):
  // submits that need it are refused at once. A worker joining clears it.
  bool prefill_gone_ = false, decode_gone_ = false;
  int32_t paused_ = 0;  // entries whose client is behind (entry::paused)
  ewma prefill_rate_{0.3}, tpot_{0.2}, decode_admits_{0.3};
  clock::time_point last_admit_{};
};

}  // namespace sched
}  // namespace tandem
