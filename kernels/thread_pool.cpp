#include "kernels/thread_pool.h"

#include <algorithm>

namespace tandem::kernels {

thread_pool::thread_pool(int n_threads) : n_threads_(std::max(1, n_threads)) {
  for (int i = 1; i < n_threads_; ++i) threads_.emplace_back([this, i] { worker_loop(i); });
}

thread_pool::~thread_pool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void thread_pool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int)>* job;
    {
      std::unique_lock<std::mutex> lk(mu_);
      start_cv_.wait(lk, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
    }
    (*job)(index);
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (--pending_ == 0) done_cv_.notify_one();
    }
  }
}

void thread_pool::run_on_all(const std::function<void(int)>& fn) {
  if (n_threads_ == 1) {
    fn(0);
    return;
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    job_ = &fn;
    pending_ = n_threads_ - 1;
    ++generation_;
  }
  start_cv_.notify_all();
  fn(0);
  std::unique_lock<std::mutex> lk(mu_);
  done_cv_.wait(lk, [&] { return pending_ == 0; });
  job_ = nullptr;
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

}  // namespace tandem::kernels
