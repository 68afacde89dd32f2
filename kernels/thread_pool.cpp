#include "kernels/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TANDEM_CPU_RELAX() _mm_pause()
#else
#define TANDEM_CPU_RELAX() std::atomic_signal_fence(std::memory_order_seq_cst)
#endif

namespace tandem::kernels {

// One parallel call. Lives on the caller's stack; workers reach it through current_ and
// touch it only while counted in active_, so it outlives every access.
struct thread_pool::job {
  // Runs chunk i as participant p (pinned jobs: chunk p on participant p only).
  std::function<void(int64_t, int)> run;
  int64_t n = 0;
  int participants = 0;  // only participants below this take chunks (a core share's limit)
  bool pinned = false;  // run_on_all: every thread runs exactly its own chunk
  uint64_t generation = 0;
  alignas(64) std::atomic<int64_t> next{0};  // next chunk to claim
  alignas(64) std::atomic<int64_t> done{0};  // chunks finished
  std::atomic<bool> failed{false};
  std::exception_ptr error;  // written once, by whoever sets `failed` first
};

namespace {

using spin_clock = std::chrono::steady_clock;

// Polls done() with a pause between reads until it holds or `us` microseconds passed; the
// clock is read only every 64 polls. Returns done()'s last value.
template <class Done>
bool spin_until(Done&& done, int us) {
  if (done()) return true;
  if (us <= 0) return false;
  const auto deadline = spin_clock::now() + std::chrono::microseconds(us);
  for (unsigned i = 1;; ++i) {
    TANDEM_CPU_RELAX();
    if (done()) return true;
    if (i % 64 == 0 && spin_clock::now() >= deadline) return false;
  }
}

}  // namespace

core_share::core_share(int cores) : cores_(std::max(1, cores)) {}

int core_share::join(int floor, int group) {
  std::lock_guard<std::mutex> lk(mu_);
  for (size_t i = 0; i < floor_.size(); ++i)
    if (floor_[i].load() == 0) {
      busy_[i].store(false);
      group_[i].store(std::clamp(group, 0, max_groups - 1));
      floor_[i].store(std::clamp(floor, 1, cores_));
      return int(i);
    }
  throw std::length_error("core_share: more than 64 pools share the cores");
}

void core_share::leave(int member) {
  set_busy(member, false);
  std::lock_guard<std::mutex> lk(mu_);
  floor_[size_t(member)].store(0);
}

void core_share::set_busy(int member, bool busy) {
  const size_t m = size_t(member);
  if (busy_[m].exchange(busy, std::memory_order_acq_rel) == busy) return;
  const int f = floor_[m].load(std::memory_order_relaxed);
  group_busy_floors_[size_t(group_[m].load(std::memory_order_relaxed))].fetch_add(busy ? f : -f,
                                                                                  std::memory_order_acq_rel);
  busy_floors_.fetch_add(busy ? f : -f, std::memory_order_acq_rel);
}

int core_share::allowed(int member) const {
  const size_t m = size_t(member);
  const int own = floor_[m].load(std::memory_order_relaxed);
  // The sum and the flag are read separately: a member changing state in between makes this
  // one call off by that member's floor, corrected at the next call.
  const int others =
      busy_floors_.load(std::memory_order_acquire) - (busy_[m].load(std::memory_order_acquire) ? own : 0);
  return std::clamp(cores_ - others, own, cores_);
}

bool core_share::other_groups_busy(int member) const {
  const int own = group_[size_t(member)].load(std::memory_order_relaxed);
  for (int g = 0; g < max_groups; ++g)
    if (g != own && group_busy_floors_[size_t(g)].load(std::memory_order_acquire) > 0) return true;
  return false;
}

thread_pool::thread_pool(int n_threads, int spin_us)
    : n_threads_(std::max(1, n_threads)), spin_us_(std::max(0, spin_us)) {
  for (int i = 1; i < n_threads_; ++i) threads_.emplace_back([this, i] { worker_loop(i); });
}

thread_pool::thread_pool(std::shared_ptr<core_share> share, int floor, int group, int spin_us)
    : thread_pool(share ? share->cores() : floor, spin_us) {
  if (share) {
    member_ = share->join(floor, group);
    share_ = std::move(share);
  }
}

thread_pool::~thread_pool() {
  if (share_) share_->leave(member_);
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_.store(true, std::memory_order_release);
  }
  start_cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void thread_pool::run_chunks(job& j, int participant) {
  auto one = [&](int64_t i) {
    try {
      j.run(i, participant);
    } catch (...) {
      if (!j.failed.exchange(true, std::memory_order_acq_rel)) j.error = std::current_exception();
    }
    if (j.done.fetch_add(1, std::memory_order_acq_rel) + 1 == j.n && participant != 0) {
      std::lock_guard<std::mutex> lk(mu_);
      if (caller_sleeping_) done_cv_.notify_one();
    }
  };
  if (j.pinned) {
    one(participant);
    return;
  }
  if (participant >= j.participants) return;  // past the share's limit when it was published
  for (int64_t i; (i = j.next.fetch_add(1, std::memory_order_relaxed)) < j.n;) one(i);
}

void thread_pool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    auto fresh = [&] {
      return generation_.load(std::memory_order_acquire) != seen || stop_.load(std::memory_order_acquire);
    };
    if (!spin_until(fresh, spin_us_)) {  // spin first: the next job usually follows closely
      std::unique_lock<std::mutex> lk(mu_);
      ++sleepers_;
      start_cv_.wait(lk, fresh);
      --sleepers_;
    }
    if (stop_.load(std::memory_order_acquire)) return;
    seen = generation_.load(std::memory_order_acquire);
    // Announce before looking: the caller retires a job only after it cleared current_ and
    // then saw active_ == 0 (both seq_cst), so a job read here stays alive until we leave.
    active_.fetch_add(1, std::memory_order_seq_cst);
    if (job* j = current_.load(std::memory_order_seq_cst)) {
      // The job may be newer than the generation we saw; remember the one we served, so a
      // pinned job is never run twice by this thread.
      seen = std::max(seen, j->generation);
      run_chunks(*j, index);
    }
    active_.fetch_sub(1, std::memory_order_seq_cst);
  }
}

