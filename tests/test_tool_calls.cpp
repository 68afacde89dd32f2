// Tool calling: the format each real template teaches, reading calls out of answers, the
// grammar that forces one valid call, and templates rendering tools and earlier calls.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "runtime/text/chat_template.h"
#include "runtime/structured/grammar.h"
#include "runtime/structured/tool_calls.h"

namespace tandem {
namespace {

using ojson = nlohmann::ordered_json;

std::string template_text(const std::string& name) {
  std::ifstream in(std::string(TANDEM_TEST_DATA_DIR) + "/templates/" + name);
  EXPECT_TRUE(in) << name;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

const ojson tools = ojson::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
   "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                                   "unit": {"enum": ["c", "f"]}},
                  "required": ["city"]}}},
  {"type": "function", "function": {"name": "now"}}
])");
const std::vector<std::string> names = {"get_weather", "now"};

TEST(ToolCalls, EachTemplateTeachesItsFormat) {
  const std::pair<const char*, tool_format> rows[] = {
      {"qwen3.jinja", tool_format::hermes},         {"qwen2.5.jinja", tool_format::hermes},
      {"llama3.1.jinja", tool_format::llama3_json}, {"llama3.2.jinja", tool_format::llama3_json},
      {"gemma3.jinja", tool_format::none},          {"phi3.jinja", tool_format::none},
      {"llama3.jinja", tool_format::none},
  };
  for (const auto& [file, want] : rows) EXPECT_EQ(detect_tool_format(template_text(file)), want) << file;
}

TEST(ToolCalls, CallsAreReadOutOfAnswers) {
  struct row {
    tool_format f;
    std::string text, content;
    std::vector<std::pair<std::string, std::string>> calls;  // name, arguments
  };
  const row rows[] = {
      {tool_format::hermes,
       "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
       "",
       {{"get_weather", R"({"city":"Paris"})"}}},
      {tool_format::hermes,
       "Let me check.\n<tool_call>{\"name\":\"now\",\"arguments\":{}}</tool_call><tool_call>{\"name\":\"get_weather\","
       "\"arguments\":\"{\\\"city\\\":\\\"Oslo\\\"}\"}</tool_call>",
       "Let me check.",
       {{"now", "{}"}, {"get_weather", R"({"city":"Oslo"})"}}},
      // Not calls: bad JSON, an unknown function, no name: they stay text.
      {tool_format::hermes, "<tool_call>{bad}</tool_call>", "<tool_call>{bad}</tool_call>", {}},
      {tool_format::hermes,
       "<tool_call>{\"name\": \"rm\", \"arguments\": {}}</tool_call>",
       "<tool_call>{\"name\": \"rm\", \"arguments\": {}}</tool_call>",
       {}},
      {tool_format::hermes, "just text", "just text", {}},
      {tool_format::llama3_json,
       "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\", \"unit\": \"c\"}}",
       "",
       {{"get_weather", R"({"city":"Rome","unit":"c"})"}}},
      {tool_format::llama3_json, "<|python_tag|>{\"name\": \"now\", \"parameters\": {}}", "", {{"now", "{}"}}},
      {tool_format::llama3_json, "The weather is fine.", "The weather is fine.", {}},
      {tool_format::llama3_json,
       "{\"name\": \"rm\", \"parameters\": {}}",
       "{\"name\": \"rm\", \"parameters\": {}}",
       {}},
      {tool_format::none,
       "<tool_call>{\"name\": \"now\"}</tool_call>",
       "<tool_call>{\"name\": \"now\"}</tool_call>",
       {}},
  };
  for (const auto& r : rows) {
    const auto a = parse_tool_calls(r.f, r.text, names);
    EXPECT_EQ(a.content, r.content) << r.text;
    ASSERT_EQ(a.calls.size(), r.calls.size()) << r.text;
    for (size_t i = 0; i < r.calls.size(); ++i) {
      EXPECT_EQ(a.calls[i].name, r.calls[i].first) << r.text;
      EXPECT_EQ(a.calls[i].arguments, r.calls[i].second) << r.text;
    }
  }
}

TEST(ToolCalls, PrefixRulesRenamesOnlyRuleNames) {
  EXPECT_EQ(prefix_rules("root ::= a \"a b\" [a-z] x{2,3} # a c\nx ::= \"\\\"a\"", "p-"),
            "p-root ::= p-a \"a b\" [a-z] p-x{2,3} # a c\np-x ::= \"\\\"a\"");
}

