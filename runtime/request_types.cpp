#include "runtime/request_types.h"

namespace tandem {

std::string_view to_string(request_state s) {
  switch (s) {
    case request_state::queued: return "queued";
    case request_state::prefilling: return "prefilling";
    case request_state::transferring: return "transferring";
    case request_state::decoding: return "decoding";
    case request_state::finished: return "finished";
    case request_state::failed: return "failed";
    case request_state::cancelled: return "cancelled";
  }
  return "?";
}

bool is_terminal(request_state s) {
  switch (s) {
    case request_state::queued:
    case request_state::prefilling:
    case request_state::transferring:
    case request_state::decoding: return false;
    case request_state::finished:
    case request_state::failed:
    case request_state::cancelled: return true;
  }
  return true;
}

std::string_view to_string(event_kind k) {
  switch (k) {
    case event_kind::accepted: return "accepted";
    case event_kind::token: return "token";
    case event_kind::done: return "done";
    case event_kind::error: return "error";
  }
  return "?";
}

}  // namespace tandem
