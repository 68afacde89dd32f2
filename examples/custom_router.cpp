// A different placement policy plugged into the router: decode requests go to the worker with
// the fewest running sequences (instead of the most free KV blocks), and prefill always to
// worker 0 while it has room. Policies are plain classes (runtime/scheduler/policy.h).
//   custom_router [MODEL.gguf]
#include <cstdio>
#include <vector>

#include "actors/pipeline.h"

namespace {

class least_busy_decode : public tandem::decode_placement {
 public:
  int32_t choose(std::span<const tandem::decode_worker_load> workers, int32_t blocks_needed) const override {
    int32_t best = -1;
    for (size_t i = 0; i < workers.size(); ++i) {
      const auto& w = workers[i];
      if (!w.alive || w.free_blocks < blocks_needed || (w.max_batch > 0 && w.batch_size >= w.max_batch)) continue;
      if (best < 0 || w.batch_size < workers[size_t(best)].batch_size) best = int32_t(i);
    }
    return best;
  }
};

class first_fit_prefill : public tandem::prefill_placement {
 public:
  int32_t choose(std::span<const tandem::prefill_worker_load> workers, int32_t) const override {
    for (size_t i = 0; i < workers.size(); ++i)
      if (workers[i].alive) return int32_t(i);
    return -1;
  }
};

}  // namespace

int main(int argc, char** argv) {
  try {
    tandem::pipeline p({.model = {.path = argc > 1 ? argv[1] : ""},
                        .pools = {.prefill_workers = 2, .decode_workers = 2},
                        .scheduling = {.prefill_policy = std::make_shared<first_fit_prefill>(),
                                       .decode_policy = std::make_shared<least_busy_decode>()}});
    std::vector<tandem::request_handle> hs;
    for (int i = 0; i < 8; ++i)
      hs.push_back(p.submit({.prompt = "Once upon a time", .max_tokens = 16, .ignore_eos = true}));
    int ok = 0;
    for (auto& h : hs) ok += h.wait().error == tandem::errc::ok;
    std::printf("%d of %zu requests finished with the custom router\n", ok, hs.size());
    for (const auto& w : p.stats().workers)
      std::printf("  %-12s %llu steps\n", w.name.c_str(), (unsigned long long)w.steps);
    return ok == int(hs.size()) ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
