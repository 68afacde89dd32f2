// The benchmark's statistics on hand-made latency sets, its trace generators, the synthetic
// prompts a prefix cache sees, and the runner's closed-loop conversations against a fake server.
#include <gtest/gtest.h>

// Beast's parser headers trip GCC 12's -Wmaybe-uninitialized (a false positive; the library's
// own client.cpp and the test_server_*.cpp turn it off too).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <boost/asio.hpp>
#include <boost/beast.hpp>
#include <nlohmann/json.hpp>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include <unistd.h>

#include "runtime/errors.h"
#include "tools/bench/client.h"
#include "tools/bench/compare.h"
#include "tools/bench/llama_bench.h"
#include "tools/bench/serve.h"
#include "tools/bench/stats.h"
#include "tools/bench/trace.h"

using namespace tandem::bench;

TEST(BenchStats, PercentilesInterpolateBetweenRanks) {
  const std::vector<double> v = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  EXPECT_DOUBLE_EQ(percentile(v, 0), 1);
  EXPECT_DOUBLE_EQ(percentile(v, 50), 5.5);
  EXPECT_DOUBLE_EQ(percentile(v, 90), 9.1);
  EXPECT_DOUBLE_EQ(percentile(v, 99), 9.91);
  // The median of interleaved rounds: unsorted input, odd and even counts, none.
  EXPECT_DOUBLE_EQ(median({3, 1, 2}), 2);
  EXPECT_DOUBLE_EQ(median({4, 1, 3, 2}), 2.5);
  EXPECT_DOUBLE_EQ(median({}), 0);
  // Ratios pair by pair (2, 4, 3): 3, not the ratio of the medians (4 / 1).
  EXPECT_DOUBLE_EQ(median_ratio({2, 4, 9}, {1, 1, 3}), 3);
  EXPECT_DOUBLE_EQ(median_ratio({2, 4, 9, 100}, {1, 1, 3}), 3);  // pairs only
  EXPECT_DOUBLE_EQ(median_ratio({}, {}), 0);
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
      done(1, 0.5, 1.5, 11),  // TTFT 0.5: misses the TTFT SLO
      done(2, 0.1, 3.1, 11),  // TPOT 0.3: misses the TPOT SLO
      done(3, 0.2, 0.2, 1),  // one token: no TPOT, meets any TPOT SLO
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
  EXPECT_DOUBLE_EQ(f.goodput, 0.5);  // two good requests in 4 s
  EXPECT_DOUBLE_EQ(f.slo_attainment, 0.4);  // of the five sent
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
      default: FAIL() << "not a prompt-length workload";
    }
    EXPECT_NEAR(1999.0 / a.back().arrival_s, 4.0, 0.4);  // the mean rate
  }
  o.seed = 8;
  EXPECT_NE(make_trace(o)[1].arrival_s,
            make_trace(trace_options{.kind = o.kind, .requests = 2000, .rate = 4, .seed = 7})[1].arrival_s);
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
    out << R"({"arrival_s": 0, "prompt_tokens": 5, "output_tokens": 3})"
        << "\n\n"
        << R"({"arrival_s": 1, "prompt_tokens": 5})"
        << "\n";
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

// ------------------------------------------------------------ prefix-cache workloads

namespace {

// Every field, so that a generator or a file round trip losing one fails.
void expect_same(const trace_entry& a, const trace_entry& b, size_t i) {
  EXPECT_EQ(a.arrival_s, b.arrival_s) << i;
  EXPECT_EQ(a.prompt_tokens, b.prompt_tokens) << i;
  EXPECT_EQ(a.prompt_text, b.prompt_text) << i;
  EXPECT_EQ(a.output_tokens, b.output_tokens) << i;
  EXPECT_EQ(a.prefix_group, b.prefix_group) << i;
  EXPECT_EQ(a.prefix_tokens, b.prefix_tokens) << i;
  EXPECT_EQ(a.conversation, b.conversation) << i;
  EXPECT_EQ(a.turn, b.turn) << i;
  EXPECT_EQ(a.new_tokens, b.new_tokens) << i;
  EXPECT_EQ(a.block_ids, b.block_ids) << i;
  EXPECT_EQ(a.block_tokens, b.block_tokens) << i;
}

void expect_same(const std::vector<trace_entry>& a, const std::vector<trace_entry>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) expect_same(a[i], b[i], i);
}

std::string temp_path(const std::string& name) { return (std::filesystem::temp_directory_path() / name).string(); }

}  // namespace

TEST(BenchTrace, NewWorkloadNames) {
  workload w;
  ASSERT_TRUE(parse_workload("system-prompt", w));
  EXPECT_EQ(w, workload::shared_prefix);
  ASSERT_TRUE(parse_workload("multiturn", w));
  EXPECT_EQ(w, workload::multiturn);
  EXPECT_FALSE(parse_workload("system_prompt", w));
  EXPECT_FALSE(parse_workload("multi-turn", w));
}

