#include "tools/server/api.h"

#include "runtime/oplog.h"

#include "runtime/structured/grammar.h"
#include "runtime/structured/json_schema.h"

#include <algorithm>
#include <cmath>
#include <random>

namespace tandem::server {
namespace {

api_error bad(std::string message, std::string param = {}) {
  api_error e;
  e.message = std::move(message);
  e.param = std::move(param);
  e.code = "invalid_argument";
  return e;
}

bool valid_utf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) >> 6) != 0x2) return false;
    i += n;
  }
  return true;
}

// Bytes as a JSON-safe string: each invalid UTF-8 sequence becomes U+FFFD.
std::string printable(const std::string& s) {
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    bool ok = n > 0 && i + n <= s.size();
    for (size_t k = 1; ok && k < n; ++k) ok = (static_cast<unsigned char>(s[i + k]) >> 6) == 0x2;
    if (ok) {
      out.append(s, i, n);
      i += n;
    } else {
      out += "\xEF\xBF\xBD";
      ++i;
    }
  }
  return out;
}

json bytes_json(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(int(c));
  return b;
}

// Which body fields a request may carry. Every field is one of: read (parsed below), inert (no
// effect on any server's output by its definition: `user`, an end-user id for abuse
// monitoring), or not implemented, in which case only the value that asks for nothing (null,
// false, 0, an empty list, "none", `{"type": "text"}`) is accepted and anything else is a 400
// naming the field; an unknown field is a 400 too. Nothing is silently ignored.
enum class endpoint { completions, chat, websocket };

bool is_empty_value(const json& v) {
  return v.is_null() || (v.is_boolean() && !v.get<bool>()) || (v.is_number() && v.get<double>() == 0.0) ||
         ((v.is_array() || v.is_object() || v.is_string()) && v.empty());
}

std::optional<api_error> check_fields(const json& b, endpoint ep) {
  static const char* const shared[] = {"model",
                                       "max_tokens",
                                       "temperature",
                                       "top_p",
                                       "top_k",
                                       "seed",
                                       "n",
                                       "stop",
                                       "stream",
                                       "stream_options",
                                       "ignore_eos",
                                       "user",
                                       "logit_bias",
                                       "min_tokens",
                                       "stop_token_ids",
                                       "presence_penalty",
                                       "frequency_penalty",
                                       "repetition_penalty",
                                       "response_format",
                                       "grammar",
                                       "guided_json",
                                       "guided_choice",
                                       "guided_grammar",
                                       "best_of"};
  for (const auto& [key, v] : b.items()) {
    if (std::find_if(std::begin(shared), std::end(shared), [&](const char* k) { return key == k; }) != std::end(shared))
      continue;
    if (key == "return_token_ids" && ep != endpoint::websocket) continue;
    if ((ep == endpoint::completions || ep == endpoint::websocket) &&
        (key == "parse_special" || key == "add_special_tokens"))
      continue;
    if (ep == endpoint::completions && (key == "prompt" || key == "logprobs" || key == "echo")) continue;
    if (ep == endpoint::chat &&
        (key == "messages" || key == "max_completion_tokens" || key == "logprobs" || key == "top_logprobs" ||
         key == "tools" || key == "tool_choice" || key == "parallel_tool_calls"))
      continue;
    if (ep == endpoint::websocket &&
        (key == "type" || key == "id" || key == "prompt" || key == "messages" || key == "logprobs"))
      continue;
    // Known to OpenAI-compatible servers, not implemented by tandem (docs/protocol.md).
    static const char* const unimplemented[] = {
        "logprobs", "top_logprobs", "echo", "suffix", "tools", "tool_choice", "parallel_tool_calls", "functions",
        "function_call", "store", "metadata", "modalities", "audio", "prediction", "reasoning_effort", "service_tier",
        "web_search_options", "min_p", "typical_p", "guided_regex", "guided_whitespace_pattern",
        "guided_decoding_backend", "json_schema", "use_beam_search", "length_penalty", "include_stop_str_in_output",
        "skip_special_tokens", "spaces_between_special_tokens", "add_generation_prompt", "continue_final_message",
        "chat_template", "chat_template_kwargs", "documents", "priority", "mirostat", "n_probs", "cache_prompt",
        "samplers", "dynatemp_range", "xtc_probability", "dry_multiplier", "n_predict", "id_slot", "return_tokens",
        "post_sampling_probs", "verbosity", "prompt_cache_key", "safety_identifier", "truncate_prompt_tokens",
        // vLLM's chat field (default false): the chat template places BOS, one at most.
        "add_special_tokens"};
    const bool known = std::find_if(std::begin(unimplemented), std::end(unimplemented),
                                    [&](const char* k) { return key == k; }) != std::end(unimplemented);
    if (!known) return bad("unknown parameter '" + key + "'", key);
    if ((key == "tools" || key == "tool_choice" || key == "parallel_tool_calls") && ep != endpoint::chat &&
        !is_empty_value(v) && v != json("none"))
      return bad("'" + key + "' is for /v1/chat/completions (the chat template renders the tools)", key);
    const bool nothing_asked = is_empty_value(v) || (key == "repetition_penalty" && v == json(1)) ||
                               (key == "tool_choice" && v == json("none")) ||
                               (key == "service_tier" && (v == json("auto") || v == json("default")));
    if (!nothing_asked) return bad("'" + key + "' is not supported by tandem (yet); leave it out or null", key);
  }
  return std::nullopt;
}

