#pragma once
// A fixed set of compute threads owned by one engine (a worker actor owns N cores).
// parallel_for splits a range into contiguous slices, one per thread; the calling thread
// takes part, so a pool of size 1 runs everything inline with no synchronisation.
//
// Dispatch cost: a decode step issues ~100 small parallel_for calls, so waking workers through
// a condition variable each time (~10-30 us per call on the test VM) would dominate. Workers
// therefore spin on an atomic generation counter for a while (spin_us) after each job before
// they sleep on a condition variable; the caller spins on the job's completion count (then
// sleeps too, if the job takes long). While jobs come back to back a dispatch costs about one
// cache-line round trip between cores (~1.5 us here).
//
// Work is claimed, not assigned: parallel_for's slices and for_each_dynamic's indices are
// taken from an atomic counter by whichever participant (caller or worker) is free. A worker
// that the OS has descheduled (more runnable threads than cores) therefore never holds up
// the caller: the caller runs the unclaimed slices itself, and waits only for slices already
// running elsewhere.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace tandem::kernels {

class thread_pool {
 public:
  // spin_us: how long an idle thread polls for the next job (or the caller for the end of a
  // job) before it sleeps.
  explicit thread_pool(int n_threads, int spin_us = 100);
  ~thread_pool();
  thread_pool(const thread_pool&) = delete;
  thread_pool& operator=(const thread_pool&) = delete;

  int size() const { return n_threads_; }

  // Calls fn(begin, end, slice) on disjoint slices covering [0, n), at most size() of them,
  // numbered 0, 1, ...; slices are rounded to multiples of `grain` (except the last). Slices
  // may run on any thread, several on one thread in turn, but never two with the same number
  // at once (use the number to pick per-thread scratch). Returns when all are done; an
  // exception thrown by fn is rethrown here (the first one) after every slice finished.
  // Not reentrant: fn must not call into the same pool.
  void parallel_for(int64_t n, int64_t grain,
                    const std::function<void(int64_t, int64_t, int)>& fn);

  // Calls fn(i, participant) for every i in [0, n), handing out indices in increasing order
  // to whichever thread is free (dynamic scheduling: for tasks of unequal cost, put the
  // costly ones first). participant < size() identifies the running thread (0: the caller).
  // Exceptions and reentrancy as parallel_for.
  void for_each_dynamic(int64_t n, const std::function<void(int64_t, int)>& fn);

  // Calls fn(thread_index) once on every thread of the pool (index 0: the caller); waits for
  // each of them. Exceptions and reentrancy as parallel_for.
  void run_on_all(const std::function<void(int)>& fn);

 private:
  struct job;
  void worker_loop(int index);
  // Publishes j, takes part in it as participant 0, waits until it is done and no worker
  // still looks at it, then rethrows its first exception.
  void dispatch(job& j);
  void run_chunks(job& j, int participant);

  int n_threads_;
  int spin_us_;
  std::vector<std::thread> threads_;
  // Own cache lines: workers poll generation_ while the caller polls the job's counters.
  alignas(64) std::atomic<uint64_t> generation_{0};
  std::atomic<job*> current_{nullptr};  // the job in progress, null between jobs
  alignas(64) std::atomic<int> active_{0};  // workers between reading current_ and leaving it
  alignas(64) std::atomic<bool> stop_{false};
  // Sleeping: workers (sleepers_) and the caller (caller_sleeping_) change these only under
  // mu_, and whoever wakes them checks them under mu_, so no wake-up is lost.
  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  int sleepers_ = 0;
  bool caller_sleeping_ = false;
};

}  // namespace tandem::kernels
