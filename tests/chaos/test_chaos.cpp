// Chaos: 64 concurrent requests of mixed lengths while workers of one kind are killed several
// times at random (seeded) moments. Every request must end exactly once; its token indices must
// run 0, 1, 2, ... without a repeat or a gap; greedy and seeded outputs must equal a fault-free
// engine's; every KV pool must be full again; every kill must be counted as a restart.
//
// Replay a failure with TANDEM_CHAOS_SEED=<the seed the failure printed>.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "actors/pipeline.h"
#include "tests/test_models.h"

using namespace tandem;
using namespace std::chrono_literals;
using testing_support::alone;

namespace {

std::shared_ptr<const model> tiny() {
  static const std::shared_ptr<const model> m = testing_support::tiny_model("chaos");
  return m;
}


struct chaos_case {
  std::string name;
  serving_mode mode;
  int workers;       // per pool
  std::string pool;  // the kind killed
  int kills;
};
void PrintTo(const chaos_case& c, std::ostream* os) { *os << c.name; }

// What one request's stream looked like.
struct stream {
  std::vector<int32_t> indices;
  std::vector<token_id> tokens;
  int finals = 0;
  int events_after_final = 0;
  std::string end;  // finish reason, or "error:<code>: <message>"
};

class Chaos : public ::testing::TestWithParam<chaos_case> {};

}  // namespace

