// The local transport moves a sequence's KV blocks between two engines; bad copies fail
// without touching memory outside the registered regions.
#include <gtest/gtest.h>

#include <csignal>
#include <filesystem>

#include <sys/wait.h>
#include <unistd.h>

#include "runtime/engine/engine.h"
#include "runtime/model/synth.h"
#include "transport/local/local_transport.h"
#include "transport/shm/shm_transport.h"

using namespace tandem;
using namespace tandem::transport;

namespace {
std::string tiny_model() {
  const auto dir = std::filesystem::temp_directory_path() / "tandem-test-models";
  std::filesystem::create_directories(dir);
  const auto p = dir / "transport-tiny-f32.gguf";
  if (!std::filesystem::exists(p)) synthesize_model(find_synth_preset("tiny"), kernels::dtype::f32, p.string(), 3);
  return p.string();
}
token_id argmax(const std::vector<float>& x) { return token_id(std::max_element(x.begin(), x.end()) - x.begin()); }
}  // namespace

// The same contract for every transport kind.
template <class T>
class AnyTransport : public ::testing::Test {};
using transport_kinds = ::testing::Types<local_transport, shm_transport>;
TYPED_TEST_SUITE(AnyTransport, transport_kinds);

TYPED_TEST(AnyTransport, CopiesBytesExactlyIncludingLargeOnes) {
  TypeParam t;
  // Larger than the shared-memory arena: moved slot by slot.
  std::vector<uint8_t> a(9u << 20), b(a.size(), 0);
  for (size_t i = 0; i < a.size(); ++i) a[i] = uint8_t(i * 131 + (i >> 12));
  const auto ra = t.register_memory(a.data(), a.size()), rb = t.register_memory(b.data(), b.size());
  const auto st = t.poll(t.submit({{ra, 0, rb, 0, a.size() / 2}, {ra, a.size() / 2, rb, a.size() / 2, a.size() / 2}}));
  ASSERT_EQ(st.state, transfer_state::done) << st.error.to_string();
  EXPECT_EQ(st.bytes_moved, a.size());
  EXPECT_EQ(a, b);
  EXPECT_EQ(t.poll(t.submit({{ra, 0, rb, 0, a.size() + 1}})).error.code(), errc::invalid_argument);
}

// Issue 22 item 4: a process killed with -9 while its shm links live leaves no segment in
// /dev/shm (the arena's name is unlinked as soon as it is mapped; the mapping carries on).
TEST(ShmTransport, KillNineLeavesNoSegmentBehind) {
  int pipefd[2];
  ASSERT_EQ(::pipe(pipefd), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(pipefd[0]);
    shm_transport a(1 << 16), b(1 << 16);
    std::vector<uint8_t> x(4096, 7), y(4096, 0);
    const auto rx = a.register_memory(x.data(), x.size()), ry = a.register_memory(y.data(), y.size());
    const bool moved = a.poll(a.submit({{rx, 0, ry, 0, x.size()}})).error.ok() && x == y;
    const char ok = moved ? 'y' : 'n';
    (void)!::write(pipefd[1], &ok, 1);
    for (;;) ::pause();  // killed here, links alive
  }
  ::close(pipefd[1]);
  char ok = 0;
  ASSERT_EQ(::read(pipefd[0], &ok, 1), 1);
  ::close(pipefd[0]);
  EXPECT_EQ(ok, 'y') << "the unlinked arena still moves bytes";
  ::kill(child, SIGKILL);
  int st = 0;
  ::waitpid(child, &st, 0);
  const std::string prefix = "tandem-" + std::to_string(child) + "-";
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm"))
    EXPECT_NE(e.path().filename().string().rfind(prefix, 0), 0u) << "left behind: " << e.path();
}

TEST(LocalTransport, MovesKvBlocksBetweenEngines) {
  auto m = model::load(tiny_model());
  engine src(m, engine_options{.n_kv_blocks = 16});
  engine dst(m, engine_options{.n_kv_blocks = 16});
  std::vector<token_id> prompt;
  for (int i = 0; i < 45; ++i) prompt.push_back(token_id(3 + i * 5 % 250));
  const seq_id a = src.create_sequence();
  std::vector<float> logits;
  ASSERT_TRUE(src.prefill(a, prompt, logits).ok());
  token_id ta = argmax(logits), tb = ta;

  std::vector<kv_block_export> sent;
  ASSERT_TRUE(src.export_kv(a, sent).ok());
  // The receiver allocates landing buffers from the headers, registers them, and the
  // sender's payloads move through the transport.
  std::vector<kv_block_export> received = sent;
  for (auto& b : received) std::fill(b.payload.begin(), b.payload.end(), 0.0f);
  local_transport t;
  std::vector<copy_op> ops;
  for (size_t i = 0; i < sent.size(); ++i) {
    const size_t bytes = sent[i].payload.size() * sizeof(float);
    const region_id from = t.register_memory(sent[i].payload.data(), bytes);
    const region_id to = t.register_memory(received[i].payload.data(), bytes);
    ops.push_back({from, 0, to, 0, bytes});
  }
  const transfer_id id = t.submit(ops);
  const transfer_status st = t.poll(id);
  ASSERT_EQ(st.state, transfer_state::done) << st.error.to_string();
  EXPECT_EQ(st.bytes_moved, sent.size() * sent[0].payload.size() * sizeof(float));
  EXPECT_EQ(t.poll(id).state, transfer_state::failed);  // polled once: forgotten

  const seq_id b = dst.create_sequence();
  ASSERT_TRUE(dst.import_kv(b, received).ok());
  for (int i = 0; i < 10; ++i) {
    std::vector<float> la, lb;
    ASSERT_TRUE(src.decode(std::span(&a, 1), std::span(&ta, 1), la).ok());
    ASSERT_TRUE(dst.decode(std::span(&b, 1), std::span(&tb, 1), lb).ok());
    ta = argmax(la);
    tb = argmax(lb);
    ASSERT_EQ(ta, tb);
  }
}

TEST(LocalTransport, BadCopiesFailBeforeAnyByteMoves) {
  local_transport t;
  std::vector<uint8_t> a(64, 1), b(64, 0);
  const region_id ra = t.register_memory(a.data(), a.size());
  const region_id rb = t.register_memory(b.data(), b.size());
  // A good op followed by an overrun: the batch fails and the good op did not run either.
  auto st = t.poll(t.submit({{ra, 0, rb, 0, 16}, {ra, 60, rb, 0, 8}}));
  EXPECT_EQ(st.state, transfer_state::failed);
  EXPECT_EQ(st.error.code(), errc::invalid_argument);
  EXPECT_NE(st.error.message().find("overruns"), std::string::npos) << st.error.message();
  EXPECT_EQ(b[0], 0);
  EXPECT_EQ(t.poll(t.submit({{ra, 0, 999, 0, 1}})).state, transfer_state::failed);
  ASSERT_TRUE(t.unregister_memory(rb).ok());
  EXPECT_EQ(t.poll(t.submit({{ra, 0, rb, 0, 1}})).error.code(), errc::invalid_argument);
  EXPECT_EQ(t.unregister_memory(rb).code(), errc::invalid_argument);
  EXPECT_EQ(t.poll(t.submit({{ra, 0, ra, 32, 32}})).state, transfer_state::done);
  EXPECT_EQ(a[32], 1);
}