// Structured outputs: the output constrained by a grammar, from one of OpenAI's
// response_format (json_object, json_schema), llama-server's `grammar` (GBNF), vLLM's
// guided_json / guided_choice / guided_grammar. Compiled here, so that a schema or grammar
// tandem cannot honour is a 400 naming the parameter before any work starts.
std::optional<api_error> parse_constraint(const json& b, std::string_view raw, api_request& out) {
  // nlohmann::json sorts object keys, but a schema's property order is the order the answer
  // is written in: schemas are read again from the body's text (`raw`), in order.
  std::optional<nlohmann::ordered_json> doc;
  auto ordered = [&](std::initializer_list<const char*> path) {
    if (!doc) {
      doc = raw.empty() ? nlohmann::ordered_json::parse(b.dump()) : nlohmann::ordered_json::parse(raw, nullptr, false);
      if (doc->is_discarded()) doc = nlohmann::ordered_json::parse(b.dump());
    }
    const nlohmann::ordered_json* at = &*doc;
    for (const char* k : path) at = &at->at(k);
    return *at;
  };
  std::string gbnf;
  const char* source = nullptr;
  const char* current = nullptr;
  auto given = [&](const char* key) { return b.contains(key) && !b[key].is_null(); };
  auto take = [&](std::string text) -> std::optional<api_error> {
    if (source)
      return bad(std::string("'") + current + "' and '" + source + "' both constrain the output; give one", current);
    source = current;
    gbnf = std::move(text);
    return std::nullopt;
  };
  try {
    if (given("response_format")) {
      current = "response_format";
      const auto& rf = b["response_format"];
      if (!rf.is_object() || !rf.contains("type") || !rf["type"].is_string())
        return bad("'response_format' must be an object with a string 'type'", current);
      const std::string type = rf["type"].get<std::string>();
      for (const auto& [key, v] : rf.items())
        if (key != "type" && !(type == "json_schema" && key == "json_schema") &&
            !(type == "json_object" && key == "schema"))
          return bad("'response_format." + key + "' is not a field of response_format type '" + type + "'", current);
      if (type == "json_object") {
        // llama-server's extension: a schema given with json_object.
        if (auto e = take(rf.contains("schema") ? json_schema_to_gbnf(ordered({"response_format", "schema"}))
                                                : json_object_gbnf()))
          return e;
      } else if (type == "json_schema") {
        if (!rf.contains("json_schema") || !rf["json_schema"].is_object())
          return bad("'response_format.json_schema' must be an object ({name, schema, strict})", current);
        const auto& js = rf["json_schema"];
        for (const auto& [key, v] : js.items())
          if (key != "name" && key != "description" && key != "schema" && key != "strict")
            return bad("'response_format.json_schema." + key + "' is not a field of json_schema", current);
        if (js.contains("name") && !js["name"].is_string())
          return bad("'response_format.json_schema.name' must be a string", current);
        if (js.contains("strict") && !js["strict"].is_boolean() && !js["strict"].is_null())
          return bad("'response_format.json_schema.strict' must be a boolean", current);
        // Without a schema any JSON value does; strict or not, the output always follows it.
        if (auto e =
                take(js.contains("schema") ? json_schema_to_gbnf(ordered({"response_format", "json_schema", "schema"}))
                                           : json_schema_to_gbnf(json::object())))
          return e;
      } else if (type != "text") {
        return bad("'response_format.type' must be 'text', 'json_object' or 'json_schema'", current);
      }
    }
    if (given("grammar")) {
      current = "grammar";
      if (!b["grammar"].is_string()) return bad("'grammar' must be a string (GBNF)", current);
      if (auto e = take(b["grammar"].get<std::string>())) return e;
    }
    if (given("guided_grammar")) {
      current = "guided_grammar";
      if (!b["guided_grammar"].is_string()) return bad("'guided_grammar' must be a string (GBNF)", current);
      if (auto e = take(b["guided_grammar"].get<std::string>())) return e;
    }
    if (given("guided_json")) {
      current = "guided_json";
      const auto& gj = b["guided_json"];
      nlohmann::ordered_json schema;
      if (gj.is_string()) {
        schema = nlohmann::ordered_json::parse(gj.get<std::string>(), nullptr, false);
        if (schema.is_discarded()) return bad("'guided_json' is a string but not JSON", current);
      } else if (gj.is_object()) {
        schema = ordered({"guided_json"});
      } else {
        return bad("'guided_json' must be a JSON schema (an object, or a string holding one)", current);
      }
      if (auto e = take(json_schema_to_gbnf(schema))) return e;
    }
    if (given("guided_choice")) {
      current = "guided_choice";
      const auto& gc = b["guided_choice"];
      if (!gc.is_array() || gc.empty() || gc.size() > 1024)
        return bad("'guided_choice' must be an array of 1 to 1024 strings", current);
      std::string g = "root ::= ";
      for (size_t i = 0; i < gc.size(); ++i) {
        if (!gc[i].is_string() || gc[i].get<std::string>().empty() || !valid_utf8(gc[i].get<std::string>()))
          return bad("'guided_choice' must hold non-empty UTF-8 strings", current);
        g += (i ? " | " : "") + gbnf_literal(gc[i].get<std::string>());
      }
      if (auto e = take(std::move(g))) return e;
    }
  } catch (const failure& e) {
    return bad(std::string("'") + current + "': " + e.what(), current);
  }
  if (!source) return std::nullopt;
  const status st = out.gen.sampling.set_grammar(std::move(gbnf));
  if (!st.ok()) return bad(std::string("'") + source + "': " + st.message(), source);
  return std::nullopt;
}

