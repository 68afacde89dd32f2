// The actor runtime end to end, under kills: workers, request actors and the router killed
// mid-stream lose nothing and outputs stay exact; past the migration limit or a pool's restart
// intensity, requests end (or are refused) clearly, and the pool recovers after its backoff.
#include <gtest/gtest.h>

#include <optional>

#include "runtime/structured/grammar.h"
#include "tests/support/pipeline_fixture.h"

using namespace tandem;
using namespace tandem::testing_support;
using namespace std::chrono_literals;

// Any worker killed while requests decode: nothing is lost. Requests not decoding yet are
// prefilled again; decoding ones migrate (prompt plus tokens so far prefilled again, decoding
// goes on), so every stream is complete, in order, and equal to a run without the fault.
TEST(Pipeline, KilledWorkersLoseNothingAndOutputsStayExact) {
  for (const worker_kind pool : {worker_kind::decode, worker_kind::prefill, worker_kind::colocated}) {
    SCOPED_TRACE(to_string(pool));
    auto m = tiny();
    serving_config cfg;
    cfg.model.loaded = m;
    cfg.pools.mode = pool == worker_kind::colocated ? serving_mode::colocated : serving_mode::disaggregated;
    pipeline p(cfg);
    struct job {
      std::vector<token_id> prompt;
      sampling_params sp;
      request_handle h;
    };
    std::vector<job> jobs;
    // Grammars that cannot complete within 120 tokens (so every request runs to its length).
    const std::string grammars[] = {"root ::= [a-z ]{600,}",
                                    "root ::= item{600,}\nitem ::= \"(\" [a-z]* \")\" | [0-9]"};
    for (int i = 0; i < 8; ++i) {
      job j;
      j.prompt = prompt_of(60, i, 300);
      j.sp = i % 2 == 0 ? sampling_params{.temperature = 0.0f}
                        : sampling_params{.temperature = 0.9f, .top_k = 20, .seed = uint64_t(50 + i)};
      // A grammar resumes exactly too: the matcher's state is a function of the output so far.
      if (i >= 6) {
        ASSERT_TRUE(j.sp.set_grammar(grammars[i - 6]).ok());
      }
      if (i >= 2 && i < 6) {  // logit_bias and min_tokens resume exactly too (functions of index and logits)
        for (token_id t = 10; t < 40; t += 3) {
          j.sp.bias_tokens.push_back(t);
          j.sp.bias_values.push_back(i == 2 ? 4.0f : -3.0f);
        }
        j.sp.min_tokens = 100;
        j.sp.frequency_penalty = i == 3 ? 0.7f : 0.0f;  // the penalties read the output so far,
        j.sp.presence_penalty = i >= 4 ? 1.5f : 0.0f;  // carried across the kill
        j.sp.repetition_penalty = i == 5 ? 1.4f : 1.0f;  // reads the prompt too
      }
      j.h = p.submit({.prompt_tokens = j.prompt, .max_tokens = 120, .sampling = j.sp, .ignore_eos = true});
      jobs.push_back(std::move(j));
    }
    // Killed once the first request is decoding (token 2 comes from a decode step).
    std::vector<token_id> first;
    request_event ev;
    while (jobs[0].h.next(ev, 10s)) {
      if (ev.kind == event_kind::token && ev.token >= 0) first.push_back(ev.token);
      if (first.size() >= 3) break;
    }
    ASSERT_TRUE(p.kill_worker(pool, 0));
    for (size_t i = 0; i < jobs.size(); ++i) {
      auto r = jobs[i].h.wait(30s);
      ASSERT_EQ(r.error, errc::ok) << i << ": " << r.message;
      EXPECT_EQ(r.finish_reason, finish_reason::length);
      if (i == 0) r.tokens.insert(r.tokens.begin(), first.begin(), first.end());
      EXPECT_EQ(r.tokens, alone(*m, jobs[i].prompt, 120, jobs[i].sp, true)) << "request " << i;
      if (i >= 6) {
        grammar_matcher gm(grammar::compile(grammars[i - 6]), nullptr);
        EXPECT_TRUE(gm.accept_bytes(m->tok().decode(r.tokens))) << m->tok().decode(r.tokens);
      }
    }
    // The kill is asynchronous: the router counts the restart when the worker's down message
    // arrives, and a killed prefill worker holds up no decoding request, so the requests can all
    // end before that (seen under ASan on 2 cores). Waited for, within a bound.
    auto& restarts = p.metrics().get_counter("tandem_restarts_total", "", {{"kind", std::string(to_string(pool))}});
    EXPECT_TRUE(eventually([&] { return restarts.value() >= 1; })) << "the kill was never counted as a restart";
    EXPECT_EQ(restarts.value(), 1);
    const std::string prom = p.metrics().to_prometheus();
    EXPECT_NE(prom.find("tandem_restarts_total{kind=\"" + std::string(to_string(pool)) + "\"} 1"), std::string::npos);
    if (pool != worker_kind::prefill) {  // the first request was decoding on the killed worker
      EXPECT_NE(prom.find("tandem_migrations_total"), std::string::npos);
    }
    // The supervisor restarted it: new work succeeds.
    EXPECT_TRUE(eventually(
        [&] {
          return p.submit({.prompt_tokens = prompt_of(20, 1, 300), .max_tokens = 5, .ignore_eos = true})
                     .wait(10s)
                     .error == errc::ok;
        },
        60s, 20ms))
        << "no request succeeded after the restart";
    expect_no_leaks(p);
  }
}

