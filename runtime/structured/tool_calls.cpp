#include "runtime/structured/tool_calls.h"

#include <algorithm>

#include "runtime/errors.h"
#include "runtime/structured/grammar.h"
#include "runtime/structured/json_schema.h"

namespace tandem {

namespace {

using ojson = nlohmann::ordered_json;

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return {};
  const auto e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

// A call object: {"name": known name, "arguments" (hermes) or "parameters" (llama3): an
// object, or a string holding one}.
std::optional<tool_call> call_of(const ojson& j, const std::vector<std::string>& known) {
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return std::nullopt;
  const std::string name = j["name"].get<std::string>();
  if (std::find(known.begin(), known.end(), name) == known.end()) return std::nullopt;
  const char* key = j.contains("arguments") ? "arguments" : j.contains("parameters") ? "parameters" : nullptr;
  ojson args = key ? j[key] : ojson::object();
  if (args.is_string()) args = ojson::parse(args.get<std::string>(), nullptr, false);
  if (!args.is_object()) return std::nullopt;
  return tool_call{name, args.dump()};
}

}  // namespace

std::string_view to_string(tool_format f) {
  switch (f) {
    case tool_format::none: return "none";
    case tool_format::hermes: return "hermes";
    case tool_format::llama3_json: return "llama3_json";
  }
  return "none";
}

tool_format detect_tool_format(const std::string& src) {
  if (src.find("<tool_call>") != std::string::npos) return tool_format::hermes;
  if (src.find("ipython") != std::string::npos || src.find("<|python_tag|>") != std::string::npos)
    return tool_format::llama3_json;
  return tool_format::none;
}

parsed_answer parse_tool_calls(tool_format f, const std::string& text, const std::vector<std::string>& known) {
  parsed_answer out;
  switch (f) {
    case tool_format::none: out.content = text; break;
    case tool_format::hermes: {
      static const std::string open = "<tool_call>", close = "</tool_call>";
      size_t pos = 0;
      std::string content;
      while (pos < text.size()) {
        const size_t b = text.find(open, pos);
        if (b == std::string::npos) {
          content += text.substr(pos);
          break;
        }
        const size_t e = text.find(close, b);
        const size_t inner = b + open.size();
        const size_t end = e == std::string::npos ? text.size() : e + close.size();
        const auto call = call_of(
            ojson::parse(trim(text.substr(inner, (e == std::string::npos ? text.size() : e) - inner)), nullptr, false),
            known);
        content += call ? text.substr(pos, b - pos) : text.substr(pos, end - pos);
        if (call) out.calls.push_back(*call);
        pos = end;
      }
      out.content = trim(content);
      break;
    }
    case tool_format::llama3_json: {
      std::string t = trim(text);
      if (t.rfind("<|python_tag|>", 0) == 0) t = trim(t.substr(14));
      const auto j = ojson::parse(t, nullptr, false);
      std::vector<tool_call> calls;
      bool all = !j.is_discarded();
      if (j.is_array()) {
        for (const auto& x : j) {
          auto c = call_of(x, known);
          if (!c) all = false;
          else calls.push_back(*c);
        }
      } else if (auto c = call_of(j, known)) {
        calls.push_back(*c);
      } else {
        all = false;
      }
      if (all && !calls.empty()) out.calls = std::move(calls);
      else out.content = trim(text);
      break;
    }
  }
  return out;
}

std::string prefix_rules(const std::string& g, const std::string& prefix) {
  auto name_char = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
  };
  std::string out;
  out.reserve(g.size() * 5 / 4);
  for (size_t i = 0; i < g.size();) {
    const char c = g[i];
    if (c == '"' || c == '[') {  // a literal or a class: copied, escapes and all
      const char end = c == '"' ? '"' : ']';
      size_t j = i + 1;
      while (j < g.size() && g[j] != end) j += g[j] == '\\' ? 2 : 1;
      j = std::min(j + 1, g.size());
      out.append(g, i, j - i);
      i = j;
    } else if (c == '{' || c == '#') {  // a repetition's counts, a comment
      const size_t j = std::min(g.find(c == '{' ? '}' : '\n', i), g.size());
      out.append(g, i, j - i);
      i = j;
    } else if (name_char(c)) {
      size_t j = i;
      while (j < g.size() && name_char(g[j])) ++j;
      out += prefix;
      out.append(g, i, j - i);
      i = j;
    } else {
      out += c;
      ++i;
    }
  }
  return out;
}

std::string forced_call_head(tool_format f, const std::string& name) {
  const bool hermes = f == tool_format::hermes;
  return std::string(hermes ? "<tool_call>\n" : "") + "{\"name\": \"" + name + "\", \"" +
         (hermes ? "arguments" : "parameters") + "\": ";
}

std::string_view forced_call_closing(tool_format f) { return f == tool_format::hermes ? "}\n</tool_call>" : "}"; }

std::string tool_call_gbnf(tool_format f, const ojson& tools, const std::optional<std::string>& only) {
  if (f == tool_format::none)
    throw failure(errc::invalid_argument, "the model's chat template has no tool-call format");
  if (!tools.is_array() || tools.empty()) throw failure(errc::invalid_argument, "no tools to call");
  std::string rules, calls;
  int n = 0;
  for (const auto& t : tools) {
    const auto& fn = t.at("function");
    const std::string name = fn.at("name").get<std::string>();
    if (only && name != *only) continue;
    const ojson params = fn.contains("parameters") && !fn["parameters"].is_null()
                             ? fn["parameters"]
                             : ojson{{"type", "object"}, {"properties", ojson::object()}};
    std::string p = "f";  // (built in steps: GCC 12 misreports "literal" + std::string&& as -Wrestrict)
    p += std::to_string(n);
    p += '-';
    rules += prefix_rules(json_schema_to_gbnf(params), p) + "\n";
    rules += "call";
    rules += std::to_string(n);
    rules += " ::= " + gbnf_literal(forced_call_head(f, name)) + " " + p + "root " +
             gbnf_literal(forced_call_closing(f)) + "\n";
    calls += n ? " | call" : "call";
    calls += std::to_string(n);
    ++n;
  }
  if (n == 0) throw failure(errc::invalid_argument, "no tool named '" + only.value_or("") + "' among 'tools'");
  return "root ::= (" + calls + ")\n" + rules;
}

}  // namespace tandem
