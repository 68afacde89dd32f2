// The actor runtime end to end, on prefix reuse: a shared prefix is computed once, the next turn
// reuses the earlier one, requests go where their prefix is cached, the host KV store serves
// prefixes across workers (and whole prompts straight to decode), and killing it loses nothing.
#include <gtest/gtest.h>

#include <thread>

#include "tests/support/pipeline_fixture.h"

using namespace tandem;
using namespace tandem::testing_support;
using namespace std::chrono_literals;

// Prefix reuse through the workers: requests that share a long prefix, sent together, compute
// it once (the others wait for the blocks it makes, then take them), and every output is what
// a lone engine gives, with the cache on or off.
TEST(Pipeline, SharedPrefixIsComputedOnceAndOutputsAreUnchanged) {
  auto m = tiny();
  const int V = m->config().n_vocab;
  const auto shared = prompt_of(160, 99, V);  // 10 full blocks
  for (auto mode : {serving_mode::disaggregated, serving_mode::colocated})
    for (bool cache : {true, false}) {
      SCOPED_TRACE(std::string(to_string(mode)) + (cache ? " with" : " without") + " the prefix cache");
      serving_config cfg;
      cfg.model.loaded = m;
      cfg.pools.mode = mode;
      cfg.kv.prefix_cache = cache;
      cfg.pools.kv_blocks_per_worker = 256;
      pipeline p(cfg);
      std::vector<std::pair<std::vector<token_id>, sampling_params>> reqs;
      std::vector<request_handle> hs;
      for (int i = 0; i < 12; ++i) {
        auto prompt = shared;
        for (auto t : prompt_of(20, 200 + i, V)) prompt.push_back(t);
        const auto sp = i % 2 == 0 ? sampling_params{.temperature = 0.0f}
                                   : sampling_params{.temperature = 0.8f, .top_k = 40, .seed = uint64_t(7 + i)};
        hs.push_back(p.submit({.prompt_tokens = prompt, .max_tokens = 8, .sampling = sp, .ignore_eos = true}));
        reqs.emplace_back(std::move(prompt), sp);
      }
      for (size_t i = 0; i < hs.size(); ++i) {
        const auto r = hs[i].wait(60s);
        ASSERT_EQ(r.error, errc::ok) << r.message;
        EXPECT_EQ(r.tokens, alone(*m, reqs[i].first, 8, reqs[i].second, true)) << "request " << i;
      }
      const double computed = p.metrics().get_counter("tandem_prompt_tokens_computed_total", "").value();
      if (cache) {
        // The first computes 180 tokens; each of the other 11 takes the 160 shared ones.
        EXPECT_EQ(computed, 180 + 11 * 20);
        EXPECT_EQ(p.metrics().get_counter("tandem_prefix_cache_hit_tokens_total", "").value(), 11 * 160);
      } else {
        EXPECT_EQ(computed, 12 * 180);
      }
      expect_idle_gauges_free(p);
    }
}

// The next turn of a conversation (prompt, answer, new message) reuses the earlier turn's
// prompt and answer in either mode.
TEST(Pipeline, NextTurnReusesTheEarlierTurn) {
  auto m = tiny();
  const int V = m->config().n_vocab;
  for (auto mode : {serving_mode::disaggregated, serving_mode::colocated}) {
    SCOPED_TRACE(std::string(to_string(mode)));
    serving_config cfg;
    cfg.model.loaded = m;
    cfg.pools.mode = mode;
    cfg.pools.kv_blocks_per_worker = 256;
    pipeline p(cfg);
    auto turn = prompt_of(100, 5, V);
    double hits_before = 0;
    size_t prev_len = 0;
    for (int k = 0; k < 3; ++k) {
      const sampling_params greedy{.temperature = 0.0f};
      const auto r =
          p.submit({.prompt_tokens = turn, .max_tokens = 20, .sampling = greedy, .ignore_eos = true}).wait(60s);
      ASSERT_EQ(r.error, errc::ok) << r.message;
      EXPECT_EQ(r.tokens, alone(*m, turn, 20, greedy, true)) << "turn " << k;
      const double hits = p.metrics().get_counter("tandem_prefix_cache_hit_tokens_total", "").value();
      // The earlier turn's KV, whole blocks of it: its prompt and the 19 answer tokens decoded
      // after the first (the last one is never fed back). Disaggregated, the answer's blocks
      // come from the host store, where its decode worker published them.
      if (k > 0) {
        EXPECT_EQ(hits - hits_before, double((prev_len + 19) / 16 * 16));
      }
      hits_before = hits;
      prev_len = turn.size();
      turn.insert(turn.end(), r.tokens.begin(), r.tokens.end());
      for (auto t : prompt_of(10, 50 + k, V)) turn.push_back(t);
    }
    expect_no_leaks(p);
  }
}

