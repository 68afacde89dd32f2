#pragma once
// The built-in default model (stories260K, embedded at build time: runtime/model/default_model.cpp).
#include <span>

namespace tandem {

// The GGUF file's bytes.
std::span<const unsigned char> default_model_bytes();
// The name it is written under in the cache directory, and the id it is served as.
inline constexpr const char* default_model_name = "stories260K";
// Its chat template (the file has none, and ChatML's markers are not in its 512-token
// vocabulary, so they would be spelled out as characters): a story model does not chat, so the
// user's words open a story, each message on a line, and the model tells it.
inline constexpr const char* default_model_chat_template =
    "{% for m in messages %}{% if m['role'] == 'user' %}{{ m['content'] | trim }}\n{% endif %}{% endfor %}";

}  // namespace tandem
