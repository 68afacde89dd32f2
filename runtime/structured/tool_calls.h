#pragma once
// Tool calling (OpenAI's `tools` / `tool_choice`): which call format a model's chat template
// teaches, reading the calls out of an answer, and a grammar that forces a valid call (for
// tool_choice "required" or a named function) built from the functions' parameter schemas.
//
// Formats:
//  - hermes (Qwen 2.5 / 3, Hermes, and other ChatML templates that print <tool_call>):
//      <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>   (one or more, text around)
//  - llama3_json (Llama 3.1 / 3.2 templates, "Environment: ipython"):
//      {"name": "f", "parameters": {...}}   (the whole answer; <|python_tag|> may lead)
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tandem {

enum class tool_format : uint8_t { none, hermes, llama3_json };
std::string_view to_string(tool_format f);

// The format a chat template's text teaches; none when it prints no tools.
tool_format detect_tool_format(const std::string& template_source);

struct tool_call {
  std::string name;
  std::string arguments;  // a JSON object's text, as OpenAI's function.arguments
};
struct parsed_answer {
  std::string content;  // the text outside the calls (trimmed)
  std::vector<tool_call> calls;
};

// The calls in an answer; text that is not a well-formed call (bad JSON, no name) stays
// content. `known`: the functions offered; a call to another name stays content too.
parsed_answer parse_tool_calls(tool_format f, const std::string& text, const std::vector<std::string>& known);

// GBNF for exactly one call in format `f` to one of `tools` (OpenAI's [{type: "function",
// function: {name, description, parameters}}]), or to `only` when given; its arguments match
// the function's parameters schema (an empty object schema when absent). Throws
// failure(invalid_argument) naming what is wrong (an unknown `only`, a schema the JSON
// Schema converter refuses).
std::string tool_call_gbnf(tool_format f, const nlohmann::ordered_json& tools, const std::optional<std::string>& only);

// How a forced call (tool_call_gbnf) is spelled around its arguments: what comes before them
// (`{"name": "f", "arguments": ` for hermes, after its `<tool_call>\n`) and what closes it.
// The server streams a forced call's arguments from between the two.
std::string forced_call_head(tool_format f, const std::string& name);
std::string_view forced_call_closing(tool_format f);

// `gbnf` with every rule name prefixed (so that grammars can be combined in one text).
std::string prefix_rules(const std::string& gbnf, const std::string& prefix);

}  // namespace tandem
