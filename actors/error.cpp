#include "actors/error.h"

#include <caf/exit_reason.hpp>
#include <caf/message.hpp>

CAF_ERROR_CODE_ENUM(tandem::errc, "tandem")

namespace tandem {

caf::error to_caf_error(const status& st) {
  if (st.ok()) return caf::error{};
  return caf::make_error(st.code(), st.message());
}

status from_caf_error(const caf::error& e) {
  if (!e) return {};
  if (e.category() == caf::atom("tandem")) {
    std::string msg;
    const auto& ctx = e.context();
    if (ctx.size() == 1 && ctx.match_element<std::string>(0)) msg = ctx.get_as<std::string>(0);
    return {static_cast<errc>(e.code()), msg};
  }
  if (e.category() == caf::atom("system")) {
    switch (static_cast<caf::sec>(e.code())) {
      case caf::sec::request_timeout: return {errc::timeout, caf::to_string(e)};
      case caf::sec::request_receiver_down:
      case caf::sec::connection_timeout:
      case caf::sec::no_route_to_receiving_node: return {errc::worker_failed, caf::to_string(e)};
      default: break;
    }
  }
  return {errc::internal, caf::to_string(e)};
}

void register_error_category(caf::actor_system_config& cfg) {
  cfg.add_error_category(caf::atom("tandem"), [](uint8_t code, caf::atom_value, const caf::message& ctx) {
    std::string out = "tandem: " + std::string(to_string(static_cast<errc>(code)));
    if (ctx.size() == 1 && ctx.match_element<std::string>(0)) out += " (" + ctx.get_as<std::string>(0) + ")";
    return out;
  });
}

std::string exit_reason_text(const caf::error& reason) {
  if (reason == caf::exit_reason::kill) return "killed";
  return caf::to_string(reason);
}

}  // namespace tandem
