#pragma once
// Chat messages -> one prompt string. A GGUF file may carry a Jinja template in
// `tokenizer.chat_template`; rather than run Jinja, the template is recognised by the markers
// of the common families (as llama.cpp does) and rendered by hand. Files without a template,
// or with one not recognised, use ChatML, documented in docs/protocol.md.
#include <string>
#include <vector>

#include "runtime/errors.h"

namespace tandem {

struct chat_message {
  std::string role;     // "system", "user", "assistant"
  std::string content;
};

enum class chat_format : uint8_t { chatml, llama2, llama3, zephyr, gemma };
std::string_view to_string(chat_format f);

// Picks the family of a template text ("" -> chatml).
chat_format detect_chat_format(const std::string& jinja_template);

// The prompt for `messages`, ending where the assistant's answer starts. invalid_argument for
// an empty list or an unknown role.
status render_chat(chat_format f, const std::vector<chat_message>& messages, std::string& out);

}  // namespace tandem
