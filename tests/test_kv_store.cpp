// The host KV pool: blocks kept by key in memory and on disk, verified on the way out, and
// reused by another engine with bitwise the same results.
#include <gtest/gtest.h>

#include <filesystem>

#include "runtime/engine/engine.h"
#include "runtime/kv/kv_store.h"
#include "runtime/model/synth.h"

using namespace tandem;
namespace fs = std::filesystem;

namespace {

std::shared_ptr<const model> tiny() {
  const auto dir = fs::temp_directory_path() / "tandem-test-models";
  fs::create_directories(dir);
  const auto path = dir / "kvstore-tiny-f32.gguf";
  if (!fs::exists(path)) synthesize_model(find_synth_preset("tiny"), kernels::dtype::f32, path.string(), 9);
  return model::load(path.string());
}

std::vector<token_id> tokens(int n, int vocab, int salt) {
  std::vector<token_id> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[size_t(i)] = token_id((i * 41 + salt * 97 + 3) % vocab);
  return t;
}

kv_block_export block(int pos, float fill, size_t floats = 64) {
  kv_block_export b;
  b.model_id = 42;
  b.layer_begin = 0;
  b.layer_end = 1;
  b.pos_begin = pos;
  b.pos_end = pos + 16;
  b.block_size = 16;
  b.n_kv_head = 1;
  b.head_dim = 2;
  b.payload.assign(floats, fill);
  b.checksum = b.compute_checksum();
  return b;
}

// The full blocks of a prompt computed on `eng`, with their keys.
std::pair<std::vector<block_key>, std::vector<kv_block_export>> full_blocks(engine& eng,
                                                                            const std::vector<token_id>& p) {
  const seq_id s = eng.create_sequence();
  std::vector<float> l;
  EXPECT_TRUE(eng.prefill(s, p, l).ok());
  auto keys = eng.sequence_keys(s);
  std::vector<kv_block_export> out;
  EXPECT_TRUE(eng.export_kv(s, out).ok());
  out.resize(keys.size());
  EXPECT_TRUE(eng.free_sequence(s).ok());
  return {keys, out};
}

}  // namespace

TEST(KvStore, KeepsBlocksByKeyInOrder) {
  kv_block_store st({.memory_bytes = 1 << 20});
  const std::vector<block_key> keys = {101, 102, 103};
  const std::vector<kv_block_export> blocks = {block(0, 1), block(16, 2), block(32, 3)};
  EXPECT_EQ(st.put(keys, blocks), 3);
  EXPECT_EQ(st.put(keys, blocks), 0);  // already held: refreshed, not added
  EXPECT_EQ(st.count(keys), 3);
  EXPECT_EQ(st.count(std::vector<block_key>{101, 999, 103}), 1);  // leading keys only
  const auto got = st.get(std::vector<block_key>{101, 102, 555});
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[1].payload, blocks[1].payload);
  EXPECT_EQ(got[1].request, 102u);  // its name travels under its checksum
  EXPECT_EQ(got[1].checksum, got[1].compute_checksum());
  EXPECT_EQ(st.stats().fetched, 2u);
}

