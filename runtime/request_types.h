#pragma once
// A request as the runtime and its clients see it: what is asked, the states it passes
// through, and the events its stream carries. Plain types, no actor framework, so the public
// pipeline API and the actors share them.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/errors.h"
#include "runtime/metrics.h"
#include "runtime/engine/sampler.h"
#include "runtime/tokenizer/tokenizer.h"

namespace tandem {

using request_id = uint64_t;

// The life of a request. Every switch over it is exhaustive.
enum class request_state : uint8_t {
  queued,  // admitted, waiting for a prefill (or colocated) worker
  prefilling,  // a worker is computing its prompt
  transferring,  // prefill done; waiting for a decode slot or its KV in flight
  decoding,  // a decode (or colocated) worker is generating its tokens
  finished,  // ended normally (stop token or length)
  failed,  // ended by an error
  cancelled,  // ended by its client
};
std::string_view to_string(request_state s);
bool is_terminal(request_state s);

// Why a request ended normally (OpenAI's finish_reason). none: it has not.
enum class finish_reason : uint8_t { none, stop, length, cancelled };
std::string_view to_string(finish_reason r);  // "" for none
std::optional<finish_reason> parse_finish_reason(std::string_view s);

// What a client asks for, tokens already made.
struct request_spec {
  request_id id = 0;
  std::vector<token_id> prompt;
  int32_t max_tokens = 64;
  sampling_params sampling;
  bool ignore_eos = false;
  uint32_t epoch = 0;  // prefill attempt (set by the router): tags the KV it produces
  // A migrated request (its worker died while decoding): the prompt's last `resumed` tokens are
  // output already generated; the next token sampled is output token number `resumed`.
  int32_t resumed = 0;
  // Who submitted it: a connection (pipeline::connect), whose requests the router counts
  // together when it shares the pools between clients. 0: a lone request, a client of its own.
  uint64_t client = 0;

  int32_t original_prompt_tokens() const { return int32_t(prompt.size()) - resumed; }
  // The output generated before it migrated: the prompt's last `resumed` tokens.
  std::vector<token_id> resumed_output() const { return {prompt.end() - resumed, prompt.end()}; }
  // The prompt for repetition_penalty's steps, shared by them (null when it is off).
  std::shared_ptr<const std::vector<token_id>> prompt_for_penalty() const {
    return sampling.repeats() ? std::make_shared<const std::vector<token_id>>(prompt) : nullptr;
  }
  int32_t total_tokens() const { return original_prompt_tokens() + max_tokens; }  // KV it can need
};

// The one rule that ends a sequence, after it sampled its output token number generated - 1
// (`generated` counts it; a migrated request counts its resumed tokens too) in a context of
// n_ctx positions. stop: that token ends the generation (it is not output); length: it is
// output and is the last (max_tokens reached, or no position left to feed it back); none: go on.
// Every worker and `tandem generate` end sequences by this, and nothing else.
finish_reason finish_after(const request_spec& spec, int32_t generated, bool ends_generation, int32_t n_ctx);

enum class event_kind : uint8_t { accepted, token, done, error };
std::string_view to_string(event_kind k);

// One event of a request's stream, as its subscriber sees it.
struct request_event {
  event_kind kind = event_kind::accepted;
  request_id id = 0;
  int32_t index = 0;  // token: position in the output
  token_id token = -1;  // token: its id
  std::string text;  // token: the UTF-8 text it completes (may be empty)
  std::optional<token_logprobs> logprobs;  // token: when the request asked for them
  int32_t queue_position = 0;  // accepted
  tandem::finish_reason finish_reason = tandem::finish_reason::none;  // done
  metrics::request_timings timings;  // done
  errc code = errc::ok;  // error
  std::string message;  // error
  double retry_after_ms = 0;  // error, when a retry can succeed (admission)
};

inline request_event make_event(event_kind kind) {
  request_event ev;
  ev.kind = kind;
  return ev;
}

}  // namespace tandem
