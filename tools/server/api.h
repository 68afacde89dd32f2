#pragma once
// The server's request and response shapes, free of networking so they can be unit-tested:
// OpenAI-compatible bodies (/v1/completions, /v1/chat/completions) and the WebSocket protocol
// (docs/protocol.md) parsed into a generation_request, and errors in OpenAI's error JSON.
#include <nlohmann/json.hpp>
#include <optional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "actors/pipeline.h"
#include "runtime/text/chat_template.h"

namespace tandem::server {

using json = nlohmann::json;

// What the server knows of the model it serves.
struct served_model {
  std::string id;  // the name clients put in "model"
  int32_t context_length = 0;
  // Renders chat messages (the model's Jinja template, or a fallback format); null: ChatML.
  std::shared_ptr<const chat_template> chat;
  int32_t n_vocab = 0;  // token ids in logit_bias and stop_token_ids are below it
  sampling_params defaults;  // temperature, top_k, top_p where a request leaves them out
};

struct api_error {
  int http_status = 400;
  std::string type = "invalid_request_error";
  std::string message;
  std::string param;  // the offending field, when there is one
  std::string code;  // tandem's error code name
  double retry_after_ms = 0;
};

struct api_request {
  generation_request gen;
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool chat = false;
  bool echo = false;  // completions: the prompt's text comes first in the answer
  bool return_token_ids = false;  // vLLM's: prompt_token_ids and each choice's token_ids in the answer
  // HTTP: choices per request (1..16). Choice i samples with derived_seed(seed, i); the prompt
  // is computed once (the others start when the first has its first token, from its blocks).
  int32_t n = 1;
  // Choices generated (>= n): the n with the highest mean log-probability per token are
  // returned. Their log-probabilities are computed for the ranking whether asked or not.
  int32_t best_of = 1;
  bool hide_logprobs = false;  // computed only to rank best_of's choices (the client did not ask)
  // Chat tools: the functions offered (null: none; given to the template), whether the answer
  // is read for calls (tool_choice auto, required or a named function; not "none") in which
  // format, and whether more than one call is kept (parallel_tool_calls).
  nlohmann::ordered_json tools;
  tool_format tools_format = tool_format::none;
  bool parse_tools = false;
  bool parallel_tools = true;
  std::vector<std::string> tool_names;
  std::string client_id;  // WebSocket: the client's id for the request
};

// Each returns nullopt and fills `out`, or the error to send. `raw`: the text `body` was parsed
// from, read again for what needs its key order (a JSON schema's properties); empty: taken
// from `body` (keys sorted).
std::optional<api_error> parse_completion(const json& body, const served_model& m, api_request& out,
                                          std::string_view raw = {});
std::optional<api_error> parse_chat_completion(const json& body, const served_model& m, api_request& out,
                                               std::string_view raw = {});
std::optional<api_error> parse_ws_generate(const json& frame, const served_model& m, api_request& out,
                                           std::string_view raw = {});

// The seed of choice `i` of a request seeded `seed`: `seed` itself for choice 0 (n = 1 is
// unchanged), a splitmix64 mix for the others (so seeds s and s + 1 share no choice).
uint64_t derived_seed(uint64_t seed, int32_t i);

// A pipeline error (an error event) as the HTTP status and body clients expect.
api_error error_from(errc code, const std::string& message, double retry_after_ms);
json error_body(const api_error& e);

// A generated token's log-probabilities, as each API shows them (token strings are the token's
// bytes, invalid UTF-8 replaced by U+FFFD; `bytes` keeps them exact).
struct logprob_entry {
  token_id token = -1;
  token_logprobs lp;
  int64_t text_offset = 0;  // where its text starts in the completion text
};
// Chat: {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]}.
json chat_logprobs_json(const tokenizer& tok, const std::vector<logprob_entry>& entries);
// Legacy completions: {"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"}.
json completion_logprobs_json(const tokenizer& tok, const std::vector<logprob_entry>& entries);
// WebSocket token frames: "logprob" and "top_logprobs": [{"token": id, "text", "logprob"}].
void add_ws_logprobs(json& frame, const tokenizer& tok, const token_logprobs& lp);

// Usage and tandem's timings for a finished request.
json usage_json(const metrics::request_timings& t);
json timings_json(const metrics::request_timings& t);

// The operator's log line for a request that ended (runtime/oplog: `request id=... status=...`):
// where it came in, how it ended (the HTTP status; a WebSocket request's is 200 or its error's),
// its tokens, latencies, workers and KV bytes moved.
struct request_log {
  int64_t id = 0;  // the pipeline's request id (0: refused before it got one)
  std::string ref;  // the client's name for it: "cmpl-7", a WebSocket request's id
  std::string endpoint;  // "/v1/chat/completions", "/ws"
  std::string protocol;  // "json", "sse", "ws"
  int status = 200;  // 499: the client went away first
  metrics::request_timings timings;
  int64_t output_tokens = 0;  // of every choice
  std::string finish;  // its finish reason, or
  std::string error;  // its error code
  std::string message;  // and message
};
void log_request(const request_log& r);

}  // namespace tandem::server
