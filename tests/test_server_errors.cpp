// tandem serve end to end, what it refuses: bad requests get OpenAI-style errors, parameters it
// does not implement are 400s naming them, admission rejections are 429s with Retry-After.
#include <gtest/gtest.h>

#include <atomic>

#include "tests/support/server_fixture.h"

using namespace tandem;
using namespace tandem::testing_support;
using namespace std::chrono_literals;

TEST_F(ServerTest, BadRequestsGetOpenAIErrors) {
  server::server_config sc;
  sc.max_body_bytes = 4096;
  start(sc);
  auto code = [&](const std::string& target, const std::string& body) {
    auto r = request(http::verb::post, target, body);
    const json j = json::parse(r.body, nullptr, false);
    EXPECT_TRUE(j.contains("error") && j["error"].contains("message")) << r.body;
    return r.status;
  };
  EXPECT_EQ(code("/v1/completions", "{not json"), 400);
  EXPECT_EQ(code("/v1/completions", R"({"model":"other","prompt":"x"})"), 400);
  EXPECT_EQ(code("/v1/completions", R"({"model":"tiny"})"), 400);
  EXPECT_EQ(code("/v1/completions", R"({"model":"tiny","prompt":"x","max_tokens":0})"), 400);
  EXPECT_EQ(code("/v1/completions", R"({"model":"tiny","prompt":"x","temperature":"hot"})"), 400);
  EXPECT_EQ(code("/v1/completions", R"({"model":"tiny","prompt":"\xff\xfe"})"), 400);
  EXPECT_EQ(code("/v1/chat/completions", R"({"model":"tiny","messages":[{"role":"robot","content":"x"}]})"), 400);
  const std::string long_prompt = json({{"model", "tiny"}, {"prompt", std::string(3000, 'a')}}).dump();
  EXPECT_EQ(code("/v1/completions", long_prompt), 400);  // longer than the tiny model's context
  EXPECT_EQ(code("/v1/completions", std::string(5000, ' ')), 413);
  EXPECT_EQ(request(http::verb::get, "/nope").status, 404);
  EXPECT_EQ(request(http::verb::get, "/v1/completions").status, 405);
  EXPECT_EQ(request(http::verb::get, "/admin/state").status, 404);  // off without --admin-key
  // Still serving everyone else.
  EXPECT_EQ(request(http::verb::post, "/v1/completions", R"({"model":"tiny","prompt":"ok","max_tokens":2})").status,
            200);
  expect_clean();
}

