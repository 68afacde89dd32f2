#pragma once
// A fixed set of compute threads owned by one engine (a worker actor owns N cores).
// parallel_for splits a range into contiguous slices, one per thread; the calling thread
// takes slice 0, so a pool of size 1 runs everything inline with no synchronisation.
//
// Dispatch cost: a decode step issues ~100 small parallel_for calls, so waking workers through
// a condition variable each time (~10 us per call) would dominate. Workers therefore spin on an
// atomic generation counter for a while (spin_us) after each job before they go to sleep on the
// condition variable; the caller, after running its own slice, spins on the count of pending
// workers (then sleeps too, if they take long). While jobs arrive back to back a dispatch
// costs well under a microsecond.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace tandem::kernels {

class thread_pool {
 public:
  // spin_us: how long an idle worker polls for the next job before it sleeps.
  explicit thread_pool(int n_threads, int spin_us = 200);
  ~thread_pool();
  thread_pool(const thread_pool&) = delete;
  thread_pool& operator=(const thread_pool&) = delete;

  int size() const { return n_threads_; }

  // Calls fn(begin, end, thread_index) on disjoint slices covering [0, n); slices are
  // rounded to multiples of `grain` (except the last). Returns when all slices are done.
  // Not reentrant: fn must not call parallel_for on the same pool.
  void parallel_for(int64_t n, int64_t grain,
                    const std::function<void(int64_t, int64_t, int)>& fn);

  // Calls fn(i, thread_index) for every i in [0, n), handing out indices in increasing order
  // to whichever thread is free (dynamic scheduling: for tasks of unequal cost, put the
  // costly ones first). Not reentrant either.
  void for_each_dynamic(int64_t n, const std::function<void(int64_t, int)>& fn);

  // Calls fn(thread_index) once on every thread of the pool.
  void run_on_all(const std::function<void(int)>& fn);

 private:
  void worker_loop(int index);

  int n_threads_;
  int spin_us_;
  std::vector<std::thread> threads_;
  // Own cache lines: workers poll generation_ while the caller polls pending_. job_ shares
  // generation_'s line, so a worker gets both in one transfer. job_ is published by the
  // release increment of generation_ and read by workers after an acquire load of it.
  alignas(64) std::atomic<uint64_t> generation_{0};
  const std::function<void(int)>* job_ = nullptr;
  alignas(64) std::atomic<int> pending_{0};  // workers still running the current job
  alignas(64) std::atomic<bool> stop_{false};
  // Sleeping: workers (sleepers_) and the caller (caller_sleeping_) change these only under
  // mu_, and whoever wakes them checks them under mu_, so no wake-up is lost.
  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  int sleepers_ = 0;
  bool caller_sleeping_ = false;
};

}  // namespace tandem::kernels
