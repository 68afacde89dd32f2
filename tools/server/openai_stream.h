#pragma once
// The OpenAI answer to one /v1/completions or /v1/chat/completions request, as a plain state
// machine: the events of its choices in, what goes out to the client back (SSE events, the
// whole JSON body or the error response, in order) with what the connection must do (start
// the other choices, cancel one, log the end). No socket and no actor in sight: http_server.cpp
// reads, routes and writes, feeds every event here and carries out what comes back, so every
// answer's shape is testable with tables of (events in -> outputs out), as router_core's
// lifecycle is (tests/test_openai_stream.cpp).
//
// Phases:
//   waiting    nothing sent yet; a whole (non-streamed) answer stays here until its end
//   streaming  the SSE response has begun: its status (200) is out, so an error is an event
//   ended      the end went out (the last event, the body or the error); events are ignored
//
// Choices: n (or best_of) of them. Choice 0 is submitted first; the others once choice 0 has
// its first token (their prompts then find its blocks in the prefix cache), each with its own
// seed. Streamed, each chunk names its choice and each choice gets its finish chunk; whole,
// best_of keeps the n likeliest (mean log-probability per token), renumbered.
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "runtime/structured/tool_calls.h"
#include "runtime/text/stop_strings.h"
#include "tools/server/api.h"

namespace tandem::server {

// One SSE event: "data: JSON\n\n" (invalid UTF-8 replaced).
std::string sse_event(const json& j);
inline constexpr std::string_view sse_done = "data: [DONE]\n\n";

// A generation's text as its events arrive: stop strings applied, the tokens, how it ended.
// One per choice here, one per request on the WebSocket.
struct generation {
  explicit generation(std::vector<std::string> stop = {}) : stops(std::move(stop)) {}
  stop_matcher stops;
  std::string text;  // shown so far
  std::vector<token_id> tokens;
  tandem::finish_reason finish_reason = tandem::finish_reason::none;
  metrics::request_timings timings;
  bool ended = false;  // its text is complete: its done event, a completed stop string, an error

  struct applied {
    std::string shown;  // the text to show for this event (a token's, after stop strings)
    bool stopped = false;  // a stop string completed just now: cancel the rest of the request
  };
  applied apply(const request_event& ev);
};

// ---- inputs besides the request's events ----
namespace in {
struct client_gone {};  // the connection closed first: 499, its choices cancelled
struct abort {
  api_error error;
};  // the server ends it (grace period over): the error, as a failure
}  // namespace in
using input = std::variant<request_event, in::client_gone, in::abort>;

// ---- outputs: what to do, in order ----
namespace out {
struct submit {
  int32_t choice;
  generation_request request;
};  // start a choice; answer with submitted()
struct cancel {
  request_id id;
};
struct open_sse {};  // the SSE response's head (200, text/event-stream)
struct sse {
  std::string event;
};  // one event: "data: ...\n\n"
struct close_sse {};  // the stream's end (after its [DONE])
struct respond {
  json body;
};  // the whole answer (200, application/json)
struct refuse {
  api_error error;
};  // the error response (nothing was sent before it)
struct finished {
  request_log log;
};  // the request is over: its log line (before a respond or refuse)
}  // namespace out
using output = std::variant<out::submit, out::cancel, out::open_sse, out::sse, out::close_sse, out::respond,
                            out::refuse, out::finished>;

// What an answer needs of the server around it.
struct stream_context {
  std::string model;  // "model" in every chunk and body
  const tokenizer* tok = nullptr;  // log-probabilities' token strings, echo of a token-id prompt
  int64_t serial = 0;  // the answer's id: cmpl-SERIAL, chatcmpl-SERIAL
  std::function<int64_t()> now;  // "created" (Unix seconds); empty: the system clock
};

class openai_stream {
 public:
  enum class phase : uint8_t { waiting, streaming, ended };

  // `req`: parsed (api.h) with its prompt tokenized. best_of above n computes log-probabilities
  // to rank by, shown only when asked for.
  openai_stream(api_request req, stream_context ctx);

  std::vector<output> start();  // choice 0's submit
  void submitted(int32_t choice, request_id id);  // the id a submit got
  std::vector<output> on(const input& i);
  std::vector<output> on(const request_event& ev);  // the same, without a copy of the event

  phase current() const { return phase_; }
  int64_t serial() const { return ctx_.serial; }

 private:
  // One choice's progress beyond its text.
  struct choice {
    explicit choice(int32_t i, std::vector<std::string> stop) : index(i), gen(std::move(stop)) {}
    int32_t index;
    request_id id = 0;  // 0: not submitted yet
    generation gen;
    bool done = false;  // its done event came
    bool first = true;  // chat streaming: its first chunk carries the role
    double logprob_sum = 0;  // of its tokens: best_of ranks choices by the mean
    int32_t logprob_count = 0;
    // A forced tool call being streamed: where its arguments start in the text (0: not yet
    // known) and how many of their bytes were sent.
    size_t args_at = 0, args_sent = 0;
    size_t content_sent = 0;  // tool_choice auto: the bytes of the text streamed as content so far
    // Log-probabilities (when asked) of tokens not yet sent: a streamed chunk carries those
    // that arrived since the last one (a token whose text a stop string holds back rides with
    // the next chunk); a whole answer carries all.
    std::vector<logprob_entry> logprobs;
  };

  // How the answer treats tool calls: not at all; forced (tool_choice required or named: the
  // grammar makes the answer one call, streamed as it comes); read (tool_choice auto: the text
  // that cannot be a call streams, the calls come at the end).
  enum class tools_mode : uint8_t { none, forced, read };

  template <class E>
  std::vector<output> dispatch(const E& e);
  void handle(const request_event& ev);
  void handle(const in::client_gone&);
  void handle(const in::abort& a);
  void step(choice& c, const request_event& ev);
  void submit_more();
  choice* find(request_id id);
  bool all_done() const;

  void stream_step(choice& c, const request_event& ev, const std::string& shown, bool new_token);
  void open_stream();
  void stream_forced_call(choice& c, bool at_end);
  void stream_content_before_calls(choice& c);
  void stream_end_of_choice(choice& c);
  void end_stream();
  void send_tool_calls(choice& c, json calls);
  void respond();
  void fail(const api_error& e);
  void finish(int status, std::string_view error = {}, std::string_view message = {});

  std::string id() const;
  int64_t now() const;
  json envelope(json choices, bool chunked) const;
  json chunk(int32_t index, bool& first, const std::string& delta, const json& finish, json logprobs) const;
  json chunk(choice& c, const std::string& delta, const json& finish);
  json logprobs_json(choice& c);
  std::string call_id(const choice& c, size_t k) const;
  parsed_answer read_calls(const choice& c) const;
  json calls_json(const choice& c, const parsed_answer& a, bool streamed) const;
  json usage_all() const;
  std::string echoed_prompt() const;
  template <class O>
  void emit(O o) {
    out_.emplace_back(std::move(o));
  }

  api_request req_;
  stream_context ctx_;
  tools_mode tools_ = tools_mode::none;
  phase phase_ = phase::waiting;
  // A deque: choices are added (submit_more) while a reference to choice 0 is in use.
  std::deque<choice> choices_;
  std::vector<output> out_;
};

}  // namespace tandem::server
