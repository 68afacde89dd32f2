// The OpenAI answer as a state machine, without sockets: tables of (event in -> outputs out)
// for streamed and whole answers, stop strings and finish reasons, n choices interleaved,
// best_of, logprobs, tool calls (forced and read), usage in the last chunk and errors. The
// shapes are those the server tests (test_server_*) and the openai npm client (tests/e2e) read.
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "tools/server/openai_stream.h"

namespace tandem::server {
namespace {

constexpr int64_t kNow = 1700000000;

// Byte-level: token 3 + b is byte b (no merges), so a token's text is its first byte.
const tokenizer& vocab() {
  static const tokenizer t(make_byte_level_vocab(259));
  return t;
}

token_id id_of(char c) { return token_id(3 + static_cast<unsigned char>(c)); }

request_event accepted(request_id id) {
  request_event e = make_event(event_kind::accepted);
  e.id = id;
  return e;
}

request_event tok(request_id id, std::string text) {
  request_event e = make_event(event_kind::token);
  e.id = id;
  e.token = text.empty() ? 3 : id_of(text[0]);
  e.text = std::move(text);
  return e;
}

// A one-byte token with its log-probability and one alternative's.
request_event tok(request_id id, char c, float lp, char alt, float alt_lp) {
  request_event e = tok(id, std::string(1, c));
  e.logprobs = token_logprobs{lp, {id_of(c), id_of(alt)}, {lp, alt_lp}};
  return e;
}

// Every request here has a 4-token prompt and ran 12.5 ms.
request_event done(request_id id, finish_reason f, int32_t output_tokens) {
  request_event e = make_event(event_kind::done);
  e.id = id;
  e.finish_reason = f;
  e.timings.prompt_tokens = 4;
  e.timings.output_tokens = output_tokens;
  e.timings.e2e_ms = 12.5;
  return e;
}

request_event error(request_id id, errc code, std::string message, double retry_after_ms = 0) {
  request_event e = make_event(event_kind::error);
  e.id = id;
  e.code = code;
  e.message = std::move(message);
  e.retry_after_ms = retry_after_ms;
  return e;
}

api_request completion(bool stream) {
  api_request r;
  r.gen.prompt = "Say hi";
  r.stream = stream;
  return r;
}

api_request chat(bool stream) {
  api_request r = completion(stream);
  r.chat = true;
  return r;
}

// tool_choice with two functions in the hermes format; forced: a grammar makes the answer a call.
api_request with_tools(api_request r, bool forced) {
  r.parse_tools = true;
  r.tools_format = tool_format::hermes;
  r.tool_names = {"get_weather", "add"};
  if (forced) r.gen.sampling.grammar = "root ::= call";  // only its presence is read here
  return r;
}

struct row {
  input ev;
  std::vector<std::string> out;  // outputs, in order; JSON after the first word compares as JSON
};

// "kind {json}" with the JSON in one canonical form (so tables may order keys as OpenAI does).
std::string canonical(const std::string& s) {
  const auto brace = s.find('{');
  if (brace == std::string::npos) return s;
  return s.substr(0, brace) + json::parse(s.substr(brace)).dump();
}

class OpenAIStream : public ::testing::Test {
 protected:
  void make(api_request r) {
    chat_ = r.chat;
    s.emplace(std::move(r), stream_context{.model = "tiny", .tok = &vocab(), .serial = 7, .now = [] { return kNow; }});
    EXPECT_EQ(render(s->start()), std::vector<std::string>{"submit c0"});
  }

  void run(const std::vector<row>& rows) {
    for (size_t i = 0; i < rows.size(); ++i) {
      std::vector<std::string> want;
      for (const auto& w : rows[i].out) want.push_back(canonical(w));
      EXPECT_EQ(render(s->on(rows[i].ev)), want) << "row " << i;
    }
  }