TEST(BenchTrace, SystemPromptIsDeterministicAndShaped) {
  trace_options o{.kind = workload::shared_prefix, .requests = 600, .rate = 5, .seed = 11};
  const auto a = make_trace(o);
  expect_same(a, make_trace(o));
  ASSERT_EQ(a.size(), 600u);
  int64_t prefix = 0, prompt = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const auto& e = a[i];
    EXPECT_EQ(e.prefix_group, 0);  // one group by default
    EXPECT_EQ(e.prefix_tokens, 1024);
    EXPECT_TRUE(e.prompt_tokens - e.prefix_tokens >= 64 && e.prompt_tokens - e.prefix_tokens <= 192) << e.prompt_tokens;
    EXPECT_TRUE(e.output_tokens >= 16 && e.output_tokens <= 48) << e.output_tokens;
    EXPECT_EQ(e.conversation, -1);
    if (i > 0) {
      EXPECT_GE(e.arrival_s, a[i - 1].arrival_s);
    }
    prefix += e.prefix_tokens;
    prompt += e.prompt_tokens;
  }
  EXPECT_NEAR(599.0 / a.back().arrival_s, 5.0, 0.6);  // the mean rate, as the other traces
  EXPECT_GE(shared_prefix_share(a), 0.8);
  EXPECT_DOUBLE_EQ(shared_prefix_share(a), double(prefix) / double(prompt));
  o.seed = 12;
  const auto other = make_trace(o);
  EXPECT_NE(other[1].arrival_s, a[1].arrival_s);
  // Groups: each request picks one, all of them used, roughly evenly.
  o.prefix_groups = 4;
  std::map<int32_t, int> per_group;
  for (const auto& e : make_trace(o)) ++per_group[e.prefix_group];
  ASSERT_EQ(per_group.size(), 4u);
  for (const auto& [g, c] : per_group) {
    EXPECT_TRUE(g >= 0 && g < 4) << g;
    EXPECT_NEAR(c / 600.0, 0.25, 0.06) << g;
  }
  EXPECT_THROW(make_trace(trace_options{.kind = workload::shared_prefix, .prefix_tokens = 0}), std::invalid_argument);
  EXPECT_THROW(make_trace(trace_options{.kind = workload::shared_prefix, .prefix_groups = 0}), std::invalid_argument);
}

TEST(BenchTrace, SystemPromptFitsTheContextKeepingOnePrefix) {
  for (int32_t ctx : {2048, 512, 64, 8}) {
    const auto t =
        make_trace(trace_options{.kind = workload::shared_prefix, .requests = 300, .seed = 3, .max_context = ctx});
    std::set<int32_t> prefixes;
    for (const auto& e : t) {
      EXPECT_LT(e.prompt_tokens + e.output_tokens, ctx);
      EXPECT_GE(e.prefix_tokens, 1);
      EXPECT_GT(e.prompt_tokens, e.prefix_tokens) << "no question after the shared prefix";
      prefixes.insert(e.prefix_tokens);
    }
    EXPECT_EQ(prefixes.size(), 1u) << "a group's requests must share the same prefix length";
    if (ctx >= 512) {
      EXPECT_GE(shared_prefix_share(t), 0.8) << ctx;  // shrunk together, the share holds
    }
  }
  EXPECT_THROW(make_trace(trace_options{.kind = workload::shared_prefix, .max_context = 3}), std::invalid_argument);
}

TEST(BenchTrace, SystemPromptSynthesisSharesExactlyTheGroupPrefix) {
  const auto t =
      make_trace(trace_options{.kind = workload::shared_prefix, .requests = 60, .seed = 9, .prefix_groups = 3});
  serve_options so;
  so.seed = 9;
  so.vocab = 256;
  std::map<int32_t, std::vector<int32_t>> first_of_group;  // group -> its first request's prefix
  std::set<std::vector<int32_t>> suffixes;
  for (size_t i = 0; i < t.size(); ++i) {
    const auto p = synthetic_prompt(t[i], i, so);
    ASSERT_EQ(p.size(), size_t(t[i].prompt_tokens));
    for (int32_t id : p) ASSERT_TRUE(id >= 3 && id < 3 + 256) << id;
    const std::vector<int32_t> prefix(p.begin(), p.begin() + t[i].prefix_tokens);
    const auto [it, fresh] = first_of_group.emplace(t[i].prefix_group, prefix);
    if (!fresh) {
      EXPECT_EQ(prefix, it->second) << "request " << i << " of group " << t[i].prefix_group;
    }
    // The question after the prefix is the request's own: its first block (16 tokens) differs
    // from every other request's, so that a cache cannot reuse past the prefix.
    suffixes.emplace(p.begin() + t[i].prefix_tokens, p.begin() + t[i].prefix_tokens + 16);
  }
  ASSERT_EQ(first_of_group.size(), 3u);
  EXPECT_NE(first_of_group[0], first_of_group[1]);
  EXPECT_NE(first_of_group[0], first_of_group[2]);
  EXPECT_NE(first_of_group[1], first_of_group[2]);
  // Different groups differ from their first block on, not only somewhere.
  EXPECT_NE(std::vector<int32_t>(first_of_group[0].begin(), first_of_group[0].begin() + 16),
            std::vector<int32_t>(first_of_group[1].begin(), first_of_group[1].begin() + 16));
  EXPECT_EQ(suffixes.size(), t.size());
  // The prefix depends on the seed; a request without a group keeps the old, per-request prompt.
  so.seed = 10;
  EXPECT_NE(synthetic_prompt(t[0], 0, so), synthetic_prompt(t[0], 0, serve_options{.seed = 9}));
  trace_entry plain{.prompt_tokens = 40};
  EXPECT_NE(synthetic_prompt(plain, 0, so), synthetic_prompt(plain, 1, so));
  EXPECT_EQ(synthetic_prompt(plain, 7, so), synthetic_prompt(plain, 7, so));
}

