#pragma once
// Teacher-forcing tandem along llama.cpp's greedy continuation (test_arch_conformance,
// test_real_vocab): the fixtures hold, per step, llama.cpp's chosen id and its top-k
// (id, log-probability) pairs from llama-server's n_probs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/engine/engine.h"

namespace tandem::testing_support {

inline std::vector<float> log_softmax(const std::vector<float>& x) {
  const float mx = *std::max_element(x.begin(), x.end());
  double sum = 0;
  for (float v : x) sum += std::exp(double(v) - mx);
  const float lse = mx + float(std::log(sum));
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = x[i] - lse;
  return out;
}

struct forced_run {
  int steps = 0, clear = 0;  // steps fed; steps where tandem's choice was clear enough to compare
  float worst = 0;  // largest |log-probability difference| seen
  std::vector<float> step_worst;  // each step's largest difference
};

inline float median(std::vector<float> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + std::ptrdiff_t(v.size() / 2), v.end());
  return v[v.size() / 2];
}

// From `logits` (after the prompt of sequence s), feeds llama.cpp's token at each of `steps`,
// expecting each of its top-k log-probabilities within `tol` of tandem's, and tandem's greedy
// choice among the tokens llama.cpp was allowed (not `banned`) to be llama.cpp's wherever
// tandem's top-2 margin exceeds `clear_margin`. `what` names the case in failures.
inline forced_run teacher_force(engine& eng, seq_id s, std::vector<float> logits, const nlohmann::json& steps,
                                const std::set<token_id>& banned, float tol, float clear_margin,
                                const std::string& what) {
  forced_run run;
  for (const auto& st : steps) {
    const auto lp = log_softmax(logits);
    float here = 0;
    for (const auto& t : st["top"]) {
      const float d = std::fabs(lp[t[0].get<size_t>()] - t[1].get<float>());
      here = std::max(here, d);
      EXPECT_LE(d, tol) << what << " step " << run.steps << " token " << t[0];
    }
    run.worst = std::max(run.worst, here);
    run.step_worst.push_back(here);
    token_id best = -1, second = -1;
    for (token_id i = 0; i < token_id(lp.size()); ++i) {
      if (banned.count(i)) continue;
      if (best < 0 || lp[size_t(i)] > lp[size_t(best)]) {
        second = best;
        best = i;
      } else if (second < 0 || lp[size_t(i)] > lp[size_t(second)]) {
        second = i;
      }
    }
    const token_id theirs = st["id"];
    if (lp[size_t(best)] - lp[size_t(second)] > clear_margin) {
      EXPECT_EQ(best, theirs) << what << " step " << run.steps;
      ++run.clear;
    }
    if (!eng.decode(std::span(&s, 1), std::span(&theirs, 1), logits).ok()) {
      ADD_FAILURE() << what << ": decode failed at step " << run.steps;
      return run;
    }
    ++run.steps;
  }
  return run;
}

}  // namespace tandem::testing_support