  // Outputs as short text, so that a table reads as a trace. A submit is answered as the
  // session does (choice i gets request id i + 1); the envelope of every chunk and body (id,
  // object, created, model) is checked here and left out; tandem's timings show as their e2e_ms.
  std::vector<std::string> render(std::vector<output> outs) {
    std::vector<std::string> got;
    for (auto& o : outs)
      std::visit(
          [&](auto& x) {
            using O = std::decay_t<decltype(x)>;
            if constexpr (std::is_same_v<O, out::submit>) {
              submits.push_back(x.request);
              s->submitted(x.choice, request_id(x.choice + 1));
              got.push_back("submit c" + std::to_string(x.choice));
            } else if constexpr (std::is_same_v<O, out::cancel>) {
              got.push_back("cancel r" + std::to_string(x.id));
            } else if constexpr (std::is_same_v<O, out::open_sse>) {
              got.push_back("open");
            } else if constexpr (std::is_same_v<O, out::sse>) {
              got.push_back(x.event == sse_done ? "[DONE]" : "sse " + sse_json(x.event).dump());
            } else if constexpr (std::is_same_v<O, out::close_sse>) {
              got.push_back("close");
            } else if constexpr (std::is_same_v<O, out::respond>) {
              got.push_back("respond " + without_envelope(x.body, false).dump());
            } else if constexpr (std::is_same_v<O, out::refuse>) {
              const auto& e = x.error;
              got.push_back("refuse " + std::to_string(e.http_status) + " " + e.code +
                            (e.retry_after_ms > 0 ? " retry=" + std::to_string(int(e.retry_after_ms)) : ""));
            } else if constexpr (std::is_same_v<O, out::finished>) {
              const request_log& l = x.log;
              got.push_back("end " + std::to_string(l.status) + " r" + std::to_string(l.id) + " " +
                            (l.finish.empty() ? "-" : l.finish) + " tokens=" + std::to_string(l.output_tokens) +
                            (l.error.empty() ? "" : " " + l.error));
              EXPECT_EQ(l.ref, chat_ ? "chatcmpl-7" : "cmpl-7");
              EXPECT_EQ(l.endpoint, chat_ ? "/v1/chat/completions" : "/v1/completions");
            } else {
              static_assert(sizeof(O) == 0, "an output without a rendering");
            }
          },
          o);
    return got;
  }

  json sse_json(const std::string& event) {
    EXPECT_EQ(event.rfind("data: ", 0), 0u) << event;
    EXPECT_EQ(event.substr(event.size() - 2), "\n\n") << event;
    return without_envelope(json::parse(event.substr(6, event.size() - 8)), true);
  }

  json without_envelope(json j, bool chunked) {
    if (j.contains("error")) return j;  // an error event: OpenAI's error body alone
    EXPECT_EQ(j["id"], chat_ ? "chatcmpl-7" : "cmpl-7");
    EXPECT_EQ(j["object"], !chat_ ? "text_completion" : chunked ? "chat.completion.chunk" : "chat.completion");
    EXPECT_EQ(j["created"], kNow);
    EXPECT_EQ(j["model"], "tiny");
    for (const std::string k : {"id", "object", "created", "model"}) j.erase(k);
    if (j.contains("tandem")) j["tandem"] = j["tandem"]["e2e_ms"];
    return j;
  }