// Fields every generation shares: model, limits, sampling, stop, streaming.
std::optional<api_error> parse_common(const json& b, const served_model& m, api_request& out, endpoint ep,
                                      std::string_view raw) {
  if (!b.is_object()) return bad("the body must be a JSON object");
  if (auto e = check_fields(b, ep)) return e;
  // `model` may be left out (one model is served, as llama-server and vLLM allow); given, it
  // must name the served one.
  if (b.contains("model") && !b["model"].is_null()) {
    if (!b["model"].is_string()) return bad("'model' must be a string", "model");
    const std::string name = b["model"].get<std::string>();
    if (name != m.id) return bad("unknown model '" + name + "'; this server serves '" + m.id + "'", "model");
  }
  auto number = [&](const char* key, double lo, double hi, double& v) -> std::optional<api_error> {
    if (!b.contains(key) || b[key].is_null()) return std::nullopt;
    if (!b[key].is_number()) return bad(std::string("'") + key + "' must be a number", key);
    v = b[key].get<double>();
    if (!std::isfinite(v) || v < lo || v > hi)
      return bad(std::string("'") + key + "' must be between " + json(lo).dump() + " and " + json(hi).dump(), key);
    return std::nullopt;
  };
  // Defaults: legacy completions 16 (OpenAI's), the WebSocket protocol 64, chat until the
  // model stops or the context is full (as OpenAI, vLLM and llama-server).
  double max_tokens = ep == endpoint::completions ? 16 : ep == endpoint::websocket ? 64 : m.context_length;
  const char* max_key = b.contains("max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  if (auto e = number(max_key, 1, m.context_length, max_tokens)) return e;
  if (b.contains(max_key) && b[max_key].is_number() && !b[max_key].is_number_integer())
    return bad(std::string("'") + max_key + "' must be an integer", max_key);
  out.gen.max_tokens = int32_t(max_tokens);

  double temperature = m.defaults.temperature, top_p = m.defaults.top_p, top_k = m.defaults.top_k, seed = -1;
  if (auto e = number("temperature", 0, 2, temperature)) return e;
  if (auto e = number("top_p", 0, 1, top_p)) return e;
  if (auto e = number("top_k", 0, 1 << 20, top_k)) return e;
  if (auto e = number("seed", 0, 9007199254740991.0, seed)) return e;
  if (top_p <= 0) return bad("'top_p' must be greater than 0", "top_p");
  out.gen.sampling.temperature = float(temperature);
  out.gen.sampling.top_p = float(top_p);
  out.gen.sampling.top_k = int32_t(top_k);
  out.gen.sampling.seed = seed >= 0 ? uint64_t(seed) : std::random_device{}();
  if (b.contains("n") && !b["n"].is_null()) {
    const auto& n = b["n"];
    if (ep == endpoint::websocket && !(n.is_number_integer() && n.get<int64_t>() == 1))
      return bad("'n' must be 1 on the WebSocket protocol (send one frame per answer)", "n");
    if (!n.is_number_integer() || n.get<int64_t>() < 1 || n.get<int64_t>() > 16)
      return bad("'n' must be an integer from 1 to 16", "n");
    out.n = int32_t(n.get<int64_t>());
  }
  // best_of (OpenAI's legacy completions, vLLM's on both): that many choices generated, the n
  // with the highest mean log-probability per token returned. Not streamed (OpenAI's rule).
  out.best_of = out.n;
  if (b.contains("best_of") && !b["best_of"].is_null()) {
    const auto& bo = b["best_of"];
    if (!bo.is_number_integer() || bo.get<int64_t>() < out.n || bo.get<int64_t>() > 16)
      return bad("'best_of' must be an integer from 'n' (" + std::to_string(out.n) + ") to 16", "best_of");
    out.best_of = int32_t(bo.get<int64_t>());
    if (ep == endpoint::websocket && out.best_of > 1)
      return bad("'best_of' must be 1 on the WebSocket protocol", "best_of");
    if (out.best_of > out.n && b.contains("stream") && b["stream"].is_boolean() && b["stream"].get<bool>())
      return bad("'best_of' above 'n' cannot be streamed (the best are known at the end)", "best_of");
  }

  if (b.contains("stop") && !b["stop"].is_null()) {
    const auto& s = b["stop"];
    if (s.is_string()) {
      out.stop.push_back(s.get<std::string>());
    } else if (s.is_array() && s.size() <= 4) {
      for (const auto& x : s) {
        if (!x.is_string()) return bad("'stop' must be a string or an array of up to 4 strings", "stop");
        out.stop.push_back(x.get<std::string>());
      }
    } else {
      return bad("'stop' must be a string or an array of up to 4 strings", "stop");
    }
  }
  if (b.contains("stream") && !b["stream"].is_null()) {
    if (!b["stream"].is_boolean()) return bad("'stream' must be a boolean", "stream");
    out.stream = b["stream"].get<bool>();
  }
  // vLLM's return_token_ids: the prompt's ids as computed, and each choice's generated ids.
  if (b.contains("return_token_ids") && !b["return_token_ids"].is_null()) {
    if (!b["return_token_ids"].is_boolean()) return bad("'return_token_ids' must be a boolean", "return_token_ids");
    out.return_token_ids = b["return_token_ids"].get<bool>();
    if (out.return_token_ids && out.stream)
      return bad("'return_token_ids' is not supported with 'stream' (yet)", "return_token_ids");
  }
  if (b.contains("stream_options") && !b["stream_options"].is_null()) {
    const auto& so = b["stream_options"];
    if (!so.is_object()) return bad("'stream_options' must be an object", "stream_options");
    for (const auto& [key, v] : so.items())
      if (key != "include_usage" && !is_empty_value(v))
        return bad("'stream_options." + key + "' is not supported by tandem", "stream_options");
    if (so.contains("include_usage")) {
      if (!so["include_usage"].is_boolean())
        return bad("'stream_options.include_usage' must be a boolean", "stream_options");
      out.include_usage = so["include_usage"].get<bool>();
    }
  }
  if (b.contains("ignore_eos") && !b["ignore_eos"].is_null()) {
    if (!b["ignore_eos"].is_boolean()) return bad("'ignore_eos' must be a boolean", "ignore_eos");
    out.gen.ignore_eos = b["ignore_eos"].get<bool>();
  }
  if (b.contains("user") && !b["user"].is_null() && !b["user"].is_string())
    return bad("'user' must be a string", "user");

  // logit_bias: {"token id": bias in [-100, 100]} (OpenAI's form: ids as object keys).
  if (b.contains("logit_bias") && !b["logit_bias"].is_null()) {
    const auto& lb = b["logit_bias"];
    if (!lb.is_object()) return bad("'logit_bias' must be an object of token id -> bias", "logit_bias");
    if (lb.size() > 1024) return bad("'logit_bias' may name at most 1024 tokens", "logit_bias");
    for (const auto& [key, v] : lb.items()) {
      size_t used = 0;
      long long id = -1;
      try {
        id = std::stoll(key, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != key.size() || id < 0 || id >= m.n_vocab)
        return bad(
            "'logit_bias' key '" + key + "' is not a token id of this model (0.." + std::to_string(m.n_vocab - 1) + ")",
            "logit_bias");
      if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < -100 || v.get<double>() > 100)
        return bad("'logit_bias' values must be numbers in [-100, 100]", "logit_bias");
      out.gen.sampling.bias_tokens.push_back(token_id(id));
      out.gen.sampling.bias_values.push_back(v.get<float>());
    }
  }
  // Log-probabilities: completions and the WebSocket protocol take `logprobs: N` (the legacy
  // form), chat `logprobs: true` with `top_logprobs: N`; N in 0..20.
  if (ep == endpoint::chat) {
    bool want = false;
    if (b.contains("logprobs") && !b["logprobs"].is_null()) {
      if (!b["logprobs"].is_boolean()) return bad("'logprobs' must be a boolean (chat)", "logprobs");
      want = b["logprobs"].get<bool>();
    }
    double top = 0;
    if (auto e = number("top_logprobs", 0, 20, top)) return e;
    if (b.contains("top_logprobs") && b["top_logprobs"].is_number() && !b["top_logprobs"].is_number_integer())
      return bad("'top_logprobs' must be an integer", "top_logprobs");
    if (top > 0 && !want) return bad("'top_logprobs' needs 'logprobs': true", "top_logprobs");
    out.gen.sampling.logprobs = want ? int32_t(top) : -1;
  } else if (b.contains("logprobs") && !b["logprobs"].is_null()) {
    const auto& lp = b["logprobs"];
    if (lp.is_boolean() && !lp.get<bool>()) {
      out.gen.sampling.logprobs = -1;
    } else if (!lp.is_number_integer() || lp.get<int64_t>() < 0 || lp.get<int64_t>() > 20) {
      return bad("'logprobs' must be an integer in 0..20 (the most likely tokens listed per token)", "logprobs");
    } else {
      out.gen.sampling.logprobs = int32_t(lp.get<int64_t>());
    }
  }
  double presence = 0, frequency = 0;
  if (auto e = number("presence_penalty", -2, 2, presence)) return e;
  if (auto e = number("frequency_penalty", -2, 2, frequency)) return e;
  out.gen.sampling.presence_penalty = float(presence);
  out.gen.sampling.frequency_penalty = float(frequency);
  double repetition = 1;
  if (auto e = number("repetition_penalty", 0, 2, repetition)) return e;
  if (repetition <= 0) return bad("'repetition_penalty' must be in (0, 2]", "repetition_penalty");
  out.gen.sampling.repetition_penalty = float(repetition);
  double min_tokens = 0;
  if (auto e = number("min_tokens", 0, m.context_length, min_tokens)) return e;
  if (b.contains("min_tokens") && b["min_tokens"].is_number() && !b["min_tokens"].is_number_integer())
    return bad("'min_tokens' must be an integer", "min_tokens");
  out.gen.sampling.min_tokens = int32_t(min_tokens);
  if (b.contains("stop_token_ids") && !b["stop_token_ids"].is_null()) {
    const auto& st = b["stop_token_ids"];
    if (!st.is_array() || st.size() > 64)
      return bad("'stop_token_ids' must be an array of up to 64 token ids", "stop_token_ids");
    for (const auto& x : st) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= m.n_vocab)
        return bad("'stop_token_ids' must hold token ids of this model (0.." + std::to_string(m.n_vocab - 1) + ")",
                   "stop_token_ids");
      out.gen.sampling.stop_tokens.push_back(token_id(x.get<int64_t>()));
    }
  }
  return parse_constraint(b, raw, out);
}

