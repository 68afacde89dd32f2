// The actor runtime end to end, on its outputs: disaggregated (1×1, 1×2, 2×2, over shared
// memory, by handoff, not streamed), colocated and auto pipelines give exactly the tokens a lone
// engine gives; admission rejects and recovers; small KV pools make requests wait, never drop;
// bad requests and the context's edge end clearly; nothing leaks.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>

#include "tests/support/pipeline_fixture.h"

using namespace tandem;
using namespace tandem::testing_support;
using namespace std::chrono_literals;

namespace {

struct topology {
  std::string name;
  serving_mode mode;
  int prefill, decode;
  kv_transport_kind kv_transport = kv_transport_kind::local;
  bool stream_kv = true;
};

void PrintTo(const topology& t, std::ostream* os) { *os << t.name; }
class SameOutput : public ::testing::TestWithParam<topology> {};

}  // namespace

TEST_P(SameOutput, ConcurrentRequestsEqualALoneEngine) {
  const auto topo = GetParam();
  auto m = tiny();
  serving_config cfg;
  cfg.model.loaded = m;
  cfg.pools.mode = topo.mode;
  cfg.pools.prefill_workers = topo.prefill;
  cfg.pools.decode_workers = topo.decode;
  cfg.kv.transport = topo.kv_transport;
  cfg.kv.stream = topo.stream_kv;
  cfg.kv.stream_layer_group = 1;
  cfg.pools.kv_blocks_per_worker = 128;
  cfg.steps.chunk_size = 24;  // long prompts are chunked
  cfg.steps.prefill_token_budget = 64;
  cfg.steps.colocated_token_budget = 48;
  pipeline p(cfg);
  struct job {
    std::vector<token_id> prompt;
    sampling_params sp;
    int32_t max_tokens;
    request_handle h;
  };
  std::vector<job> jobs;
  for (int i = 0; i < 32; ++i) {
    job j;
    j.prompt = prompt_of(3 + (i * 13) % 90, i, m->config().n_vocab);
    j.sp = i % 2 == 0 ? sampling_params{.temperature = 0.0f}
                      : sampling_params{.temperature = 0.9f, .top_k = 20, .top_p = 0.9f, .seed = uint64_t(1000 + i)};
    j.max_tokens = 4 + i % 13;
    j.h = p.submit({.prompt_tokens = j.prompt, .max_tokens = j.max_tokens, .sampling = j.sp, .ignore_eos = true});
    jobs.push_back(std::move(j));
  }
  for (auto& j : jobs) {
    const auto r = j.h.wait(60s);
    ASSERT_EQ(r.error, errc::ok) << r.message;
    EXPECT_EQ(r.finish_reason, finish_reason::length);
    EXPECT_EQ(r.tokens, alone(*m, j.prompt, j.max_tokens, j.sp, true)) << "request " << r.id;
    EXPECT_EQ(r.timings.output_tokens, j.max_tokens);
    EXPECT_GT(r.timings.ttft_ms, 0);
    if (topo.mode == serving_mode::disaggregated) {
      EXPECT_GT(r.timings.kv_bytes, 0u);
    }
  }
  expect_no_leaks(p);
  // Prompts of several chunks had their decode worker reserved before prefill ended: their KV
  // went over the link in pieces while prefill ran (and the tokens above are still exact).
  const bool streamed = p.metrics().to_prometheus().find("tandem_kv_link_pieces_total") != std::string::npos;
  EXPECT_EQ(streamed, topo.mode == serving_mode::disaggregated && topo.stream_kv);
}

INSTANTIATE_TEST_SUITE_P(
    Topologies, SameOutput,
    ::testing::Values(topology{"disagg_1x1", serving_mode::disaggregated, 1, 1},
                      topology{"disagg_1x2", serving_mode::disaggregated, 1, 2},
                      topology{"disagg_2x2", serving_mode::disaggregated, 2, 2},
                      topology{"disagg_1x2_shm", serving_mode::disaggregated, 1, 2, kv_transport_kind::shm},
                      topology{"disagg_1x2_handoff", serving_mode::disaggregated, 1, 2, kv_transport_kind::handoff},
                      topology{"disagg_1x2_not_streamed", serving_mode::disaggregated, 1, 2, kv_transport_kind::local,
                               false},
                      topology{"colocated", serving_mode::colocated, 1, 1}),
    [](const auto& info) { return info.param.name; });

