#pragma once
// Clients of a serving endpoint, for `tandem bench serve` and `tandem chaos`: plain HTTP calls,
// an OpenAI-compatible streaming completion (tandem, vLLM, llama.cpp's llama-server, ...) and
// tandem's WebSocket protocol (many requests over one connection). Beast stays inside client.cpp.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace tandem::bench {

struct endpoint {
  std::string host, port;
};
// http://HOST[:PORT][/]; throws std::invalid_argument otherwise.
endpoint parse_url(const std::string& url);
// "250ms", "2s", "1.5m"; throws std::invalid_argument otherwise.
std::chrono::milliseconds parse_duration(const std::string& s);

struct http_reply {
  int status = 0;
  std::string body;
};
// One request on a fresh connection; `bearer` (if not empty) as the Authorization token.
http_reply http_call(const endpoint& ep, const std::string& method, const std::string& target,
                     const std::string& bearer, const std::string& body = "",
                     std::chrono::seconds timeout = std::chrono::seconds(15));

struct stream_request {
  std::vector<int32_t> prompt_tokens;  // used when prompt_text is empty
  std::string prompt_text;
  int32_t max_tokens = 16;
  std::string model;  // OpenAI: the served model's id
};

struct stream_result {
  bool ok = false;
  std::string error;  // why not ok
  double ttft_s = 0, e2e_s = 0;  // from the send
  std::vector<double> token_times_s;  // each streamed token's arrival, from the send
  int32_t prompt_tokens = 0, output_tokens = 0;  // as the server counted them
  // Each generated token's id, in order: only tandem's WebSocket sends them (OpenAI's SSE
  // streams text), and a multi-turn conversation resends them in the next turn's prompt.
  std::vector<int32_t> output_token_ids;
};

// POST /v1/completions with stream and usage, ignore_eos and temperature 0 (the output length
// is the trace's). Blocks until the stream ends; never throws.
stream_result openai_stream(const endpoint& ep, const std::string& api_key, const stream_request& r,
                            std::chrono::seconds timeout);

// tandem's WebSocket protocol (/ws): requests interleaved on one connection; `done` is called
// on the client's own thread when each request ends (or when the connection fails).
class ws_client {
 public:
  ws_client(const endpoint& ep, const std::string& api_key);
  ~ws_client();
  ws_client(const ws_client&) = delete;
  ws_client& operator=(const ws_client&) = delete;
  void submit(const stream_request& r, std::function<void(stream_result)> done);

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace tandem::bench
