#pragma once
// The tiny synthetic model the actor, pipeline and server tests run on, made once per test
// binary. `tag` keeps each binary's file its own: ctest runs binaries in parallel, and two
// writers of one file would race.
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>

#include "runtime/engine/engine.h"
#include "runtime/model/model.h"
#include "runtime/request_types.h"
#include "runtime/engine/sampler.h"
#include "runtime/model/synth.h"

namespace tandem::testing_support {

inline std::shared_ptr<const model> tiny_model(const std::string& tag) {
  const auto dir = std::filesystem::temp_directory_path() / "tandem-test-models";
  std::filesystem::create_directories(dir);
  const auto p = dir / (tag + "-tiny-f32.gguf");
  if (!std::filesystem::exists(p)) synthesize_model(find_synth_preset("tiny"), kernels::dtype::f32, p.string(), 5);
  return model::load(p.string());
}

// What one engine alone produces for a request: the reference every pipeline must equal.
inline std::vector<token_id> alone(const model& m, const std::vector<token_id>& prompt, int32_t max_tokens,
                                   const sampling_params& sp, bool ignore_eos) {
  auto shared = std::shared_ptr<const model>(&m, [](const model*) {});
  engine eng(shared, engine_options{.n_kv_blocks = 64});
  const seq_id s = eng.create_sequence();
  std::vector<float> logits;
  EXPECT_TRUE(eng.prefill(s, prompt, logits).ok());
  std::vector<token_id> out;
  std::vector<float> adjusted;
  request_spec rule;  // what the workers' stop rule reads
  rule.prompt = prompt;
  rule.max_tokens = max_tokens;
  for (int32_t i = 0; i < max_tokens; ++i) {
    auto l = adjusted_logits(logits, sp, uint64_t(i), m.tok(), adjusted, out, prompt);
    l = constrained_logits(l, sp, out, m.tok(), adjusted);
    const token_id t = sample(l, sp, uint64_t(i));
    const finish_reason end = finish_after(rule, i + 1, ends_generation(sp, ignore_eos, m.tok(), t), m.config().n_ctx);
    if (end == finish_reason::stop) break;
    out.push_back(t);
    if (end == finish_reason::length) break;
    EXPECT_TRUE(eng.decode(std::span(&s, 1), std::span(&t, 1), logits).ok());
  }
  return out;
}

}  // namespace tandem::testing_support
