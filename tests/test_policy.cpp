// Scheduling policies without any actor: admission, placement, step batching, KV credits, EWMA.
// Each suite is a table of named cases so a failure says which situation broke.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <set>

#include "runtime/scheduler/policy.h"
#include "runtime/scheduler/prefix_view.h"

using namespace tandem;

namespace {

// ---- admission ----

struct admission_case {
  std::string name;
  admission_config config;
  load_snapshot load;
  int32_t prompt = 100;
  bool admitted = true;
  reject_reason reason{};
  double retry_ms = 0;  // checked when rejected
  double predicted_ms = 0;
  std::vector<std::string> message_has;  // substrings the message must contain
  std::optional<std::string> message;  // the exact message, where the wording itself matters
};

TEST(Admission, Table) {
  const admission_config def;
  auto cfg = [](auto edit) {
    admission_config c;
    edit(c);
    return c;
  };
  auto load = [](auto edit) {
    load_snapshot l;
    l.context_length = 4096;
    edit(l);
    return l;
  };
  const load_snapshot idle = load([](auto&) {});
  const admission_config token_bound_1000 = cfg([](auto& c) { c.max_prefill_queue_tokens = 1000; });
  const std::vector<admission_case> cases = {
      {"cold router admits", def, idle, 100, true, {}, 0, 0, {}, {}},
      {"prompt over the context",
       def,
       idle,
       4097,
       false,
       reject_reason::prompt_too_long,
       0,
       0,
       {"4097", "4096", "model context", "retrying will not help"},
       {}},
      {"prompt at the context is admitted", def, idle, 4096, true, {}, 0, 0, {}, {}},
      {"max_prompt_tokens below the context",
       cfg([](auto& c) { c.max_prompt_tokens = 2048; }),
       idle,
       3000,
       false,
       reject_reason::prompt_too_long,
       0,
       0,
       {"3000", "2048", "max_prompt_tokens"},
       {}},
      {"max_prompt_tokens above the context: the context binds",
       cfg([](auto& c) { c.max_prompt_tokens = 8192; }),
       idle,
       5000,
       false,
       reject_reason::prompt_too_long,
       0,
       0,
       {"5000", "4096", "model context"},
       {}},
      {"no limit known", def, load_snapshot{}, 1000000, true, {}, 0, 0, {}, {}},
      {"prompt check precedes load",
       def,
       load([](auto& l) {
         l.prefill_queue = 256;
         l.decode_queue = 256;
       }),
       5000,
       false,
       reject_reason::prompt_too_long,
       0,
       0,
       {},
       {}},
      // 256 queued requests of 84 tokens each at 100 tokens/s: one request's tokens drain in 840 ms.
      {"prefill queue full by requests",
       def,
       load([](auto& l) {
         l.prefill_queue = 256;
         l.prefill_queue_tokens = 256 * 84;
         l.prefill_tokens_per_s = 100;
       }),
       10,
       false,
       reject_reason::prefill_queue_full,
       840,
       (256 * 84 + 10) * 10.0,
       {},
       "prefill queue holds 256 requests (bound 256); retry in 840 ms"},
      {"prefill queue full by requests, no rate yet: default hint",
       def,
       load([](auto& l) {
         l.prefill_queue = 300;
         l.prefill_queue_tokens = 3000;
       }),
       10,
       false,
       reject_reason::prefill_queue_full,
       admission_policy::default_retry_ms,
       0,
       {"300 requests", "bound 256"},
       {}},
      {"prefill queue one below its bound",
       def,
       load([](auto& l) { l.prefill_queue = 255; }),
       10,
       true,
       {},
       0,
       0,
       {},
       {}},
      // 900 queued + 200 > 1000: 100 tokens must drain at 2 workers × 100 tokens/s.
      {"prefill queue full by tokens",
       token_bound_1000,
       load([](auto& l) {
         l.prefill_queue = 3;
         l.prefill_queue_tokens = 900;
         l.prefill_tokens_per_s = 100;
         l.prefill_workers = 2;
       }),
       200,
       false,
       reject_reason::prefill_queue_full,
       500,
       5500,
       {"900 prompt tokens", "adds 200", "bound 1000", "500 ms"},
       {}},
      {"prefill tokens exactly at the bound",
       token_bound_1000,
       load([](auto& l) {
         l.prefill_queue = 3;
         l.prefill_queue_tokens = 800;
       }),
       200,
       true,
       {},
       0,
       0,
       {},
       {}},
      {"prompt above the token bound is admitted to an empty queue",
       token_bound_1000,
       idle,
       1500,
       true,
       {},
       0,
       0,
       {},
       {}},
      // It fits once the 300 queued tokens are gone: 3 s at 100 tokens/s.
      {"prompt above the token bound waits for the queue to empty",
       token_bound_1000,
       load([](auto& l) {
         l.prefill_queue = 1;
         l.prefill_queue_tokens = 300;
         l.prefill_tokens_per_s = 100;
       }),
       1500,
       false,
       reject_reason::prefill_queue_full,
       3000,
       18000,
       {},
       {}},
      {"both prefill bounds exceeded: the longer drain wins",
       cfg([](auto& c) {
         c.max_prefill_queue = 2;
         c.max_prefill_queue_tokens = 1000;
       }),
       load([](auto& l) {
         l.prefill_queue = 2;
         l.prefill_queue_tokens = 990;
         l.prefill_tokens_per_s = 100;
       }),
       100,
       false,
       reject_reason::prefill_queue_full,
       4950,
       10900,
       {"2 requests", "990 prompt tokens"},
       {}},
      {"hint never below the floor",
       def,
       load([](auto& l) {
         l.prefill_queue = 256;
         l.prefill_queue_tokens = 256;
         l.prefill_tokens_per_s = 1e9;
       }),
       1,
       false,
       reject_reason::prefill_queue_full,
       admission_policy::min_retry_ms,
       0.000257,
       {},
       {}},
      {"zero bounds are unbounded",
       cfg([](auto& c) {
         c.max_prefill_queue = 0;
         c.max_prefill_queue_tokens = 0;
         c.max_decode_queue = 0;
       }),
       load([](auto& l) {
         l.prefill_queue = 100000;
         l.prefill_queue_tokens = int64_t(1) << 40;
         l.decode_queue = 100000;
       }),
       100,
       true,
       {},
       0,
       0,
       {},
       {}},
      {"decode queue at its bound, no rate yet",
       def,
       load([](auto& l) { l.decode_queue = 256; }),
       10,
       false,
       reject_reason::decode_queue_full,
       admission_policy::default_retry_ms,
       0,
       {},
       "decode queue holds 256 requests (bound 256); retry in 1000 ms"},
      {"decode queue over its bound with a measured rate",
       def,
       load([](auto& l) {
         l.decode_queue = 260;
         l.decode_admits_per_s = 10;
       }),
       10,
       false,
       reject_reason::decode_queue_full,
       500,
       0,
       {"260 requests", "bound 256", "500 ms"},
       {}},
      {"decode queue one below its bound",
       def,
       load([](auto& l) { l.decode_queue = 255; }),
       10,
       true,
       {},
       0,
       0,
       {},
       {}},
      {"prefill queue checked before decode queue",
       def,
       load([](auto& l) {
         l.prefill_queue = 256;
         l.decode_queue = 256;
       }),
       10,
       false,
       reject_reason::prefill_queue_full,
       admission_policy::default_retry_ms,
       0,
       {},
       {}},
      // (1500 + 500) tokens at 1000 tokens/s = 2000 ms; 1000 ms over the budget must drain.
      {"predicted TTFT over budget",
       cfg([](auto& c) { c.ttft_budget_ms = 1000; }),
       load([](auto& l) {
         l.prefill_queue = 3;
         l.prefill_queue_tokens = 1500;
         l.prefill_tokens_per_s = 1000;
       }),
       500,
       false,
       reject_reason::ttft_budget,
       1000,
       2000,
       {"2000 ms", "1000 ms budget", "1500", "500", "1000 tokens/s"},
       {}},
      {"predicted TTFT exactly at budget is admitted",
       cfg([](auto& c) { c.ttft_budget_ms = 1000; }),
       load([](auto& l) {
         l.prefill_queue = 3;
         l.prefill_queue_tokens = 1500;
         l.prefill_tokens_per_s = 1000;
         l.prefill_workers = 2;
       }),
       500,
       true,
       {},
       0,
       1000,
       {},
       {}},
      {"prompt alone misses the TTFT budget: retrying will not help",
       cfg([](auto& c) { c.ttft_budget_ms = 100; }),
       load([](auto& l) { l.prefill_tokens_per_s = 1000; }),
       500,
       false,
       reject_reason::ttft_budget,
       0,
       500,
       {"retrying will not help"},
       {}},
      // Auto mode: a prompt a decode worker computes itself does not wait behind the queue:
      // 200 tokens at 1000 tokens/s + a 30 ms decode step = 230 ms, within 1000.
      {"prompt within a decode worker's local room is predicted without the queue",
       cfg([](auto& c) { c.ttft_budget_ms = 1000; }),
       load([](auto& l) {
         l.prefill_queue = 3;
         l.prefill_queue_tokens = 1500;
         l.prefill_tokens_per_s = 1000;
         l.decode_step_ms = 30;
         l.local_prefill_tokens = 256;
       }),
       200,
       true,
       {},
       0,
       230,
       {},
       {}},
      // One token past the room: behind the queue, (1500 + 257) tokens = 1757 ms.
      {"prompt past the local room waits for the prefill queue",
       cfg([](auto& c) { c.ttft_budget_ms = 1000; }),
       load([](auto& l) {
         l.prefill_queue = 3;
         l.prefill_queue_tokens = 1500;
         l.prefill_tokens_per_s = 1000;
         l.decode_step_ms = 30;
         l.local_prefill_tokens = 256;
       }),
       257,
       false,
       reject_reason::ttft_budget,
       757,
       1757,
       {"1500 queued prompt tokens"},
       {}},
      {"a local prompt that alone misses the budget is refused for good",
       cfg([](auto& c) { c.ttft_budget_ms = 100; }),
       load([](auto& l) {
         l.prefill_tokens_per_s = 1000;
         l.decode_step_ms = 30;
         l.local_prefill_tokens = 256;
       }),
       200,
       false,
       reject_reason::ttft_budget,
       0,
       200,
       {"computed by a decode worker", "retrying will not help"},
       {}},
      {"no prefill rate yet: no TTFT check",
       cfg([](auto& c) { c.ttft_budget_ms = 1; }),
       load([](auto& l) {
         l.prefill_queue = 100;
         l.prefill_queue_tokens = 100000;
       }),
       100,
       true,
       {},
       0,
       0,
       {},
       {}},
      {"no live prefill worker is predicted as one",
       cfg([](auto& c) { c.ttft_budget_ms = 10000; }),
       load([](auto& l) {
         l.prefill_workers = 0;
         l.prefill_queue_tokens = 400;
         l.prefill_tokens_per_s = 100;
       }),
       100,
       true,
       {},
       0,
       5000,
       {},
       {}},
      {"decode step over the TPOT budget",
       cfg([](auto& c) { c.tpot_budget_ms = 50; }),
       load([](auto& l) { l.decode_step_ms = 85; }),
       10,
       false,
       reject_reason::tpot_budget,
       admission_policy::default_retry_ms,
       0,
       {"85 ms", "50 ms"},
       {}},
      {"fractional step times keep a decimal",
       cfg([](auto& c) { c.tpot_budget_ms = 12.5; }),
       load([](auto& l) { l.decode_step_ms = 12.75; }),
       10,
       false,
       reject_reason::tpot_budget,
       admission_policy::default_retry_ms,
       0,
       {"12.8 ms", "12.5 ms"},
       {}},
      {"decode step at the TPOT budget is admitted",
       cfg([](auto& c) { c.tpot_budget_ms = 50; }),
       load([](auto& l) { l.decode_step_ms = 50; }),
       10,
       true,
       {},
       0,
       0,
       {},
       {}},
      {"no step time yet: no TPOT check",
       cfg([](auto& c) { c.tpot_budget_ms = 50; }),
       idle,
       10,
       true,
       {},
       0,
       0,
       {},
       {}},
  };
  const admission_policy policy;
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const admission_decision d = policy.decide(c.config, c.load, c.prompt);
    EXPECT_EQ(d.admitted, c.admitted) << d.message;
    EXPECT_NEAR(d.predicted_ttft_ms, c.predicted_ms, 1e-6 + 1e-9 * c.predicted_ms);
    if (c.admitted) {
      EXPECT_TRUE(d.message.empty()) << d.message;
      continue;
    }
    EXPECT_EQ(to_string(d.reason), to_string(c.reason));
    EXPECT_DOUBLE_EQ(d.retry_after_ms, c.retry_ms);
    for (const auto& part : c.message_has) EXPECT_NE(d.message.find(part), std::string::npos) << d.message;
    if (c.message) {
      EXPECT_EQ(d.message, *c.message);
    }
  }
}