// Shared cores (pools.share_cores): the prefill and decode workers compute on as many of the
// process's cores as the other leaves, decode paced while a prompt computes; the tokens are a
// lone engine's (the kernels do not depend on the thread count), also across a kill of either
// worker (the killed one's pool leaves the share, its restart joins it).
TEST(Pipeline, SharedCoresKeepOutputsExactThroughKills) {
  for (const worker_kind pool : {worker_kind::decode, worker_kind::prefill}) {
    SCOPED_TRACE(to_string(pool));
    auto m = tiny();
    serving_config cfg;
    cfg.model.loaded = m;
    cfg.pools.share_cores = true;
    cfg.pools.threads_per_worker = 1;  // 2 cores shared
    cfg.steps.decode_pace_ms = 4;
    cfg.steps.prefill_token_budget = 32;  // prompts of several steps, so prefill and decode overlap
    pipeline p(cfg);
    std::vector<std::vector<token_id>> prompts;
    std::vector<request_handle> hs;
    const sampling_params greedy{.temperature = 0.0f};
    for (int i = 0; i < 6; ++i) {
      prompts.push_back(prompt_of(90 + 7 * i, i, 300));
      hs.push_back(
          p.submit({.prompt_tokens = prompts.back(), .max_tokens = 80, .sampling = greedy, .ignore_eos = true}));
    }
    std::vector<token_id> first;
    request_event ev;
    while (hs[0].next(ev, 10s)) {
      if (ev.kind == event_kind::token && ev.token >= 0) first.push_back(ev.token);
      if (first.size() >= 3) break;
    }
    ASSERT_TRUE(p.kill_worker(pool, 0));
    for (size_t i = 0; i < hs.size(); ++i) {
      auto r = hs[i].wait(30s);
      ASSERT_EQ(r.error, errc::ok) << i << ": " << r.message;
      if (i == 0) r.tokens.insert(r.tokens.begin(), first.begin(), first.end());
      EXPECT_EQ(r.tokens, alone(*m, prompts[i], 80, greedy, true)) << "request " << i;
    }
    expect_no_leaks(p);
  }
}

// A request actor killed mid-decode: its reader gets an error, and everything it held is freed.
TEST(Pipeline, KilledRequestActorEndsWithAnErrorAndFreesItsKv) {
  for (auto mode : {serving_mode::disaggregated, serving_mode::colocated}) {
    SCOPED_TRACE(std::string(to_string(mode)));
    serving_config cfg;
    cfg.model.loaded = tiny();
    cfg.pools.mode = mode;
    pipeline p(cfg);
    auto h = p.submit({.prompt_tokens = prompt_of(60, 3, 300), .max_tokens = 200, .ignore_eos = true});
    auto other = p.submit({.prompt_tokens = prompt_of(30, 4, 300), .max_tokens = 20, .ignore_eos = true});
    request_event ev;
    while (h.next(ev, 10s) && !(ev.kind == event_kind::token && ev.index >= 2)) {}
    ASSERT_TRUE(p.kill_request(h.id()));
    const auto r = h.wait(30s);
    EXPECT_EQ(r.error, errc::worker_failed) << r.message;
    EXPECT_EQ(other.wait(30s).error, errc::ok);  // everyone else goes on
    expect_no_leaks(p);
    EXPECT_FALSE(p.kill_request(h.id()));
  }
}