std::optional<api_error> parse_messages(const json& b, const served_model& m, api_request& out) {
  if (!b.contains("messages") || !b["messages"].is_array() || b["messages"].empty())
    return bad("'messages' is required and must be a non-empty array", "messages");
  std::vector<chat_message> msgs;
  for (const auto& x : b["messages"]) {
    if (!x.is_object() || !x.contains("role") || !x["role"].is_string())
      return bad("each message needs a string 'role'", "messages");
    chat_message cm;
    cm.role = x["role"].get<std::string>();
    if (cm.role == "developer") cm.role = "system";
    const auto& c = x.contains("content") ? x["content"] : json();
    if (cm.role == "assistant" && x.contains("tool_calls") && !x["tool_calls"].is_null()) {
      // An earlier call: [{id, type: "function", function: {name, arguments (a JSON string)}}].
      const auto& tc = x["tool_calls"];
      if (!tc.is_array()) return bad("an assistant message's 'tool_calls' must be an array", "messages");
      for (const auto& t : tc)
        if (!t.is_object() || !t.contains("function") || !t["function"].is_object() ||
            !t["function"].contains("name") || !t["function"]["name"].is_string())
          return bad("each of an assistant message's 'tool_calls' needs function.name", "messages");
      cm.tool_calls = nlohmann::ordered_json::parse(tc.dump());
    }
    if (cm.role == "tool") {
      if (x.contains("tool_call_id") && !x["tool_call_id"].is_null()) {
        if (!x["tool_call_id"].is_string()) return bad("a tool message's 'tool_call_id' must be a string", "messages");
        cm.tool_call_id = x["tool_call_id"].get<std::string>();
      }
    }
    if (c.is_null() && cm.tool_calls.is_array()) {
      // content may be null beside tool_calls
    } else if (c.is_string()) {
      cm.content = c.get<std::string>();
    } else if (c.is_array()) {  // content parts: only text is supported
      for (const auto& part : c) {
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
            !part["text"].is_string())
          return bad("only text content parts are supported", "messages");
        cm.content += part["text"].get<std::string>();
      }
    } else {
      return bad("each message needs 'content' (a string or text parts)", "messages");
    }
    if (!valid_utf8(cm.content)) return bad("message content is not valid UTF-8", "messages");
    msgs.push_back(std::move(cm));
  }
  std::string prompt;
  if (!out.tools.is_null() && !m.chat) return bad("this model has no chat template that takes tools", "tools");
  const status st = m.chat ? m.chat->render(msgs, prompt, &out.gen.literal_ranges, out.tools)
                           : render_chat(chat_format::chatml, msgs, prompt);
  if (!st.ok()) return bad(st.message(), "messages");
  out.gen.prompt = std::move(prompt);
  // The template's markers are control tokens (as llama-server and vLLM read them); the same
  // texts inside a message's content are not (literal_ranges), unlike llama-server.
  out.gen.parse_special = true;
  out.chat = true;
  return std::nullopt;
}