// KV-aware routing: with two prefill workers and two prompt families, each family's requests
// go where its prefix is cached, so each prefix is computed once in all. (The weight 4 makes
// the cached prefix outweigh any queue these twelve requests can build; at 1, a family
// member may rightly go to an idle worker rather than queue behind its own family.)
TEST(Pipeline, RequestsGoWhereTheirPrefixIsCached) {
  auto m = tiny();
  const int V = m->config().n_vocab;
  for (double overlap_weight : {4.0, 0.0}) {
    SCOPED_TRACE("overlap weight " + std::to_string(overlap_weight));
    serving_config cfg;
    cfg.model.loaded = m;
    cfg.pools.prefill_workers = 2;
    cfg.pools.decode_workers = 1;
    cfg.scheduling.route_overlap_weight = overlap_weight;
    cfg.pools.kv_blocks_per_worker = 256;
    pipeline p(cfg);
    std::vector<request_handle> hs;
    std::vector<std::vector<token_id>> prompts;
    for (int i = 0; i < 12; ++i) {
      auto prompt = prompt_of(160, 300 + i % 2, V);  // family i % 2: 10 shared blocks
      for (auto t : prompt_of(20, 400 + i, V)) prompt.push_back(t);
      hs.push_back(
          p.submit({.prompt_tokens = prompt, .max_tokens = 4, .sampling = {.temperature = 0.0f}, .ignore_eos = true}));
      prompts.push_back(std::move(prompt));
      std::this_thread::sleep_for(5ms);  // pacing: requests arrive over time, as a client's would
    }
    for (size_t i = 0; i < hs.size(); ++i) {
      const auto r = hs[i].wait(60s);
      ASSERT_EQ(r.error, errc::ok) << r.message;
      EXPECT_EQ(r.tokens, alone(*m, prompts[i], 4, {.temperature = 0.0f}, true));
    }
    const double computed = p.metrics().get_counter("tandem_prompt_tokens_computed_total", "").value();
    if (overlap_weight > 0) {
      EXPECT_EQ(computed, 2 * 180 + 10 * 20);  // one full prompt per family, suffixes for the rest
      EXPECT_EQ(p.metrics().get_counter("tandem_router_prefix_routed_tokens_total", "").value(), 10 * 160);
    } else {
      EXPECT_GE(computed, 2 * 180 + 10 * 20);  // load alone: families may land on both workers
    }
    expect_no_leaks(p);
  }
}

namespace {
// Sends prompts to prefill workers in turn, whatever they hold: what one worker computed
// reaches the other only through the host store.
class round_robin : public prefill_placement {
 public:
  int32_t choose(std::span<const prefill_worker_load> w, int32_t) const override {
    for (size_t tries = 0; tries < w.size(); ++tries) {
      const size_t i = next_++ % w.size();
      if (w[i].alive) return int32_t(i);
    }
    return -1;
  }

 private:
  mutable size_t next_ = 0;
};
}  // namespace