TEST(BenchTrace, MultiturnConversationsGrowTurnByTurn) {
  trace_options o{.kind = workload::multiturn, .rate = 2, .seed = 5};
  const auto t = make_trace(o);
  expect_same(t, make_trace(o));
  ASSERT_EQ(t.size(), size_t(o.conversations * o.turns));  // 8 x 4 by default
  ASSERT_EQ(t.size(), 32u);
  std::map<int32_t, std::vector<trace_entry>> convs;
  for (size_t i = 0; i < t.size(); ++i) {
    if (i > 0) {
      EXPECT_GE(t[i].arrival_s, t[i - 1].arrival_s);
    }
    convs[t[i].conversation].push_back(t[i]);
  }
  ASSERT_EQ(convs.size(), 8u);
  for (const auto& [c, turns] : convs) {
    ASSERT_TRUE(c >= 0 && c < 8) << c;
    ASSERT_EQ(turns.size(), 4u);
    for (size_t k = 0; k < turns.size(); ++k) {
      const auto& e = turns[k];
      EXPECT_EQ(e.turn, int32_t(k)) << "conversation " << c << ": turns out of order";
      EXPECT_EQ(e.prefix_group, -1);
      EXPECT_TRUE(e.output_tokens >= 16 && e.output_tokens <= 48) << e.output_tokens;
      if (k == 0) {
        EXPECT_TRUE(e.prompt_tokens >= 256 && e.prompt_tokens <= 512) << e.prompt_tokens;
        EXPECT_EQ(e.new_tokens, e.prompt_tokens);
      } else {
        const auto& p = turns[k - 1];
        EXPECT_TRUE(e.new_tokens >= 32 && e.new_tokens <= 96) << e.new_tokens;
        EXPECT_EQ(e.prompt_tokens, p.prompt_tokens + p.output_tokens + e.new_tokens);
        EXPECT_GT(e.arrival_s, p.arrival_s);  // a think time after the turn before
      }
    }
  }
  const double share = shared_prefix_share(t);
  EXPECT_GT(share, 0.5);  // three turns in four resend a history longer than their new message
  EXPECT_LT(share, 1.0);
  o.seed = 6;
  EXPECT_NE(make_trace(o)[0].prompt_tokens + make_trace(o)[1].arrival_s, t[0].prompt_tokens + t[1].arrival_s);
  EXPECT_THROW(make_trace(trace_options{.kind = workload::multiturn, .conversations = 0}), std::invalid_argument);
  EXPECT_THROW(make_trace(trace_options{.kind = workload::multiturn, .turns = 0}), std::invalid_argument);
}

TEST(BenchTrace, MultiturnFitsTheContextWithItsLastTurn) {
  for (int32_t ctx : {600, 256, 40, 13}) {
    const auto t = make_trace(
        trace_options{.kind = workload::multiturn, .seed = 2, .max_context = ctx, .conversations = 5, .turns = 6});
    ASSERT_EQ(t.size(), 30u) << ctx;  // the turns are kept; their lengths give way
    for (const auto& e : t) {
      EXPECT_LT(e.prompt_tokens + e.output_tokens, ctx) << "conversation " << e.conversation << " turn " << e.turn;
      EXPECT_GE(e.new_tokens, 1);
      EXPECT_GE(e.output_tokens, 1);
    }
  }
  // Six turns need at least a token each of opening, outputs and messages: 12, below 13.
  EXPECT_THROW(make_trace(trace_options{.kind = workload::multiturn, .max_context = 12, .turns = 6}),
               std::invalid_argument);
}

TEST(BenchTrace, MultiturnPromptsResendTheHistory) {
  const auto t = make_trace(
      trace_options{.kind = workload::multiturn, .seed = 4, .max_context = 1024, .conversations = 3, .turns = 5});
  serve_options so;
  so.seed = 4;
  std::map<int32_t, std::pair<std::vector<int32_t>, std::vector<int32_t>>> last;  // prompt, output
  for (size_t i = 0; i < t.size(); ++i) {
    const auto& e = t[i];
    std::vector<int32_t> p;
    if (e.turn == 0) {
      p = synthetic_prompt(e, i, so);
    } else {
      const auto& [prompt, output] = last.at(e.conversation);
      p = next_turn_prompt(prompt, output, e, i, so);
      ASSERT_GE(p.size(), prompt.size() + output.size());
      EXPECT_TRUE(std::equal(prompt.begin(), prompt.end(), p.begin()));
      EXPECT_TRUE(std::equal(output.begin(), output.end(), p.begin() + std::ptrdiff_t(prompt.size())));
    }
    // With every turn producing its full output, the built prompt is the trace's length.
    ASSERT_EQ(p.size(), size_t(e.prompt_tokens)) << "conversation " << e.conversation << " turn " << e.turn;
    EXPECT_LT(p.size() + size_t(e.output_tokens), 1024u);
    std::vector<int32_t> output(size_t(e.output_tokens));
    for (size_t k = 0; k < output.size(); ++k) output[k] = int32_t(5000 + i * 100 + k);  // what a server returned
    last[e.conversation] = {p, output};
  }
}

TEST(BenchTrace, PrefixAndTurnFieldsRoundTrip) {
  const std::string path = temp_path("tandem_test_trace_prefix.jsonl");
  std::vector<trace_entry> t =
      make_trace(trace_options{.kind = workload::shared_prefix, .requests = 20, .seed = 1, .prefix_groups = 3});
  const auto turns = make_trace(trace_options{.kind = workload::multiturn,
                                              .arrival = arrival_kind::gamma,
                                              .burstiness = 0.5,
                                              .seed = 1,
                                              .conversations = 3,
                                              .turns = 3});
  for (auto e : turns) {
    e.arrival_s += 1000;  // after the others, so that the sorted file keeps this order
    t.push_back(e);
  }
  t.push_back(trace_entry{.arrival_s = 2000, .prompt_tokens = 0, .prompt_text = "plain text", .output_tokens = 5});
  save_trace(t, path);
  const auto back = load_trace(path);
  expect_same(t, back);
  EXPECT_DOUBLE_EQ(shared_prefix_share(back), shared_prefix_share(t));
  // The older keys alone still load, with the defaults.
  {
    std::ofstream(path) << R"({"arrival_s": 0, "prompt_tokens": 5, "output_tokens": 3})"
                        << "\n";
  }
  const auto old = load_trace(path);
  ASSERT_EQ(old.size(), 1u);
  expect_same(old[0], trace_entry{.prompt_tokens = 5, .output_tokens = 3}, 0);
  std::filesystem::remove(path);
}