  bool chat_ = false;
  std::optional<openai_stream> s;
  std::vector<generation_request> submits;  // what each submit asked for
};

// The usage of a 4-token prompt and `completion` tokens, as the tables write it.
std::string usage(int completion) {
  return R"("usage": {"prompt_tokens": 4, "completion_tokens": )" + std::to_string(completion) +
         R"(, "total_tokens": )" + std::to_string(4 + completion) +
         R"(, "prompt_tokens_details": {"cached_tokens": 0}})";
}

// ---------------------------------------------------------------- plain text

// Streamed: the head at the first event, then one chunk per token (an empty text too: a token
// may end inside a UTF-8 character), then the finish chunk, [DONE] and the end.
TEST_F(OpenAIStream, CompletionStreamsOneChunkPerToken) {
  make(completion(true));
  run({
      {accepted(1), {"open"}},
      {tok(1, "Hel"), {R"(sse {"choices": [{"index": 0, "text": "Hel", "finish_reason": null, "logprobs": null}]})"}},
      {tok(1, ""), {R"(sse {"choices": [{"index": 0, "text": "", "finish_reason": null, "logprobs": null}]})"}},
      {tok(1, "lo"), {R"(sse {"choices": [{"index": 0, "text": "lo", "finish_reason": null, "logprobs": null}]})"}},
      {done(1, finish_reason::length, 3),
       {R"(sse {"choices": [{"index": 0, "text": "", "finish_reason": "length", "logprobs": null}]})", "[DONE]",
        "close", "end 200 r1 length tokens=3"}},
      // Over: what still comes is ignored.
      {tok(1, "x"), {}},
  });
  EXPECT_EQ(s->current(), openai_stream::phase::ended);
}

// Whole: nothing goes out until the end; then the log line and the body.
TEST_F(OpenAIStream, CompletionAnswersWhole) {
  make(completion(false));
  run({
      {accepted(1), {}},
      {tok(1, "Hel"), {}},
      {tok(1, "lo"), {}},
  });
  EXPECT_EQ(s->current(), openai_stream::phase::waiting);
  run({
      {done(1, finish_reason::stop, 2),
       {"end 200 r1 stop tokens=2",
        R"(respond {"choices": [{"index": 0, "text": "Hello", "finish_reason": "stop", "logprobs": null}], )" +
            usage(2) + R"(, "tandem": 12.5})"}},
  });
}

// Chat: the role in the first delta; a delta without text has no content.
TEST_F(OpenAIStream, ChatStreamsTheRoleFirst) {
  make(chat(true));
  run({
      {accepted(1), {"open"}},
      {tok(1, "Hi"),
       {R"(sse {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hi"}, "finish_reason": null,
                             "logprobs": null}]})"}},
      {tok(1, ""), {R"(sse {"choices": [{"index": 0, "delta": {}, "finish_reason": null, "logprobs": null}]})"}},
      {tok(1, " you"),
       {R"(sse {"choices": [{"index": 0, "delta": {"content": " you"}, "finish_reason": null, "logprobs": null}]})"}},
      {done(1, finish_reason::stop, 3),
       {R"(sse {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop", "logprobs": null}]})", "[DONE]", "close",
        "end 200 r1 stop tokens=3"}},
  });
}

// Whole chat answer: the message (and "text" beside it, as the server has always answered).
TEST_F(OpenAIStream, ChatAnswersWhole) {
  make(chat(false));
  run({
      {tok(1, "Hi"), {}},
      {done(1, finish_reason::length, 1),
       {"end 200 r1 length tokens=1",
        R"(respond {"choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi"}, "text": "Hi",
                                 "finish_reason": "length", "logprobs": null}], )" +
            usage(1) + R"(, "tandem": 12.5})"}},
  });
}

// ---------------------------------------------------------------- stop reasons

// A stop string: its start is held back while it may complete; once complete, the text before
// it goes out, the request is cancelled and the finish reason is "stop" whatever the request
// ends with. Held-back text that never completes one goes out at the end.
TEST_F(OpenAIStream, StopStringVersusLength) {
  auto r = completion(true);
  r.stop = {"lo"};
  make(r);
  run({
      {accepted(1), {"open"}},
      {tok(1, "Hel"), {R"(sse {"choices": [{"index": 0, "text": "He", "finish_reason": null, "logprobs": null}]})"}},
      {tok(1, "lo!"),
       {"cancel r1", R"(sse {"choices": [{"index": 0, "text": "l", "finish_reason": null, "logprobs": null}]})"}},
      {tok(1, "more"), {}},  // generated before the cancel arrived: not shown
      {done(1, finish_reason::cancelled, 3),
       {R"(sse {"choices": [{"index": 0, "text": "", "finish_reason": "stop", "logprobs": null}]})", "[DONE]", "close",
        "end 200 r1 stop tokens=2"}},
  });

  make(r);
  run({
      {accepted(1), {"open"}},
      {tok(1, "Hel"), {R"(sse {"choices": [{"index": 0, "text": "He", "finish_reason": null, "logprobs": null}]})"}},
      {done(1, finish_reason::length, 1),
       {R"(sse {"choices": [{"index": 0, "text": "l", "finish_reason": null, "logprobs": null}]})",
        R"(sse {"choices": [{"index": 0, "text": "", "finish_reason": "length", "logprobs": null}]})", "[DONE]",
        "close", "end 200 r1 length tokens=1"}},
  });
}