// Past the migration limit a request ends with a clear error instead of moving forever.
TEST(Pipeline, MigrationLimitEndsTheRequestClearly) {
  serving_config cfg;
  cfg.model.loaded = tiny();
  cfg.scheduling.max_migrations = 0;
  pipeline p(cfg);
  // Every step 20 ms slower, so that the 200 tokens cannot all come before the kill lands (on
  // a loaded machine the request once finished first).
  p.inject(fault_kind::stall, 1000, std::chrono::milliseconds(20));
  auto h = p.submit({.prompt_tokens = prompt_of(60, 3, 300), .max_tokens = 200, .ignore_eos = true});
  request_event ev;
  while (h.next(ev, 10s) && !(ev.kind == event_kind::token && ev.index >= 2)) {}
  ASSERT_TRUE(p.kill_worker(worker_kind::decode, 0));
  const auto r = h.wait(30s);
  EXPECT_EQ(r.error, errc::worker_failed);
  EXPECT_NE(r.message.find("migration limit"), std::string::npos) << r.message;
  expect_no_leaks(p);
}

// Fault injection by kind or by the name kill() returns; unknown kinds are refused clearly.
TEST(Pipeline, KillsByKindAndByName) {
  serving_config cfg;
  cfg.model.loaded = tiny();
  cfg.pools.prefill_workers = 1;
  cfg.pools.decode_workers = 2;
  pipeline p(cfg);
  auto until_named = [&](const std::string& what) {  // an actor not started (or joined) yet is tried again
    return eventually_value([&]() -> std::optional<std::string> {
             auto name = p.kill(what);
             return name.empty() ? std::nullopt : std::optional(name);
           })
        .value_or("");
  };
  EXPECT_EQ(until_named("decode-1"), "decode-1");
  EXPECT_EQ(until_named("kv_link-p0-d0"), "kv_link-p0-d0");
  EXPECT_EQ(until_named("prefill"), "prefill-0");  // the only one of its kind
  EXPECT_THROW(p.kill("nonsense"), failure);
  EXPECT_EQ(p.kill("request-424242"), "");  // no such request
  // Still serving afterwards, exactly.
  const auto prompt = prompt_of(12, 3, tiny()->config().n_vocab);
  auto r = p.submit({.prompt_tokens = prompt, .max_tokens = 8, .ignore_eos = true}).wait();
  EXPECT_EQ(r.finish_reason, finish_reason::length) << r.message;
  EXPECT_EQ(r.tokens, testing_support::alone(*tiny(), prompt, 8, {.temperature = 0.0f}, true));
}

// Past its restart intensity a pool stays empty (degraded): what waits for it ends with
// worker_failed instead of hanging, new requests are refused at once, the metrics say so. A
// restart within the intensity only delays requests.
// Issue 22: the router pushed past its restart intensity no longer stays degraded for good:
// requests are refused (an error, not a hang) until the root starts it again after its
// backoff, and then it serves exactly as before.
TEST(Pipeline, RouterPastItsRestartIntensityRecoversAfterItsBackoff) {
  auto m = tiny();
  serving_config cfg;
  cfg.model.loaded = m;
  cfg.pools.max_router_restarts = 1;
  cfg.pools.recover_after = 1500ms;
  pipeline p(cfg);
  const sampling_params greedy{.temperature = 0.0f};
  const auto prompt = prompt_of(20, 3, m->config().n_vocab);
  auto r = p.submit({.prompt_tokens = prompt, .max_tokens = 8, .sampling = greedy, .ignore_eos = true}).wait(30s);
  ASSERT_EQ(r.error, errc::ok) << r.message;
  // Killed twice (one restart allowed in the window): degraded.
  for (int k = 0; k < 2; ++k) {
    ASSERT_TRUE(eventually([&] { return !p.kill("router").empty(); })) << "kill " << k << ": no router to kill";
    if (k == 0) {  // the restarted router is up before the second kill
      ASSERT_TRUE(eventually(
          [&] {
            return p.submit({.prompt_tokens = prompt, .max_tokens = 1, .sampling = greedy}).wait(30s).error == errc::ok;
          },
          60s, 10ms))
          << "the router restarted after the first kill never served";
    }
  }
  ASSERT_TRUE(eventually([&] { return p.degraded(); })) << "two router kills did not degrade the pipeline";
  EXPECT_EQ(p.metrics().get_gauge("tandem_pool_degraded", "", {{"pool", "router"}}).value(), 1);
  r = p.submit({.prompt_tokens = prompt, .max_tokens = 8, .sampling = greedy, .ignore_eos = true}).wait(30s);
  EXPECT_EQ(r.error, errc::worker_failed) << r.message;
  EXPECT_NE(r.message.find("tries again by itself"), std::string::npos) << r.message;
  EXPECT_GE(r.retry_after_ms, 1000) << "a hint to retry once the backoff is over";
  // After the backoff it serves again by itself, exactly.
  ASSERT_TRUE(eventually([&] { return !p.degraded(); })) << "still degraded 10 s after a 1.5 s backoff";
  EXPECT_EQ(p.metrics().get_gauge("tandem_pool_degraded", "", {{"pool", "router"}}).value(), 0);
  EXPECT_EQ(p.metrics().get_counter("tandem_pool_recoveries_total", "", {{"pool", "router"}}).value(), 1);
  r = p.submit({.prompt_tokens = prompt, .max_tokens = 8, .sampling = greedy, .ignore_eos = true}).wait(30s);
  ASSERT_EQ(r.error, errc::ok) << r.message;
  EXPECT_EQ(r.tokens, alone(*m, prompt, 8, greedy, true));
  expect_no_leaks(p);
}

