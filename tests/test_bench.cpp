// The benchmark's statistics on hand-made latency sets, and its trace generators.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "tools/bench/stats.h"
#include "tools/bench/trace.h"

using namespace tandem::bench;

TEST(BenchStats, PercentilesInterpolateBetweenRanks) {
  const std::vector<double> v = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  EXPECT_DOUBLE_EQ(percentile(v, 0), 1);
  EXPECT_DOUBLE_EQ(percentile(v, 50), 5.5);
  EXPECT_DOUBLE_EQ(percentile(v, 90), 9.1);
  EXPECT_DOUBLE_EQ(percentile(v, 99), 9.91);
  EXPECT_DOUBLE_EQ(percentile(v, 100), 10);
  EXPECT_DOUBLE_EQ(percentile({7}, 99), 7);
  EXPECT_DOUBLE_EQ(percentile({}, 50), 0);
  const summary s = summarize({10, 1, 4, 3, 2});  // unsorted in
  EXPECT_EQ(s.count, 5);
  EXPECT_DOUBLE_EQ(s.mean, 4);
  EXPECT_DOUBLE_EQ(s.p50, 3);
  EXPECT_DOUBLE_EQ(s.min, 1);
  EXPECT_DOUBLE_EQ(s.max, 10);
  EXPECT_DOUBLE_EQ(s.p90, 7.6);
}

request_outcome done(double send, double ttft, double e2e, int out, std::vector<double> itl = {}) {
  request_outcome r;
  r.ok = true;
  r.send_s = send;
  r.ttft_s = ttft;
  r.e2e_s = e2e;
  r.prompt_tokens = 100;
  r.output_tokens = out;
  r.itl_s = std::move(itl);
  return r;
}

TEST(BenchStats, TpotGoodputAndAttainment) {
  std::vector<request_outcome> rs = {
      done(0, 0.1, 1.1, 11, {0.1, 0.1}),  // TPOT 0.1: meets both
      done(1, 0.5, 1.5, 11),              // TTFT 0.5: misses the TTFT SLO
      done(2, 0.1, 3.1, 11),              // TPOT 0.3: misses the TPOT SLO
      done(3, 0.2, 0.2, 1),               // one token: no TPOT, meets any TPOT SLO
  };
  request_outcome failed;
  rs.push_back(failed);
  EXPECT_DOUBLE_EQ(*tpot_of(rs[0]), 0.1);
  EXPECT_FALSE(tpot_of(rs[3]).has_value());
  const slo s{.ttft_s = 0.3, .tpot_s = 0.2};
  EXPECT_TRUE(meets(rs[0], s));
  EXPECT_FALSE(meets(rs[1], s));
  EXPECT_FALSE(meets(rs[2], s));
  EXPECT_TRUE(meets(rs[3], s));
  EXPECT_FALSE(meets(rs[4], s));
  const run_figures f = compute_figures(rs, 4.0, s);
  EXPECT_EQ(f.sent, 5);
  EXPECT_EQ(f.completed, 4);
  EXPECT_EQ(f.failed, 1);
  EXPECT_EQ(f.output_tokens, 34);
  EXPECT_DOUBLE_EQ(f.request_throughput, 1.0);
  EXPECT_DOUBLE_EQ(f.output_tokens_per_s, 8.5);
  EXPECT_DOUBLE_EQ(f.prompt_tokens_per_s, 100.0);
  EXPECT_DOUBLE_EQ(f.goodput, 0.5);          // two good requests in 4 s
  EXPECT_DOUBLE_EQ(f.slo_attainment, 0.4);   // of the five sent
  EXPECT_EQ(f.tpot_s.count, 3);
  EXPECT_NEAR(f.tpot_s.mean, (0.1 + 0.1 + 0.3) / 3, 1e-12);
  EXPECT_EQ(f.itl_s.count, 2);
  EXPECT_EQ(f.ttft_s.count, 4);
  // Without SLOs every finished request is good.
  EXPECT_DOUBLE_EQ(compute_figures(rs, 4.0, slo{}).goodput, 1.0);
}

