#pragma once
// tandem as a library: the one header a program includes (installed as <tandem/tandem.h>).
//
//   #include <tandem/tandem.h>
//   tandem::pipeline p({.model = {.path = "model.gguf"}});
//   auto r = p.submit({.prompt = "Once upon a time", .max_tokens = 32}).wait();
//
// With it come the pipeline and its connections (actors/pipeline.h), the configuration
// (runtime/serving_config.h), the policies a program may replace (runtime/scheduler/policy.h),
// fault injection (runtime/fault_injection.h), the error vocabulary and its caf::error bridge
// (runtime/errors.h, actors/error.h), and the engine for those who embed one without actors
// (runtime/engine/engine.h, sampler.h). docs/api.md is the guided tour.
#include <tandem/version.h>

#include "actors/error.h"
#include "actors/pipeline.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/sampler.h"
#include "runtime/errors.h"
#include "runtime/fault_injection.h"
#include "runtime/scheduler/policy.h"
#include "runtime/serving_config.h"
