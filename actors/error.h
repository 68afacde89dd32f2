#pragma once
// tandem's error vocabulary (runtime/errors.h) as caf::error, so a failure keeps its code and
// message when it crosses actor boundaries (and, later, process boundaries).
#include <caf/actor_system_config.hpp>
#include <caf/error.hpp>

#include "runtime/errors.h"

CAF_ERROR_CODE_ENUM(tandem::errc, "tandem")

namespace tandem {

// A status as caf::error: category "tandem", code = errc, context = the message.
caf::error to_caf_error(const status& st);
// Back from caf::error; errors of other categories (CAF's own) become errc::unsupported with
// CAF's rendering as the message, so nothing is lost.
status from_caf_error(const caf::error& e);
// Lets an actor system render tandem errors as "tandem: <code> (<message>)".
void register_error_category(caf::actor_system_config& cfg);

}  // namespace tandem
