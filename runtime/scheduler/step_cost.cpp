#include "runtime/scheduler/step_cost.h"

#include <algorithm>
#include <cmath>

namespace tandem::sched {

step_cost_model::step_cost_model(double decay) : decay_(std::clamp(decay, 0.5, 0.9999)) {}

void step_cost_model::observe(int32_t tokens, double ms) {
  if (tokens <= 0 || !(ms >= 0) || !std::isfinite(ms)) return;  // nothing computed, or a bad clock
  const double t = tokens;
  w_ = decay_ * w_ + 1;
  t_ = decay_ * t_ + t;
  tt_ = decay_ * tt_ + t * t;
  m_ = decay_ * m_ + ms;
  tm_ = decay_ * tm_ + t * ms;
  fit();
}

void step_cost_model::fit() {
  const double var = w_ * tt_ - t_ * t_;  // w² · the weighted variance of the sizes
  // Steps of (nearly) one size give no slope: wait for another size.
  if (!(var > 1e-6 * w_ * tt_)) return;
  double slope = (w_ * tm_ - t_ * m_) / var;
  double base = (m_ - slope * t_) / w_;
  // Costs are not negative: a noisy fit that says so is cut to the nearest sensible line.
  if (slope < 0) {
    slope = 0;
    base = m_ / w_;
  }
  if (base < 0) {
    base = 0;
    slope = tm_ / tt_;  // through the origin
  }
  base_ = base;
  per_token_ = slope;
  ready_ = true;
}

bool step_cost_model::ready() const { return ready_; }

int32_t step_cost_model::tokens_within(double target_ms, int32_t lo, int32_t hi) const {
  hi = std::max(hi, lo);
  if (!ready_) return hi;
  if (per_token_ <= 0) return hi;
  const double n = std::floor((target_ms - base_) / per_token_);
  if (!(n >= lo)) return lo;
  return n >= hi ? hi : int32_t(n);
}

void tpot_slack::step(int32_t decodes, double ms) {
  if (decodes <= 0) return idle();
  if (!(ms >= 0) || !std::isfinite(ms)) return;
  slack_ = std::clamp(slack_ + target_ - ms, -cap_, cap_);
}

int32_t tpot_slack::tokens(double per_token_ms) const {
  if (slack_ <= 0 || !(per_token_ms > 0)) return 0;
  return int32_t(std::min(1e6, std::floor(slack_ / per_token_ms)));
}

}  // namespace tandem::sched