TEST(BenchTrace, BadPrefixAndTurnLinesAreNamed) {
  const std::string path = temp_path("tandem_test_trace_bad.jsonl");
  const std::string ok = R"({"arrival_s": 0, "prompt_tokens": 50, "output_tokens": 3})";
  struct bad_case {
    std::vector<std::string> lines;
    std::string expected;  // in the message
  };
  const std::vector<bad_case> cases = {
      {{ok, R"({"arrival_s": 1, "prompt_tokens": 50, "output_tokens": 3, "prefix_group": 0, "prefix_tokens": 51})"},
       ":2: 'prefix_tokens' must be an integer in 1..50"},
      {{ok, R"({"arrival_s": 1, "prompt_tokens": 50, "output_tokens": 3, "prefix_group": -2, "prefix_tokens": 5})"},
       ":2: 'prefix_group' must be"},
      {{R"({"arrival_s": 1, "prompt_tokens": 50, "output_tokens": 3, "prefix_group": 1})"},
       ":1: 'prefix_group' and 'prefix_tokens' go together"},
      {{R"({"arrival_s": 1, "prompt_tokens": 50, "output_tokens": 3, "prefix_group": "a", "prefix_tokens": 5})"},
       ":1: 'prefix_group' must be"},
      {{ok, R"({"arrival_s": 1, "prompt": "hi", "output_tokens": 3, "prefix_group": 0, "prefix_tokens": 1})"},
       ":2: 'prefix_group' needs 'prompt_tokens'"},
      {{R"({"arrival_s": 1, "prompt": "hi", "output_tokens": 3, "conversation": 2})"},
       ":1: 'conversation' needs 'prompt_tokens'"},
      {{R"({"arrival_s": 1, "prompt_tokens": 50, "output_tokens": 3, "turn": 1, "new_tokens": 4})"},
       ":1: 'turn' and 'new_tokens' need 'conversation'"},
      {{R"({"arrival_s": 1, "prompt_tokens": 50, "output_tokens": 3, "conversation": 0, "turn": 0, "new_tokens": 4})"},
       ":1: turn 0's 'new_tokens'"},
      {{R"({"arrival_s": 1, "prompt_tokens": 50, "output_tokens": 3, "conversation": 0})",
        R"({"arrival_s": 2, "prompt_tokens": 60, "output_tokens": 3, "conversation": 0, "turn": 1})"},
       ":2: a turn after the first needs 'new_tokens'"},
      {{R"({"arrival_s": 1, "prompt_tokens": 50, "output_tokens": 3, "conversation": 0})",
        R"({"arrival_s": 2, "prompt_tokens": 60, "output_tokens": 3, "conversation": 0, "turn": 1, "new_tokens": 8})"},
       ":2: 'prompt_tokens' must be turn 0's prompt_tokens + output_tokens + this turn's new_tokens (61)"},
      {{R"({"arrival_s": 1, "prompt_tokens": 50, "output_tokens": 3, "conversation": 0})", ok,
        R"({"arrival_s": 3, "prompt_tokens": 70, "output_tokens": 3, "conversation": 0, "turn": 2, "new_tokens": 8})"},
       ":3: conversation 0: turn 2 where turn 1 comes next"},
      // A turn that arrives before its predecessor: named by its line, though sorting moved it.
      {{R"({"arrival_s": 5, "prompt_tokens": 50, "output_tokens": 3, "conversation": 7})",
        R"({"arrival_s": 1, "prompt_tokens": 61, "output_tokens": 3, "conversation": 7, "turn": 1, "new_tokens": 8})"},
       ":2: conversation 7: turn 1 where turn 0 comes next"},
      {{R"({"arrival_s": 1, "prompt_tokens": 50, "output_tokens": 3, "conversation": 0})",
        R"({"arrival_s": 2, "prompt_tokens": 50, "output_tokens": 3, "conversation": 0})"},
       ":2: conversation 0: turn 0 where turn 1 comes next"},
      {{R"({"arrival_s": 1, "prompt_tokens": 50, "output_tokens": 3, "conversation": 0, "turn": 1.5, "new_tokens": )"
        R"(8})"},
       ":1: 'turn' must be"},
  };
  for (const auto& c : cases) {
    {
      std::ofstream out(path);
      for (const auto& l : c.lines) out << l << "\n";
    }
    try {
      load_trace(path);
      ADD_FAILURE() << "accepted; expected: " << c.expected;
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(c.expected), std::string::npos) << e.what() << "\nexpected: " << c.expected;
    }
  }
  std::filesystem::remove(path);
}

// ------------------------------------------------------------ the runner, against a fake server

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
using tcp = asio::ip::tcp;
using json = nlohmann::json;

// A loopback server speaking just enough of tandem's: GET /metrics (Prometheus text, with or
// without the prefix-cache counters) and /ws, which answers each generate with max_tokens
// token frames (ids 1000, 1001, ...) and a done, or an error when max_tokens is 7. It records
// every prompt it was sent. Connections are served one at a time, as the runner makes them.
class fake_server {
 public:
  explicit fake_server(bool cache_counters) : cache_counters_(cache_counters) {
    acceptor_.open(tcp::v4());
    acceptor_.bind({asio::ip::address_v4::loopback(), 0});
    acceptor_.listen();
    thread_ = std::thread([this] { serve(); });
  }
  ~fake_server() {
    stop_ = true;
    beast::error_code ec;
    tcp::socket poke(ioc_);  // unblocks accept
    poke.connect(acceptor_.local_endpoint(), ec);
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(acceptor_.local_endpoint().port()); }
  std::vector<std::vector<int32_t>> prompts() {
    std::lock_guard<std::mutex> lk(mu_);
    return prompts_;
  }