// The text a generation shows (the WebSocket's requests use it alone): stop strings applied,
// tokens counted until one completes, the request's finish reason unless a stop string ended it.
TEST(Generation, AppliesStopStringsAndTheEnd) {
  generation g({"END"});
  EXPECT_EQ(g.apply(accepted(1)).shown, "");
  EXPECT_EQ(g.apply(tok(1, "abcE")).shown, "abc");
  const auto stopped = g.apply(tok(1, "ND and more"));
  EXPECT_EQ(stopped.shown, "");
  EXPECT_TRUE(stopped.stopped);
  EXPECT_TRUE(g.ended);
  EXPECT_FALSE(g.apply(tok(1, "x")).stopped);
  g.apply(done(1, finish_reason::cancelled, 3));
  EXPECT_EQ(g.text, "abc");
  EXPECT_EQ(g.tokens.size(), 2u);
  EXPECT_EQ(g.finish_reason, finish_reason::stop);
  EXPECT_EQ(g.timings.output_tokens, 3);

  generation plain;
  EXPECT_EQ(plain.apply(tok(1, "a")).shown, "a");
  EXPECT_EQ(plain.apply(done(1, finish_reason::length, 1)).shown, "");
  EXPECT_EQ(plain.finish_reason, finish_reason::length);
  generation failed;
  failed.apply(error(1, errc::worker_failed, "gone"));
  EXPECT_TRUE(failed.ended);
  EXPECT_EQ(failed.finish_reason, finish_reason::none);
}

// ---------------------------------------------------------------- n and best_of

// n = 2, streamed with usage: choice 1 starts at choice 0's first token, with its own seed;
// their chunks interleave as events come, each names its choice and gets its finish chunk;
// after the last, the usage chunk (no choices; the prompt once, every choice's tokens).
TEST_F(OpenAIStream, NChoicesInterleaveAndUsageComesLast) {
  auto r = completion(true);
  r.n = r.best_of = 2;
  r.include_usage = true;
  r.gen.sampling.seed = 42;
  make(r);
  run({
      {accepted(1), {"open"}},
      {tok(1, "A"),
       {"submit c1", R"(sse {"choices": [{"index": 0, "text": "A", "finish_reason": null, "logprobs": null}]})"}},
      {accepted(2), {}},
      {tok(2, "B"), {R"(sse {"choices": [{"index": 1, "text": "B", "finish_reason": null, "logprobs": null}]})"}},
      {tok(1, "a"), {R"(sse {"choices": [{"index": 0, "text": "a", "finish_reason": null, "logprobs": null}]})"}},
      {tok(2, "b"), {R"(sse {"choices": [{"index": 1, "text": "b", "finish_reason": null, "logprobs": null}]})"}},
      {done(2, finish_reason::length, 2),
       {R"(sse {"choices": [{"index": 1, "text": "", "finish_reason": "length", "logprobs": null}]})"}},
      {done(1, finish_reason::stop, 2),
       {R"(sse {"choices": [{"index": 0, "text": "", "finish_reason": "stop", "logprobs": null}]})",
        R"(sse {"choices": [], )" + usage(4) + R"(, "tandem": 12.5})", "[DONE]", "close", "end 200 r1 stop tokens=4"}},
  });
  ASSERT_EQ(submits.size(), 2u);
  EXPECT_EQ(submits[0].sampling.seed, 42u);
  EXPECT_EQ(submits[1].sampling.seed, derived_seed(42, 1));
}

