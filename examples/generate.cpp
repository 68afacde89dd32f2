// The smallest program: a disaggregated pipeline (1 prefill + 1 decode worker) on a model,
// one request, its text streamed as it arrives.
//   generate [MODEL.gguf] [PROMPT]     (no model: the built-in default)
#include <cstdio>
#include <iostream>

#include "actors/pipeline.h"

int main(int argc, char** argv) {
  try {
    tandem::pipeline p({.model = {.path = argc > 1 ? argv[1] : ""}});
    auto h = p.submit({.prompt = argc > 2 ? argv[2] : "Once upon a time", .max_tokens = 48});
    for (tandem::request_event ev; h.next(ev);) {
      if (ev.kind == tandem::event_kind::token) std::cout << ev.text << std::flush;
      if (ev.kind == tandem::event_kind::error) std::cerr << "error: " << ev.message << "\n";
    }
    std::cout << "\n";
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
