#pragma once
// Chat messages -> one prompt string. The model's own Jinja template (GGUF
// `tokenizer.chat_template`, or a file given with --chat-template) is rendered by tandem's
// Jinja interpreter (runtime/text/jinja.h) as transformers and llama.cpp render it. Files without a
// template, or with one the interpreter cannot parse, fall back to a hand-written format picked
// by the template's markers (ChatML when there is none), documented in docs/protocol.md.
#include <optional>
#include <string>
#include <vector>

#include "runtime/errors.h"
#include "runtime/text/jinja.h"
#include "runtime/tokenizer/tokenizer.h"
#include "runtime/structured/tool_calls.h"

namespace tandem {

struct chat_message {
  std::string role;  // "system", "user", "assistant" (and "tool" for templates that take it)
  std::string content;
  // An assistant's earlier calls (OpenAI's [{id, type, function: {name, arguments}}], the
  // arguments given to the template as objects, as transformers does); null when none.
  nlohmann::ordered_json tool_calls;
  std::string tool_call_id;  // a "tool" message: the call it answers
};

enum class chat_format : uint8_t { chatml, llama2, llama3, zephyr, gemma };
std::string_view to_string(chat_format f);

// Picks the family of a template text ("" -> chatml).
chat_format detect_chat_format(const std::string& jinja_template);

// The prompt for `messages`, ending where the assistant's answer starts. invalid_argument for
// an empty list or an unknown role.
status render_chat(chat_format f, const std::vector<chat_message>& messages, std::string& out);

class chat_template {
 public:
  // `source`: the Jinja text ("" for none). bos/eos: the vocabulary's token texts, which
  // templates print as bos_token / eos_token. vocab_adds_bos: the tokenizer puts BOS in front
  // itself, so a rendering that starts with bos_token loses it (llama.cpp does the same: one
  // BOS, not two). A template that does not parse falls back to the format its markers
  // suggest; fallback_reason() then says why.
  // control_tokens: the vocabulary's control-token texts; where a message's content holds one,
  // render() reports its bytes as literal, so that the user's "<|im_start|>" is not the token.
  chat_template(const std::string& source, std::string bos_token, std::string eos_token, bool vocab_adds_bos,
                std::vector<std::string> control_tokens = {});

  // The template for a vocabulary: its BOS/EOS texts, whether it adds BOS, its control tokens.
  static chat_template for_vocab(const std::string& source, const tokenizer& tok);

  // What renders: "jinja" (the template) or the fallback format's name.
  std::string describe() const;
  bool uses_jinja() const { return jinja_.has_value(); }
  const std::string& fallback_reason() const { return fallback_reason_; }

  // The prompt, ending where the assistant's answer starts (add_generation_prompt). Errors
  // (invalid_argument): an empty list, a role the fallback format lacks, or the template's own
  // raise_exception (its message passed through).
  // `literal` (if given) gets the byte ranges of `out` that copy control-token text from the
  // messages: tokenizer::encode(out, tok.file_specials(), true, literal) keeps them characters.
  // `tools` (OpenAI's list of functions; null: none) is the template's `tools` variable.
  status render(const std::vector<chat_message>& messages, std::string& out,
                std::vector<tokenizer::byte_range>* literal = nullptr,
                const nlohmann::ordered_json& tools = nullptr) const;
  // The call format the template teaches (none without a Jinja template).
  tool_format tool_calls_format() const { return jinja_ ? tools_ : tool_format::none; }

 private:
  std::optional<jinja::template_> jinja_;
  chat_format fallback_ = chat_format::chatml;
  std::string fallback_reason_;
  std::string bos_, eos_;
  bool strip_bos_ = false;
  bool strip_eos_ = false;  // for_vocab: the vocabulary appends EOS (tokenizer.ggml.add_eos_token)
  tool_format tools_ = tool_format::none;
  std::vector<std::string> controls_;
};

}  // namespace tandem
