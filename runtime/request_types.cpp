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

std::string_view to_string(finish_reason r) {
  switch (r) {
    case finish_reason::none: return "";
    case finish_reason::stop: return "stop";
    case finish_reason::length: return "length";
    case finish_reason::cancelled: return "cancelled";
  }
  return "";
}

std::optional<finish_reason> parse_finish_reason(std::string_view s) {
  for (auto r : {finish_reason::none, finish_reason::stop, finish_reason::length, finish_reason::cancelled})
    if (to_string(r) == s) return r;
  return std::nullopt;
}

finish_reason finish_after(const request_spec& spec, int32_t generated, bool ends_generation, int32_t n_ctx) {
  if (ends_generation) return finish_reason::stop;
  if (generated >= spec.max_tokens) return finish_reason::length;
  // The next step would feed the last token at position prompt + generated - 1: full once that
  // is past the last position. (A one-token-early stop here once cut outputs short of a lone
  // engine's; the prefill worker once did not check it at all, so a prompt of exactly n_ctx
  // tokens was admitted and then failed in decode.)
  if (spec.original_prompt_tokens() + generated - 1 >= n_ctx) return finish_reason::length;
  return finish_reason::none;
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
