#pragma once
// The tiny synthetic model the actor, pipeline and server tests run on, made once per test
// binary. `tag` keeps each binary's file its own: ctest runs binaries in parallel, and two
// writers of one file would race.
#include <filesystem>
#include <memory>
#include <string>

#include "runtime/model.h"
#include "runtime/synth.h"

namespace tandem::testing_support {

inline std::shared_ptr<const model> tiny_model(const std::string& tag) {
  const auto dir = std::filesystem::temp_directory_path() / "tandem-test-models";
  std::filesystem::create_directories(dir);
  const auto p = dir / (tag + "-tiny-f32.gguf");
  if (!std::filesystem::exists(p)) synthesize_model(find_synth_preset("tiny"), kernels::dtype::f32, p.string(), 5);
  return model::load(p.string());
}

}  // namespace tandem::testing_support