// A fuller queue never earns an earlier retry, and no hint undercuts the floor.
TEST(Admission, RetryHintGrowsWithTheQueue) {
  struct sweep {
    std::string name;
    admission_config config;
    reject_reason reason;
    std::function<load_snapshot(int64_t)> load_at;  // load with `n` queued units
  };
  admission_config ttft;
  ttft.ttft_budget_ms = 200;
  admission_config tokens;
  tokens.max_prefill_queue_tokens = 1000;
  admission_config requests;
  requests.max_prefill_queue = 8;
  const std::vector<sweep> sweeps = {
      {"ttft budget", ttft, reject_reason::ttft_budget,
       [](int64_t n) {
         load_snapshot l;
         l.prefill_queue_tokens = n * 50;
         l.prefill_tokens_per_s = 500;
         return l;
       }},
      {"prefill token bound", tokens, reject_reason::prefill_queue_full,
       [](int64_t n) {
         load_snapshot l;
         l.prefill_queue = 1;
         l.prefill_queue_tokens = 900 + n * 7;
         l.prefill_tokens_per_s = 3000;
         return l;
       }},
      {"prefill request bound", requests, reject_reason::prefill_queue_full,
       [](int64_t n) {
         load_snapshot l;
         l.prefill_queue = int32_t(8 + n);
         l.prefill_queue_tokens = (8 + n) * 64;
         l.prefill_tokens_per_s = 2000;
         return l;
       }},
  };
  const admission_policy policy;
  for (const auto& s : sweeps) {
    SCOPED_TRACE(s.name);
    double previous = 0;
    int rejected = 0;
    for (int64_t n = 0; n < 400; ++n) {
      const admission_decision d = policy.decide(s.config, s.load_at(n), 100);
      if (d.admitted) continue;
      ++rejected;
      EXPECT_EQ(to_string(d.reason), to_string(s.reason)) << n;
      EXPECT_GE(d.retry_after_ms, admission_policy::min_retry_ms) << n;
      EXPECT_GE(d.retry_after_ms, previous) << n;
      previous = d.retry_after_ms;
    }
    EXPECT_GT(rejected, 100);
    EXPECT_GT(previous, admission_policy::min_retry_ms);  // the sweep reached beyond the floor
  }
}

