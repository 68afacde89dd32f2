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

// A decode worker's TPOT slack (auto mode): how much prompt work it may take into its own steps
// without its sequences' time per output token going past the target. Every step with decodes
// in it adds (target - the step's time): a batch that decodes faster than the target saves
// slack, and a step slowed by a prompt spends it (debt below zero is paid back by the steps
// after). With nothing decoding nobody waits: the slack is full. It is capped at `burst`
// targets: the longest stall one prompt may cause its batch.
class tpot_slack {
 public:
  explicit tpot_slack(double target_ms, double burst = 10)
      : target_(target_ms), cap_(target_ms * burst), slack_(cap_) {}
  // A step ran: `decodes` sequences decoded in it, taking `ms` in all.
  void step(int32_t decodes, double ms);
  // Nothing decodes here any more.
  void idle() { slack_ = cap_; }
  double slack_ms() const { return slack_; }
  // The prompt tokens it may compute now at `per_token_ms` each (0 when in debt).
  int32_t tokens(double per_token_ms) const;

 private:
  double target_, cap_, slack_;
};

}  // namespace tandem::sched
