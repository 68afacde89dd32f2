#pragma once
// The public C++ API: build a serving pipeline from a config, submit requests, read their
// events. No CAF knowledge needed. (Those who know CAF can spawn and wire the actors of this
// folder themselves: their typed interfaces are in actors/protocol.h.)
//
//   tandem::pipeline p({.model = {.path = "model.gguf"}, .pools = {.mode = tandem::serving_mode::disaggregated}});
//   auto h = p.submit({.prompt = "Once upon a time", .max_tokens = 32});
//   for (tandem::request_event ev; h.next(ev);) { if (ev.kind == tandem::event_kind::token) std::cout << ev.text; }
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/fault_injection.h"
#include "runtime/model/model.h"
#include "runtime/scheduler/policy.h"
#include "runtime/request_types.h"
#include "runtime/scheduler/router_core.h"
#include "runtime/serving_config.h"

namespace tandem {

struct generation_request {
  std::string prompt;  // tokenized (pipeline::prompt_ids)...
  std::vector<token_id> prompt_tokens;  // ...unless tokens are given, which are taken as they are
  // The special tokens the model file puts around a text (tokenizer.ggml.add_bos_token /
  // add_eos_token: llama.cpp's add_special, vLLM's add_special_tokens); false: none.
  bool add_special = true;
  // Overrides the file's word on BOS alone (unset: the file's, when add_special).
  std::optional<bool> add_bos;
  // Control tokens written in `prompt` (<|im_start|>, <|eot_id|>) are their tokens, as
  // llama-server and vLLM read raw prompts; false keeps them characters.
  bool parse_special = true;
  // With parse_special: byte ranges of `prompt` where control tokens stay characters (text a
  // chat template copied from a message: chat_template::render).
  std::vector<tokenizer::byte_range> literal_ranges;
  int32_t max_tokens = 64;
  sampling_params sampling{.temperature = 0.0f};
  bool ignore_eos = false;
};

// The ids a request's prompt is computed from: prompt_tokens as given, else `prompt` encoded with
// the specials its fields ask for (the file's unless overridden) and parse_special.
std::vector<token_id> prompt_ids(const tokenizer& tok, const generation_request& req);

// Everything a finished request produced.
struct generation_result {
  request_id id = 0;
  std::vector<token_id> tokens;
  std::string text;
  tandem::finish_reason finish_reason = tandem::finish_reason::none;  // none on error
  errc error = errc::ok;
  std::string message;
  double retry_after_ms = 0;
  metrics::request_timings timings;
};

struct connection_inbox;

class request_handle {
 public:
  request_id id() const;
  // The next event; false once the final event (done or error) has been returned, or on timeout.
  bool next(request_event& ev, std::chrono::milliseconds timeout = std::chrono::minutes(10));
  // The next event if one is queued, without waiting. Each event taken returns a credit to the
  // request, so a consumer that stops taking (a slow network client) pauses its request.
  bool try_next(request_event& ev);
  bool finished() const;  // the final event has been taken
  // Reads every remaining event.
  generation_result wait(std::chrono::milliseconds timeout = std::chrono::minutes(10));
  void cancel();
  // Cancels and stops reading (the reader is going away): events are no longer queued and
  // their credits go straight back, so the request ends promptly rather than waiting for a
  // reader that will not come.
  void abandon();

 private:
  friend class pipeline;
  std::shared_ptr<connection_inbox> in_;  // a connection of its own, ending with the request
  request_id id_ = 0;
};

// A client connection: many requests in flight, their events in one queue in arrival order
// (each event carries its request's id), served by one actor. Closing it (or destroying it)
// cancels every request still running on it and frees their KV blocks. Movable, not copyable.
class connection {
 public:
  connection() = default;
  connection(connection&&) noexcept;
  connection& operator=(connection&&) noexcept;
  ~connection();

  // Starts a request; a request refused before admission gets its error event like any other.
  request_id submit(generation_request req);
  bool try_next(request_event& ev);  // each event taken returns a credit to its request
  bool next(request_event& ev, std::chrono::milliseconds timeout);
  void cancel(request_id id);
  void abandon(request_id id);  // cancel, and drop its events unread
  size_t unfinished() const;  // submitted requests whose final event is not taken yet
  bool open() const { return in_ != nullptr; }
  void close();