void thread_pool::dispatch(job& j) {
  bool wake;
  {
    std::lock_guard<std::mutex> lk(mu_);
    j.generation = generation_.load(std::memory_order_relaxed) + 1;
    current_.store(&j, std::memory_order_seq_cst);
    generation_.store(j.generation, std::memory_order_release);
    wake = sleepers_ > 0;
  }
  if (wake) start_cv_.notify_all();
  run_chunks(j, 0);
  auto finished = [&] { return j.done.load(std::memory_order_acquire) == j.n; };
  if (!spin_until(finished, spin_us_)) {
    std::unique_lock<std::mutex> lk(mu_);
    caller_sleeping_ = true;
    done_cv_.wait(lk, finished);
    caller_sleeping_ = false;
  }
  current_.store(nullptr, std::memory_order_seq_cst);
  // Workers that picked up j may still be leaving it (their last access is brief).
  for (unsigned i = 1; active_.load(std::memory_order_seq_cst) != 0; ++i) {
    TANDEM_CPU_RELAX();
    if (i % 1024 == 0) std::this_thread::yield();
  }
  if (j.failed.load(std::memory_order_acquire)) std::rethrow_exception(j.error);
}

void thread_pool::run_on_all(const std::function<void(int)>& fn) {
  if (n_threads_ == 1) {
    fn(0);
    return;
  }
  job j;
  j.run = [&](int64_t i, int) { fn(int(i)); };
  j.n = n_threads_;
  j.participants = n_threads_;
  j.pinned = true;
  dispatch(j);
}

void thread_pool::parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t, int)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t chunks = (n + grain - 1) / grain;
  const int threads = active();
  // In a core share more threads may be runnable than there are cores for a moment (a member
  // whose share shrank finishes the slices it holds): slices of a quarter of a thread's part
  // then keep a descheduled thread from holding up the call for long.
  const int slices = int(std::min<int64_t>(share_ && threads > 1 ? 4 * int64_t(threads) : threads, chunks));
  if (slices <= 1) {
    fn(0, n, 0);
    return;
  }
  // Spread whole grains evenly: the first `extra` slices get one more grain.
  struct plan {
    int64_t n, grain, per, extra;
    bool by_participant;  // more slices than threads: number them by who runs them
    const std::function<void(int64_t, int64_t, int)>* fn;
  } const p{n, grain, chunks / slices, chunks % slices, slices > threads, &fn};
  job j;
  j.run = [&p](int64_t s, int participant) {  // one reference: fits std::function's inline buffer
    const int64_t first = s * p.per + std::min<int64_t>(s, p.extra);
    const int64_t count = p.per + (s < p.extra ? 1 : 0);
    const int64_t begin = first * p.grain;
    const int64_t end = std::min(p.n, (first + count) * p.grain);
    if (begin < end) (*p.fn)(begin, end, p.by_participant ? participant : int(s));
  };
  j.n = slices;
  j.participants = threads;
  dispatch(j);
}

void thread_pool::for_each_dynamic(int64_t n, const std::function<void(int64_t, int)>& fn) {
  if (n <= 0) return;
  const int threads = active();
  if (threads == 1 || n == 1) {
    for (int64_t i = 0; i < n; ++i) fn(i, 0);
    return;
  }
  job j;
  j.run = [&](int64_t i, int p) { fn(i, p); };
  j.n = n;
  j.participants = threads;
  dispatch(j);
}

}  // namespace tandem::kernels
