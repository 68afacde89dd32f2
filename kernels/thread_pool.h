#pragma once
// A fixed set of compute threads owned by one engine (a worker actor owns N cores).
// parallel_for splits a range into contiguous slices, one per thread; the calling thread
// takes slice 0, so a pool of size 1 runs everything inline with no synchronisation.
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace tandem::kernels {

class thread_pool {
 public:
  explicit thread_pool(int n_threads);
  ~thread_pool();
  thread_pool(const thread_pool&) = delete;
  thread_pool& operator=(const thread_pool&) = delete;

  int size() const { return n_threads_; }

  // Calls fn(begin, end, thread_index) on disjoint slices covering [0, n); slices are
  // rounded to multiples of `grain` (except the last). Returns when all slices are done.
  // Not reentrant: fn must not call parallel_for on the same pool.
  void parallel_for(int64_t n, int64_t grain,
                    const std::function<void(int64_t, int64_t, int)>& fn);

  // Calls fn(thread_index) once on every thread of the pool.
  void run_on_all(const std::function<void(int)>& fn);

 private:
  void worker_loop(int index);

  int n_threads_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  const std::function<void(int)>* job_ = nullptr;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
};

}  // namespace tandem::kernels
