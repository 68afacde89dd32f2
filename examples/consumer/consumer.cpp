// Composes a disaggregated pipeline (1 prefill, 2 decode workers) on the built-in model or
// MODEL.gguf, serves a request, kills a decode worker while four more run, and checks that
// every request still gets the same greedy answer. Exit 0 when it does.
//   consumer [MODEL.gguf]
#include <tandem/tandem.h>

#include <cstdio>
#include <string>
#include <vector>

static_assert(TANDEM_VERSION_MAJOR == 0 && TANDEM_VERSION_MINOR >= 2, "built against tandem 0.2 or later");

int main(int argc, char** argv) {
  try {
    std::printf("tandem %s (headers %s)\n", tandem::version(), TANDEM_VERSION);
    tandem::pipeline p(
        {.model = {.path = argc > 1 ? argv[1] : ""},
         .pools = {.mode = tandem::serving_mode::disaggregated, .prefill_workers = 1, .decode_workers = 2}});
    const tandem::generation_request req{.prompt = "Once upon a time", .max_tokens = 24, .ignore_eos = true};
    const auto first = p.submit(req).wait();
    if (first.error != tandem::errc::ok) {
      std::fprintf(stderr, "request failed: %s\n", first.message.c_str());
      return 1;
    }
    std::printf("answer: %s\n", first.text.c_str());

    // A worker dies mid-stream: its requests are recovered (re-prefilled elsewhere), not lost,
    // and greedy decoding makes the same tokens again.
    std::vector<tandem::request_handle> hs;
    for (int i = 0; i < 4; ++i) hs.push_back(p.submit(req));
    const std::string killed = p.kill(tandem::actor_kind::decode, 0);
    std::printf("killed: %s\n", killed.empty() ? "(none alive)" : killed.c_str());
    int wrong = 0;
    for (auto& h : hs) {
      const auto r = h.wait();
      if (r.error != tandem::errc::ok || r.tokens != first.tokens) {
        std::fprintf(stderr, "request %llu: %s\n", (unsigned long long)r.id,
                     r.error != tandem::errc::ok ? r.message.c_str() : "different tokens after the kill");
        ++wrong;
      }
    }
    if (wrong) return 1;
    std::printf("all %zu requests after the kill gave the same answer\n", hs.size());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