TEST(Pipeline, HostStoreServesPrefixesToOtherWorkers) {
  auto m = tiny();
  const int V = m->config().n_vocab;
  for (bool store : {true, false}) {
    SCOPED_TRACE(store ? "with the store" : "without");
    serving_config cfg;
    cfg.model.loaded = m;
    cfg.pools.prefill_workers = 2;
    cfg.scheduling.prefill_policy = std::make_shared<round_robin>();
    cfg.kv.store_memory_bytes = store ? 64ll << 20 : 0;
    cfg.pools.kv_blocks_per_worker = 256;
    pipeline p(cfg);
    for (int i = 0; i < 6; ++i) {
      auto prompt = prompt_of(160, 77, V);
      for (auto t : prompt_of(20, 500 + i, V)) prompt.push_back(t);
      // Every other one with repetition_penalty, which reads the whole prompt whichever path
      // (a prefill worker, or straight to a decode worker from the store) samples its first token.
      sampling_params sp{.temperature = 0.0f};
      if (i % 2 == 1) sp.repetition_penalty = 1.6f;
      const auto r = p.submit({.prompt_tokens = prompt, .max_tokens = 4, .sampling = sp, .ignore_eos = true}).wait(60s);
      ASSERT_EQ(r.error, errc::ok) << r.message;
      EXPECT_EQ(r.tokens, alone(*m, prompt, 4, sp, true)) << "request " << i;
    }
    const double computed = p.metrics().get_counter("tandem_prompt_tokens_computed_total", "").value();
    // With the store, worker 1's first prompt fetches the 160 tokens worker 0 computed.
    EXPECT_EQ(computed, store ? 180 + 5 * 20 : 2 * 180 + 4 * 20);
    if (store) {
      EXPECT_GT(p.metrics().get_counter("tandem_kv_store_blocks_total", "", {{"event", "fetched"}}).value(), 0);
    }
    expect_no_leaks(p);
  }
}

// Killing the store while requests fetch from it and publish to it loses nothing: fetches
// that get no answer compute instead, a fresh store takes over, outputs stay exact.
TEST(Pipeline, KillingTheHostStoreLosesNoRequest) {
  auto m = tiny();
  const int V = m->config().n_vocab;
  for (auto mode : {serving_mode::disaggregated, serving_mode::colocated}) {
    SCOPED_TRACE(std::string(to_string(mode)));
    serving_config cfg;
    cfg.model.loaded = m;
    cfg.pools.mode = mode;
    cfg.pools.prefill_workers = 2;
    cfg.pools.colocated_workers = 2;
    cfg.scheduling.prefill_policy = std::make_shared<round_robin>();
    cfg.pools.kv_blocks_per_worker = 256;
    pipeline p(cfg);
    std::vector<std::pair<std::vector<token_id>, request_handle>> reqs;
    int kills = 0;
    for (int i = 0; i < 40; ++i) {
      auto prompt = prompt_of(96, 600 + i % 3, V);
      for (auto t : prompt_of(10 + i % 7, 700 + i, V)) prompt.push_back(t);
      auto h =
          p.submit({.prompt_tokens = prompt, .max_tokens = 6, .sampling = {.temperature = 0.0f}, .ignore_eos = true});
      reqs.emplace_back(std::move(prompt), std::move(h));
      if (i % 8 == 4) kills += p.kill("kv_store") == "kv_store";
      std::this_thread::sleep_for(2ms);  // pacing: the kills land among requests arriving over time
    }
    for (auto& [prompt, h] : reqs) {
      const auto r = h.wait(60s);
      ASSERT_EQ(r.error, errc::ok) << r.message;
      EXPECT_EQ(r.tokens, alone(*m, prompt, 6, {.temperature = 0.0f}, true));
    }
    EXPECT_GE(kills, 4);
    expect_no_leaks(p);
  }
}

