// The built-in default model's bytes, linked into the binary so that `tandem serve` with no
// --model answers with readable text on any machine: stories260K (Karpathy's tinyllamas, MIT; a
// 260 K-parameter Llama trained on TinyStories), the same file the tests use
// (tests/data/stories260K.gguf). The assembler's .incbin copies it in at build time.
#include "runtime/model/default_model.h"

#ifndef TANDEM_DEFAULT_MODEL_FILE
#error "TANDEM_DEFAULT_MODEL_FILE (the GGUF to embed) must be defined by the build"
#endif

#define TANDEM_STR2(x) #x
#define TANDEM_STR(x) TANDEM_STR2(x)

// .rodata, 32-byte aligned (GGUF data is read in place only after a copy to disk, but aligned
// bytes cost nothing); start and end symbols bracket the file.
asm(".section .rodata\n"
    ".balign 32\n"
    "tandem_default_model_begin:\n"
    ".incbin \"" TANDEM_STR(TANDEM_DEFAULT_MODEL_FILE) "\"\n"
    "tandem_default_model_end:\n"
    ".previous\n");

extern "C" const unsigned char tandem_default_model_begin[];
extern "C" const unsigned char tandem_default_model_end[];

namespace tandem {

std::span<const unsigned char> default_model_bytes() {
  return {tandem_default_model_begin, size_t(tandem_default_model_end - tandem_default_model_begin)};
}

}  // namespace tandem
