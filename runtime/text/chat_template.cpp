#include "runtime/text/chat_template.h"

#include <nlohmann/json.hpp>

#include <algorithm>

namespace tandem {

std::string_view to_string(chat_format f) {
  switch (f) {
    case chat_format::chatml: return "chatml";
    case chat_format::llama2: return "llama2";
    case chat_format::llama3: return "llama3";
    case chat_format::zephyr: return "zephyr";
    case chat_format::gemma: return "gemma";
  }
  return "?";
}

chat_format detect_chat_format(const std::string& t) {
  auto has = [&](const char* s) { return t.find(s) != std::string::npos; };
  if (has("<|start_header_id|>")) return chat_format::llama3;
  if (has("<start_of_turn>")) return chat_format::gemma;
  if (has("[INST]")) return chat_format::llama2;
  if (has("<|user|>")) return chat_format::zephyr;
  return chat_format::chatml;  // also "<|im_start|>" and no template at all
}

status render_chat(chat_format f, const std::vector<chat_message>& messages, std::string& out) {
  out.clear();
  if (messages.empty()) return {errc::invalid_argument, "messages must not be empty"};
  for (const auto& m : messages)
    if (m.role != "system" && m.role != "user" && m.role != "assistant")
      return {errc::invalid_argument, "unknown message role '" + m.role + "' (system, user, assistant)"};
  switch (f) {
    case chat_format::chatml:
      for (const auto& m : messages) out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
      out += "<|im_start|>assistant\n";
      return {};
    case chat_format::llama3:
      for (const auto& m : messages)
        out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + m.content + "<|eot_id|>";
      out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      return {};
    case chat_format::zephyr:
      for (const auto& m : messages) out += "<|" + m.role + "|>\n" + m.content + "</s>\n";
      out += "<|assistant|>\n";
      return {};
    case chat_format::gemma: {
      std::string pending_system;
      for (const auto& m : messages) {
        if (m.role == "system") {  // gemma has no system turn: it leads the next user turn
          pending_system += m.content + "\n\n";
          continue;
        }
        const std::string role = m.role == "assistant" ? "model" : "user";
        out += "<start_of_turn>" + role + "\n" + (role == "user" ? pending_system : "") + m.content + "<end_of_turn>\n";
        if (role == "user") pending_system.clear();
      }
      out += "<start_of_turn>model\n";
      return {};
    }
    case chat_format::llama2: {
      std::string system;
      for (const auto& m : messages) {
        if (m.role == "system") {
          system += m.content;
        } else if (m.role == "user") {
          out += "[INST] ";
          if (!system.empty()) out += "<<SYS>>\n" + system + "\n<</SYS>>\n\n";
          system.clear();
          out += m.content + " [/INST]";
        } else {
          out += " " + m.content + " ";
        }
      }
      return {};
    }
  }
  return {errc::invalid_argument, "unknown chat format"};
}

chat_template::chat_template(const std::string& source, std::string bos_token, std::string eos_token,
                             bool vocab_adds_bos, std::vector<std::string> control_tokens)
    : bos_(std::move(bos_token)),
      eos_(std::move(eos_token)),
      strip_bos_(vocab_adds_bos),
      controls_(std::move(control_tokens)) {
  std::erase(controls_, std::string());
  fallback_ = detect_chat_format(source);
  tools_ = detect_tool_format(source);
  if (source.empty()) {
    fallback_reason_ = "the model has no chat template";
    return;
  }
  try {
    jinja_ = jinja::template_::parse(source);
  } catch (const failure& e) {
    fallback_reason_ = std::string("its chat template does not parse (") + e.what() + ")";
  }
}

chat_template chat_template::for_vocab(const std::string& source, const tokenizer& tok) {
  auto text_of = [&](token_id id) { return id >= 0 ? tok.token_text(id) : std::string(); };
  std::vector<std::string> controls;
  for (token_id i = 0; i < tok.n_vocab(); ++i)
    if (tok.token_type(i) == 3) controls.push_back(tok.token_text(i));  // 3: control
  chat_template t(source, text_of(tok.bos()), text_of(tok.eos()), tok.file_specials().bos, std::move(controls));
  t.strip_eos_ = tok.file_specials().eos;
  return t;
}

std::string chat_template::describe() const {
  return jinja_ ? "jinja" : std::string(to_string(fallback_)) + " (" + fallback_reason_ + ")";
}

namespace {

// U+FFFE, a noncharacter: marks, inside a message's content, the first byte of a control-token
// text, so that after rendering (templates trim, split and concatenate content freely) its
// position is known. A U+FFFE of the content itself is doubled.
constexpr std::string_view kMark = "\xEF\xBF\xBE";

std::string mark_controls(const std::string& content, const std::vector<std::string>& controls) {
  std::string out;
  out.reserve(content.size());
  for (size_t i = 0; i < content.size();) {
    if (content.compare(i, kMark.size(), kMark) == 0) {
      out.append(kMark).append(kMark);
      i += kMark.size();
      continue;
    }
    const bool starts_control = std::any_of(controls.begin(), controls.end(),
                                            [&](const std::string& c) { return content.compare(i, c.size(), c) == 0; });
    out += content[i++];
    if (starts_control) out.append(kMark);
  }
  return out;
}

// Removes the marks; each marked byte becomes a one-byte literal range.
void unmark(std::string& s, std::vector<tokenizer::byte_range>* literal) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    if (s.compare(i, kMark.size(), kMark) != 0) {
      out += s[i++];
      continue;
    }
    i += kMark.size();
    if (s.compare(i, kMark.size(), kMark) == 0) {
      out.append(kMark);
      i += kMark.size();
    } else if (literal && !out.empty()) {
      literal->push_back({uint32_t(out.size() - 1), uint32_t(out.size())});
    }
  }
  s.swap(out);
}

}  // namespace