TEST(Pipeline, StoriesMatchesTheReferenceInBothModes) {
  const std::string path = std::string(TANDEM_TEST_DATA_DIR) + "/stories260K.gguf";
  ASSERT_TRUE(std::filesystem::exists(path)) << "missing test data: " << path;
  const std::vector<token_id> expected = {
      432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 338, 401, 396, 267, 337, 410, 408, 419, 292, 411, 322,
      265, 282, 295, 433, 426, 385, 328, 432, 358, 394, 261, 370, 432, 352, 266, 268, 388, 426, 338, 391, 266, 267,
      337, 335, 312, 432, 398, 312, 286, 267, 414, 270, 333, 415, 426, 13,  438, 310, 439, 419, 357, 336};
  for (auto mode : {serving_mode::disaggregated, serving_mode::colocated}) {
    pipeline p({.model = {.path = path}, .pools = {.mode = mode, .decode_workers = 2}});
    std::vector<request_handle> hs;
    for (int i = 0; i < 8; ++i) hs.push_back(p.submit({.prompt = "Once upon a time", .max_tokens = 64}));
    for (auto& h : hs) {
      const auto r = h.wait(60s);
      ASSERT_EQ(r.error, errc::ok) << r.message;
      EXPECT_EQ(r.tokens, expected) << to_string(mode);
      EXPECT_EQ(r.text.substr(0, 30), ", there was a little girl name");
    }
    expect_no_leaks(p);
  }
}

TEST(Pipeline, AdmissionRejectsEarlyAndRecovers) {
  serving_config cfg;
  cfg.model.loaded = tiny();
  cfg.scheduling.admission.max_prefill_queue = 2;
  cfg.steps.prefill_token_budget = 8;  // slow prefill: requests pile up
  cfg.steps.chunk_size = 8;
  pipeline p(cfg);
  std::vector<request_handle> hs;
  for (int i = 0; i < 40; ++i)
    hs.push_back(p.submit({.prompt_tokens = prompt_of(120, i, 300), .max_tokens = 2, .ignore_eos = true}));
  int rejected = 0, finished = 0;
  for (auto& h : hs) {
    const auto r = h.wait(60s);
    if (r.error == errc::overloaded) {
      ++rejected;
      EXPECT_GE(r.retry_after_ms, 50) << r.message;
      EXPECT_NE(r.message.find("prefill queue"), std::string::npos) << r.message;
    } else {
      ASSERT_EQ(r.error, errc::ok) << r.message;
      ++finished;
    }
  }
  EXPECT_GT(rejected, 0);
  EXPECT_GT(finished, 0);
  // Load gone: accepted again.
  auto r = p.submit({.prompt_tokens = prompt_of(10, 1, 300), .max_tokens = 3, .ignore_eos = true}).wait(30s);
  EXPECT_EQ(r.error, errc::ok) << r.message;
  EXPECT_EQ(r.tokens.size(), 3u);
  expect_no_leaks(p);
  const std::string prom = p.metrics().to_prometheus();
  EXPECT_NE(prom.find("tandem_rejections_total{reason=\"prefill_queue_full\"}"), std::string::npos);
}

TEST(Pipeline, SmallKvPoolsMakeRequestsWaitNotDrop) {
  for (auto mode : {serving_mode::disaggregated, serving_mode::colocated}) {
    serving_config cfg;
    cfg.model.loaded = tiny();
    cfg.pools.mode = mode;
    cfg.pools.kv_blocks_per_worker = 12;  // room for about two requests at a time
    pipeline p(cfg);
    std::vector<request_handle> hs;
    for (int i = 0; i < 16; ++i)
      hs.push_back(p.submit({.prompt_tokens = prompt_of(40, i, 300), .max_tokens = 40, .ignore_eos = true}));
    for (auto& h : hs) {
      const auto r = h.wait(60s);
      ASSERT_EQ(r.error, errc::ok) << r.message;
      EXPECT_EQ(r.tokens.size(), 40u);
    }
    expect_no_leaks(p);
  }
}

TEST(Pipeline, BadRequestsGetClearErrors) {
  pipeline p({.model = {.loaded = tiny()}});
  auto r = p.submit({.prompt_tokens = {5, 99999}, .max_tokens = 3}).wait(5s);
  EXPECT_EQ(r.error, errc::invalid_argument);
  r = p.submit({.prompt = "x", .max_tokens = 0}).wait(5s);
  EXPECT_EQ(r.error, errc::invalid_argument);
  r = p.submit({.prompt = "x", .sampling = {.temperature = -2}}).wait(5s);
  EXPECT_EQ(r.error, errc::invalid_argument);
  r = p.submit({.prompt_tokens = prompt_of(400, 0, 300), .max_tokens = 3}).wait(5s);  // context is 256
  EXPECT_EQ(r.error, errc::context_overflow) << r.message;
  r = p.submit({.prompt = "hello", .max_tokens = 3, .ignore_eos = true}).wait(10s);
  EXPECT_EQ(r.error, errc::ok) << r.message;
  expect_no_leaks(p);
}

