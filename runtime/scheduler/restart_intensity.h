#pragma once
// Restart intensity with a backoff, as Erlang/OTP supervisors and systemd do it: a supervisor
// restarts a failed child at once up to `max_restarts` within `window`; past that it gives up
// for a while (degraded) and tries again after `recover_after`. The wait doubles while
// degradations keep following recoveries closely (within ten waits of the last recovery), up
// to `recover_after_max`, and falls back to `recover_after` once things stay quiet.
//
// A plain class (no actor, no clock): the router's root and every pool supervisor use it, and
// tests drive it with tables of (failure times in → decisions out).
#include <chrono>
#include <cstdint>
#include <vector>

namespace tandem {

class restart_intensity {
 public:
  using clock = std::chrono::steady_clock;
  struct options {
    int32_t max_restarts = 5;  // within `window`
    std::chrono::milliseconds window{10000};
    // 0: never recovers by itself (a process whose supervisor outside restarts it).
    std::chrono::milliseconds recover_after{30000};
    std::chrono::milliseconds recover_after_max{300000};
  };
  enum class verdict : uint8_t {
    restart,  // start the child again now
    degrade,  // give up: degraded, try again after backoff() (if it is not 0)
    ignore,  // already degraded: nothing restarts until recover()
  };

  restart_intensity() = default;
  explicit restart_intensity(options o);

  // A child failed at `now`: restart it now, or give up for a while.
  verdict failed(clock::time_point now);
  // Degraded: how long to wait before recover() (0: never by itself).
  std::chrono::milliseconds backoff() const { return backoff_; }
  bool degraded() const { return degraded_; }
  // Degraded: since when (the failure that passed the intensity); its recovery is due at
  // degraded_since() + backoff().
  clock::time_point degraded_since() const { return degraded_since_; }
  // The wait is over: the failures are forgotten and children may start again.
  void recover(clock::time_point now);

 private:
  options opts_;
  std::vector<clock::time_point> restarts_;  // within the window
  bool degraded_ = false;
  clock::time_point degraded_since_{};
  std::chrono::milliseconds backoff_{0};  // the last wait (0: none yet)
  clock::time_point recovered_at_{};
};

}  // namespace tandem