TEST(Admission, ReasonNamesAreDistinct) {
  std::set<std::string_view> names;
  for (auto r : {reject_reason::prefill_queue_full, reject_reason::decode_queue_full, reject_reason::ttft_budget,
                 reject_reason::tpot_budget, reject_reason::prompt_too_long})
    names.insert(to_string(r));
  EXPECT_EQ(names.size(), 5u);
  EXPECT_EQ(to_string(reject_reason::ttft_budget), "ttft_budget");
}

// ---- placement ----

TEST(PrefillPlacement, Table) {
  struct placement_case {
    std::string name;
    std::vector<prefill_worker_load> workers;
    int32_t expected;
  };
  const std::vector<placement_case> cases = {
      {"least queued tokens", {{0, true, 500, 1}, {1, true, 200, 5}, {2, true, 300, 0}}, 1},
      {"dead workers skipped", {{0, false, 0, 0}, {1, true, 10, 1}, {2, false, 0, 0}}, 1},
      {"token tie: fewer requests", {{0, true, 100, 3}, {1, true, 100, 2}, {2, true, 100, 4}}, 1},
      {"full tie: lowest index", {{7, true, 100, 2}, {3, true, 100, 2}}, 0},
      {"index into the span, not the worker id", {{9, true, 50, 0}, {4, true, 10, 0}}, 1},
      {"none alive", {{0, false, 0, 0}, {1, false, 0, 0}}, -1},
      {"no workers", {}, -1},
  };
  const prefill_placement placement;
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    EXPECT_EQ(placement.choose(c.workers, 128), c.expected);
  }
}

