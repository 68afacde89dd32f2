// row_split: how a prefill's rows are shared among threads by their measured speed. Tables of
// (observed jobs in -> weights and pieces out); no threads, no clock.
#include "runtime/engine/row_split.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

using tandem::row_split;

namespace {

std::vector<row_split::piece> pieces(const row_split& s, int64_t rows) {
  std::vector<row_split::piece> out;
  for (int p = 0; p < s.threads(); ++p) out.push_back(s.piece_of(p, rows));
  return out;
}

}  // namespace

TEST(RowSplit, StartsEqualAndAlignsBoundaries) {
  struct row {
    int threads;
    int64_t rows;
    std::vector<std::pair<int64_t, int64_t>> want;
  };
  const std::vector<row> table = {
      {1, 509, {{0, 509}}},
      {2, 509, {{0, 256}, {256, 509}}},  // 254.5 rounds to the nearest multiple of 4
      {2, 128, {{0, 64}, {64, 128}}},
      {3, 300, {{0, 100}, {100, 200}, {200, 300}}},
      {3, 509, {{0, 168}, {168, 340}, {340, 509}}},  // 169.7 -> 168, 339.3 -> 340
      {2, 3, {{0, 0}, {0, 3}}},  // fewer rows than the grain: one piece holds them all
  };
  for (const row& r : table) {
    const row_split s(r.threads);
    const auto got = pieces(s, r.rows);
    ASSERT_EQ(got.size(), r.want.size());
    for (size_t p = 0; p < got.size(); ++p) {
      EXPECT_EQ(got[p].begin, r.want[p].first) << r.threads << " threads, " << r.rows << " rows, piece " << p;
      EXPECT_EQ(got[p].end, r.want[p].second) << r.threads << " threads, " << r.rows << " rows, piece " << p;
    }
  }
}

TEST(RowSplit, WeightsFollowMeasuredSpeed) {
  // Each row: jobs observed in turn (rows, seconds per participant) -> weights after them.
  struct job {
    std::vector<int64_t> rows;
    std::vector<double> seconds;
  };
  struct row {
    const char* what;
    int threads;
    std::vector<job> jobs;
    std::vector<double> want;
  };
  const std::vector<row> table = {
      {"equal speeds keep equal weights", 2, {{{256, 253}, {0.10, 253.0 / 256 * 0.10}}}, {0.5, 0.5}},
      // speeds 2560 and 2024 rows/s: shares 0.558464, 0.441536; a quarter of the way there
      {"one job moves a quarter of the way", 2, {{{256, 253}, {0.10, 0.125}}}, {0.514616, 0.485384}},
      {"a thread that took no part changes nothing", 2, {{{509, 0}, {0.2, 0.0}}}, {0.5, 0.5}},
      {"a piece timed at zero changes nothing", 2, {{{256, 253}, {0.1, 0.0}}}, {0.5, 0.5}},
      {"a wrong count of participants changes nothing", 2, {{{100, 100, 100}, {0.1, 0.1, 0.1}}}, {0.5, 0.5}},
      {"three threads, one twice as fast", 3, {{{100, 100, 100}, {0.05, 0.1, 0.1}}}, {0.375, 0.3125, 0.3125}},
  };
  for (const row& r : table) {
    row_split s(r.threads);
    for (const job& j : r.jobs) s.observe(j.rows, j.seconds);
    for (int p = 0; p < r.threads; ++p)
      EXPECT_NEAR(s.weight(p), r.want[size_t(p)], 1e-5) << r.what << ", participant " << p;
  }
}

TEST(RowSplit, SettlesOnTheSpeedRatioAndBalancesTheTime) {
  // Participant 1 runs at 0.8 of participant 0's speed: after some jobs the pieces take both
  // the same time, within the grain of `align` rows.
  row_split s(2);
  const double speed[2] = {2500, 2000};
  for (int j = 0; j < 60; ++j) {
    const auto got = pieces(s, 509);
    std::vector<int64_t> rows;
    std::vector<double> secs;
    for (int p = 0; p < 2; ++p) {
      rows.push_back(got[size_t(p)].end - got[size_t(p)].begin);
      secs.push_back(double(rows.back()) / speed[p]);
    }
    s.observe(rows, secs);
  }
  EXPECT_NEAR(s.weight(0), 5.0 / 9, 1e-3);
  const auto got = pieces(s, 509);
  EXPECT_EQ(got[0].begin, 0);
  EXPECT_EQ(got[0].end, got[1].begin);
  EXPECT_EQ(got[1].end, 509);
  EXPECT_NEAR(double(got[0].end) / speed[0], double(509 - got[1].begin) / speed[1], double(row_split::align) / 2000);
}

TEST(RowSplit, SkewIsBounded) {
  // A thread measured 10x slower job after job (descheduled) still gets a quarter of the rows
  // at 2 threads: (1 - max_skew) / 2.
  row_split s(2);
  for (int j = 0; j < 100; ++j) s.observe(std::vector<int64_t>{256, 253}, std::vector<double>{0.1, 1.0});
  EXPECT_DOUBLE_EQ(s.weight(0), 0.75);
  EXPECT_DOUBLE_EQ(s.weight(1), 0.25);
  const auto got = pieces(s, 512);
  EXPECT_EQ(got[0].end, 384);
}

TEST(RowSplit, PiecesTileTheRowsWhateverTheWeights) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> secs(0.01, 1.0);
  std::uniform_int_distribution<int64_t> rows(1, 2000);
  for (int threads = 1; threads <= 5; ++threads) {
    row_split s(threads);
    for (int j = 0; j < 200; ++j) {
      std::vector<int64_t> r(size_t(threads), 100);
      std::vector<double> t(static_cast<size_t>(threads), 0.0);
      for (double& x : t) x = secs(rng);
      s.observe(r, t);
      const int64_t n = rows(rng);
      int64_t at = 0;
      double sum = 0;
      for (int p = 0; p < threads; ++p) {
        const auto pc = s.piece_of(p, n);
        ASSERT_EQ(pc.begin, at) << threads << " threads, " << n << " rows, piece " << p;
        ASSERT_LE(pc.begin, pc.end);
        if (p + 1 < threads) {
          ASSERT_EQ(pc.end % row_split::align, 0);
        }
        at = pc.end;
        sum += s.weight(p);
      }
      ASSERT_EQ(at, n);
      ASSERT_NEAR(sum, 1.0, 1e-12);
    }
  }
}

TEST(RowSplit, RefusesNoThreads) { EXPECT_THROW(row_split(0), std::invalid_argument); }
