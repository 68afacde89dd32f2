#pragma once
// The thread a worker's compute runs on. CAF's scheduler threads never run a forward pass:
// the worker actor hands a step to its runner and stays responsive (cancel, stats, kill)
// until the step's result comes back as a message. One step runs at a time; the runner's
// thread is also thread 0 of the engine's pool, so a worker with N threads uses N cores.
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

namespace tandem {

class compute_runner {
 public:
  compute_runner() : shared_(std::make_shared<shared>()) {
    thread_ = std::thread([s = shared_] { loop(*s); });
  }
  // A killed worker can be destroyed on this very thread: the step's reply held the last
  // reference to the actor. Then the thread is detached (it owns the queue it still reads)
  // instead of joining itself; otherwise the destructor waits for the step in progress.
  ~compute_runner() {
    {
      std::lock_guard<std::mutex> lk(shared_->mu);
      shared_->stop = true;
    }
    shared_->cv.notify_one();
    if (thread_.get_id() == std::this_thread::get_id()) thread_.detach();
    else thread_.join();
  }
  compute_runner(const compute_runner&) = delete;
  compute_runner& operator=(const compute_runner&) = delete;

  void post(std::function<void()> job) {
    {
      std::lock_guard<std::mutex> lk(shared_->mu);
      shared_->jobs.push_back(std::move(job));
    }
    shared_->cv.notify_one();
  }

 private:
  struct shared {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::function<void()>> jobs;
    bool stop = false;
  };
  static void loop(shared& s) {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock<std::mutex> lk(s.mu);
        s.cv.wait(lk, [&] { return s.stop || !s.jobs.empty(); });
        if (s.jobs.empty() || s.stop) return;  // stopping: queued steps are dropped
        job = std::move(s.jobs.front());
        s.jobs.pop_front();
      }
      job();
    }
  }

  std::shared_ptr<shared> shared_;
  std::thread thread_;
};

}  // namespace tandem