TEST(DecodePlacement, Table) {
  struct placement_case {
    std::string name;
    std::vector<decode_worker_load> workers;
    int32_t blocks_needed;
    int32_t expected;
  };
  const std::vector<placement_case> cases = {
      {"most free blocks", {{0, true, 10, 100, 1, 8}, {1, true, 50, 100, 3, 8}, {2, true, 30, 100, 0, 8}}, 5, 1},
      {"too few free blocks skipped", {{0, true, 4, 100, 0, 8}, {1, true, 6, 100, 7, 8}}, 5, 1},
      {"exactly enough free blocks", {{0, true, 5, 100, 0, 8}}, 5, 0},
      {"full batch skipped", {{0, true, 90, 100, 8, 8}, {1, true, 20, 100, 2, 8}}, 5, 1},
      {"max_batch 0: no batch limit", {{0, true, 10, 100, 1000, 0}}, 5, 0},
      {"dead skipped even with most room", {{0, false, 100, 100, 0, 8}, {1, true, 10, 100, 0, 8}}, 5, 1},
      {"free tie: smaller batch", {{0, true, 50, 100, 4, 8}, {1, true, 50, 100, 2, 8}}, 5, 1},
      {"full tie: lowest index", {{0, true, 50, 100, 2, 8}, {1, true, 50, 100, 2, 8}}, 5, 0},
      {"none eligible", {{0, true, 4, 100, 0, 8}, {1, true, 90, 100, 8, 8}, {2, false, 90, 100, 0, 8}}, 5, -1},
      {"no workers", {}, 1, -1},
  };
  const decode_placement placement;
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    EXPECT_EQ(placement.choose(c.workers, c.blocks_needed), c.expected);
  }
}