TEST(KvStore, MemoryBudgetSpillsToDiskAndBack) {
  const auto path = fs::temp_directory_path() / ("tandem-kvstore-" + std::to_string(::getpid()) + ".bin");
  const int64_t per = 64 * 4 + 64;  // payload + the store's per-block overhead
  {
    kv_block_store st({.memory_bytes = 2 * per, .disk_path = path.string(), .disk_bytes = 3 * (64 * 4 + 96)});
    std::vector<block_key> keys;
    std::vector<kv_block_export> blocks;
    for (int i = 0; i < 6; ++i) {
      keys.push_back(block_key(200 + i));
      blocks.push_back(block(16 * i, float(i) + 0.5f));
      st.put(std::span(keys).last(1), std::span(blocks).last(1));
    }
    auto s = st.stats();
    EXPECT_EQ(s.memory_blocks, 2);  // the two most recent
    EXPECT_EQ(s.disk_blocks, 3);  // the next three
    EXPECT_EQ(s.evicted, 1u);  // the oldest left the disk too
    EXPECT_EQ(s.spilled, 4u);
    EXPECT_EQ(st.count(keys), 0);  // key 200 is gone: no run from the start
    // A block from disk comes back bitwise, into memory.
    const auto got = st.get(std::vector<block_key>{201, 202});
    ASSERT_EQ(got.size(), 2u);
    EXPECT_EQ(got[0].payload, blocks[1].payload);
    EXPECT_EQ(got[1].payload, blocks[2].payload);
    EXPECT_TRUE(fs::exists(path));
  }
  EXPECT_FALSE(fs::exists(path));  // the tier is this process's cache
}

TEST(KvStore, CorruptedBlocksAreDroppedNotServed) {
  const auto path = fs::temp_directory_path() / ("tandem-kvstore-c-" + std::to_string(::getpid()) + ".bin");
  kv_block_store st({.memory_bytes = 1 * (64 * 4 + 64), .disk_path = path.string(), .disk_bytes = 1 << 16});
  const std::vector<block_key> keys = {1, 2, 3};
  st.put(keys, std::vector<kv_block_export>{block(0, 1), block(16, 2), block(32, 3)});
  ASSERT_EQ(st.stats().disk_blocks, 2);
  ASSERT_TRUE(st.corrupt(2));  // on disk
  EXPECT_EQ(st.get(keys).size(), 1u);
  EXPECT_EQ(st.stats().corrupted, 1u);
  EXPECT_EQ(st.count(keys), 1);  // dropped
  ASSERT_TRUE(st.corrupt(1));  // in memory
  EXPECT_EQ(st.get(keys).size(), 0u);
  EXPECT_EQ(st.stats().corrupted, 2u);
  EXPECT_THROW(kv_block_store({.disk_path = "/nonexistent-dir/x.bin", .disk_bytes = 4096}), failure);
}

// Blocks one engine published serve another engine's prompt: only the tail is computed, and
// the logits are the ones computing everything gives, bit for bit. A block that fails its
// checksum or carries another key is refused, and the rest is computed.
TEST(KvStore, AnotherEngineReusesPublishedBlocksExactly) {
  auto m = tiny();
  const int V = m->config().n_vocab;
  engine a(m, {.n_kv_blocks = 64}), b(m, {.n_kv_blocks = 64, .prefix_cache = true}), plain(m, {.n_kv_blocks = 64});
  const auto prompt = tokens(150, V, 1);  // 9 full blocks
  auto [keys, blocks] = full_blocks(a, prompt);
  ASSERT_EQ(keys.size(), 9u);
  EXPECT_EQ(keys, block_keys(b.prefix_salt(), std::span(prompt).first(144), 16));

  kv_block_store st({});
  st.put(keys, blocks);
  const auto fetched = st.get(keys);
  auto damaged = fetched;
  damaged[4].payload[7] += 1.0f;  // bytes changed after the checksum
  EXPECT_EQ(b.cache_blocks(keys, damaged), 4);
  auto renamed = fetched;
  EXPECT_EQ(b.cache_blocks(std::vector<block_key>{keys[5], keys[4]}, std::span(renamed).subspan(4, 2)),
            0);  // wrong names
  EXPECT_EQ(b.cache_blocks(keys, fetched), 9);

  const seq_id s = b.create_sequence();
  ASSERT_EQ(b.attach_prefix(s, prompt), 144);
  std::vector<float> got, want;
  ASSERT_TRUE(b.prefill(s, std::span(prompt).subspan(144), got).ok());
  const seq_id r = plain.create_sequence();
  ASSERT_TRUE(plain.prefill(r, prompt, want).ok());
  EXPECT_EQ(got, want);
}
