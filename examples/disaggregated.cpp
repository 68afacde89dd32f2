// 1 prefill + 2 decode workers, 16 concurrent requests of different prompt lengths; prints each
// request's queue wait, TTFT, TPOT, KV bytes and transfer time.
//   disaggregated [MODEL.gguf]
#include <cstdio>
#include <string>
#include <vector>

#include "actors/pipeline.h"

int main(int argc, char** argv) {
  try {
    tandem::pipeline p(
        {.model = {.path = argc > 1 ? argv[1] : ""},
         .pools = {.mode = tandem::serving_mode::disaggregated, .prefill_workers = 1, .decode_workers = 2}});
    std::vector<tandem::request_handle> hs;
    for (int i = 0; i < 16; ++i) {
      std::string prompt = "Request " + std::to_string(i) + ":";
      for (int k = 0; k < i; ++k) prompt += " and then the story went on";
      hs.push_back(p.submit({.prompt = prompt, .max_tokens = 24, .ignore_eos = true}));
    }
    std::printf("%3s %7s %10s %10s %9s %9s %10s %9s\n", "req", "prompt", "queue ms", "ttft ms", "tpot ms", "tokens",
                "kv bytes", "kv ms");
    for (auto& h : hs) {
      const auto r = h.wait();
      if (r.error != tandem::errc::ok) {
        std::printf("%3llu error: %s\n", (unsigned long long)r.id, r.message.c_str());
        continue;
      }
      const auto& t = r.timings;
      std::printf("%3llu %7d %10.2f %10.2f %9.2f %9d %10llu %9.3f\n", (unsigned long long)r.id, t.prompt_tokens,
                  t.queue_prefill_ms + t.queue_decode_ms, t.ttft_ms, t.tpot_ms, t.output_tokens,
                  (unsigned long long)t.kv_bytes, t.kv_transfer_ms);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