// A prompt as text, as a one-element array of text, or as token ids. Text is tokenized as
// llama-server and vLLM tokenize a raw prompt: the model file's specials (BOS only where its
// tokenizer.ggml.add_bos_token asks) and the control tokens written in it as tokens. The body
// may ask otherwise: "add_special_tokens": false (vLLM's name) for none, "parse_special": false
// (llama-server's /tokenize name) for control-token text kept as characters.
std::optional<api_error> parse_prompt(const json& b, const json& p, api_request& out) {
  for (const char* key : {"add_special_tokens", "parse_special"}) {
    if (!b.contains(key) || b[key].is_null()) continue;
    if (!b[key].is_boolean()) return bad(std::string("'") + key + "' must be a boolean", key);
    (key == std::string_view("parse_special") ? out.gen.parse_special : out.gen.add_special) = b[key].get<bool>();
  }
  if (p.is_string()) {
    out.gen.prompt = p.get<std::string>();
  } else if (p.is_array() && p.size() == 1 && p[0].is_string()) {
    out.gen.prompt = p[0].get<std::string>();
  } else if (p.is_array() && !p.empty() &&
             std::all_of(p.begin(), p.end(), [](const json& x) { return x.is_number_integer(); })) {
    for (const auto& x : p) out.gen.prompt_tokens.push_back(token_id(x.get<int64_t>()));
  } else {
    return bad("'prompt' must be a string or an array of token ids (one prompt per request)", "prompt");
  }
  if (!valid_utf8(out.gen.prompt)) return bad("'prompt' is not valid UTF-8", "prompt");
  return std::nullopt;
}

}  // namespace

