#pragma once
// The built-in default model (stories260K, embedded at build time: runtime/default_model.cpp).
#include <span>

namespace tandem {

// The GGUF file's bytes.
std::span<const unsigned char> default_model_bytes();
// The name it is written under in the cache directory, and the id it is served as.
inline constexpr const char* default_model_name = "stories260K";

}  // namespace tandem
