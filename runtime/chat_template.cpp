#include "runtime/chat_template.h"

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

}  // namespace tandem