bool matches(const std::string& gbnf, const std::string& text) {
  grammar_matcher m(grammar::compile(gbnf), nullptr);
  return m.accept_bytes(text) && m.complete();
}

TEST(ToolCalls, TheForcingGrammarTakesExactlyOneValidCall) {
  const std::string any = tool_call_gbnf(tool_format::hermes, tools, std::nullopt);
  EXPECT_TRUE(
      matches(any, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Paris\"}}\n</tool_call>"));
  EXPECT_TRUE(matches(
      any, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"a\",\"unit\":\"f\"}}\n</tool_call>"));
  EXPECT_TRUE(matches(any, "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>"));
  EXPECT_FALSE(
      matches(any, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>"));  // city required
  EXPECT_FALSE(matches(any, "<tool_call>\n{\"name\": \"rm\", \"arguments\": {}}\n</tool_call>"));
  EXPECT_FALSE(matches(any, "Sure: <tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>"));
  const std::string named = tool_call_gbnf(tool_format::llama3_json, tools, std::string("get_weather"));
  EXPECT_TRUE(matches(named, "{\"name\": \"get_weather\", \"parameters\": {\"city\":\"Oslo\"}}"));
  EXPECT_FALSE(matches(named, "{\"name\": \"now\", \"parameters\": {}}"));
  // What the grammar takes, the parser reads back as the call.
  const auto a = parse_tool_calls(tool_format::llama3_json,
                                  "{\"name\": \"get_weather\", \"parameters\": {\"city\":\"Oslo\"}}", names);
  ASSERT_EQ(a.calls.size(), 1u);
  EXPECT_EQ(a.calls[0].arguments, R"({"city":"Oslo"})");
  EXPECT_THROW(tool_call_gbnf(tool_format::hermes, tools, std::string("rm")), failure);
  EXPECT_THROW(tool_call_gbnf(tool_format::none, tools, std::nullopt), failure);
  const ojson bad = ojson::parse(
      R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "string", "pattern": "x"}}}])");
  try {
    tool_call_gbnf(tool_format::hermes, bad, std::nullopt);
    ADD_FAILURE() << "a schema keyword tandem cannot honour was accepted";
  } catch (const failure& e) {
    EXPECT_NE(std::string(e.what()).find("pattern"), std::string::npos) << e.what();
  }
}

TEST(ToolCalls, TemplatesRenderToolsAndEarlierCalls) {
  const chat_template qwen(template_text("qwen3.jinja"), "", "<|im_end|>", false);
  ASSERT_TRUE(qwen.uses_jinja());
  EXPECT_EQ(qwen.tool_calls_format(), tool_format::hermes);
  std::vector<chat_message> msgs(3);
  msgs[0] = {"user", "Weather in Paris?"};
  msgs[1].role = "assistant";
  msgs[1].tool_calls =
      ojson::parse(R"([{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": )"
                   R"(\"Paris\"}"}}])");
  msgs[2].role = "tool";
  msgs[2].content = "sunny, 21 C";
  msgs[2].tool_call_id = "c1";
  std::string out;
  ASSERT_TRUE(qwen.render(msgs, out, nullptr, tools).ok());
  EXPECT_NE(out.find("<tools>"), std::string::npos) << out;
  EXPECT_NE(out.find("\"name\": \"get_weather\""), std::string::npos) << out;  // the tool, as tojson prints it
  EXPECT_NE(out.find("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("<tool_response>\nsunny, 21 C\n</tool_response>"), std::string::npos) << out;
  const chat_template llama(template_text("llama3.2.jinja"), "<|begin_of_text|>", "<|eot_id|>", false);
  ASSERT_TRUE(llama.render({msgs[0]}, out, nullptr, tools).ok());
  EXPECT_NE(out.find("Environment: ipython"), std::string::npos) << out;
  EXPECT_NE(out.find("get_weather"), std::string::npos) << out;
  // Without tools the rendering is the plain one.
  std::string plain;
  ASSERT_TRUE(qwen.render({msgs[0]}, plain).ok());
  EXPECT_EQ(plain.find("<tools>"), std::string::npos);
}

}  // namespace
}  // namespace tandem
