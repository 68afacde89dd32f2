#include "kernels/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

namespace tk = tandem::kernels;

namespace {

TEST(thread_pool, size_is_at_least_one) {
  EXPECT_EQ(tk::thread_pool(0).size(), 1);
  EXPECT_EQ(tk::thread_pool(-3).size(), 1);
  EXPECT_EQ(tk::thread_pool(3).size(), 3);
}

TEST(thread_pool, parallel_for_covers_range_exactly_once) {
  for (int threads : {1, 2, 3, 4, 7}) {
    tk::thread_pool pool(threads);
    for (int64_t n : {0, 1, 2, 5, 17, 64, 100, 1000})
      for (int64_t grain : {0, 1, 3, 16, 64, 1000}) {
        SCOPED_TRACE("threads=" + std::to_string(threads) + " n=" + std::to_string(n) +
                     " grain=" + std::to_string(grain));
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        std::atomic<int> bad_slice{0};
        std::mutex mu;
        std::set<int> used;
        pool.parallel_for(n, grain, [&](int64_t b, int64_t e, int t) {
          const int64_t g = std::max<int64_t>(1, grain);
          if (b < 0 || e > n || b >= e || t < 0 || t >= threads || b % g != 0 || (e != n && e % g != 0)) ++bad_slice;
          for (int64_t i = b; i < e; ++i) ++hits[size_t(i)];
          std::lock_guard<std::mutex> lk(mu);
          if (!used.insert(t).second) ++bad_slice;  // one slice per thread
        });
        EXPECT_EQ(bad_slice.load(), 0);
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[size_t(i)].load(), 1) << "i=" << i;
      }
  }
}

TEST(thread_pool, run_on_all_runs_every_index_once) {
  for (int threads : {1, 2, 3, 8}) {
    tk::thread_pool pool(threads);
    for (int rep = 0; rep < 50; ++rep) {  // many generations back to back
      std::vector<std::atomic<int>> hits(static_cast<size_t>(threads));
      std::mutex mu;
      std::set<std::thread::id> ids;
      pool.run_on_all([&](int t) {
        ++hits[size_t(t)];
        std::lock_guard<std::mutex> lk(mu);
        ids.insert(std::this_thread::get_id());
      });
      for (int t = 0; t < threads; ++t) ASSERT_EQ(hits[size_t(t)].load(), 1);
      EXPECT_EQ(int(ids.size()), threads);  // distinct OS threads
    }
  }
}

TEST(thread_pool, index_zero_is_the_calling_thread) {
  tk::thread_pool pool(3);
  std::thread::id id0;
  pool.run_on_all([&](int t) {
    if (t == 0) id0 = std::this_thread::get_id();
  });
  EXPECT_EQ(id0, std::this_thread::get_id());
}

// Workers mark their exit through a thread_local destructor; the pool's destructor must have
// joined them (so those destructors ran) by the time it returns.
std::atomic<int> exited{0};
struct exit_probe {
  bool armed = false;
  ~exit_probe() {
    if (armed) ++exited;
  }
};
thread_local exit_probe probe;

TEST(thread_pool, destruction_joins_workers) {
  for (int threads : {1, 2, 5}) {
    exited = 0;
    {
      tk::thread_pool pool(threads);
      pool.run_on_all([&](int t) {
        if (t != 0) probe.armed = true;
      });
    }
    EXPECT_EQ(exited.load(), threads - 1);
  }
  { tk::thread_pool idle(4); }  // never used: must still shut down
}

TEST(thread_pool, for_each_dynamic_runs_every_index_once) {
  for (int threads : {1, 2, 3}) {
    tk::thread_pool pool(threads);
    for (int64_t n : {0, 1, 2, 7, 1000}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      std::atomic<int> bad{0};
      pool.for_each_dynamic(n, [&](int64_t i, int p) {
        if (p < 0 || p >= threads) ++bad;
        ++hits[size_t(i)];
      });
      EXPECT_EQ(bad.load(), 0);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[size_t(i)].load(), 1);
    }
  }
}

