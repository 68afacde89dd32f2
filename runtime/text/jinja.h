#pragma once
// A Jinja2 interpreter for the chat templates that GGUF files carry in `tokenizer.chat_template`.
//
// It covers the part of the Jinja2 language that Hugging Face chat templates use (statements,
// expressions, filters, tests, Python-style methods on strings/lists/dicts) with the settings that
// transformers renders them with: trim_blocks=True, lstrip_blocks=True, the loopcontrols
// extension, and the globals raise_exception(msg) and strftime_now(fmt). Output is meant to be
// byte-identical to what llama.cpp and transformers produce for the same context.
//
// Templates come from untrusted files: parsing and rendering are bounded (nesting depth, output
// size, work steps) and every failure is a tandem::failure(errc::invalid_argument, ...), never a
// crash or an endless loop.
#include <cstddef>
#include <cstdint>
#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "runtime/errors.h"

namespace tandem::jinja {

// Limits for one render. The defaults suit chat templates by orders of magnitude.
struct render_options {
  // The time strftime_now() formats (local time, as transformers and llama.cpp do). Unset: now.
  // Set it to make renderings of date-dependent templates (Llama 3.2) deterministic.
  std::optional<std::time_t> now;
  size_t max_output_bytes = size_t{16} << 20;  // the rendered text, and any one string built
  uint64_t max_steps = 10'000'000;  // statements, loop iterations and calls, in total
};

namespace detail {
struct program_ast;  // jinja_internal.h
}

// A parsed template. Cheap to copy (the syntax tree is shared and immutable); render() is const
// and may run on several threads at once.
class template_ {
 public:
  // Parse errors throw tandem::failure(errc::invalid_argument, "template line L col C: ...").
  static template_ parse(std::string_view source);

  // Renders with `context`, a JSON object whose keys become the template's variables (messages,
  // add_generation_prompt, bos_token, eos_token, tools, ...). Runtime errors (raise_exception, type
  // errors, unknown filter, limits) throw tandem::failure(errc::invalid_argument, ...); the message
  // of raise_exception(msg) is "template raised an exception: " followed by msg verbatim.
  //
  // Object keys keep their order with ordered_json (as Python dicts do, which `|tojson` and
  // `.items()` show); plain nlohmann::json has sorted its keys already.
  std::string render(const nlohmann::ordered_json& context, const render_options& options = {}) const;
  std::string render(const nlohmann::json& context, const render_options& options = {}) const;

 private:
  std::shared_ptr<const detail::program_ast> ast_;
};

// The fixed prefix of raise_exception()'s failure message.
inline constexpr std::string_view raised_prefix = "template raised an exception: ";

}  // namespace tandem::jinja