// best_of 3, n 2: log-probabilities computed to rank, not shown; the two with the highest mean
// per token (a tie: the lower choice first), renumbered; usage counts all three.
TEST_F(OpenAIStream, BestOfKeepsTheLikeliest) {
  auto r = completion(false);
  r.n = 2;
  r.best_of = 3;
  make(r);
  EXPECT_EQ(submits[0].sampling.logprobs, 0);
  run({
      {tok(1, 'A', -2.0f, 'Z', -3.0f), {"submit c1", "submit c2"}},
      {tok(2, 'B', -0.5f, 'Z', -3.0f), {}},
      {tok(3, 'C', -0.5f, 'Z', -3.0f), {}},
      {tok(1, 'a', -1.0f, 'Z', -3.0f), {}},
      {done(1, finish_reason::length, 2), {}},
      {done(3, finish_reason::stop, 1), {}},
      {done(2, finish_reason::stop, 1),
       {"end 200 r1 length tokens=4",
        R"(respond {"choices": [{"index": 0, "text": "B", "finish_reason": "stop", "logprobs": null},
                                {"index": 1, "text": "C", "finish_reason": "stop", "logprobs": null}], )" +
            usage(4) + R"(, "tandem": 12.5})"}},
  });
  ASSERT_EQ(submits.size(), 3u);
  EXPECT_EQ(submits[2].sampling.seed, derived_seed(submits[0].sampling.seed, 2));
}

// ---------------------------------------------------------------- logprobs

// Completions, streamed: each token's chunk carries its entry (text_offset: where its text
// starts); the finish chunk has the lists empty.
TEST_F(OpenAIStream, LogprobsStreamWithTheirTokens) {
  auto r = completion(true);
  r.gen.sampling.logprobs = 1;
  make(r);
  run({
      {accepted(1), {"open"}},
      {tok(1, 'H', -0.25f, 'J', -1.5f),
       {R"(sse {"choices": [{"index": 0, "text": "H", "finish_reason": null, "logprobs": {"tokens": ["H"],
              "token_logprobs": [-0.25], "top_logprobs": [{"H": -0.25, "J": -1.5}], "text_offset": [0]}}]})"}},
      {tok(1, 'i', -0.5f, 'o', -2.0f),
       {R"(sse {"choices": [{"index": 0, "text": "i", "finish_reason": null, "logprobs": {"tokens": ["i"],
              "token_logprobs": [-0.5], "top_logprobs": [{"i": -0.5, "o": -2.0}], "text_offset": [1]}}]})"}},
      {done(1, finish_reason::length, 2),
       {R"(sse {"choices": [{"index": 0, "text": "", "finish_reason": "length", "logprobs": {"tokens": [],
              "token_logprobs": [], "top_logprobs": [], "text_offset": []}}]})",
        "[DONE]", "close", "end 200 r1 length tokens=2"}},
  });
}

// Chat, whole: every token's entry with its bytes and alternatives.
TEST_F(OpenAIStream, ChatLogprobsInTheWholeAnswer) {
  auto r = chat(false);
  r.gen.sampling.logprobs = 2;
  make(r);
  run({
      {tok(1, 'H', -0.25f, 'J', -1.5f), {}},
      {tok(1, 'i', -0.5f, 'o', -2.0f), {}},
      {done(1, finish_reason::length, 2),
       {"end 200 r1 length tokens=2",
        R"(respond {"choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi"}, "text": "Hi",
             "finish_reason": "length", "logprobs": {"content": [
               {"token": "H", "logprob": -0.25, "bytes": [72], "top_logprobs": [
                 {"token": "H", "logprob": -0.25, "bytes": [72]}, {"token": "J", "logprob": -1.5, "bytes": [74]}]},
               {"token": "i", "logprob": -0.5, "bytes": [105], "top_logprobs": [
                 {"token": "i", "logprob": -0.5, "bytes": [105]},
                 {"token": "o", "logprob": -2.0, "bytes": [111]}]}]}}], )" +
            usage(2) + R"(, "tandem": 12.5})"}},
  });
}