std::optional<api_error> parse_completion(const json& b, const served_model& m, api_request& out,
                                          std::string_view raw) {
  if (auto e = parse_common(b, m, out, endpoint::completions, raw)) return e;
  if (b.contains("echo") && !b["echo"].is_null()) {
    if (!b["echo"].is_boolean()) return bad("'echo' must be a boolean", "echo");
    out.echo = b["echo"].get<bool>();
    if (out.echo && out.gen.sampling.logprobs >= 0)
      return bad("'echo' with 'logprobs' needs the prompt's log-probabilities, which tandem does not compute yet",
                 "echo");
  }
  if (!b.contains("prompt")) return bad("'prompt' is required", "prompt");
  return parse_prompt(b, b["prompt"], out);
}

// tools, tool_choice, parallel_tool_calls (chat). The template gets the tools; the answer is
// read for calls in the format the template teaches; "required" or a named function force a
// call by the grammar of its arguments' schema.
static std::optional<api_error> parse_tools(const json& b, const served_model& m, api_request& out,
                                            std::string_view raw) {
  auto given = [&](const char* k) { return b.contains(k) && !b[k].is_null(); };
  if (given("parallel_tool_calls")) {
    if (!b["parallel_tool_calls"].is_boolean())
      return bad("'parallel_tool_calls' must be a boolean", "parallel_tool_calls");
    out.parallel_tools = b["parallel_tool_calls"].get<bool>();
  }
  const bool has_tools = given("tools") && !(b["tools"].is_array() && b["tools"].empty());
  if (!has_tools) {
    if (given("tool_choice") && b["tool_choice"] != json("none") && b["tool_choice"] != json("auto"))
      return bad("'tool_choice' needs 'tools'", "tool_choice");
    return std::nullopt;
  }
  if (!b["tools"].is_array() || b["tools"].size() > 128)
    return bad("'tools' must be an array of up to 128 tools", "tools");
  out.tools_format = m.chat ? m.chat->tool_calls_format() : tool_format::none;
  if (out.tools_format == tool_format::none)
    return bad("this model's chat template has no tool-call format tandem reads (hermes <tool_call>, Llama 3 JSON)",
               "tools");
  for (const auto& t : b["tools"]) {
    if (!t.is_object() || t.value("type", "") != "function" || !t.contains("function") || !t["function"].is_object())
      return bad("each tool must be {\"type\": \"function\", \"function\": {...}}", "tools");
    const auto& fn = t["function"];
    const std::string name = fn.contains("name") && fn["name"].is_string() ? fn["name"].get<std::string>() : "";
    const bool ok_name = !name.empty() && name.size() <= 64 && std::all_of(name.begin(), name.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
    });
    if (!ok_name) return bad("a function's 'name' must be 1 to 64 of a-z, A-Z, 0-9, _ and -", "tools");
    if (fn.contains("parameters") && !fn["parameters"].is_null() && !fn["parameters"].is_object())
      return bad("function '" + name + "': 'parameters' must be a JSON schema object", "tools");
    if (std::find(out.tool_names.begin(), out.tool_names.end(), name) != out.tool_names.end())
      return bad("two tools are named '" + name + "'", "tools");
    out.tool_names.push_back(name);
  }
  // In the client's key order: the template prints the schemas (`tool | tojson`).
  auto doc = raw.empty() ? nlohmann::ordered_json::parse(b.dump()) : nlohmann::ordered_json::parse(raw, nullptr, false);
  if (doc.is_discarded()) doc = nlohmann::ordered_json::parse(b.dump());
  out.tools = doc.at("tools");
  std::string choice = "auto";
  std::optional<std::string> only;
  if (given("tool_choice")) {
    const auto& tc = b["tool_choice"];
    if (tc.is_string()) {
      choice = tc.get<std::string>();
      if (choice != "auto" && choice != "none" && choice != "required")
        return bad("'tool_choice' must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", ...}",
                   "tool_choice");
    } else if (tc.is_object() && tc.value("type", "") == "function" && tc.contains("function") &&
               tc["function"].is_object() && tc["function"].contains("name") && tc["function"]["name"].is_string()) {
      choice = "named";
      only = tc["function"]["name"].get<std::string>();
      if (std::find(out.tool_names.begin(), out.tool_names.end(), *only) == out.tool_names.end())
        return bad("'tool_choice' names '" + *only + "', which is not among 'tools'", "tool_choice");
    } else {
      return bad("'tool_choice' must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", ...}",
                 "tool_choice");
    }
  }
  // With "auto" beside a response_format the answer follows that grammar, which has no calls
  // in it: nothing to read.
  out.parse_tools = choice != "none" && !(choice == "auto" && !out.gen.sampling.grammar.empty());
  if (choice == "required" || choice == "named") {
    if (!out.gen.sampling.grammar.empty())
      return bad("'tool_choice' forces a call, and another field constrains the output already", "tool_choice");
    std::string g;
    try {
      g = tool_call_gbnf(out.tools_format, out.tools, only);
    } catch (const failure& e) {
      return bad(std::string("'tools': ") + e.what(), "tools");
    }
    const status st = out.gen.sampling.set_grammar(std::move(g));
    if (!st.ok()) return bad("'tools': " + st.message(), "tools");
  }
  return std::nullopt;
}