 private:
  friend class pipeline;
  std::shared_ptr<connection_inbox> in_;
  class pipeline* pipe_ = nullptr;
};

struct pipeline_stats {
  struct worker {
    std::string name;
    int32_t kv_total_blocks = 0, kv_free_blocks = 0, reserved_blocks = 0, active = 0;
    uint64_t steps = 0;
    int32_t max_batch = 0;
    bool busy = false;  // in a step now
    int32_t step_sequences = 0, step_prefill_tokens = 0;  // that step's (or the last one's)
  };
  std::vector<worker> workers;
  int64_t live_requests = 0;  // request actors alive
  int64_t live_connections = 0;  // connection actors alive (a lone request's ends with it)
  // The router's view: its two queues, and the requests it tracks by lifecycle state (it
  // learns "decoding" from the workers; "prefilling" is known to the request actor only).
  int32_t prefill_queue = 0, decode_queue = 0;
  std::vector<std::pair<std::string, int32_t>> requests_by_state;
  struct request {
    request_id id = 0;
    std::string state;
    std::string prefill_worker, decode_worker;  // empty: not placed there (yet)
    int32_t prompt_tokens = 0, max_tokens = 0;
  };
  std::vector<request> requests;  // the oldest the router tracks, up to stats()' limit
  int32_t kv_links = 0, retiring_kv_links = 0;
  // In snapshots only: pools past their restart intensity ("prefill", "decode", "colocated",
  // "kv_store", "router"; nothing restarts in them until their backoff ends), whether the router is (nothing is
  // served), a router process's members as JSON (cluster_nodes()), and when it was taken.
  std::vector<std::string> degraded_pools;
  bool router_degraded = false;
  std::string cluster_nodes = "[]";
  std::chrono::steady_clock::time_point taken_at{};
};

class pipeline {
 public:
  explicit pipeline(serving_config cfg);
  ~pipeline();  // stops accepting, ends every request, waits for every actor
  pipeline(const pipeline&) = delete;
  pipeline& operator=(const pipeline&) = delete;

  request_handle submit(generation_request req);
  // Events go to `on_event` (on an actor thread; keep it short) instead of a handle.
  request_id submit(generation_request req, std::function<void(const request_event&)> on_event);
  // Events queue in the handle as with submit(req); `on_ready` runs (on an actor thread; keep
  // it short, e.g. post to your event loop) whenever one was queued. For event loops that take
  // events with try_next() at their own pace.
  request_handle submit_notify(generation_request req, std::function<void()> on_ready);
  void cancel(request_id id);
  // Opens a connection; `on_ready` runs (on an actor thread; keep it short, e.g. post to your
  // event loop) whenever one of its requests queued an event.
  connection connect(std::function<void()> on_ready);
  // Fault injection: kills worker `index` of a pool; its supervisor restarts it. False if
  // there is no such worker alive.
  bool kill_worker(worker_kind pool, int index);
  // Fault injection: kills a request's actor. Its reader gets an error event; the router frees
  // what the request held. False if the router does not know the request (ended already).
  bool kill_request(request_id id);
  // Fault injection by kind (runtime/kinds.h): `index` picks one of that kind, -1 a random
  // one; or by name ("decode-1", "kv_link-p0-d1", "request-17", "router", "kv_store").
  // Returns the name of what was killed, empty if there was nothing of that kind alive.
  // Waits at most `within` for the router to pick the victim: past it, throws failure(timeout)
  // (nothing was killed; /admin/kill answers 503 rather than hang).
  static constexpr std::chrono::milliseconds kill_wait{10000};
  std::string kill(actor_kind kind, int index = -1, std::chrono::milliseconds within = kill_wait);
  std::string kill(const actor_name& name, std::chrono::milliseconds within = kill_wait);
  // The same from text (/admin/kill, tandem chaos): a kind, a name, or "random" (any kind
  // this pipeline has). Throws failure(invalid_argument) on anything else.
  std::string kill(const std::string& kind_or_name, int index = -1, std::chrono::milliseconds within = kill_wait);
  // Arms `count` faults of a kind (runtime/fault_injection.h); each is suffered once by the
  // first actor that meets it. `stall` is how long a stalled step hangs.
  void inject(fault_kind kind, int count, std::chrono::milliseconds stall = std::chrono::milliseconds(5000));
  // The router failed past its restart intensity: nothing is served until its backoff ends.
  bool degraded();
  // A router process (cluster_port >= 0): the port nodes join at, and its members as JSON
  // (role, name, device, workers, KV address, heartbeat age); 0 and "[]" otherwise.
  uint16_t cluster_port() const;
  std::string cluster_nodes();

  const model& get_model() const;
  metrics::registry& metrics();
  // Asks the router and every worker now (blocks this thread up to seconds if one is stuck).
  pipeline_stats stats(size_t listed_requests = 0);
  // A snapshot (stats(snapshot_listed) and the fields only snapshots fill) published by an
  // observer thread, for callers that must not wait on an actor (the HTTP threads: /health,
  // /admin/state, the dashboard): one taken after this call if it comes within 50 ms (a round
  // trip to the router and the workers, normally about a millisecond), else the latest there
  // is, however stuck a worker or the router is. At start-up it waits (up to 2 s) for the first.
  std::shared_ptr<const pipeline_stats> snapshot() const;
  static constexpr size_t snapshot_listed = 64;
  const serving_config& config() const;

 private:
  std::string kill_actor(actor_kind kind, int32_t index, int32_t decode, std::chrono::milliseconds within);
  void publish_gauges(const pipeline_stats& s);
  bool kill_request(request_id id, std::chrono::milliseconds within);
  friend class connection;
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace tandem