// ---- batching ----

bool same(const std::vector<prefill_chunk>& got, const std::vector<prefill_chunk>& want) {
  if (got.size() != want.size()) return false;
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i].request != want[i].request || got[i].begin != want[i].begin || got[i].length != want[i].length ||
        got[i].last != want[i].last)
      return false;
  return true;
}

std::string show(const std::vector<prefill_chunk>& chunks) {
  std::string s = "[";
  for (const auto& c : chunks)
    s += " {" + std::to_string(c.request) + " @" + std::to_string(c.begin) + " +" + std::to_string(c.length) +
         (c.last ? " last}" : "}");
  return s + " ]";
}

TEST(PlanPrefillStep, Table) {
  struct step_case {
    std::string name;
    std::vector<pending_prefill> queue;
    int32_t budget;
    int32_t chunk;
    std::vector<prefill_chunk> expected;
  };
  const std::vector<step_case> cases = {
      {"empty queue", {}, 512, 0, {}},
      {"whole prompts in FIFO order", {{1, 100, 0}, {2, 50, 0}}, 512, 0, {{1, 0, 100, true}, {2, 0, 50, true}}},
      {"exact fit", {{1, 300, 0}, {2, 212, 0}, {3, 10, 0}}, 512, 0, {{1, 0, 300, true}, {2, 0, 212, true}}},
      {"budget splits a prompt",
       {{1, 100, 0}, {2, 1000, 0}, {3, 5, 0}},
       512,
       0,
       {{1, 0, 100, true}, {2, 0, 412, false}}},
      {"chunk limit; leftover budget goes behind",
       {{1, 1000, 0}, {2, 100, 0}},
       512,
       256,
       {{1, 0, 256, false}, {2, 0, 100, true}}},
      {"chunk limit across many prompts",
       {{1, 1000, 0}, {2, 1000, 0}, {3, 1000, 0}},
       512,
       256,
       {{1, 0, 256, false}, {2, 0, 256, false}}},
      {"chunk equal to the rest is last", {{1, 256, 0}}, 512, 256, {{1, 0, 256, true}}},
      {"partially done prompt finishes", {{1, 1000, 900}}, 512, 0, {{1, 900, 100, true}}},
      {"partially done prompt continues", {{1, 1000, 256}}, 256, 0, {{1, 256, 256, false}}},
      {"finished entries skipped", {{1, 100, 100}, {2, 10, 0}}, 512, 0, {{2, 0, 10, true}}},
      {"zero budget still progresses", {{1, 100, 0}}, 0, 0, {{1, 0, 1, false}}},
      {"one-token budget", {{1, 1, 0}, {2, 1, 0}}, 1, 0, {{1, 0, 1, true}}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const auto got = plan_prefill_step(c.queue, c.budget, c.chunk);
    EXPECT_TRUE(same(got, c.expected)) << "got " << show(got) << " want " << show(c.expected);
  }
}

// Steps applied one after another cover every prompt position exactly once, in order, within budget.
TEST(PlanPrefillStep, StepsCoverEveryPromptOnce) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<pending_prefill> queue;
    for (int64_t r = 0; r < 8; ++r) queue.push_back({r, int32_t(1 + rng() % 700), 0});
    const int32_t budget = int32_t(1 + rng() % 600);
    const int32_t chunk = int32_t(rng() % 300);  // 0 = no limit
    std::map<int64_t, int32_t> finished_at;
    for (int step = 0; !queue.empty(); ++step) {
      ASSERT_LT(step, 10000);
      const auto chunks = plan_prefill_step(queue, budget, chunk);
      ASSERT_FALSE(chunks.empty());
      int32_t used = 0;
      for (const auto& c : chunks) {
        auto it = std::find_if(queue.begin(), queue.end(), [&](const auto& p) { return p.request == c.request; });
        ASSERT_NE(it, queue.end());
        EXPECT_EQ(c.begin, it->done_tokens);
        EXPECT_GT(c.length, 0);
        if (chunk > 0) {
          EXPECT_LE(c.length, chunk);
        }
        it->done_tokens += c.length;
        EXPECT_EQ(c.last, it->done_tokens == it->prompt_tokens);
        used += c.length;
      }
      EXPECT_LE(used, budget);
      // The head of the queue is always served (FIFO: nobody overtakes it entirely).
      EXPECT_EQ(chunks.front().request, queue.front().request);
      std::erase_if(queue, [](const auto& p) { return p.done_tokens == p.prompt_tokens; });
    }
  }
}

