// Prefix reuse in one engine: content keys, reuse that gives bitwise the same logits as
// computing the prefix, and eviction that never takes a block a sequence uses.
#include <gtest/gtest.h>

#include <filesystem>

#include "runtime/engine/engine.h"
#include "runtime/kv/prefix_cache.h"
#include "runtime/engine/sampler.h"
#include "runtime/model/synth.h"

using namespace tandem;
namespace fs = std::filesystem;

namespace {

std::shared_ptr<const model> synth(kernels::dtype t, uint64_t seed = 7) {
  const auto dir = fs::temp_directory_path() / "tandem-test-models";
  fs::create_directories(dir);
  const auto path = dir / ("prefix-tiny-" + std::string(kernels::to_string(t)) + "-" + std::to_string(seed) + ".gguf");
  if (!fs::exists(path)) synthesize_model(find_synth_preset("tiny"), t, path.string(), seed);
  return model::load(path.string());
}

std::vector<token_id> tokens(int n, int vocab, int salt) {
  std::vector<token_id> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[size_t(i)] = token_id((i * 37 + salt * 101 + 5) % vocab);
  return t;
}

token_id argmax(const std::vector<float>& x) { return token_id(std::max_element(x.begin(), x.end()) - x.begin()); }

// Greedy continuation of `prompt` by n tokens on `eng` (a fresh sequence, attached to the
// cache first when `reuse`), with the logits of every step.
struct run {
  std::vector<token_id> out;
  std::vector<std::vector<float>> logits;
  int32_t reused = 0;
};
run generate(engine& eng, const std::vector<token_id>& prompt, int n, bool reuse, bool keep = false) {
  run r;
  const seq_id s = eng.create_sequence();
  if (reuse) r.reused = eng.attach_prefix(s, prompt);
  std::vector<float> l;
  EXPECT_TRUE(eng.prefill(s, std::span(prompt).subspan(size_t(r.reused)), l).ok());
  for (int i = 0; i < n; ++i) {
    r.logits.push_back(l);
    const token_id t = argmax(l);
    r.out.push_back(t);
    EXPECT_TRUE(eng.decode(std::span(&s, 1), std::span(&t, 1), l).ok());
  }
  if (!keep) {
    EXPECT_TRUE(eng.free_sequence(s).ok());
  }
  return r;
}

}  // namespace

TEST(PrefixKeys, ChainedSaltedAndSensitiveToEveryToken) {
  const kv_layout lay{2, 2, 16, 16};
  const uint64_t salt = prefix_salt(1234, lay, kernels::dtype::f32, 0);
  const auto t = tokens(70, 500, 1);
  const auto k = block_keys(salt, t, 16);
  ASSERT_EQ(k.size(), 4u);  // full blocks only: 70 tokens hold 4
  EXPECT_EQ(k, block_keys(salt, t, 16));
  // One token changed in block 2: blocks 0-1 keep their keys, 2 and 3 change.
  auto t2 = t;
  t2[40] += 1;
  const auto k2 = block_keys(salt, t2, 16);
  EXPECT_EQ(k2[0], k[0]);
  EXPECT_EQ(k2[1], k[1]);
  EXPECT_NE(k2[2], k[2]);
  EXPECT_NE(k2[3], k[3]);  // a key names the whole prefix, not only its own block
  // Same block contents after a different prefix: a different key.
  auto t3 = t;
  t3[0] += 1;
  EXPECT_NE(block_keys(salt, t3, 16)[3], k[3]);
  // Another model, layout, KV type or matmul mode: no key in common.
  for (uint64_t other :
       {prefix_salt(1235, lay, kernels::dtype::f32, 0),
        prefix_salt(1234, kv_layout{2, 2, 16, 32}, kernels::dtype::f32, 0),
        prefix_salt(1234, lay, kernels::dtype::f16, 0), prefix_salt(1234, lay, kernels::dtype::f32, 1)}) {
    EXPECT_NE(other, salt);
    const auto ko = block_keys(other, t, 16);
    for (size_t i = 0; i < ko.size(); ++i) EXPECT_NE(ko[i], k[i]);
  }
}