// A prompt whose full blocks are all in the host store goes straight to a decode worker, which
// fetches them and computes only the tail: no prefill worker, no KV link; the output is what a
// lone engine gives. With the store emptied (killed) it takes the prefill path again.
TEST(Pipeline, WholePromptInTheStoreGoesStraightToDecode) {
  auto m = tiny();
  const int V = m->config().n_vocab;
  serving_config cfg;
  cfg.model.loaded = m;
  cfg.pools.kv_blocks_per_worker = 256;
  pipeline p(cfg);
  const auto direct = [&] { return p.metrics().get_counter("tandem_router_direct_to_decode_total", "").value(); };
  const auto computed = [&] { return p.metrics().get_counter("tandem_prompt_tokens_computed_total", "").value(); };
  const sampling_params greedy{.temperature = 0.0f}, seeded{.temperature = 0.9f, .top_k = 30, .seed = 5};
  const auto prompt = prompt_of(103, 21, V);  // 6 full blocks before the last token, a 7-token tail
  for (int i = 0; i < 2; ++i) {
    const auto& sp = i == 0 ? greedy : seeded;
    const auto r = p.submit({.prompt_tokens = prompt, .max_tokens = 12, .sampling = sp, .ignore_eos = true}).wait(60s);
    ASSERT_EQ(r.error, errc::ok) << r.message;
    EXPECT_EQ(r.tokens, alone(*m, prompt, 12, sp, true));
    EXPECT_EQ(r.timings.kv_bytes > 0, i == 0);  // the direct one moved no KV over a link
  }
  // The first computed all 103 prompt tokens on the prefill worker; the second only the tail,
  // on the decode worker.
  EXPECT_EQ(direct(), 1);
  EXPECT_EQ(computed(), 103 + 7);
  // The next turn of that conversation is not whole in the store: prefill path.
  auto longer = prompt;
  for (auto t : prompt_of(30, 22, V)) longer.push_back(t);
  const auto r2 =
      p.submit({.prompt_tokens = longer, .max_tokens = 5, .sampling = greedy, .ignore_eos = true}).wait(60s);
  ASSERT_EQ(r2.error, errc::ok) << r2.message;
  EXPECT_EQ(r2.tokens, alone(*m, longer, 5, greedy, true));
  EXPECT_EQ(direct(), 1);
  // A new, empty store: the same prompt is prefilled again (and is exact).
  auto& stored = p.metrics().get_gauge("tandem_kv_store_blocks", "", {{"tier", "memory"}});
  ASSERT_GT(stored.value(), 0);
  ASSERT_EQ(p.kill("kv_store"), "kv_store");
  ASSERT_TRUE(eventually([&] { return stored.value() == 0; })) << "no fresh, empty store took the killed one's place";
  const auto r3 =
      p.submit({.prompt_tokens = prompt, .max_tokens = 12, .sampling = greedy, .ignore_eos = true}).wait(60s);
  ASSERT_EQ(r3.error, errc::ok) << r3.message;
  EXPECT_EQ(r3.tokens, alone(*m, prompt, 12, greedy, true));
  EXPECT_EQ(direct(), 1) << "sent straight to decode from an empty store";
  expect_no_leaks(p);
}

// Direct-to-decode requests under decode kills and store kills: each either finishes exactly
// or recovers (reserved again, fetched again, or prefilled); nothing leaks.
TEST(Pipeline, DirectRequestsSurviveDecodeAndStoreKills) {
  auto m = tiny();
  const int V = m->config().n_vocab;
  serving_config cfg;
  cfg.model.loaded = m;
  cfg.pools.decode_workers = 2;
  cfg.pools.kv_blocks_per_worker = 256;
  pipeline p(cfg);
  const sampling_params greedy{.temperature = 0.0f};
  std::vector<std::vector<token_id>> prompts;
  for (int f = 0; f < 3; ++f) {  // put three prompts in the store
    prompts.push_back(prompt_of(70 + 16 * f, 40 + f, V));
    ASSERT_EQ(p.submit({.prompt_tokens = prompts.back(), .max_tokens = 2, .sampling = greedy, .ignore_eos = true})
                  .wait(60s)
                  .error,
              errc::ok);
  }
  // The second prompt's requests with repetition_penalty: sent straight to a decode worker,
  // their first token is sampled there from the whole prompt's logits, the prompt read too.
  auto sp_of = [&](int f) {
    sampling_params sp = greedy;
    if (f == 1) sp.repetition_penalty = 1.6f;
    return sp;
  };
  std::vector<std::pair<int, request_handle>> hs;
  for (int i = 0; i < 30; ++i) {
    hs.emplace_back(
        i % 3,
        p.submit(
            {.prompt_tokens = prompts[size_t(i % 3)], .max_tokens = 10, .sampling = sp_of(i % 3), .ignore_eos = true}));
    if (i % 10 == 3) p.kill(actor_kind::decode, i % 2);
    if (i == 17) p.kill("kv_store");
    std::this_thread::sleep_for(3ms);  // pacing: the kills land among requests arriving over time
  }
  for (auto& [f, h] : hs) {
    const auto r = h.wait(60s);
    ASSERT_EQ(r.error, errc::ok) << r.message;
    EXPECT_EQ(r.tokens, alone(*m, prompts[size_t(f)], 10, sp_of(f), true));
  }
  EXPECT_GT(p.metrics().get_counter("tandem_router_direct_to_decode_total", "").value(), 0);
  expect_no_leaks(p);
}