// Issue 22: a pool past its restart intensity is degraded (refuses at once, not a hang), and
// does not stay so: after its backoff it starts its workers again and serves exactly.
TEST(Pipeline, PoolPastItsRestartIntensityIsDegradedAndRefusesThenRecovers) {
  auto m = tiny();
  serving_config cfg;
  cfg.model.loaded = m;
  cfg.pools.max_worker_restarts = 1;
  cfg.pools.restart_window = 60000ms;
  cfg.pools.recover_after = 4000ms;  // past the 2 s after which waiting requests end
  pipeline p(cfg);
  auto kill_decode = [&p] {  // a worker not joined yet (start-up, restart) is tried again
    return eventually_value([&]() -> std::optional<std::string> {
             auto name = p.kill(actor_kind::decode, 0);
             return name.empty() ? std::nullopt : std::optional(name);
           })
        .value_or("");
  };
  ASSERT_EQ(kill_decode(), "decode-0");  // restarted: within the intensity
  auto during = p.submit({.prompt_tokens = prompt_of(20, 1, 300), .max_tokens = 8, .ignore_eos = true});
  EXPECT_EQ(during.wait(30s).error, errc::ok);  // queued while it restarted, then served
  ASSERT_EQ(kill_decode(), "decode-0");  // the second death: past the intensity, no restart
  auto waiting = p.submit({.prompt_tokens = prompt_of(20, 2, 300), .max_tokens = 8, .ignore_eos = true});
  const auto r = waiting.wait(30s);
  EXPECT_EQ(r.error, errc::worker_failed) << r.message;
  auto later = p.submit({.prompt_tokens = prompt_of(20, 3, 300), .max_tokens = 8, .ignore_eos = true});
  const auto t0 = std::chrono::steady_clock::now();
  const auto r2 = later.wait(30s);
  EXPECT_EQ(r2.error, errc::worker_failed) << r2.message;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s) << "refused at once, not after the stranded delay";
  EXPECT_EQ(p.metrics().get_gauge("tandem_pool_degraded", "", {{"pool", "decode"}}).value(), 1);
  EXPECT_EQ(p.snapshot()->degraded_pools, std::vector<std::string>{"decode"});
  // The backoff ends: the pool starts decode-0 again and serving resumes by itself, exactly.
  auto& degraded = p.metrics().get_gauge("tandem_pool_degraded", "", {{"pool", "decode"}});
  EXPECT_TRUE(eventually([&] { return degraded.value() == 0; })) << "still degraded 10 s after a 4 s backoff";
  EXPECT_EQ(degraded.value(), 0);
  EXPECT_EQ(p.metrics().get_counter("tandem_pool_recoveries_total", "", {{"pool", "decode"}}).value(), 1);
  EXPECT_TRUE(eventually([&] { return p.snapshot()->degraded_pools.empty(); }))
      << "the snapshot still lists a degraded pool";
  const sampling_params greedy{.temperature = 0.0f};
  const auto prompt = prompt_of(20, 4, m->config().n_vocab);
  generation_result r3;
  (void)eventually(  // until the restarted worker has joined the router; the assertion says why not
      [&] {
        r3 = p.submit({.prompt_tokens = prompt, .max_tokens = 8, .sampling = greedy, .ignore_eos = true}).wait(30s);
        return r3.error == errc::ok;
      },
      60s, 20ms);
  ASSERT_EQ(r3.error, errc::ok) << r3.message;
  EXPECT_EQ(r3.tokens, alone(*m, prompt, 8, greedy, true));
  expect_no_leaks(p);
}