std::optional<api_error> parse_chat_completion(const json& b, const served_model& m, api_request& out,
                                               std::string_view raw) {
  if (auto e = parse_common(b, m, out, endpoint::chat, raw)) return e;
  if (auto e = parse_tools(b, m, out, raw)) return e;
  return parse_messages(b, m, out);
}

std::optional<api_error> parse_ws_generate(const json& f, const served_model& m, api_request& out,
                                           std::string_view raw) {
  if (!f.is_object()) return bad("a frame must be a JSON object");
  if (!f.contains("id") || !(f["id"].is_string() || f["id"].is_number_integer()))
    return bad("'id' is required (a string or an integer chosen by the client)", "id");
  out.client_id = f["id"].is_string() ? f["id"].get<std::string>() : std::to_string(f["id"].get<int64_t>());
  if (auto e = parse_common(f, m, out, endpoint::websocket, raw)) return e;
  if (!f.contains("temperature")) out.gen.sampling.temperature = 0.0f;  // greedy unless asked
  if (f.contains("messages")) {
    for (const char* key : {"add_special_tokens", "parse_special"})
      if (f.contains(key) && !f[key].is_null())
        return bad(std::string("'") + key + "' is for a 'prompt'; with 'messages' the chat template decides", key);
    return parse_messages(f, m, out);
  }
  if (!f.contains("prompt")) return bad("'prompt' (text or token ids) or 'messages' is required", "prompt");
  return parse_prompt(f, f["prompt"], out);
}

