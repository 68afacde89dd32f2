#pragma once
// The thread a worker's compute runs on. CAF's scheduler threads never run a forward pass:
// the worker actor hands a step to its runner and stays responsive (cancel, stats, kill)
// until the step's result comes back as a message. One step runs at a time; the runner's
// thread is also thread 0 of the engine's pool, so a worker with N threads uses N cores.
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace tandem {

class compute_runner {
 public:
  compute_runner() : thread_([this] { loop(); }) {}
  ~compute_runner() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    thread_.join();  // waits for the step in progress: the engine outlives it
  }
  compute_runner(const compute_runner&) = delete;
  compute_runner& operator=(const compute_runner&) = delete;

  void post(std::function<void()> job) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      jobs_.push_back(std::move(job));
    }
    cv_.notify_one();
  }

 private:
  void loop() {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return stop_ || !jobs_.empty(); });
        if (jobs_.empty()) return;  // stop requested and nothing left
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stop_ = false;
  std::thread thread_;  // last: starts after the members it uses exist
};

}  // namespace tandem