// The one stop rule at the edge of the context, in every mode: a prompt of n_ctx - 1 tokens
// gets two tokens (the last sampled from the last position), one of n_ctx tokens gets one (it
// ends in the prefill worker, where it once went on to decode and failed there), one of
// n_ctx + 1 is refused up front.
TEST(Pipeline, ContextEdgeEndsTheSameInEveryMode) {
  const int32_t n_ctx = tiny()->config().n_ctx;
  for (const auto mode : {serving_mode::disaggregated, serving_mode::colocated}) {
    SCOPED_TRACE(std::string(to_string(mode)));
    serving_config cfg;
    cfg.model.loaded = tiny();
    cfg.pools.mode = mode;
    pipeline p(cfg);
    for (const int32_t n : {n_ctx - 1, n_ctx, n_ctx + 1}) {
      SCOPED_TRACE(n);
      const auto prompt = prompt_of(n, 5, tiny()->config().n_vocab);
      const auto r = p.submit({.prompt_tokens = prompt, .max_tokens = 10, .ignore_eos = true}).wait(30s);
      if (n > n_ctx) {
        EXPECT_EQ(r.error, errc::context_overflow) << r.message;
        continue;
      }
      EXPECT_EQ(r.error, errc::ok) << r.message;
      EXPECT_EQ(r.finish_reason, finish_reason::length);
      EXPECT_EQ(int32_t(r.tokens.size()), n_ctx + 1 - n);
      EXPECT_EQ(r.tokens, alone(*tiny(), prompt, 10, {.temperature = 0.0f}, true));
    }
    expect_no_leaks(p);
  }
}

// Auto mode: a prompt whose uncached part fits in the decode worker's slack (at most one
// prefill step's budget: 64 tokens here) is computed by the decode worker itself, a longer one
// by the prefill pool (over the KV link); the tokens are a lone engine's either way, also
// across a kill of the decode worker while short and long ones decode there.
TEST(Pipeline, AutoModeComputesShortPromptsOnTheDecodeWorkerExactly) {
  auto m = tiny();
  serving_config cfg;
  cfg.model.loaded = m;
  cfg.pools.mode = serving_mode::automatic;
  cfg.steps.prefill_token_budget = 64;
  pipeline p(cfg);
  auto counter = [&](const std::string& name) {  // summed over its labels
    const auto j = nlohmann::json::parse(p.metrics().to_json());
    double sum = 0;
    if (j["counters"].contains(name))
      for (const auto& x : j["counters"][name]) sum += x["value"].get<double>();
    return sum;
  };
  // (Once the decode worker's first report is in: requests sent before it go to the prefill pool.)
  ASSERT_EQ(p.submit({.prompt_tokens = prompt_of(10, 98, 300), .max_tokens = 4}).wait(30s).error, errc::ok);
  // A short one now: its decode worker computes it, and its request names it as such.
  const auto warm = p.submit({.prompt_tokens = prompt_of(10, 99, 300), .max_tokens = 4}).wait(30s);
  ASSERT_EQ(warm.error, errc::ok);
  EXPECT_EQ(warm.timings.prefill_worker, "decode-0");
  EXPECT_EQ(warm.timings.decode_worker, "decode-0");
  std::vector<std::vector<token_id>> prompts;
  std::vector<request_handle> hs;
  const sampling_params greedy{.temperature = 0.0f};
  for (int i = 0; i < 8; ++i) {
    prompts.push_back(prompt_of(i % 2 ? 20 + 3 * i : 120 + 9 * i, i, 300));  // short, long, short, ...
    hs.push_back(p.submit({.prompt_tokens = prompts.back(), .max_tokens = 60, .sampling = greedy, .ignore_eos = true}));
  }
  std::vector<token_id> first;
  request_event ev;
  while (hs[0].next(ev, 10s)) {
    if (ev.kind == event_kind::token && ev.token >= 0) first.push_back(ev.token);
    if (first.size() >= 3) break;
  }
  ASSERT_TRUE(p.kill_worker(worker_kind::decode, 0));
  for (size_t i = 0; i < hs.size(); ++i) {
    auto r = hs[i].wait(30s);
    ASSERT_EQ(r.error, errc::ok) << i << ": " << r.message;
    if (i == 0) r.tokens.insert(r.tokens.begin(), first.begin(), first.end());
    EXPECT_EQ(r.tokens, alone(*m, prompts[i], 60, greedy, true)) << "request " << i;
    // A long prompt (past the 64-token budget) is never computed on the decode worker, also
    // when it is prefilled again after the kill. (A short one may be placed there twice: once
    // before the kill, again after it, so the counter below bounds nothing about long ones.)
    if (i % 2 == 0) {
      EXPECT_EQ(r.timings.prefill_worker, "prefill-0") << "request " << i;
    }
  }
  const double local = counter("tandem_router_local_prefill_total");
  EXPECT_GE(local, 1) << "no short prompt was computed on the decode worker" << p.metrics().to_prometheus();
  EXPECT_GE(counter("tandem_kv_link_transfers_total"), 4) << "the long prompts went over the KV link";
  expect_no_leaks(p);
}