status chat_template::render(const std::vector<chat_message>& messages, std::string& out,
                             std::vector<tokenizer::byte_range>* literal, const nlohmann::ordered_json& tools) const {
  out.clear();
  if (literal) literal->clear();
  if (messages.empty()) return {errc::invalid_argument, "messages must not be empty"};
  std::vector<chat_message> marked = messages;
  for (auto& m : marked) m.content = mark_controls(m.content, controls_);
  if (!jinja_) {
    if (status st = render_chat(fallback_, marked, out); !st.ok()) return st;
  } else {
    // The variables transformers and llama.cpp give a chat template.
    nlohmann::ordered_json ctx;
    ctx["messages"] = nlohmann::ordered_json::array();
    for (const auto& m : marked) {
      nlohmann::ordered_json msg = {{"role", m.role}, {"content", m.content}};
      if (m.tool_calls.is_array()) {  // only when present: templates test `'tool_calls' in message`
        msg["tool_calls"] = m.tool_calls;
        for (auto& c : msg["tool_calls"])
          if (c.contains("function") && c["function"].contains("arguments") && c["function"]["arguments"].is_string()) {
            auto args = nlohmann::ordered_json::parse(c["function"]["arguments"].get<std::string>(), nullptr, false);
            if (!args.is_discarded()) c["function"]["arguments"] = std::move(args);
          }
      }
      if (!m.tool_call_id.empty()) msg["tool_call_id"] = m.tool_call_id;
      ctx["messages"].push_back(std::move(msg));
    }
    if (!tools.is_null()) ctx["tools"] = tools;
    ctx["add_generation_prompt"] = true;
    ctx["bos_token"] = bos_;
    ctx["eos_token"] = eos_;
    try {
      out = jinja_->render(ctx);
    } catch (const failure& e) {
      return {errc::invalid_argument, std::string("chat template: ") + e.what()};
    }
  }
  if (strip_bos_ && !bos_.empty() && out.rfind(bos_, 0) == 0) out.erase(0, bos_.size());
  // And a vocabulary that appends EOS itself loses a rendering's last eos_token (llama.cpp's
  // rule; no real template ends its generation prompt with one).
  if (strip_eos_ && !eos_.empty() && out.size() >= eos_.size() &&
      out.compare(out.size() - eos_.size(), eos_.size(), eos_) == 0)
    out.erase(out.size() - eos_.size());
  unmark(out, literal);
  return {};
}

}  // namespace tandem
