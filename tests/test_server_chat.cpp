// tandem serve end to end, /v1/chat/completions: streamed chunks and stop strings; tool calls
// forced, read back and streamed (on a model whose template takes tools), refused where the
// template has no tool-call format.
#include <gtest/gtest.h>

#include "tests/support/server_fixture.h"

using namespace tandem;
using namespace tandem::testing_support;
using namespace std::chrono_literals;

// tools: the template gets them; tool_choice "required" and a named function force one valid
// call (the random model would never write one), read back into tool_calls, streamed as a
// tool_calls delta; auto leaves the model free; earlier calls and tool results render; what
// cannot work is a 400 naming the field.
TEST_F(ServerTest, ToolCallsAreForcedReadAndStreamed) {
  start({}, {}, small(), qwen3_template(small()->tok()));
  const json tools = json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
      "properties": {"city": {"type": "string", "maxLength": 16}, "unit": {"enum": ["c", "f"]}}, "required": ["city",)"
                                 R"( "unit"]}}},
    {"type": "function", "function": {"name": "add", "parameters": {"type": "object",
      "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}])");
  const json msgs = {{{"role", "user"}, {"content", "Weather in Paris?"}}};
  auto chat = [&](json body) {
    body["model"] = "tiny";
    if (!body.contains("messages")) body["messages"] = msgs;
    body["tools"] = tools;
    return request(http::verb::post, "/v1/chat/completions", body.dump());
  };
  for (int seed = 0; seed < 4; ++seed) {
    auto r = chat({{"tool_choice", "required"}, {"seed", seed}, {"temperature", 1.0}, {"max_tokens", 120}});
    ASSERT_EQ(r.status, 200) << r.body;
    const json j = json::parse(r.body);
    const auto& c = j["choices"][0];
    EXPECT_EQ(c["finish_reason"], "tool_calls") << r.body;
    ASSERT_EQ(c["message"]["tool_calls"].size(), 1u) << r.body;
    const auto& call = c["message"]["tool_calls"][0];
    EXPECT_EQ(call["type"], "function");
    EXPECT_FALSE(call["id"].get<std::string>().empty());
    const std::string name = call["function"]["name"];
    const json args = json::parse(call["function"]["arguments"].get<std::string>());
    if (name == "get_weather") {
      EXPECT_TRUE(args["city"].is_string() && (args["unit"] == "c" || args["unit"] == "f")) << args.dump();
    } else {
      EXPECT_EQ(name, "add");
      EXPECT_TRUE(args["a"].is_number_integer() && args["b"].is_number_integer()) << args.dump();
    }
  }
  auto named = chat(
      {{"tool_choice", {{"type", "function"}, {"function", {{"name", "add"}}}}}, {"seed", 1}, {"max_tokens", 120}});
  ASSERT_EQ(named.status, 200) << named.body;
  EXPECT_EQ(json::parse(named.body)["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "add");
  auto free = chat({{"tool_choice", "auto"}, {"seed", 1}, {"max_tokens", 8}, {"ignore_eos", true}});
  ASSERT_EQ(free.status, 200) << free.body;
  {  // auto, streamed: an answer that is no call streams as content token by token, the same text
    auto fs = chat({{"tool_choice", "auto"}, {"seed", 1}, {"max_tokens", 8}, {"ignore_eos", true}, {"stream", true}});
    bool fdone = false;
    std::string text;
    int pieces = 0;
    for (const auto& e : sse_events(fs.body, fdone))
      if (!e["choices"].empty() && e["choices"][0]["delta"].contains("content") &&
          !e["choices"][0]["delta"]["content"].get<std::string>().empty()) {
        text += e["choices"][0]["delta"]["content"].get<std::string>();
        ++pieces;
      }
    const json whole = json::parse(free.body)["choices"][0]["message"];
    if (!whole.contains("tool_calls")) {
      EXPECT_EQ(text, whole["content"].get<std::string>());
      EXPECT_GT(pieces, 1) << fs.body;
    }
  }
  // Streamed: the role, then the call as a tool_calls delta, then finish "tool_calls".
  auto s = chat({{"tool_choice", "required"}, {"seed", 2}, {"max_tokens", 120}, {"stream", true}});
  ASSERT_EQ(s.status, 200);
  bool done = false;
  const auto events = sse_events(s.body, done);
  EXPECT_TRUE(done);
  // As OpenAI streams a call: a first delta with index, id, type and name (arguments ""), then
  // the arguments in pieces, which together are the JSON object.
  std::string finish, role, name, args;
  int call_deltas = 0;
  for (const auto& e : events) {
    const auto& c = e["choices"][0];
    if (c["delta"].contains("role")) role = c["delta"]["role"];
    if (c["delta"].contains("tool_calls")) {
      const auto& t = c["delta"]["tool_calls"][0];
      EXPECT_EQ(t["index"], 0);
      if (call_deltas++ == 0) {
        EXPECT_FALSE(t["id"].get<std::string>().empty());
        EXPECT_EQ(t["type"], "function");
        name = t["function"]["name"];
      } else {
        EXPECT_FALSE(t.contains("id"));
      }
      args += t["function"]["arguments"].get<std::string>();
    }
    if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
  }
  EXPECT_EQ(role, "assistant");
  EXPECT_EQ(finish, "tool_calls");
  EXPECT_TRUE(name == "get_weather" || name == "add") << name;
  EXPECT_GT(call_deltas, 2) << "the arguments come in pieces: " << s.body;
  EXPECT_TRUE(json::parse(args).is_object()) << args;
  // A second turn: the call and its result in the history.
  json turn = msgs;
  turn.push_back({{"role", "assistant"},
                  {"content", nullptr},
                  {"tool_calls",
                   {{{"id", "c1"},
                     {"type", "function"},
                     {"function", {{"name", "get_weather"}, {"arguments", R"({"city":"Paris","unit":"c"})"}}}}}}});
  turn.push_back({{"role", "tool"}, {"tool_call_id", "c1"}, {"content", "sunny, 21 C"}});
  auto second = chat({{"messages", turn}, {"max_tokens", 4}});
  EXPECT_EQ(second.status, 200) << second.body;
  // Refused, naming the field.
  auto refused = [&](json body, const std::string& target, const std::string& param) {
    auto r = request(http::verb::post, target, body.dump());
    EXPECT_EQ(r.status, 400) << body.dump() << " -> " << r.body;
    EXPECT_EQ(json::parse(r.body)["error"]["param"], param) << r.body;
  };
  const json base = {{"model", "tiny"}, {"messages", msgs}, {"tools", tools}};
  auto with = [&](json extra) {
    json b = base;
    b.update(extra);
    return b;
  };
  refused(with({{"tool_choice", {{"type", "function"}, {"function", {{"name", "rm"}}}}}}), "/v1/chat/completions",
          "tool_choice");
  refused(with({{"tool_choice", "sometimes"}}), "/v1/chat/completions", "tool_choice");
  refused(with({{"tools", {{{"type", "function"}, {"function", {{"name", "bad name!"}}}}}}}), "/v1/chat/completions",
          "tools");
  refused({{"model", "tiny"}, {"messages", msgs}, {"tool_choice", "required"}}, "/v1/chat/completions", "tool_choice");
  refused({{"model", "tiny"}, {"prompt", "x"}, {"tools", tools}}, "/v1/completions", "tools");
  refused(with({{"tool_choice", "required"}, {"response_format", {{"type", "json_object"}}}}), "/v1/chat/completions",
          "tool_choice");
  expect_clean();
}

// A model whose template has no tool-call format (here: none at all) refuses tools.
TEST_F(ServerTest, ToolsNeedATemplateThatTakesThem) {
  start();
  const json body = {{"model", "tiny"},
                     {"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                     {"tools", {{{"type", "function"}, {"function", {{"name", "f"}}}}}}};
  auto r = request(http::verb::post, "/v1/chat/completions", body.dump());
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_EQ(json::parse(r.body)["error"]["param"], "tools");
}

TEST_F(ServerTest, ChatCompletionsStreamAndStopStrings) {
  start();
  json body = {{"model", "tiny"},
               {"messages", {{{"role", "user"}, {"content", "Hello"}}}},
               {"max_tokens", 10},
               {"temperature", 0},
               {"stream", true}};
  auto s = request(http::verb::post, "/v1/chat/completions", body.dump());
  ASSERT_EQ(s.status, 200) << s.body;
  bool done = false;
  const auto events = sse_events(s.body, done);
  ASSERT_TRUE(done);
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events.front()["object"], "chat.completion.chunk");
  EXPECT_EQ(events.front()["choices"][0]["delta"]["role"], "assistant");
  std::string text;
  for (const auto& e : events) text += e["choices"][0]["delta"].value("content", "");
  EXPECT_EQ(events.back()["choices"][0]["finish_reason"], "length");

  // A stop string taken from the middle of that answer ends it just before.
  if (text.size() >= 4) {
    const std::string stop = text.substr(text.size() / 2, 2);
    body["stream"] = false;
    body["stop"] = stop;
    auto r = request(http::verb::post, "/v1/chat/completions", body.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    const json j = json::parse(r.body);
    EXPECT_EQ(j["choices"][0]["message"]["content"].get<std::string>(), text.substr(0, text.find(stop)));
    EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  }
  expect_clean();
}
