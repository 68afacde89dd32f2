// A router and its workers as separate members, composed from the library: the pipeline
// publishes its cluster port, one prefill and one decode node join it (here threads of this
// process, each with its own actor system, as separate processes or hosts would), and
// requests then run through the router with their KV moving over the channel between nodes.
// Prints each request's output next to the same request run by one engine process alone.
//   cluster [MODEL.gguf]
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "actors/node.h"
#include "actors/pipeline.h"

int main(int argc, char** argv) {
  try {
    const std::string model = argc > 1 ? argv[1] : "";
    tandem::pipeline router({.model = {.path = model}, .cluster = {.port = 0}});  // 0: any free port
    std::printf("router: nodes join at 127.0.0.1:%u\n", router.cluster_port());

    // On other hosts: tandem serve --role prefill|decode --join HOST:PORT (this is the same).
    tandem::node prefill({.role = tandem::node_role::prefill, .join_port = router.cluster_port(), .model_path = model});
    tandem::node decode({.role = tandem::node_role::decode,
                         .join_port = router.cluster_port(),
                         .model_path = model,
                         .kv_listen_host = "127.0.0.1"});
    std::thread p([&] { prefill.run(); }), d([&] { decode.run(); });

    tandem::pipeline alone({.model = {.path = model}});  // the reference: one process
    int differ = 0;
    for (int i = 0; i < 4; ++i) {
      const tandem::generation_request req{
          .prompt = "Request " + std::to_string(i) + ": once upon a time", .max_tokens = 16, .ignore_eos = true};
      auto got = router.submit(req).wait();
      auto want = alone.submit(req).wait();
      if (got.error != tandem::errc::ok) {
        std::printf("%d error: %s\n", i, got.message.c_str());
        ++differ;
        continue;
      }
      differ += got.tokens != want.tokens;
      std::printf("%d %s (kv %llu bytes in %.2f ms)%s\n", i, got.text.c_str(), (unsigned long long)got.timings.kv_bytes,
                  got.timings.kv_transfer_ms, got.tokens == want.tokens ? "" : "  <- differs from one process");
    }
    std::printf("nodes: %s\n", router.cluster_nodes().c_str());
    prefill.stop();
    decode.stop();
    p.join();
    d.join();
    return differ == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