 private:
  void serve() {
    while (!stop_) {
      tcp::socket s(ioc_);
      beast::error_code ec;
      acceptor_.accept(s, ec);
      if (ec || stop_) return;
      beast::flat_buffer buf;
      http::request<http::string_body> req;
      http::read(s, buf, req, ec);
      if (ec) continue;
      if (websocket::is_upgrade(req)) {
        websocket::stream<tcp::socket> ws(std::move(s));
        ws.accept(req, ec);
        if (!ec) generate(ws);
        continue;
      }
      http::response<http::string_body> res{http::status::ok, 11};
      res.body() = metrics();
      res.prepare_payload();
      http::write(s, res, ec);
    }
  }
  std::string metrics() {
    std::lock_guard<std::mutex> lk(mu_);
    std::string m =
        "# TYPE tandem_prompt_tokens_total counter\ntandem_prompt_tokens_total " + std::to_string(prompt_total_) + "\n";
    // Half of each prompt counted as a hit, split over two label sets (summed by the client).
    if (cache_counters_)
      m += "tandem_prefix_cache_hit_tokens_total{worker=\"a\"} " + std::to_string(prompt_total_ / 4) +
           "\ntandem_prefix_cache_hit_tokens_total{worker=\"b\"} " + std::to_string(prompt_total_ / 4) +
           "\ntandem_prompt_tokens_computed_total " + std::to_string(prompt_total_ - 2 * (prompt_total_ / 4)) + "\n";
    return m;
  }
  void generate(websocket::stream<tcp::socket>& ws) {
    for (;;) {
      beast::flat_buffer buf;
      beast::error_code ec;
      ws.read(buf, ec);
      if (ec) return;  // the client closed
      const json f = json::parse(beast::buffers_to_string(buf.data()), nullptr, false);
      if (!f.is_object() || f.value("type", "") != "generate") continue;
      const std::string id = f["id"];
      const auto prompt = f["prompt"].get<std::vector<int32_t>>();
      const int max_tokens = f["max_tokens"];
      {
        std::lock_guard<std::mutex> lk(mu_);
        prompts_.push_back(prompt);
        prompt_total_ += int64_t(prompt.size()) * 4;  // a multiple of 4: the hit counters above stay exact
      }
      auto send = [&](const json& j) { ws.write(asio::buffer(j.dump()), ec); };
      if (max_tokens == 7) {
        send({{"type", "error"}, {"id", id}, {"code", "internal"}, {"message", "made to fail"}});
        continue;
      }
      for (int k = 0; k < max_tokens; ++k)
        send({{"type", "token"}, {"id", id}, {"index", k}, {"text", "x"}, {"token", 1000 + k}});
      send({{"type", "done"},
            {"id", id},
            {"finish_reason", "length"},
            {"usage", {{"prompt_tokens", prompt.size()}, {"completion_tokens", max_tokens}}}});
    }
  }

  bool cache_counters_;
  asio::io_context ioc_;
  tcp::acceptor acceptor_{ioc_};
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::vector<std::vector<int32_t>> prompts_;
  int64_t prompt_total_ = 0;
};

trace_entry turn(double at, int32_t conversation, int32_t k, int32_t prompt, int32_t output, int32_t fresh) {
  return {.arrival_s = at,
          .prompt_tokens = prompt,
          .output_tokens = output,
          .conversation = conversation,
          .turn = k,
          .new_tokens = fresh};
}

}  // namespace

