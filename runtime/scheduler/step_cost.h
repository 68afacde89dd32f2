#pragma once
// A worker's step time as a function of the tokens in the step, fitted online to the steps it
// measures: ms ≈ base + per_token · tokens, by least squares over exponentially decaying weights
// (the latest steps count most, so the model follows a machine whose speed drifts, or a context
// that grows). Sarathi-Serve's idea for colocated steps: size each step's prefill so that the
// step, decodes included, stays inside the TPOT target (tokens_within). A plain class: the
// colocated worker feeds it and asks it, tests drive it with tables.
#include <cstdint>

namespace tandem::sched {

class step_cost_model {
 public:
  // decay: the weight an observation keeps per later observation (0 < decay < 1).
  explicit step_cost_model(double decay = 0.97);

  void observe(int32_t tokens, double ms);

  // Fitted only once steps of at least two sizes were seen (a slope needs them).
  bool ready() const;
  double base_ms() const { return base_; }
  double per_token_ms() const { return per_token_; }
  double predict(int32_t tokens) const { return base_ + per_token_ * tokens; }

  // The most tokens a step may hold to be predicted within target_ms, clamped to [lo, hi]
  // (lo: what must run anyway, e.g. every decode and a minimum of prefill; hi: the cap).
  // Not ready yet: hi.
  int32_t tokens_within(double target_ms, int32_t lo, int32_t hi) const;

 private:
  void fit();
  double decay_;
  // Decayed sums of weight, t, t², ms and t·ms.
  double w_ = 0, t_ = 0, tt_ = 0, m_ = 0, tm_ = 0;
  double base_ = 0, per_token_ = 0;
  bool ready_ = false;
};

}  // namespace tandem::sched