// spin_us = 0: every job goes through the sleeping paths (workers and caller on condition
// variables); spin_us = 50 with pauses between jobs: a mix of spinning and sleeping.
TEST(thread_pool, back_to_back_jobs_with_and_without_spinning) {
  for (int spin : {0, 50}) {
    tk::thread_pool pool(3, spin);
    std::atomic<int64_t> sum{0};
    for (int rep = 0; rep < 300; ++rep) {
      pool.parallel_for(300, 7, [&](int64_t b, int64_t e, int) {
        for (int64_t i = b; i < e; ++i) sum += i;
      });
      // A sleep: a pause with no job, so that spinning workers give up and sleep (the test's point).
      if (rep % 50 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    EXPECT_EQ(sum.load(), 300 * (299 * 300 / 2));
  }
}

TEST(thread_pool, exceptions_reach_the_caller_after_all_slices) {
  tk::thread_pool pool(3);
  for (int thrower : {0, 1, 2}) {
    std::atomic<int> ran{0};
    EXPECT_THROW(pool.parallel_for(3, 1,
                                   [&](int64_t b, int64_t, int) {
                                     ++ran;
                                     if (b == thrower) throw std::runtime_error("slice failed");
                                   }),
                 std::runtime_error);
    EXPECT_EQ(ran.load(), 3);
  }
  int ok = 0;  // still usable afterwards
  pool.run_on_all([&](int t) {
    if (t == 0) ok = 1;
  });
  EXPECT_EQ(ok, 1);
}

}  // namespace

namespace {

// A core share hands every core to whoever is busy alone, and each busy member its floor.
TEST(core_share, busy_members_keep_their_floors_and_share_the_rest) {
  tk::core_share share(4);
  const int prefill = share.join(1), decode = share.join(2);
  struct row {
    bool prefill_busy, decode_busy;
    int prefill_allowed, decode_allowed;
  };
  for (const row& r : {row{false, false, 4, 4}, row{true, false, 4, 3}, row{false, true, 2, 4}, row{true, true, 2, 3},
                       row{false, false, 4, 4}}) {
    share.set_busy(prefill, r.prefill_busy);
    share.set_busy(decode, r.decode_busy);
    share.set_busy(decode, r.decode_busy);  // saying it twice changes nothing
    SCOPED_TRACE(std::to_string(r.prefill_busy) + std::to_string(r.decode_busy));
    EXPECT_EQ(share.allowed(prefill), r.prefill_allowed);
    EXPECT_EQ(share.allowed(decode), r.decode_allowed);
  }
  // A floor never exceeds the cores; a member that leaves gives its floor back and its slot.
  const int greedy = share.join(9);
  share.set_busy(greedy, true);
  EXPECT_EQ(share.allowed(prefill), 1);  // 4 cores less greedy's 4, but never below its floor
  share.leave(greedy);
  EXPECT_EQ(share.allowed(prefill), 4);
  EXPECT_EQ(share.join(1), greedy);
}

// A decode worker paces its steps for a busy prefill worker, not for its fellow decode workers.
TEST(core_share, other_groups_are_told_apart_from_peers) {
  tk::core_share share(4);
  const int prefill = share.join(1, 0), d1 = share.join(1, 1), d2 = share.join(1, 1);
  EXPECT_FALSE(share.other_groups_busy(d1));
  share.set_busy(d2, true);
  EXPECT_FALSE(share.other_groups_busy(d1));  // a peer
  EXPECT_TRUE(share.other_groups_busy(prefill));
  share.set_busy(prefill, true);
  EXPECT_TRUE(share.other_groups_busy(d1));
  EXPECT_TRUE(share.other_groups_busy(d2));
  share.leave(prefill);  // leaving clears its busy floor
  EXPECT_FALSE(share.other_groups_busy(d1));
  EXPECT_EQ(share.allowed(d1), 3);  // d2's floor kept for it
}

TEST(core_share, slots_are_reused_so_restarts_never_run_out) {
  auto share = std::make_shared<tk::core_share>(2);
  const int decode = share->join(1);
  share->set_busy(decode, true);
  for (int i = 0; i < 3 * tk::core_share::max_members; ++i) {  // a worker restarted again and again
    tk::thread_pool pool(share, 1);
    pool.set_busy(true);
    EXPECT_EQ(share->allowed(decode), 1);
  }  // each pool left the share (and its floor) when destroyed
  EXPECT_EQ(share->allowed(decode), 2);
  for (int i = 1; i < tk::core_share::max_members; ++i) share->join(1);
  EXPECT_THROW(share->join(1), std::length_error);
}

// A pool in a share has the share's cores as threads, uses what the share allows at each call,
// and still covers every index exactly once.
TEST(core_share, a_pool_uses_what_the_share_allows_at_each_call) {
  auto share = std::make_shared<tk::core_share>(3);
  tk::thread_pool a(share, 1), b(share, 2);
  EXPECT_EQ(a.size(), 3);
  EXPECT_EQ(a.active(), 3);
  auto participants = [](tk::thread_pool& p) {
    std::mutex mu;
    std::set<int> seen;
    std::vector<std::atomic<int>> hits(64);
    p.for_each_dynamic(64, [&](int64_t i, int who) {
      ++hits[size_t(i)];
      // A sleep: each index keeps its worker busy long enough for every participant to join.
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      std::lock_guard<std::mutex> lk(mu);
      seen.insert(who);
    });
    for (auto& h : hits) EXPECT_EQ(h.load(), 1);
    std::atomic<int> n_slices{0};
    const int allowed = p.active();
    p.parallel_for(64, 1, [&](int64_t, int64_t, int slot) {
      ++n_slices;
      EXPECT_LT(slot, allowed);  // the participant running it: only those the share allows
    });
    const int slices = n_slices.load();
    return std::make_pair(seen, slices);
  };
  b.set_busy(true);  // b keeps 2 of 3 cores: a runs on 1, inline
  EXPECT_EQ(a.active(), 1);
  auto [seen, slices] = participants(a);
  EXPECT_EQ(seen, std::set<int>{0});
  EXPECT_EQ(slices, 1);
  b.set_busy(false);  // b idle: a may use all 3
  EXPECT_EQ(a.active(), 3);
  std::tie(seen, slices) = participants(a);
  EXPECT_EQ(slices, 12);  // 4 per thread: a descheduled one holds up a quarter of its part
  EXPECT_LE(seen.size(), 3u);
  for (int who : seen) EXPECT_LT(who, 3);
  a.set_busy(true);  // a busy keeps 1: b gets 2 of its 3 threads; no participant 2 takes work
  EXPECT_EQ(b.active(), 2);
  std::tie(seen, slices) = participants(b);
  EXPECT_EQ(slices, 8);
  for (int who : seen) EXPECT_LT(who, 2);
}

}  // namespace