// Over SSE each event is timed when it arrives, not when the client's read buffer fills: a
// server sending five small events 60 ms apart is seen as five tokens about 60 ms apart.
TEST(BenchServe, SseTokensAreTimedAsTheyArrive) {
  asio::io_context ioc;
  tcp::acceptor acc(ioc);
  acc.open(tcp::v4());
  acc.bind({asio::ip::address_v4::loopback(), 0});
  acc.listen();
  std::thread server([&] {
    tcp::socket s(ioc);
    acc.accept(s);
    beast::flat_buffer buf;
    http::request<http::string_body> req;
    http::read(s, buf, req);
    asio::write(s, asio::buffer(std::string("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                                            "Transfer-Encoding: chunked\r\n\r\n")));
    auto chunk = [&](const std::string& data) {
      std::ostringstream c;
      c << std::hex << data.size() << "\r\n" << data << "\r\n";
      asio::write(s, asio::buffer(c.str()));
    };
    for (int k = 0; k < 5; ++k) {
      std::this_thread::sleep_for(std::chrono::milliseconds(60));  // the fake server's pacing: what is measured
      chunk("data: {\"choices\":[{\"text\":\"x\",\"index\":0}]}\n\n");
    }
    chunk("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":5}}\n\ndata: [DONE]\n\n");
    chunk("");
  });
  const auto r = openai_stream({"127.0.0.1", std::to_string(acc.local_endpoint().port())}, "",
                               {.prompt_tokens = {1, 2, 3}, .max_tokens = 5, .model = "m"}, std::chrono::seconds(10));
  server.join();
  ASSERT_TRUE(r.ok) << r.error;
  ASSERT_EQ(r.token_times_s.size(), 5u);
  EXPECT_EQ(r.output_tokens, 5);
  EXPECT_LT(r.ttft_s, 0.2);  // the first event, not the last
  for (size_t k = 1; k < r.token_times_s.size(); ++k) EXPECT_GT(r.token_times_s[k] - r.token_times_s[k - 1], 0.03) << k;
}

TEST(BenchServe, MultiturnSendsEachTurnWithItsHistoryAndStopsAtAFailure) {
  fake_server srv(true);
  serve_options so;
  so.url = srv.url();
  so.api = "ws";
  so.progress = false;
  so.seed = 3;
  // Conversation 0: three turns; conversation 1: its first turn fails (max_tokens 7), so its
  // later turns must not be sent. All arrive at once: the runner must still wait for each turn.
  const std::vector<trace_entry> t = {
      turn(0, 0, 0, 20, 4, 20), turn(0, 1, 0, 30, 7, 30), turn(0, 0, 1, 29, 3, 5),
      turn(0, 1, 1, 42, 2, 5),  turn(0, 0, 2, 38, 2, 6),  turn(0, 1, 2, 50, 2, 6),
  };
  const serve_report r = run_serve_bench(so, t);
  EXPECT_EQ(r.figures.sent, 6);
  EXPECT_EQ(r.figures.completed, 3);
  EXPECT_EQ(r.figures.failed, 3);
  EXPECT_EQ(r.errors.at("internal: made to fail"), 1);
  EXPECT_EQ(r.errors.at("not sent: turn 0 of its conversation failed"), 1);
  EXPECT_EQ(r.errors.at("not sent: turn 1 of its conversation failed"), 1);
  const auto prompts = srv.prompts();
  ASSERT_EQ(prompts.size(), 4u) << "the failed conversation's later turns were sent";
  // The server saw conversation 0's turns in order, each resending the one before and its output.
  std::vector<std::vector<int32_t>> conv0;
  for (const auto& p : prompts)
    if (p.size() != 30) conv0.push_back(p);
  ASSERT_EQ(conv0.size(), 3u);
  EXPECT_EQ(conv0[0], synthetic_prompt(t[0], 0, so));
  ASSERT_EQ(conv0[1].size(), 29u);
  ASSERT_EQ(conv0[2].size(), 38u);
  EXPECT_EQ(conv0[1], next_turn_prompt(conv0[0], {1000, 1001, 1002, 1003}, t[2], 2, so));
  EXPECT_EQ(conv0[2], next_turn_prompt(conv0[1], {1000, 1001, 1002}, t[4], 4, so));
  for (size_t i : {0u, 2u, 4u}) EXPECT_TRUE(r.outcomes[i].ok) << i;
  // Closed loop: a turn is sent only after the one before ended.
  EXPECT_GE(r.outcomes[2].send_s, r.outcomes[0].send_s + r.outcomes[0].e2e_s);
  EXPECT_GE(r.outcomes[4].send_s, r.outcomes[2].send_s + r.outcomes[2].e2e_s);
  // The server's prefix-cache counters over the run: a quarter + a quarter of 4 x the prompts.
  int64_t sent_tokens = 0;
  for (const auto& p : prompts) sent_tokens += int64_t(p.size());
  ASSERT_TRUE(r.server.is_object());
  EXPECT_DOUBLE_EQ(double(r.server["prompt_tokens"]), 4.0 * double(sent_tokens));
  EXPECT_DOUBLE_EQ(double(r.server["prefix_cache_hit_tokens"]), 2.0 * double(sent_tokens));
  EXPECT_DOUBLE_EQ(double(r.server["prefix_cache_hit_ratio"]), 0.5);
  EXPECT_DOUBLE_EQ(double(r.server["prompt_tokens_computed"]), 2.0 * double(sent_tokens));
  EXPECT_GT(r.trace_shared_share, 0.0);
  EXPECT_DOUBLE_EQ(r.to_json()["trace_shared_prefix_share"].get<double>(), shared_prefix_share(t));
}

TEST(BenchServe, MissingCacheCountersAreNotReported) {
  fake_server srv(false);
  serve_options so;
  so.url = srv.url();
  so.api = "ws";
  so.progress = false;
  const serve_report r = run_serve_bench(so, {trace_entry{.prompt_tokens = 12, .output_tokens = 3}});
  EXPECT_EQ(r.figures.completed, 1);
  ASSERT_TRUE(r.server.is_object());
  EXPECT_DOUBLE_EQ(double(r.server["prompt_tokens"]), 48.0);
  EXPECT_TRUE(r.server["prefix_cache_hit_tokens"].is_null());
  EXPECT_TRUE(r.server["prefix_cache_hit_ratio"].is_null());
  EXPECT_TRUE(r.server["prompt_tokens_computed"].is_null());
  EXPECT_DOUBLE_EQ(r.trace_shared_share, 0.0);
}

TEST(BenchServe, MultiturnRefusesTheOpenAIApiAndOutOfOrderTurns) {
  serve_options so;
  so.url = "http://127.0.0.1:1";  // never reached: both are refused before any connection
  so.progress = false;
  const std::vector<trace_entry> t = {turn(0, 0, 0, 20, 4, 20), turn(1, 0, 1, 29, 3, 5)};
  so.api = "openai";
  try {
    run_serve_bench(so, t);
    FAIL() << "a multiturn trace ran over the OpenAI API";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()).rfind("multiturn needs --api ws: ", 0), 0u) << e.what();
  }
  // Turn 0 alone needs no token ids: any API may send it.
  so.api = "ws";
  EXPECT_THROW(run_serve_bench(so, {t[1], t[0]}), std::invalid_argument);
  EXPECT_THROW(run_serve_bench(so, {t[1]}), std::invalid_argument);
}