// Issue 20: a parameter tandem does not implement is a 400 naming it, never a silent 200;
// at the value that asks for nothing it is accepted. `model` may be left out, and chat
// generates until the model stops or the context is full.
TEST_F(ServerTest, UnimplementedParametersAre400sNamingThem) {
  start();
  auto refused = [&](const std::string& target, json body, const std::string& param) {
    auto r = request(http::verb::post, target, body.dump());
    EXPECT_EQ(r.status, 400) << body.dump() << " -> " << r.body;
    const json j = json::parse(r.body, nullptr, false);
    EXPECT_EQ(j["error"]["param"], param) << r.body;
  };
  const json comp = {{"model", "tiny"}, {"prompt", "Once"}, {"max_tokens", 3}};
  const json chat = {{"model", "tiny"}, {"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"max_tokens", 3}};
  const std::vector<std::pair<std::string, json>> asks = {
      {"logprobs", 21},
      {"logprobs", true},
      {"echo", 1},
      {"suffix", "end"},
      {"best_of", 0},
      {"best_of", 17},
      {"frequency_penalty", 2.5},
      {"presence_penalty", -3},
      {"repetition_penalty", 0},
      {"repetition_penalty", 2.5},
      {"n", 0},
      {"n", 17},
      {"n", 1.5},
      {"n", "2"},
      {"no_such_field", 1},
      // implemented, but checked: ids outside the vocabulary, biases outside [-100, 100]
      {"logit_bias", {{"999999", 1}}},
      {"logit_bias", {{"x", 1}}},
      {"logit_bias", {{"5", 101}}},
      {"stop_token_ids", {-1}},
      {"min_tokens", -1},
      {"min_tokens", 1.5},
      // the prompt's tokenization: booleans
      {"parse_special", "no"},
      {"add_special_tokens", 0},
      {"return_token_ids", "yes"}};
  for (const auto& [k, v] : asks) {
    json b = comp;
    b[k] = v;
    refused("/v1/completions", b, k);
  }
  for (const auto& [k, v] : std::vector<std::pair<std::string, json>>{
           {"logprobs", 2},
           {"top_logprobs", 3},  // without logprobs: true
           // structured outputs: implemented, but what cannot be honoured is refused
           {"response_format",
            {{"type", "json_schema"},
             {"json_schema", {{"name", "x"}, {"schema", {{"type", "string"}, {"pattern", "a+"}}}}}}},
           {"response_format", {{"type", "xml"}}},
           {"response_format", {{"type", "json_object"}, {"strict", true}}},
           {"grammar", "root ::= undefined-rule"},
           {"grammar", 7},
           {"guided_choice", json::array()},
           {"guided_json", "{not json"},
           {"guided_regex", "a+"},
           {"tools", json::array({{{"type", "function"}, {"function", {{"name", "f"}}}}})},
           {"tool_choice", "required"},
           {"add_special_tokens", true},  // vLLM's chat field: the template places BOS here
           {"parse_special", false},  // a chat message's content is always text
           {"max_tokens_typo", 4}}) {
    json b = chat;
    b[k] = v;
    refused("/v1/chat/completions", b, k);
  }
  json so = comp;
  so["stream"] = true;
  so["stream_options"] = {{"include_usage", true}, {"continuous_usage_stats", true}};
  refused("/v1/completions", so, "stream_options");
  json ids_streamed = comp;
  ids_streamed.update({{"stream", true}, {"return_token_ids", true}});
  refused("/v1/completions", ids_streamed, "return_token_ids");

  // The values that ask for nothing pass, as OpenAI's clients send them.
  json quiet = chat;
  quiet.update({{"logprobs", false},
                {"presence_penalty", 0},
                {"frequency_penalty", 0},
                {"logit_bias", json::object()},
                {"response_format", {{"type", "text"}}},
                {"tool_choice", "none"},
                {"tools", json::array()},
                {"n", 1},
                {"user", "u-1"},
                {"top_logprobs", nullptr},
                {"add_special_tokens", false}});
  auto ok = request(http::verb::post, "/v1/chat/completions", quiet.dump());
  EXPECT_EQ(ok.status, 200) << ok.body;

  // No model named: the served one. Chat without max_tokens runs to the end (EOS or context),
  // not to 16 tokens.
  json nomodel = {
      {"messages", {{{"role", "user"}, {"content", "Once upon a time"}}}}, {"ignore_eos", true}, {"temperature", 0}};
  auto r = request(http::verb::post, "/v1/chat/completions", nomodel.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = json::parse(r.body);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_GT(j["usage"]["completion_tokens"].get<int>(), 16);
  EXPECT_EQ(j["usage"]["prompt_tokens"].get<int>() + j["usage"]["completion_tokens"].get<int>(),
            tiny()->config().n_ctx + 1)
      << "generated until the context was full";
  // Legacy completions keep OpenAI's default of 16.
  auto c = request(http::verb::post, "/v1/completions", json({{"prompt", "Once"}, {"ignore_eos", true}}).dump());
  ASSERT_EQ(c.status, 200) << c.body;
  EXPECT_EQ(json::parse(c.body)["usage"]["completion_tokens"], 16);
  expect_clean();
}

namespace {
// Refuses every other request, as a full queue would (deterministic, unlike a real burst).
struct every_other_refused : admission_policy {
  mutable std::atomic<int> n{0};
  admission_decision decide(const admission_config&, const load_snapshot&, int32_t) const override {
    admission_decision d;
    if (n++ % 2 == 1) {
      d.admitted = false;
      d.reason = reject_reason::prefill_queue_full;
      d.retry_after_ms = 1500;
      d.message = "the prefill queue is full";
    }
    return d;
  }
};
}  // namespace

TEST_F(ServerTest, AdmissionRejectionsAre429WithRetryAfter) {
  serving_config pc;
  pc.scheduling.admission_policy_impl = std::make_shared<every_other_refused>();
  start({}, pc);
  const std::string body = R"({"model":"tiny","prompt":"x","max_tokens":2})";
  auto ok = request(http::verb::post, "/v1/completions", body);
  EXPECT_EQ(ok.status, 200) << ok.body;
  auto refused = request(http::verb::post, "/v1/completions", body);
  EXPECT_EQ(refused.status, 429) << refused.body;
  EXPECT_EQ(refused.retry_after, "2");  // seconds, rounded up
  const json e = json::parse(refused.body);
  EXPECT_EQ(e["error"]["type"], "rate_limit_error");
  EXPECT_EQ(e["error"]["code"], "overloaded");
  // Streamed: the refusal comes before any event, so it is still a plain 429.
  auto streamed = request(http::verb::post, "/v1/completions",
                          R"({"model":"tiny","prompt":"x","max_tokens":2,"stream":true})");  // admitted (3rd)
  EXPECT_EQ(streamed.status, 200);
  auto streamed_refused =
      request(http::verb::post, "/v1/completions", R"({"model":"tiny","prompt":"x","max_tokens":2,"stream":true})");
  EXPECT_EQ(streamed_refused.status, 429);
  expect_clean();
}