// A prompt's last token is always computed (its logits give the first output token), so the
// blocks it can reuse are the full blocks before it; prompt_block_keys keys exactly those.
TEST(PrefixKeys, ReusablePromptBlocksStopBeforeTheLastToken) {
  struct row {
    size_t prompt;
    int32_t block_size, blocks;
  };
  for (const row r : {row{0, 16, 0}, row{1, 16, 0}, row{16, 16, 0}, row{17, 16, 1}, row{32, 16, 1}, row{33, 16, 2},
                      row{70, 16, 4}, row{5, 1, 4}, row{40, 0, 0}}) {
    SCOPED_TRACE(testing::Message() << "prompt " << r.prompt << ", block " << r.block_size);
    EXPECT_EQ(reusable_prompt_blocks(r.prompt, r.block_size), r.blocks);
    const auto t = tokens(int(r.prompt), 500, 2);
    EXPECT_EQ(prompt_block_keys(9, t, r.block_size).size(), size_t(r.blocks));
  }
}
TEST(PrefixKeys, EnginesOfDifferentModelsHaveDifferentSalts) {
  auto a = synth(kernels::dtype::f32, 7), b = synth(kernels::dtype::f32, 8), c = synth(kernels::dtype::q8_0, 7);
  engine ea(a, {.n_kv_blocks = 4}), eb(b, {.n_kv_blocks = 4}), ec(c, {.n_kv_blocks = 4});
  engine fast(a, {.n_kv_blocks = 4, .matmul = kernels::cpu::matmul_mode::fastest});
  EXPECT_NE(ea.prefix_salt(), eb.prefix_salt());
  EXPECT_NE(ea.prefix_salt(), ec.prefix_salt());
  EXPECT_NE(ea.prefix_salt(), fast.prefix_salt());
  EXPECT_EQ(ea.prefix_salt(), engine(a, {.n_kv_blocks = 4}).prefix_salt());
}

class PrefixReuse : public ::testing::TestWithParam<kernels::dtype> {};

// Reuse may not change a single bit: batch-invariant kernels make a token's K/V and logits
// independent of which tokens were computed with it.
TEST_P(PrefixReuse, ReusedPrefixGivesBitwiseTheSameLogits) {
  auto m = synth(GetParam());
  const int V = m->config().n_vocab;
  engine plain(m, {.n_threads = 2, .n_kv_blocks = 128});
  engine cached(m, {.n_threads = 2, .n_kv_blocks = 128, .prefix_cache = true});
  const auto a = tokens(200, V, 1);
  auto b = std::vector<token_id>(a.begin(), a.begin() + 100);  // shares 100 tokens: 6 full blocks
  for (auto t : tokens(60, V, 2)) b.push_back(t);

  const run first = generate(cached, a, 4, true);
  EXPECT_EQ(first.reused, 0);
  for (const auto& [prompt, expect_reused] : {std::pair{a, 192}, std::pair{b, 96}}) {
    const run ref = generate(plain, prompt, 6, false);
    const run again = generate(cached, prompt, 6, true);
    EXPECT_EQ(again.reused, expect_reused);  // full blocks, never the last prompt token
    ASSERT_EQ(again.out, ref.out);
    for (size_t i = 0; i < ref.logits.size(); ++i) ASSERT_EQ(again.logits[i], ref.logits[i]) << "step " << i;
  }
  // A prompt exactly a whole number of blocks long keeps its last block to compute.
  const auto c = std::vector<token_id>(a.begin(), a.begin() + 64);
  EXPECT_EQ(generate(cached, c, 1, true).reused, 48);
  const auto st = cached.prefix_stats();
  EXPECT_EQ(st.hit_tokens, uint64_t(192 + 96 + 48));
  EXPECT_GT(st.published_blocks, 0u);
}

INSTANTIATE_TEST_SUITE_P(WeightTypes, PrefixReuse, ::testing::Values(kernels::dtype::f32, kernels::dtype::q8_0),
                         [](const auto& info) { return std::string(kernels::to_string(info.param)); });