// `bench kernels --against-llama-bench` drives llama-bench as a subprocess. A stand-in
// llama-bench (a shell script) answers with a figure computed from the flags it got, so the
// test checks which flags each measurement passes and that its JSON is read; a library link
// flattened into a text file (as in a copy of a build) is staged as a real link.
TEST(LlamaBench, PassesPromptDepthAndThreadsAndReadsTheResult) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("tandem-fake-llama-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  {
    std::ofstream s(dir / "llama-bench");
    s << "#!/bin/sh\n"
         "[ \"$1\" = --help ] && exit 0\n"
         "[ -L \"$(dirname \"$0\")/libfake.so\" ] || exit 3\n"
         "while [ $# -gt 0 ]; do case $1 in -p) p=$2;; -n) n=$2;; -d) d=$2;; -t) t=$2;; esac; shift; done\n"
         "echo \"[{\\\"avg_ts\\\": $((p + n * 1000 + d * 1000000 + t * 100000000))}]\"\n";
  }
  fs::permissions(dir / "llama-bench", fs::perms::owner_all);
  std::ofstream(dir / "libfake.so.1") << "not really a library";
  std::ofstream(dir / "libfake.so") << "libfake.so.1";  // a flattened symlink
  {
    tandem::bench::llama_bench ref(dir.string());
    EXPECT_EQ(ref.prefill_tps("m.gguf", 2, 509, 1391), 509 + 1391e6 + 2e8);
    EXPECT_EQ(ref.decode_tps("m.gguf", 1, 64, 1900), 64e3 + 1900e6 + 1e8);
  }
  fs::remove(dir / "llama-bench");
  EXPECT_THROW(tandem::bench::llama_bench(dir.string()), tandem::failure);
  fs::remove_all(dir);
}

// ------------------------------------------------------------ the Mooncake trace

namespace {

const std::string mooncake_sample = std::string(TANDEM_TEST_DATA_DIR) + "/mooncake-sample.jsonl";

// The sample's raw lines, parsed by hand (the loader's answer is checked against them).
std::vector<nlohmann::json> raw_mooncake() {
  std::ifstream in(mooncake_sample);
  std::vector<nlohmann::json> out;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  return out;
}

}  // namespace

TEST(BenchTrace, MooncakeWindowIsScaledAsAsked) {
  const auto raw = raw_mooncake();
  ASSERT_EQ(raw.size(), 190u);
  const auto t = load_mooncake_trace(mooncake_sample, {.scale_tokens = 16, .speedup = 2.0, .from = 120, .count = 50});
  EXPECT_EQ(t.file_entries, 190u);
  ASSERT_EQ(t.entries.size(), 50u);
  EXPECT_EQ(t.trimmed, 0);
  EXPECT_NE(t.scaling.find("entries 120..170 of 190"), std::string::npos) << t.scaling;
  EXPECT_NE(t.scaling.find("/ 16 (32-token blocks)"), std::string::npos) << t.scaling;
  EXPECT_NE(t.scaling.find("time / 2"), std::string::npos) << t.scaling;
  const double t0 = raw[120]["timestamp"].get<double>();
  for (size_t i = 0; i < t.entries.size(); ++i) {
    const auto& e = t.entries[i];
    const auto& r = raw[120 + i];  // the sample's timestamps do not decrease: order kept
    EXPECT_DOUBLE_EQ(e.arrival_s, (r["timestamp"].get<double>() - t0) / 1000.0 / 2.0) << i;
    EXPECT_EQ(e.block_ids, r["hash_ids"].get<std::vector<int64_t>>()) << i;
    EXPECT_EQ(e.block_tokens, 32);
    EXPECT_EQ(e.prompt_tokens, (r["input_length"].get<int32_t>() + 15) / 16) << i;
    EXPECT_EQ(e.output_tokens, std::max(1, (r["output_length"].get<int32_t>() + 15) / 16)) << i;
    // Within its blocks: every block but the last full, the last one not empty.
    EXPECT_GT(e.prompt_tokens, (int32_t(e.block_ids.size()) - 1) * 32) << i;
    EXPECT_LE(e.prompt_tokens, int32_t(e.block_ids.size()) * 32) << i;
  }
  // The whole file at scale 1 keeps every length as it is.
  const auto whole = load_mooncake_trace(mooncake_sample, {.scale_tokens = 1});
  ASSERT_EQ(whole.entries.size(), 190u);
  EXPECT_EQ(whole.entries[0].prompt_tokens, raw[0]["input_length"].get<int32_t>());
  EXPECT_EQ(whole.entries[0].block_tokens, 512);
}

TEST(BenchTrace, MooncakeEqualHashIdsSendEqualBlocks) {
  const auto t = load_mooncake_trace(mooncake_sample, {.scale_tokens = 32});
  serve_options so;
  so.seed = 5;
  std::map<int64_t, std::vector<int32_t>> block_of;  // hash id -> the tokens it stood for
  size_t reused = 0;
  for (size_t i = 0; i < t.entries.size(); ++i) {
    const auto& e = t.entries[i];
    const auto p = synthetic_prompt(e, i, so);
    ASSERT_EQ(p.size(), size_t(e.prompt_tokens));
    for (size_t k = 0; k < e.block_ids.size(); ++k) {
      const size_t b = k * size_t(e.block_tokens), n = std::min(size_t(e.block_tokens), p.size() - b);
      std::vector<int32_t> blk(p.begin() + std::ptrdiff_t(b), p.begin() + std::ptrdiff_t(b + n));
      auto [it, fresh] = block_of.emplace(e.block_ids[k], blk);
      if (fresh) continue;
      ++reused;
      // A shorter last block is the start of the same block elsewhere.
      const size_t m = std::min(blk.size(), it->second.size());
      EXPECT_TRUE(std::equal(blk.begin(), blk.begin() + std::ptrdiff_t(m), it->second.begin()))
          << "request " << i << ", block " << k << " (id " << e.block_ids[k] << ")";
    }
  }
  EXPECT_GT(reused, 190u) << "the sample shares block 0 everywhere and longer prefixes from line 134";
  // Different ids give different blocks.
  EXPECT_NE(block_of.at(1), block_of.at(14));
  // The share a prefix cache could reuse: block 0 of every request, and the conversations.
  const double share = shared_prefix_share(t.entries);
  EXPECT_GT(share, 0.05);
  EXPECT_LT(share, 0.9);
}

