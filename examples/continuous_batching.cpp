// Library example: one engine, three prompts of different lengths, prefilled in chunks and then
// decoded together one token per step (continuous batching) — the loop a decode worker runs.
//   continuous_batching MODEL.gguf
#include <cstdio>
#include <string>
#include <vector>

#include "runtime/engine/engine.h"
#include "runtime/engine/sampler.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s MODEL.gguf\n", argv[0]);
    return 2;
  }
  try {
    auto m = tandem::model::load(argv[1]);
    tandem::engine eng(m, tandem::engine_options{.n_threads = 2});
    const std::vector<std::string> prompts = {"Once upon a time", "The cat", "Lily and her mom went to the park"};
    std::vector<tandem::seq_id> seqs;
    std::vector<tandem::token_id> next;
    std::vector<std::string> texts(prompts.size());
    std::vector<float> logits;
    for (const auto& p : prompts) {
      const auto ids = m->tok().encode(p, true);
      seqs.push_back(eng.create_sequence());
      for (size_t i = 0; i < ids.size(); i += 4)  // chunked prefill, 4 tokens at a time
        if (auto st = eng.prefill(seqs.back(), std::span(ids).subspan(i, std::min<size_t>(4, ids.size() - i)), logits);
            !st.ok())
          throw tandem::failure(st.code(), st.message());
      next.push_back(tandem::sample(logits, {.temperature = 0.0f}, 0));
    }
    for (uint64_t step = 1; step <= 24; ++step) {
      for (size_t i = 0; i < seqs.size(); ++i) texts[i] += m->tok().token_bytes(next[i]);
      if (auto st = eng.decode(seqs, next, logits); !st.ok()) throw tandem::failure(st.code(), st.message());
      for (size_t i = 0; i < seqs.size(); ++i)
        next[i] =
            tandem::sample(std::span(logits).subspan(i * size_t(m->config().n_vocab), size_t(m->config().n_vocab)),
                           {.temperature = 0.0f}, step);
    }
    for (size_t i = 0; i < prompts.size(); ++i) std::printf("[%s]%s\n", prompts[i].c_str(), texts[i].c_str());
    std::printf("KV blocks in use: %d of %d\n", eng.kv_pool().total_blocks() - eng.kv_pool().free_blocks(),
                eng.kv_pool().total_blocks());
  } catch (const tandem::failure& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