// The tokens a sequence generated are cached too: the next turn of a conversation (the
// previous prompt, the answer, a new message) finds all of it.
TEST(PrefixCache, NextTurnReusesThePreviousAnswer) {
  auto m = synth(kernels::dtype::f32);
  const int V = m->config().n_vocab;
  engine eng(m, {.n_kv_blocks = 128, .prefix_cache = true});
  const auto turn1 = tokens(90, V, 3);
  const run r1 = generate(eng, turn1, 40, true);
  auto turn2 = turn1;
  turn2.insert(turn2.end(), r1.out.begin(), r1.out.end());
  for (auto t : tokens(20, V, 4)) turn2.push_back(t);
  // 90 prompt tokens and 40 decode steps: 130 positions hold KV, 8 full blocks.
  EXPECT_EQ(eng.cached_prefix_tokens(turn2), 128);
  engine plain(m, {.n_kv_blocks = 128});
  const run again = generate(eng, turn2, 5, true), ref = generate(plain, turn2, 5, false);
  EXPECT_EQ(again.reused, 128);
  EXPECT_EQ(again.logits, ref.logits);
}

TEST(PrefixCache, EvictionNeverTakesABlockInUse) {
  auto m = synth(kernels::dtype::f32);
  const int V = m->config().n_vocab;
  // 30 blocks of 16: a 200-token prompt takes 13.
  engine eng(m, {.n_kv_blocks = 30, .prefix_cache = true});
  engine plain(m, {.n_kv_blocks = 30});
  const auto a = tokens(200, V, 5);
  (void)generate(eng, a, 1, true);
  EXPECT_EQ(eng.prefix_stats().cached_blocks, 12);
  EXPECT_EQ(eng.available_blocks(), 30);  // cached but unused: all evictable
  // A running sequence on the cached prefix holds 12 shared blocks + its own.
  const seq_id s = eng.create_sequence();
  ASSERT_EQ(eng.attach_prefix(s, a), 192);
  std::vector<float> l;
  ASSERT_TRUE(eng.prefill(s, std::span(a).subspan(192), l).ok());
  EXPECT_EQ(eng.available_blocks(), 30 - 13);
  // Other prompts push the pool: only unused cached blocks may leave, and the rest fails
  // cleanly (out of blocks) instead of taking the running sequence's.
  for (int i = 0; i < 4; ++i) {
    const seq_id o = eng.create_sequence();
    std::vector<float> ol;
    const status st = eng.prefill(o, tokens(150, V, 10 + i), ol);  // 10 blocks each
    EXPECT_TRUE(st.ok() || st.code() == errc::out_of_kv_blocks);
    ASSERT_TRUE(eng.free_sequence(o).ok());
  }
  EXPECT_GT(eng.prefix_stats().evicted_blocks, 0u);
  // The running sequence goes on exactly as alone.
  const run ref = generate(plain, a, 8, false);
  std::vector<token_id> out;
  for (int i = 0; i < 8; ++i) {
    const token_id t = argmax(l);
    out.push_back(t);
    ASSERT_TRUE(eng.decode(std::span(&s, 1), std::span(&t, 1), l).ok());
  }
  EXPECT_EQ(out, ref.out);
  EXPECT_EQ(eng.cached_prefix_tokens(a), 192);  // still whole: it was in use throughout
}

TEST(PrefixCache, LruEvictsTailsFirstAndKeepsChainsFindable) {
  kv_block_pool pool(kv_layout{1, 1, 4, 4}, 8);
  prefix_index idx(pool);
  std::vector<block_key> chain = {11, 12, 13, 14};
  for (block_key k : chain) {
    const block_id b = pool.allocate();
    ASSERT_TRUE(idx.insert(k, b));
    pool.release(b);  // only the cache holds it now
  }
  (void)idx.match(chain);
  EXPECT_FALSE(idx.insert(11, 0));  // a key is cached once
  EXPECT_EQ(idx.evictable(), 4);
  EXPECT_EQ(idx.evict(1), 1);
  EXPECT_EQ(idx.count_cached(chain), 3);  // the tail went, the head is still found
  EXPECT_EQ(idx.evict(2), 2);
  EXPECT_EQ(idx.count_cached(chain), 1);
  // A block someone else holds stays.
  pool.retain(idx.match(chain)[0]);
  EXPECT_EQ(idx.evict(5), 0);
  EXPECT_EQ(idx.size(), 1);
  EXPECT_EQ(pool.free_blocks(), 7);
}
