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
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace tandem::kernels {

// The cores of one process, shared by the pools of its workers so that cores follow the work
// (a prefill and a decode worker do not own fixed halves of the machine). Each member has a
// floor: the cores it keeps whenever it is busy. A member may use every core that the floors
// of the other busy members leave, so a prefill worker computes on all cores while the decode
// worker is idle, and on its floor while decode has work. Members say when they are busy
// (set_busy); pools read allowed() at every parallel call, so a change takes effect at the
// next kernel, not the next step. Results do not change: the kernels are batch- and
// thread-count-invariant (kernels/cpu/matmul.h), whatever number of threads a call gets.
class core_share {
 public:
  static constexpr int max_members = 64;
  static constexpr int max_groups = 4;
  explicit core_share(int cores);
  int cores() const { return cores_; }
  // A new member keeping `floor` cores (clamped to 1..cores) while busy, in `group` (0 to
  // max_groups - 1: members of one kind, e.g. the decode workers); returns its index. Throws
  // when max_members are in at once.
  int join(int floor, int group = 0);
  void leave(int member);  // its index may be given to a later member
  void set_busy(int member, bool busy);
  bool busy(int member) const { return busy_[size_t(member)].load(std::memory_order_relaxed); }
  // Cores `member` may use now: all of them but the floors of the other busy members, and
  // never fewer than its own floor.
  int allowed(int member) const;
  // Whether a member of another group is busy now (a decode worker paces its steps only while
  // a prefill worker computes, not for the other decode workers).
  bool other_groups_busy(int member) const;

 private:
  int cores_;
  std::mutex mu_;  // join/leave only
  std::array<std::atomic<int>, max_members> floor_{};  // 0: slot free
  std::array<std::atomic<bool>, max_members> busy_{};
  std::array<std::atomic<int>, max_members> group_{};
  std::atomic<int> busy_floors_{0};  // sum of the floors of busy members
  std::array<std::atomic<int>, max_groups> group_busy_floors_{};  // ... by group
};

class thread_pool {
 public:
  // spin_us: how long an idle thread polls for the next job (or the caller for the end of a
  // job) before it sleeps.
  explicit thread_pool(int n_threads, int spin_us = 100);
  // A pool in a core share: share->cores() threads, of which a parallel call uses as many as
  // the share allows it then (at least `floor`).
  thread_pool(std::shared_ptr<core_share> share, int floor, int group = 0, int spin_us = 100);
  ~thread_pool();
  thread_pool(const thread_pool&) = delete;
  thread_pool& operator=(const thread_pool&) = delete;

  // Threads it has (per-thread scratch: slice and participant numbers are below this).
  int size() const { return n_threads_; }
  // Threads the next parallel call may use: size(), or what the core share allows now.
  int active() const { return share_ ? std::min(n_threads_, share_->allowed(member_)) : n_threads_; }
  // In a core share: whether this pool's owner has work (its floor is then kept for it).
  void set_busy(bool busy) {
    if (share_) share_->set_busy(member_, busy);
  }
  // In a core share, a member of another group is busy now (false outside a share).
  bool other_groups_busy() const { return share_ && share_->other_groups_busy(member_); }

  // Calls fn(begin, end, slot) on disjoint slices covering [0, n), at most size() of them
  // numbered 0, 1, ... (in a core share: up to 4 per thread it may use, so that a descheduled
  // thread holds up little, numbered by the participant running each); slices are rounded to
  // multiples of `grain` (except the last). Slices may run on any thread, several on one
  // thread in turn; `slot` is below size() and never the same for two slices at once (use it
  // to pick per-thread scratch). Returns when all are done; an
  // exception thrown by fn is rethrown here (the first one) after every slice finished.
  // Not reentrant: fn must not call into the same pool.
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t, int)>& fn);

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
  std::shared_ptr<core_share> share_;
  int member_ = -1;
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