// ---------------------------------------------------------------- tool calls

const std::string kHead = "<tool_call>\n{\"name\": \"add\", \"arguments\": ";

// Forced (tool_choice required or named), streamed as OpenAI's: the role with the call's index,
// id, type and name (arguments "") once the name is known, then the arguments in pieces short
// of what may be the closing `}\n</tool_call>`, then finish "tool_calls".
TEST_F(OpenAIStream, ForcedCallStreamsItsArguments) {
  make(with_tools(chat(true), true));
  run({
      {accepted(1), {"open"}},
      {tok(1, "<tool_call>\n"), {}},
      {tok(1, kHead.substr(12)),
       {R"(sse {"choices": [{"index": 0, "delta": {"role": "assistant", "tool_calls": [{"index": 0, "id": "call_7_0_0",
              "type": "function", "function": {"name": "add", "arguments": ""}}]},
              "finish_reason": null, "logprobs": null}]})"}},
      {tok(1, R"({"a": 1, "b": 2})"),
       {R"(sse {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{\""}}]},
              "finish_reason": null, "logprobs": null}]})"}},
      {tok(1, "}\n</tool_call>"), {R"(sse {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0,
              "function": {"arguments": "a\": 1, \"b\": 2}"}}]},
              "finish_reason": null, "logprobs": null}]})"}},
      {done(1, finish_reason::stop, 4),
       {R"(sse {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls", "logprobs": null}]})", "[DONE]",
        "close", "end 200 r1 stop tokens=4"}},
  });
}

// Forced, whole: the call read back (its arguments as compact JSON), content null.
TEST_F(OpenAIStream, ForcedCallAnswersWhole) {
  make(with_tools(chat(false), true));
  run({
      {tok(1, kHead), {}},
      {tok(1, "{\"a\": 1, \"b\": 2}}\n</tool_call>"), {}},
      {done(1, finish_reason::stop, 2),
       {"end 200 r1 stop tokens=2",
        R"(respond {"choices": [{"index": 0, "message": {"role": "assistant", "content": null, "tool_calls": [
             {"id": "call_7_0_0", "type": "function", "function": {"name": "add", "arguments": "{\"a\":1,\"b\":2}"}}]},
             "finish_reason": "tool_calls", "logprobs": null}], )" +
            usage(2) + R"(, "tandem": 12.5})"}},
  });
}

// tool_choice auto: text streams as content up to where a call may begin (a `<tool_call>` or a
// tail that could become one); the calls come whole at the end, then finish "tool_calls".
TEST_F(OpenAIStream, ReadCallsComeAtTheEnd) {
  make(with_tools(chat(true), false));
  run({
      {accepted(1), {"open"}},
      {tok(1, "Let me check. "),
       {R"(sse {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "Let me check. "},
              "finish_reason": null, "logprobs": null}]})"}},
      {tok(1, "<tool"), {}},
      {tok(1, "_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1}}\n</tool_call>"), {}},
      {done(1, finish_reason::stop, 3),
       {R"(sse {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_7_0_0", "type": "function",
              "function": {"name": "add", "arguments": "{\"a\":1}"}}]}, "finish_reason": null, "logprobs": null}]})",
        R"(sse {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls", "logprobs": null}]})", "[DONE]",
        "close", "end 200 r1 stop tokens=3"}},
  });

  // No call after all: what was held back goes out at the end, the finish is the request's.
  make(with_tools(chat(true), false));
  run({
      {accepted(1), {"open"}},
      {tok(1, "Hi"),
       {R"(sse {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hi"}, "finish_reason": null,
              "logprobs": null}]})"}},
      {tok(1, " <"),
       {R"(sse {"choices": [{"index": 0, "delta": {"content": " "}, "finish_reason": null, "logprobs": null}]})"}},
      {done(1, finish_reason::length, 2),
       {R"(sse {"choices": [{"index": 0, "delta": {"content": "<"}, "finish_reason": null, "logprobs": null}]})",
        R"(sse {"choices": [{"index": 0, "delta": {}, "finish_reason": "length", "logprobs": null}]})", "[DONE]",
        "close", "end 200 r1 length tokens=2"}},
  });
}

