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
          if (b < 0 || e > n || b >= e || t < 0 || t >= threads || b % g != 0 ||
              (e != n && e % g != 0))
            ++bad_slice;
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