TEST(BenchTrace, GeneratorsAreDeterministicAndShaped) {
  trace_options o;
  o.requests = 2000;
  o.rate = 4;
  o.seed = 7;
  for (auto kind : {workload::short_prompts, workload::long_prompts, workload::mixed}) {
    o.kind = kind;
    const auto a = make_trace(o), b = make_trace(o);
    ASSERT_EQ(a.size(), 2000u);
    int longs = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].arrival_s, b[i].arrival_s);
      EXPECT_EQ(a[i].prompt_tokens, b[i].prompt_tokens);
      EXPECT_EQ(a[i].output_tokens, b[i].output_tokens);
      if (i > 0) {
        EXPECT_GE(a[i].arrival_s, a[i - 1].arrival_s);
      }
      const bool is_long = a[i].prompt_tokens >= 1000;
      longs += is_long;
      if (is_long) {
        EXPECT_LE(a[i].prompt_tokens, 4000);
        EXPECT_TRUE(a[i].output_tokens >= 30 && a[i].output_tokens <= 100);
      } else {
        EXPECT_TRUE(a[i].prompt_tokens >= 100 && a[i].prompt_tokens <= 300);
        EXPECT_TRUE(a[i].output_tokens >= 100 && a[i].output_tokens <= 200);
      }
    }
    switch (kind) {
      case workload::short_prompts: EXPECT_EQ(longs, 0); break;
      case workload::long_prompts: EXPECT_EQ(longs, 2000); break;
      case workload::mixed: EXPECT_NEAR(longs / 2000.0, 0.25, 0.04); break;
    }
    EXPECT_NEAR(1999.0 / a.back().arrival_s, 4.0, 0.4);  // the mean rate
  }
  o.seed = 8;
  EXPECT_NE(make_trace(o)[1].arrival_s, make_trace(trace_options{.kind = o.kind, .requests = 2000, .rate = 4, .seed = 7})[1].arrival_s);
}

TEST(BenchTrace, GammaArrivalsAreBurstierWithTheSameMean) {
  trace_options o{.requests = 4000, .rate = 10, .arrival = arrival_kind::gamma, .burstiness = 0.25, .seed = 3};
  const auto t = make_trace(o);
  std::vector<double> gaps;
  for (size_t i = 1; i < t.size(); ++i) gaps.push_back(t[i].arrival_s - t[i - 1].arrival_s);
  double mean = 0, var = 0;
  for (double g : gaps) mean += g / double(gaps.size());
  for (double g : gaps) var += (g - mean) * (g - mean) / double(gaps.size());
  EXPECT_NEAR(mean, 0.1, 0.01);
  // Gamma with shape k: coefficient of variation 1/sqrt(k) = 2 (Poisson: 1).
  EXPECT_NEAR(std::sqrt(var) / mean, 2.0, 0.25);
}

TEST(BenchTrace, ContextBoundsAndRates) {
  trace_options o{.kind = workload::long_prompts, .requests = 200, .rate = 2, .seed = 1, .max_context = 2048};
  for (const auto& e : make_trace(o)) EXPECT_LT(e.prompt_tokens + e.output_tokens, 2048);
  const auto t = make_trace(o);
  const auto faster = at_rate(t, 8);
  EXPECT_NEAR(199.0 / faster.back().arrival_s, 8.0, 1e-9);
  EXPECT_EQ(faster[5].prompt_tokens, t[5].prompt_tokens);
}

TEST(BenchTrace, FilesRoundTripAndBadLinesAreNamed) {
  const auto dir = std::filesystem::temp_directory_path();
  const std::string path = (dir / "tandem_test_trace.jsonl").string();
  std::vector<trace_entry> t = {{0.5, 0, "hello there", 12}, {0.0, 300, "", 40}};
  save_trace(t, path);
  const auto back = load_trace(path);  // sorted by arrival
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[0].prompt_tokens, 300);
  EXPECT_EQ(back[1].prompt_text, "hello there");
  EXPECT_EQ(back[1].output_tokens, 12);
  {
    std::ofstream out(path);
    out << R"({"arrival_s": 0, "prompt_tokens": 5, "output_tokens": 3})" << "\n\n"
        << R"({"arrival_s": 1, "prompt_tokens": 5})" << "\n";
  }
  try {
    load_trace(path);
    FAIL() << "a line without output_tokens was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(":3: 'output_tokens'"), std::string::npos) << e.what();
  }
  { std::ofstream(path) << "not json\n"; }
  EXPECT_THROW(load_trace(path), std::runtime_error);
  EXPECT_THROW(load_trace(path + ".missing"), std::runtime_error);
  std::filesystem::remove(path);
}
