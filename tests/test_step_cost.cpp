// The online step-cost model the colocated worker sizes its steps with (runtime/scheduler/step_cost.h).
#include "runtime/scheduler/step_cost.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

using tandem::sched::step_cost_model;

namespace {

struct step {
  int32_t tokens;
  double ms;
};

step_cost_model fed(const std::vector<step>& steps, double decay = 0.97) {
  step_cost_model m(decay);
  for (const auto& s : steps) m.observe(s.tokens, s.ms);
  return m;
}

TEST(StepCost, FitsAnExactLineAndSizesStepsToATarget) {
  // ms = 8 + 1.5 tokens: decode-only steps (4 tokens) and steps with prefill chunks.
  const auto m = fed({{4, 14}, {4, 14}, {132, 206}, {4, 14}, {260, 398}, {68, 110}});
  ASSERT_TRUE(m.ready());
  EXPECT_NEAR(m.base_ms(), 8.0, 1e-6);
  EXPECT_NEAR(m.per_token_ms(), 1.5, 1e-6);
  EXPECT_NEAR(m.predict(100), 158.0, 1e-6);
  struct row {
    double target;
    int32_t lo, hi, want;
  };
  for (const row& r : {row{25, 4, 256, 11},  // floor((25 - 8) / 1.5)
                       row{25, 20, 256, 20},  // what must run anyway runs, past the target
                       row{1000, 4, 256, 256},  // the cap
                       row{5, 4, 256, 4},  // below the base: only what must run
                       row{25, 4, 2, 4}}) {  // hi below lo: lo
    SCOPED_TRACE(r.target);
    EXPECT_EQ(m.tokens_within(r.target, r.lo, r.hi), r.want);
  }
}

TEST(StepCost, NeedsTwoSizesBeforeItTrustsASlope) {
  const auto one_size = fed({{4, 10}, {4, 11}, {4, 9}});
  EXPECT_FALSE(one_size.ready());
  EXPECT_EQ(one_size.tokens_within(25, 4, 256), 256);  // not ready: the configured budget
  const auto none = fed({{0, 5}, {-3, 5}, {10, -1}});  // nothing computed, bad clocks: ignored
  EXPECT_FALSE(none.ready());
}

TEST(StepCost, NeverFitsNegativeCosts) {
  // Noise that would fit a falling line: flat at the mean instead.
  const auto falling = fed({{10, 30}, {200, 10}, {10, 30}, {200, 10}});
  ASSERT_TRUE(falling.ready());
  EXPECT_GE(falling.per_token_ms(), 0.0);
  EXPECT_GE(falling.base_ms(), 0.0);
  // A steep line through a negative intercept: through the origin instead.
  const auto steep = fed({{10, 1}, {100, 100}, {10, 1}, {100, 100}});
  ASSERT_TRUE(steep.ready());
  EXPECT_EQ(steep.base_ms(), 0.0);
  EXPECT_GT(steep.per_token_ms(), 0.9);
}

TEST(StepCost, FollowsAMachineThatSlowsDown) {
  step_cost_model m(0.9);
  for (int i = 0; i < 40; ++i) m.observe(i % 2 ? 4 : 200, i % 2 ? 10 : 210);  // 8 + 1.0 t (about)
  EXPECT_NEAR(m.per_token_ms(), 1.0, 0.05);
  for (int i = 0; i < 80; ++i) m.observe(i % 2 ? 4 : 200, i % 2 ? 16 : 416);  // twice as slow
  EXPECT_NEAR(m.per_token_ms(), 2.04, 0.05);
  EXPECT_NEAR(m.tokens_within(25, 4, 256), 8, 1);  // (25 - 7.8) / 2.04
}

}  // namespace

namespace tandem::sched {
namespace {

// The TPOT slack of a decode worker (auto mode): (event in -> slack and tokens out).
TEST(TpotSlack, DecodesFasterThanTheTargetSaveAndAPromptSpends) {
  tpot_slack s(25, 10);  // 25 ms target; at most 250 ms of slack (one prompt's stall)
  EXPECT_DOUBLE_EQ(s.slack_ms(), 250);  // nothing decodes yet: full
  EXPECT_EQ(s.tokens(2.0), 125);  // 250 ms at 2 ms per prompt token
  struct row {
    int32_t decodes;
    double ms;
    double slack;
  };
  for (const row& r : std::vector<row>{
           {4, 210, 65},  // a step slowed by a prompt spends what the batch had saved
           {4, 15, 75},  // decoding in 15 ms with a 25 ms target saves 10 ms a step
           {4, 200, -100},  // another prompt: in debt
           {4, 400, -250},  // debt is capped too
           {4, 5, -230},  // paid back by the steps after
           {0, 100, 250},  // nothing decodes: nobody waits, full again
           {2, 30, 245},  // a step slower than the target spends a little
       }) {
    s.step(r.decodes, r.ms);
    EXPECT_DOUBLE_EQ(s.slack_ms(), r.slack) << r.decodes << " decodes, " << r.ms << " ms";
  }
  s.step(3, 400);  // in debt: no prompt is computed here
  EXPECT_EQ(s.tokens(2.0), 0);
  s.idle();
  EXPECT_EQ(s.tokens(0.0), 0) << "no fitted cost per token: nothing";
  EXPECT_EQ(s.tokens(3.0), 83);
  s.step(2, std::nan(""));  // a bad clock changes nothing
  EXPECT_DOUBLE_EQ(s.slack_ms(), 250);
}

}  // namespace
}  // namespace tandem::sched