TEST_P(Chaos, KilledWorkersLoseNothing) {
  const auto c = GetParam();
  uint64_t seed = std::hash<std::string>{}(c.name) % 100000;
  if (const char* s = std::getenv("TANDEM_CHAOS_SEED")) seed = std::strtoull(s, nullptr, 10);
  SCOPED_TRACE("seed " + std::to_string(seed) + " (replay with TANDEM_CHAOS_SEED=" + std::to_string(seed) + ")");
  std::mt19937_64 rng(seed);

  // Declared before the pipeline: callbacks that come while it shuts down find them alive.
  std::mutex mu;
  std::condition_variable cv;
  std::map<request_id, stream> streams;
  int ended = 0;

  auto m = tiny();
  pipeline_config cfg;
  cfg.loaded_model = m;
  cfg.mode = c.mode;
  cfg.prefill_workers = cfg.decode_workers = cfg.colocated_workers = c.workers;
  cfg.kv_blocks_per_worker = 160;
  cfg.chunk_size = 32;
  cfg.max_migrations = c.kills + 1;  // even a request hit by every kill finishes
  cfg.admission.max_prefill_queue = 1000;
  pipeline p(cfg);

  struct job {
    std::vector<token_id> prompt;
    sampling_params sp;
    int32_t max_tokens;
  };
  std::vector<job> jobs;
  const int vocab = m->config().n_vocab;
  for (int i = 0; i < 64; ++i) {
    job j;
    // Prompt + output stay within the context (256); killing prefill workers wants long prompts.
    const bool long_prompts = c.pool == "prefill";
    const int len = long_prompts ? 100 + int(rng() % 100) : 4 + int(rng() % 60);
    for (int t = 0; t < len; ++t) j.prompt.push_back(token_id(3 + rng() % uint64_t(vocab - 3)));
    j.sp = i % 2 == 0 ? sampling_params{.temperature = 0.0f}
                      : sampling_params{.temperature = 0.8f, .top_k = 30, .top_p = 0.95f, .seed = rng()};
    j.max_tokens = long_prompts ? 16 + int32_t(rng() % 40) : 16 + int32_t(rng() % 180);
    jobs.push_back(std::move(j));
  }

  std::vector<request_id> ids;
  // All at once: the first kills find prompts queued for prefill, later ones sequences decoding.
  for (const auto& j : jobs) {
    ids.push_back(p.submit({.prompt_tokens = j.prompt, .max_tokens = j.max_tokens, .sampling = j.sp, .ignore_eos = true},
                           [&](const request_event& ev) {
                             std::lock_guard<std::mutex> lk(mu);
                             auto& s = streams[ev.id];
                             if (s.finals > 0) {
                               ++s.events_after_final;
                               return;
                             }
                             if (ev.kind == event_kind::token && ev.token >= 0) {
                               s.indices.push_back(ev.index);
                               s.tokens.push_back(ev.token);
                             } else if (ev.kind == event_kind::done || ev.kind == event_kind::error) {
                               ++s.finals;
                               s.end = ev.kind == event_kind::done
                                           ? ev.finish_reason
                                           : "error:" + std::string(to_string(ev.code)) + ": " + ev.message;
                               ++ended;
                               cv.notify_all();
                             }
                           }));
  }

  // The killer: `kills` times, after a random pause, a random worker of the kind.
  int killed = 0;
  for (int k = 0; k < c.kills; ++k) {
    std::this_thread::sleep_for(std::chrono::milliseconds(k == 0 ? rng() % 3 : 2 + rng() % 40));
    const int index = int(rng() % uint64_t(c.workers));
    // A worker just killed may still be restarting: try another moment.
    bool ok = false;
    for (int attempt = 0; attempt < 200 && !(ok = p.kill_worker(c.pool, index)); ++attempt) std::this_thread::sleep_for(5ms);
    ASSERT_TRUE(ok) << c.pool << " worker " << index << " never came back to be killed";
    ++killed;
    // The router has seen it die (and counted the restart) before the next kill, so that no
    // kill lands on an already dead worker.
    auto& restarts = p.metrics().get_counter("tandem_restarts_total", "", {{"kind", c.pool}});
    for (int i = 0; i < 1000 && restarts.value() < killed; ++i) std::this_thread::sleep_for(1ms);
  }
  bool all_ended = false;
  {
    std::unique_lock<std::mutex> lk(mu);
    all_ended = cv.wait_for(lk, 60s, [&] { return ended == int(jobs.size()); });
  }
  if (!all_ended) {  // where the stragglers are, for the failure report
    std::string where;
    for (const auto& r : p.stats(64).requests)
      where += " #" + std::to_string(r.id) + " " + r.state + " p=" + r.prefill_worker + " d=" + r.decode_worker;
    FAIL() << ended << " of " << jobs.size() << " requests ended; the router still tracks:" << where;
  }
  std::this_thread::sleep_for(50ms);  // anything sent after a final event would show now

  std::lock_guard<std::mutex> lk(mu);
  for (size_t i = 0; i < jobs.size(); ++i) {
    const auto& s = streams[ids[i]];
    SCOPED_TRACE("request " + std::to_string(i));
    EXPECT_EQ(s.finals, 1);
    EXPECT_EQ(s.events_after_final, 0);
    ASSERT_EQ(s.end, "length");
    for (size_t k = 0; k < s.indices.size(); ++k) ASSERT_EQ(s.indices[k], int32_t(k)) << "repeated or skipped index";
    EXPECT_EQ(s.tokens, alone(*m, jobs[i].prompt, jobs[i].max_tokens, jobs[i].sp, true));
  }

  // Every pool full again, every request actor gone.
  pipeline_stats st;
  for (int i = 0; i < 250; ++i) {
    st = p.stats();
    bool clean = st.live_requests == 0;
    for (const auto& w : st.workers) clean = clean && w.kv_free_blocks == w.kv_total_blocks && w.reserved_blocks == 0;
    if (clean) break;
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_EQ(st.live_requests, 0);
  for (const auto& w : st.workers) {
    EXPECT_EQ(w.kv_free_blocks, w.kv_total_blocks) << w.name;
    EXPECT_EQ(w.reserved_blocks, 0) << w.name;
  }
  const auto migrations = p.metrics().get_counter("tandem_migrations_total", "").value();
  const auto reprefills = p.metrics().get_counter("tandem_reprefills_total", "").value();
  std::printf("[ chaos    ] %s: %d kills, %.0f migrations, %.0f re-prefills\n", c.name.c_str(), killed,
              double(migrations), double(reprefills));
  EXPECT_GT(migrations + reprefills, 0) << "the kills hit no request: the test proved nothing";
  const std::string restarts = "tandem_restarts_total{kind=\"" + c.pool + "\"} " + std::to_string(killed);
  EXPECT_NE(p.metrics().to_prometheus().find(restarts), std::string::npos) << "expected " << restarts;
}

INSTANTIATE_TEST_SUITE_P(Kinds, Chaos,
                         ::testing::Values(chaos_case{"prefill_2x2", serving_mode::disaggregated, 2, "prefill", 4},
                                           chaos_case{"decode_2x2", serving_mode::disaggregated, 2, "decode", 4},
                                           chaos_case{"decode_1x1", serving_mode::disaggregated, 1, "decode", 3},
                                           chaos_case{"colocated_2", serving_mode::colocated, 2, "colocated", 4}),
                         [](const auto& info) { return info.param.name; });