// ---------------------------------------------------------------- echo, token ids

// echo: every choice starts with the prompt (streamed: a chunk each at the start); a token-id
// prompt is decoded. return_token_ids: each choice's ids, and the prompt's.
TEST_F(OpenAIStream, EchoAndTokenIds) {
  auto r = completion(true);
  r.echo = true;
  r.n = r.best_of = 2;
  make(r);
  run({
      {accepted(1),
       {"open", R"(sse {"choices": [{"index": 0, "text": "Say hi", "finish_reason": null, "logprobs": null}]})",
        R"(sse {"choices": [{"index": 1, "text": "Say hi", "finish_reason": null, "logprobs": null}]})"}},
  });

  r = completion(false);
  r.echo = true;
  r.return_token_ids = true;
  r.gen.prompt.clear();
  r.gen.prompt_tokens = {id_of('O'), id_of('k')};
  make(r);
  run({
      {tok(1, "!"), {}},
      {done(1, finish_reason::length, 1),
       {"end 200 r1 length tokens=1",
        R"(respond {"choices": [{"index": 0, "text": "Ok!", "finish_reason": "length", "logprobs": null,
             "token_ids": [36], "prompt_token_ids": [82, 110]}], )" +
            usage(1) + R"(, "tandem": 12.5})"}},
  });
}

// ---------------------------------------------------------------- errors and ends

// Once the stream began (status 200 sent), an error is an SSE error event, then [DONE]; every
// choice still running is cancelled; the log line has the error.
TEST_F(OpenAIStream, ErrorMidStreamIsAnEvent) {
  auto r = completion(true);
  r.n = r.best_of = 2;
  make(r);
  run({
      {accepted(1), {"open"}},
      {tok(1, "A"),
       {"submit c1", R"(sse {"choices": [{"index": 0, "text": "A", "finish_reason": null, "logprobs": null}]})"}},
      {error(2, errc::worker_failed, "the worker died"),
       {R"(sse {"error": {"message": "the worker died", "type": "server_error", "param": null,
              "code": "worker_failed"}})",
        "[DONE]", "close", "cancel r1", "cancel r2", "end 200 r1 - tokens=1 worker_failed"}},
      {tok(1, "B"), {}},
  });
}

// Before anything was sent, an error is the error response (its status, Retry-After's figure).
TEST_F(OpenAIStream, ErrorBeforeTheStreamIsAResponse) {
  make(completion(true));
  run({
      {error(1, errc::overloaded, "the queue is full", 2500),
       {"cancel r1", "end 429 r1 - tokens=0 overloaded", "refuse 429 overloaded retry=2500"}},
  });
  EXPECT_EQ(s->current(), openai_stream::phase::ended);
}

// The client went away: every choice cancelled, logged as 499; the grace period ended: the
// shutting_down error, as an event once streaming, else a 503.
TEST_F(OpenAIStream, ClientGoneAndGraceOver) {
  make(completion(false));
  run({
      {tok(1, "A"), {}},
      {in::client_gone{}, {"cancel r1", "end 499 r1 - tokens=1 client_closed"}},
      {in::client_gone{}, {}},
  });

  const api_error shutting = error_from(errc::shutting_down, "the grace period ended", 0);
  make(completion(true));
  run({
      {accepted(1), {"open"}},
      {in::abort{shutting},
       {R"(sse {"error": {"message": "the grace period ended", "type": "server_error", "param": null,
              "code": "shutting_down"}})",
        "[DONE]", "close", "cancel r1", "end 200 r1 - tokens=0 shutting_down"}},
  });

  make(completion(false));
  run({
      {in::abort{shutting}, {"cancel r1", "end 503 r1 - tokens=0 shutting_down", "refuse 503 shutting_down"}},
  });
}

}  // namespace
}  // namespace tandem::server