TEST(BenchTrace, MooncakeFitsTheContextAndRoundTrips) {
  const auto t = load_mooncake_trace(mooncake_sample, {.scale_tokens = 8, .count = 60, .max_context = 512});
  ASSERT_EQ(t.entries.size(), 60u);
  EXPECT_GT(t.trimmed, 0);  // 26K-token prompts / 8 do not fit 512
  EXPECT_NE(t.scaling.find("shortened to the context"), std::string::npos);
  for (const auto& e : t.entries) {
    EXPECT_LE(e.prompt_tokens + e.output_tokens, 512);
    EXPECT_GT(e.prompt_tokens, (int32_t(e.block_ids.size()) - 1) * e.block_tokens);  // cut at the end, ids with it
    EXPECT_LE(e.prompt_tokens, int32_t(e.block_ids.size()) * e.block_tokens);
  }
  const std::string path = temp_path("tandem_test_mooncake.jsonl");
  save_trace(t.entries, path);
  expect_same(load_trace(path), t.entries);  // --save-trace replays the same prompts
  std::filesystem::remove(path);
}

TEST(BenchTrace, MooncakeBadLinesAndOptionsAreNamed) {
  const std::string path = temp_path("tandem_test_mooncake_bad.jsonl");
  auto fails_with = [&](const std::string& line, const std::string& what) {
    {
      std::ofstream(path) << R"({"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [0]})"
                          << "\n"
                          << line << "\n";
    }
    try {
      load_mooncake_trace(path, {});
      ADD_FAILURE() << "accepted: " << line;
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(":2: "), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  fails_with("not json", "not a JSON object");
  fails_with(R"({"timestamp": 0, "input_length": 10, "output_length": 5})", "'hash_ids'");
  fails_with(R"({"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": []})", "'hash_ids'");
  fails_with(R"({"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [-1]})", "non-negative");
  fails_with(R"({"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0]})", "does not fit 1 blocks");
  fails_with(R"({"timestamp": 0, "input_length": 100, "output_length": 5, "hash_ids": [0, 1]})",
             "does not fit 2 blocks");
  fails_with(R"({"timestamp": -5, "input_length": 10, "output_length": 5, "hash_ids": [0]})", "'timestamp'");
  fails_with(R"({"timestamp": 0, "input_length": 10, "output_length": 0, "hash_ids": [0]})", "'output_length'");
  EXPECT_THROW(load_mooncake_trace(path, {.scale_tokens = 0}), std::invalid_argument);
  EXPECT_THROW(load_mooncake_trace(path, {.scale_tokens = 513}), std::invalid_argument);
  EXPECT_THROW(load_mooncake_trace(path, {.speedup = 0}), std::invalid_argument);
  EXPECT_THROW(load_mooncake_trace(path + ".missing", {}), std::runtime_error);
  // A saved block trace whose ids do not cover its prompt is refused too.
  {
    std::ofstream(path)
        << R"({"arrival_s": 0, "prompt_tokens": 70, "output_tokens": 3, "block_ids": [1, 2], "block_tokens": 32})"
        << "\n";
  }
  EXPECT_THROW(load_trace(path), std::runtime_error);
  std::filesystem::remove(path);
}

// Interleaved rounds: each figure of the table is its own median, the representative round is
// the median-goodput one, and whether the SLOs held is judged on the medians.
TEST(BenchCompare, RoundsGiveEachFigureItsMedian) {
  auto run = [](double goodput, double attainment, double ttft_p50, double tpot_p90, double handoff) {
    mode_run m;
    m.mode = "auto";
    m.rate = 2;
    m.report.figures.goodput = goodput;
    m.report.figures.slo_attainment = attainment;
    m.report.figures.ttft_s.p50 = ttft_p50;
    m.report.figures.tpot_s.p90 = tpot_p90;
    m.report.figures.completed = int64_t(goodput * 100);  // marks which round was taken
    m.report.server = nlohmann::json{{"handoff_ms_mean", handoff}};
    return m;
  };
  const mode_run a = run(1.9, 1.0, 0.30, 0.020, 30), b = run(1.2, 0.5, 0.10, 0.030, 10),
                 c = run(1.6, 0.875, 0.20, 0.010, 20);
  compare_options o;
  o.attainment = 0.9;
  const mode_run m = median_of_rounds({&a, &b, &c}, o);
  EXPECT_EQ(m.mode, "auto");
  EXPECT_EQ(m.rate, 2);
  EXPECT_EQ(m.report.figures.completed, 160);  // round c: the median goodput
  EXPECT_DOUBLE_EQ(m.report.figures.goodput, 1.6);
  EXPECT_DOUBLE_EQ(m.report.figures.slo_attainment, 0.875);
  EXPECT_DOUBLE_EQ(m.report.figures.ttft_s.p50, 0.20);
  EXPECT_DOUBLE_EQ(m.report.figures.tpot_s.p90, 0.020);  // round a's: each figure its own median
  EXPECT_DOUBLE_EQ(m.report.server["handoff_ms_mean"].get<double>(), 20);
  EXPECT_FALSE(m.held);  // 87.5% < 90%, although one round held
  // Two rounds: the mean of the middle two.
  const mode_run two = median_of_rounds({&a, &c}, o);
  EXPECT_DOUBLE_EQ(two.report.figures.goodput, 1.75);
  EXPECT_DOUBLE_EQ(two.report.figures.slo_attainment, 0.9375);
  EXPECT_TRUE(two.held);
}
