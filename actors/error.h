#pragma once
// tandem's error vocabulary (runtime/errors.h) as caf::error, so a failure keeps its code and
// message when it crosses actor boundaries (and, later, process boundaries).
#include <caf/actor_system_config.hpp>
#include <caf/error.hpp>

#include "runtime/errors.h"

// (The CAF_ERROR_CODE_ENUM declaration that makes errc a caf::error code is in error.cpp only:
// where it is visible, CAF turns every errc argument of a message into a caf::error, and
// messages such as (fail_atom, errc, message) would then not match their handlers.)

namespace tandem {

// Why an actor exited, for the log: "killed" for a kill (fault injection, an admin), else what
// CAF says (an exception, an error).
std::string exit_reason_text(const caf::error& reason);

// A status as caf::error: category "tandem", code = errc, context = the message.
caf::error to_caf_error(const status& st);
// Back from caf::error. CAF's own errors get the nearest code (a request that timed out:
// timeout; its receiver gone or unreachable: worker_failed; anything else: internal)
// with CAF's rendering as the message, so nothing is lost.
status from_caf_error(const caf::error& e);
// Lets an actor system render tandem errors as "tandem: <code> (<message>)".
void register_error_category(caf::actor_system_config& cfg);

}  // namespace tandem
