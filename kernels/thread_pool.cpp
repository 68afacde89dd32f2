#include "kernels/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <exception>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TANDEM_CPU_RELAX() _mm_pause()
#else
#define TANDEM_CPU_RELAX() std::atomic_signal_fence(std::memory_order_seq_cst)
#endif

namespace tandem::kernels {
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

thread_pool::thread_pool(int n_threads, int spin_us)
    : n_threads_(std::max(1, n_threads)), spin_us_(std::max(0, spin_us)) {
  for (int i = 1; i < n_threads_; ++i) threads_.emplace_back([this, i] { worker_loop(i); });
}

thread_pool::~thread_pool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_.store(true, std::memory_order_release);
  }
  start_cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void thread_pool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    // Spin first: the next job usually follows within microseconds.
    auto fresh = [&] {
      return generation_.load(std::memory_order_acquire) != seen ||
             stop_.load(std::memory_order_acquire);
    };
    if (!spin_until(fresh, spin_us_)) {
      std::unique_lock<std::mutex> lk(mu_);
      ++sleepers_;
      start_cv_.wait(lk, fresh);
      --sleepers_;
    }
    if (stop_.load(std::memory_order_acquire)) return;  // only set while no job is running
    // The caller bumps the generation only after every worker finished the previous job, so
    // exactly one new job is waiting here.
    seen = generation_.load(std::memory_order_acquire);
    (*job_)(index);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard<std::mutex> lk(mu_);
      if (caller_sleeping_) done_cv_.notify_one();
    }
  }
}

void thread_pool::run_on_all(const std::function<void(int)>& fn) {
  if (n_threads_ == 1) {
    fn(0);
    return;
  }
  job_ = &fn;
  pending_.store(n_threads_ - 1, std::memory_order_relaxed);
  bool wake;
  {
    std::lock_guard<std::mutex> lk(mu_);
    generation_.fetch_add(1, std::memory_order_release);  // publishes job_ and pending_
    wake = sleepers_ > 0;
  }
  if (wake) start_cv_.notify_all();
  std::exception_ptr error;
  try {
    fn(0);
  } catch (...) {
    error = std::current_exception();  // the workers still use fn: wait for them first
  }
  auto done = [&] { return pending_.load(std::memory_order_acquire) == 0; };
  if (!spin_until(done, spin_us_)) {
    std::unique_lock<std::mutex> lk(mu_);
    caller_sleeping_ = true;
    done_cv_.wait(lk, done);
    caller_sleeping_ = false;
  }
  job_ = nullptr;
  if (error) std::rethrow_exception(error);
}

void thread_pool::parallel_for(int64_t n, int64_t grain,
                               const std::function<void(int64_t, int64_t, int)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t chunks = (n + grain - 1) / grain;
  const int workers = int(std::min<int64_t>(n_threads_, chunks));
  if (workers <= 1) {
    fn(0, n, 0);
    return;
  }
  // Spread whole grains evenly: the first `extra` threads get one more grain.
  const int64_t per = chunks / workers, extra = chunks % workers;
  run_on_all([&](int t) {
    if (t >= workers) return;
    const int64_t first = t * per + std::min<int64_t>(t, extra);
    const int64_t count = per + (t < extra ? 1 : 0);
    const int64_t begin = first * grain;
    const int64_t end = std::min(n, (first + count) * grain);
    if (begin < end) fn(begin, end, t);
  });
}

void thread_pool::for_each_dynamic(int64_t n, const std::function<void(int64_t, int)>& fn) {
  if (n <= 0) return;
  if (n_threads_ == 1 || n == 1) {
    for (int64_t i = 0; i < n; ++i) fn(i, 0);
    return;
  }
  std::atomic<int64_t> next{0};
  run_on_all([&](int t) {
    for (int64_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < n;) fn(i, t);
  });
}

}  // namespace tandem::kernels
