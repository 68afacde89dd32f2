// restart_intensity: tables of (event at time t → verdict, backoff) for the policy every
// supervisor (pools, the router's root) follows.
#include "runtime/scheduler/restart_intensity.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

using namespace tandem;
using namespace std::chrono_literals;
using verdict = restart_intensity::verdict;

namespace {

enum class what { fail, recover };

struct step {
  int64_t at_ms;
  what event;
  verdict want = verdict::restart;  // for fail
  int64_t backoff_ms = -1;  // checked when >= 0
};

std::string name(verdict v) {
  switch (v) {
    case verdict::restart: return "restart";
    case verdict::degrade: return "degrade";
    case verdict::ignore: return "ignore";
  }
  return "?";
}

void run(restart_intensity::options o, const std::vector<step>& steps) {
  restart_intensity ri(o);
  const auto t0 = restart_intensity::clock::time_point{} + 1h;
  for (size_t i = 0; i < steps.size(); ++i) {
    const auto& s = steps[i];
    const auto now = t0 + std::chrono::milliseconds(s.at_ms);
    SCOPED_TRACE("step " + std::to_string(i) + " at " + std::to_string(s.at_ms) + " ms");
    if (s.event == what::recover) {
      ASSERT_TRUE(ri.degraded());
      ri.recover(now);
      EXPECT_FALSE(ri.degraded());
      continue;
    }
    const verdict v = ri.failed(now);
    EXPECT_EQ(name(v), name(s.want));
    EXPECT_EQ(ri.degraded(), s.want != verdict::restart);
    if (s.backoff_ms >= 0) {
      EXPECT_EQ(ri.backoff().count(), s.backoff_ms);
    }
  }
}

restart_intensity::options opts(int32_t max, int64_t window_ms, int64_t after_ms, int64_t max_after_ms) {
  return {max, std::chrono::milliseconds(window_ms), std::chrono::milliseconds(after_ms),
          std::chrono::milliseconds(max_after_ms)};
}

}  // namespace

TEST(RestartIntensity, RestartsUpToTheIntensityThenDegrades) {
  run(opts(3, 10000, 30000, 300000), {
                                         {0, what::fail, verdict::restart},
                                         {100, what::fail, verdict::restart},
                                         {200, what::fail, verdict::restart},
                                         {300, what::fail, verdict::degrade, 30000},
                                         {400, what::fail, verdict::ignore, 30000},  // more children dying
                                     });
}

TEST(RestartIntensity, FailuresOutsideTheWindowAreForgotten) {
  run(opts(2, 1000, 30000, 300000), {
                                        {0, what::fail, verdict::restart},
                                        {900, what::fail, verdict::restart},
                                        {1500, what::fail, verdict::restart},  // the one at 0 has left the window
                                        {2000, what::fail, verdict::restart},  // and the one at 900
                                        {2100, what::fail, verdict::degrade, 30000},
                                    });
}

TEST(RestartIntensity, BackoffDoublesWhileDegradationsFollowRecoveriesUpToItsMax) {
  run(opts(1, 10000, 1000, 3000), {
                                      {0, what::fail, verdict::restart},
                                      {10, what::fail, verdict::degrade, 1000},
                                      {1010, what::recover},
                                      {1020, what::fail, verdict::restart},  // counts from zero again
                                      {1030, what::fail, verdict::degrade, 2000},
                                      {3030, what::recover},
                                      {3040, what::fail, verdict::restart},
                                      {3050, what::fail, verdict::degrade, 3000},  // 4000 capped at the max
                                      {6050, what::recover},
                                      {6060, what::fail, verdict::restart},
                                      {6070, what::fail, verdict::degrade, 3000},
                                  });
}

TEST(RestartIntensity, BackoffFallsBackOnceQuietForTenWaits) {
  run(opts(1, 10000, 1000, 60000), {
                                       {0, what::fail, verdict::restart},
                                       {10, what::fail, verdict::degrade, 1000},
                                       {1010, what::recover},
                                       {1020, what::fail, verdict::restart},
                                       {1030, what::fail, verdict::degrade, 2000},
                                       {3030, what::recover},
                                       // Quiet for 20 s (ten waits of 2 s) after the recovery.
                                       {23031, what::fail, verdict::restart},
                                       {23032, what::fail, verdict::degrade, 1000},
                                   });
}

TEST(RestartIntensity, ZeroRecoverAfterNeverRecoversByItself) {
  run(opts(1, 10000, 0, 0), {
                                {0, what::fail, verdict::restart},
                                {10, what::fail, verdict::degrade, 0},
                                {20, what::fail, verdict::ignore, 0},
                            });
}

TEST(RestartIntensity, ZeroMaxRestartsDegradesAtTheFirstFailure) {
  run(opts(0, 10000, 500, 500), {
                                    {0, what::fail, verdict::degrade, 500},
                                    {500, what::recover},
                                    {600, what::fail, verdict::degrade, 500},
                                });
}

TEST(RestartIntensity, RemembersWhenItDegraded) {
  restart_intensity ri(opts(1, 10000, 2000, 2000));
  const auto t0 = restart_intensity::clock::time_point{} + 1h;
  EXPECT_EQ(name(ri.failed(t0)), "restart");
  EXPECT_EQ(name(ri.failed(t0 + 5ms)), "degrade");
  EXPECT_EQ(name(ri.failed(t0 + 9ms)), "ignore");
  EXPECT_EQ(ri.degraded_since(), t0 + 5ms);  // its recovery is due at degraded_since() + backoff()
}