uint64_t derived_seed(uint64_t seed, int32_t i) {
  if (i == 0) return seed;
  uint64_t z = seed + uint64_t(i) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

api_error error_from(errc code, const std::string& message, double retry_after_ms) {
  api_error e;
  e.message = message;
  e.code = std::string(to_string(code));
  e.retry_after_ms = retry_after_ms;
  switch (code) {
    case errc::overloaded:
      e.http_status = 429;
      e.type = "rate_limit_error";
      break;
    case errc::invalid_argument:
    case errc::context_overflow:
      e.http_status = 400;
      e.type = "invalid_request_error";
      break;
    case errc::worker_failed:
    case errc::shutting_down:
      e.http_status = 503;
      e.type = "server_error";
      break;
    default:
      e.http_status = 500;
      e.type = "server_error";
      break;
  }
  return e;
}

json error_body(const api_error& e) {
  json err = {{"message", e.message},
              {"type", e.type},
              {"param", e.param.empty() ? json() : json(e.param)},
              {"code", e.code.empty() ? json() : json(e.code)}};
  if (e.retry_after_ms > 0) err["retry_after_ms"] = e.retry_after_ms;
  return {{"error", err}};
}

json chat_logprobs_json(const tokenizer& tok, const std::vector<logprob_entry>& entries) {
  json content = json::array();
  for (const auto& e : entries) {
    const std::string b = tok.token_bytes(e.token);
    json top = json::array();
    for (size_t i = 0; i < e.lp.top_ids.size(); ++i) {
      const std::string tb = tok.token_bytes(e.lp.top_ids[i]);
      top.push_back({{"token", printable(tb)}, {"logprob", e.lp.top_logprobs[i]}, {"bytes", bytes_json(tb)}});
    }
    content.push_back(
        {{"token", printable(b)}, {"logprob", e.lp.logprob}, {"bytes", bytes_json(b)}, {"top_logprobs", top}});
  }
  return {{"content", content}};
}

json completion_logprobs_json(const tokenizer& tok, const std::vector<logprob_entry>& entries) {
  json tokens = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
  for (const auto& e : entries) {
    tokens.push_back(printable(tok.token_bytes(e.token)));
    lps.push_back(e.lp.logprob);
    json top = json::object();
    for (size_t i = 0; i < e.lp.top_ids.size(); ++i) {
      const std::string key = printable(tok.token_bytes(e.lp.top_ids[i]));
      if (!top.contains(key)) top[key] = e.lp.top_logprobs[i];  // two tokens of one text: the likelier
    }
    tops.push_back(top);
    offsets.push_back(e.text_offset);
  }
  return {{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

void add_ws_logprobs(json& frame, const tokenizer& tok, const token_logprobs& lp) {
  frame["logprob"] = lp.logprob;
  json top = json::array();
  for (size_t i = 0; i < lp.top_ids.size(); ++i)
    top.push_back({{"token", lp.top_ids[i]},
                   {"text", printable(tok.token_bytes(lp.top_ids[i]))},
                   {"logprob", lp.top_logprobs[i]}});
  frame["top_logprobs"] = top;
}

json usage_json(const metrics::request_timings& t) {
  return {{"prompt_tokens", t.prompt_tokens},
          {"completion_tokens", t.output_tokens},
          {"total_tokens", t.prompt_tokens + t.output_tokens},
          // OpenAI's name for the prompt tokens a prefix cache served.
          {"prompt_tokens_details", {{"cached_tokens", t.cached_tokens}}}};
}

json timings_json(const metrics::request_timings& t) {
  return {{"queue_ms", t.queue_prefill_ms + t.queue_decode_ms},
          {"ttft_ms", t.ttft_ms},
          {"tpot_ms", t.tpot_ms},
          {"prefill_ms", t.prefill_ms},
          {"decode_ms", t.decode_ms},
          {"kv_bytes", t.kv_bytes},
          {"kv_transfer_ms", t.kv_transfer_ms},
          {"handoff_ms", t.handoff_ms},
          {"e2e_ms", t.e2e_ms},
          {"prefill_worker", t.prefill_worker},
          {"decode_worker", t.decode_worker}};
}

void log_request(const request_log& r) {
  const auto& t = r.timings;
  const auto lvl = r.status >= 500 ? oplog::level::warn : oplog::level::info;
  std::string message = r.message.substr(0, 300);
  if (r.id == 0) {  // refused before it reached the pipeline
    oplog::event(lvl, "request",
                 {{"endpoint", r.endpoint},
                  {"protocol", r.protocol},
                  {"status", r.status},
                  {"error", r.error},
                  {"message", message}});
    return;
  }
  if (!r.error.empty()) {
    oplog::event(lvl, "request",
                 {{"id", r.id},
                  {"ref", r.ref},
                  {"endpoint", r.endpoint},
                  {"protocol", r.protocol},
                  {"status", r.status},
                  {"prompt_tokens", t.prompt_tokens},
                  {"output_tokens", r.output_tokens},
                  {"e2e_ms", t.e2e_ms},
                  {"prefill_worker", t.prefill_worker},
                  {"decode_worker", t.decode_worker},
                  {"error", r.error},
                  {"message", message}});
    return;
  }
  oplog::event(lvl, "request",
               {{"id", r.id},
                {"ref", r.ref},
                {"endpoint", r.endpoint},
                {"protocol", r.protocol},
                {"status", r.status},
                {"prompt_tokens", t.prompt_tokens},
                {"cached_tokens", t.cached_tokens},
                {"output_tokens", r.output_tokens},
                {"queue_ms", t.queue_prefill_ms + t.queue_decode_ms},
                {"ttft_ms", t.ttft_ms},
                {"tpot_ms", t.tpot_ms},
                {"e2e_ms", t.e2e_ms},
                {"prefill_worker", t.prefill_worker},
                {"decode_worker", t.decode_worker},
                {"kv_bytes", t.kv_bytes},
                {"finish", r.finish}});
}

}  // namespace tandem::server