TEST(PlanColocatedStep, Table) {
  struct colocated_case {
    std::string name;
    int32_t decodes;
    std::vector<pending_prefill> queue;
    int32_t budget;
    int32_t chunk;
    int32_t expected_decode;
    std::vector<prefill_chunk> expected_prefill;
  };
  const std::vector<colocated_case> cases = {
      {"decode first, prefill gets the rest", 10, {{1, 1000, 0}}, 512, 0, 10, {{1, 0, 502, false}}},
      {"one token left for prefill", 511, {{1, 1000, 0}}, 512, 0, 511, {{1, 0, 1, false}}},
      {"budget equal to decodes: no prefill", 512, {{1, 1000, 0}}, 512, 0, 512, {}},
      {"budget below decodes: decodes still all run", 600, {{1, 1000, 0}}, 512, 0, 600, {}},
      {"chunk limit applies to the rest",
       10,
       {{1, 1000, 0}, {2, 20, 0}},
       512,
       128,
       10,
       {{1, 0, 128, false}, {2, 0, 20, true}}},
      {"no decodes: whole budget to prefill", 0, {{1, 100, 0}}, 512, 0, 0, {{1, 0, 100, true}}},
      {"no decodes, zero budget: still progresses", 0, {{1, 10, 0}}, 0, 0, 0, {{1, 0, 1, false}}},
      {"negative decodes count as none", -3, {{1, 10, 0}}, 512, 0, 0, {{1, 0, 10, true}}},
      {"nothing to prefill", 5, {}, 512, 0, 5, {}},
      {"idle", 0, {}, 512, 0, 0, {}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const colocated_plan plan = plan_colocated_step(c.decodes, c.queue, c.budget, c.chunk);
    EXPECT_EQ(plan.decode_tokens, c.expected_decode);
    EXPECT_TRUE(same(plan.prefill, c.expected_prefill))
        << "got " << show(plan.prefill) << " want " << show(c.expected_prefill);
  }
}

// ---- KV credits ----

TEST(BlocksForTokens, Table) {
  struct blocks_case {
    std::string name;
    int32_t tokens, block_size, expected;
  };
  const std::vector<blocks_case> cases = {
      {"none", 0, 16, 0},
      {"negative", -5, 16, 0},
      {"one token", 1, 16, 1},
      {"a full block", 16, 16, 1},
      {"one past a block", 17, 16, 2},
      {"block size one", 1000, 1, 1000},
      {"largest count does not overflow", std::numeric_limits<int32_t>::max(), 16, 134217728},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    EXPECT_EQ(blocks_for_tokens(c.tokens, c.block_size), c.expected);
  }
  EXPECT_THROW(blocks_for_tokens(10, 0), failure);
}

TEST(KvCreditLedger, Table) {
  enum class op { reserve, release };
  struct step {
    op kind;
    int64_t request;
    int32_t tokens;  // reserve only
    bool expect_ok;  // reserve only
    int32_t expect_free;  // after the step
  };
  struct ledger_case {
    std::string name;
    int32_t total_blocks;
    std::vector<step> steps;
  };
  // block_size 16 throughout
  const std::vector<ledger_case> cases = {
      {"reserve then release", 10, {{op::reserve, 1, 33, true, 7}, {op::release, 1, 0, true, 10}}},
      {"not enough: refused, nothing changes",
       10,
       {{op::reserve, 1, 100, true, 3}, {op::reserve, 2, 64, false, 3}, {op::release, 2, 0, true, 3}}},
      {"exact fit, then nothing more", 10, {{op::reserve, 1, 160, true, 0}, {op::reserve, 2, 1, false, 0}}},
      {"release is idempotent",
       10,
       {{op::reserve, 1, 16, true, 9},
        {op::release, 1, 0, true, 10},
        {op::release, 1, 0, true, 10},
        {op::release, 99, 0, true, 10}}},
      {"re-reserve grows, never shrinks",
       10,
       {{op::reserve, 1, 16, true, 9},
        {op::reserve, 1, 48, true, 7},
        {op::reserve, 1, 16, true, 7},
        {op::release, 1, 0, true, 10}}},
      {"failed growth keeps the old reservation",
       4,
       {{op::reserve, 1, 32, true, 2},
        {op::reserve, 2, 32, true, 0},
        {op::reserve, 1, 64, false, 0},
        {op::release, 2, 0, true, 2},
        {op::reserve, 1, 64, true, 0}}},
      {"zero tokens reserve nothing but are held", 10, {{op::reserve, 1, 0, true, 10}}},
      {"empty pool", 0, {{op::reserve, 1, 1, false, 0}, {op::reserve, 2, 0, true, 0}}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    kv_credit_ledger ledger(c.total_blocks, 16);
    for (size_t i = 0; i < c.steps.size(); ++i) {
      SCOPED_TRACE("step " + std::to_string(i));
      const step& s = c.steps[i];
      if (s.kind == op::reserve) {
        EXPECT_EQ(ledger.try_reserve(s.request, s.tokens), s.expect_ok);
        if (s.expect_ok) {
          EXPECT_TRUE(ledger.holds(s.request));
        }
      } else {
        ledger.release(s.request);
        EXPECT_FALSE(ledger.holds(s.request));
      }
      EXPECT_EQ(ledger.free_blocks(), s.expect_free);
      EXPECT_EQ(ledger.free_blocks() + ledger.reserved_blocks(), ledger.total_blocks());
    }
  }
}

TEST(KvCreditLedger, RejectsBadShapes) {
  EXPECT_THROW(kv_credit_ledger(-1, 16), failure);
  EXPECT_THROW(kv_credit_ledger(10, 0), failure);
}

// Random reserve/release traffic against a model that is too simple to be wrong.
TEST(KvCreditLedger, MatchesAModelUnderRandomTraffic) {
  constexpr int32_t total = 64, block_size = 16;
  kv_credit_ledger ledger(total, block_size);
  std::map<int64_t, int32_t> model;  // request → blocks
  std::mt19937 rng(20240611);
  for (int i = 0; i < 20000; ++i) {
    const int64_t request = int64_t(rng() % 24);
    int32_t model_reserved = 0;
    for (const auto& [r, b] : model) model_reserved += b;
    if (rng() % 3 == 0) {
      ledger.release(request);
      model.erase(request);
    } else {
      const int32_t tokens = int32_t(rng() % 400);
      const int32_t need = (tokens + block_size - 1) / block_size;
      const auto it = model.find(request);
      const int32_t have = it == model.end() ? 0 : it->second;
      const bool fits = need <= have || need - have <= total - model_reserved;
      ASSERT_EQ(ledger.try_reserve(request, tokens), fits) << "op " << i;
      if (fits) model[request] = std::max(need, have);
    }
    int32_t reserved = 0;
    for (const auto& [r, b] : model) reserved += b;
    ASSERT_EQ(ledger.reserved_blocks(), reserved) << "op " << i;
    ASSERT_LE(ledger.reserved_blocks(), total);
    ASSERT_EQ(ledger.free_blocks(), total - reserved);
    for (int64_t r = 0; r < 24; ++r) {
      ASSERT_EQ(ledger.holds(r), model.count(r) == 1) << "op " << i << " request " << r;
      ASSERT_EQ(ledger.held_blocks(r), model.count(r) ? model.at(r) : 0);
    }
  }
}

// ---- EWMA ----

TEST(Ewma, Table) {
  struct ewma_case {
    std::string name;
    double alpha;
    std::vector<double> samples;
    bool has_value;
    double expected;
  };
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<ewma_case> cases = {
      {"empty", 0.2, {}, false, 0},
      {"first sample taken as is", 0.2, {42}, true, 42},
      {"weighted blend", 0.5, {10, 20, 0}, true, 7.5},
      {"default weight", 0.2, {100, 200}, true, 120},
      {"alpha 1 follows the latest", 1.0, {3, 9, 4}, true, 4},
      {"non-finite samples ignored", 0.5, {inf, 10, nan, -inf, 20}, true, 15},
      {"only non-finite: still empty", 0.5, {nan, inf}, false, 0},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    ewma e(c.alpha);
    for (double x : c.samples) e.add(x);
    EXPECT_EQ(e.has_value(), c.has_value);
    EXPECT_DOUBLE_EQ(e.value(), c.expected);
  }
}

TEST(Ewma, ConvergesAndRejectsBadWeights) {
  ewma e;
  e.add(0);
  for (int i = 0; i < 200; ++i) e.add(1000);
  EXPECT_NEAR(e.value(), 1000, 1e-6);
  for (double alpha : {0.0, -0.1, 1.5, std::numeric_limits<double>::quiet_NaN()})
    EXPECT_THROW(ewma{alpha}, failure) << alpha;
}

}  // namespace

// KV-aware placement: cached prompt tokens count against a worker's queue.
TEST(PrefillPlacement, CachedPrefixWeighsAgainstLoad) {
  // Worker 0 has 1000 of the 1200 prompt tokens cached but 300 queued; worker 1 is idle.
  const std::vector<prefill_worker_load> w = {{0, true, 300, 2, 1000}, {1, true, 0, 0, 0}};
  EXPECT_EQ(prefill_placement().choose(w, 1200), 0);  // 300 + 200 < 0 + 1200
  EXPECT_EQ(prefill_placement(1.0, 5.0).choose(w, 1200), 1);  // 1500 + 200 > 1200: load wins
  EXPECT_EQ(prefill_placement(0.0, 1.0).choose(w, 1200), 1);  // cache ignored: least queued
  // Cached tokens past the prompt (a stale view) count as the whole prompt, no more: the
  // queues decide (50 vs 10), not a negative cost.
  const std::vector<prefill_worker_load> stale = {{0, true, 50, 0, 5000}, {1, true, 10, 0, 200}};
  EXPECT_EQ(prefill_placement().choose(stale, 100), 1);
}

TEST(PrefixView, FollowsWhatWasSentWithinEachWorkersCapacity) {
  prefix_view v(4);
  const std::vector<block_key> a = {1, 2, 3}, b = {1, 2, 7, 8};
  v.record(0, a);
  EXPECT_EQ(v.overlap(0, a), 3);
  EXPECT_EQ(v.overlap(0, b), 2);  // leading keys only
  EXPECT_EQ(v.overlap(1, a), 0);
  EXPECT_EQ(v.overlap(9, a), 0);  // a worker never seen
  v.record(0, b);  // 1 2 7 8 recent, 3 the oldest: out at capacity 4
  EXPECT_EQ(v.size(0), 4);
  EXPECT_EQ(v.overlap(0, a), 2);
  EXPECT_EQ(v.overlap(0, b), 4);
  v.forget(0);
  EXPECT_EQ(v.overlap(0, b), 0);
}
