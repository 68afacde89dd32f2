#include "runtime/scheduler/restart_intensity.h"

#include <algorithm>

namespace tandem {

restart_intensity::restart_intensity(options o) : opts_(o) {
  opts_.max_restarts = std::max(0, opts_.max_restarts);
  opts_.recover_after = std::max(std::chrono::milliseconds(0), opts_.recover_after);
  opts_.recover_after_max = std::max(opts_.recover_after, opts_.recover_after_max);
}

restart_intensity::verdict restart_intensity::failed(clock::time_point now) {
  if (degraded_) return verdict::ignore;
  std::erase_if(restarts_, [&](auto t) { return now - t > opts_.window; });
  if (int32_t(restarts_.size()) < opts_.max_restarts) {
    restarts_.push_back(now);
    return verdict::restart;
  }
  degraded_ = true;
  degraded_since_ = now;
  if (opts_.recover_after.count() == 0) {
    backoff_ = std::chrono::milliseconds(0);
    return verdict::degrade;
  }
  // Failing again soon after the last recovery: wait twice as long as last time.
  const bool soon_again = backoff_.count() > 0 && now - recovered_at_ < 10 * backoff_;
  backoff_ = soon_again ? std::min(2 * backoff_, opts_.recover_after_max) : opts_.recover_after;
  return verdict::degrade;
}

void restart_intensity::recover(clock::time_point now) {
  degraded_ = false;
  restarts_.clear();
  recovered_at_ = now;
}

}  // namespace tandem
