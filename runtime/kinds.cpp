#include "runtime/kinds.h"

#include <array>
#include <charconv>

namespace tandem {
namespace {

// Parses by the enum's own to_string: one spelling, written once.
template <class E, size_t N>
std::optional<E> parse_by_name(std::string_view s, const std::array<E, N>& all) {
  for (E e : all)
    if (to_string(e) == s) return e;
  return std::nullopt;
}

bool parse_number(std::string_view s, int64_t& out) {
  if (s.empty() || s.size() > 18 || s[0] == '-' || s[0] == '+') return false;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && end == s.data() + s.size();
}

}  // namespace

std::string_view to_string(serving_mode m) {
  switch (m) {
    case serving_mode::disaggregated: return "disaggregated";
    case serving_mode::colocated: return "colocated";
    case serving_mode::automatic: return "auto";
  }
  return "?";
}
std::optional<serving_mode> parse_serving_mode(std::string_view s) {
  return parse_by_name(s, std::array{serving_mode::disaggregated, serving_mode::colocated, serving_mode::automatic});
}

std::string_view to_string(worker_kind k) {
  switch (k) {
    case worker_kind::prefill: return "prefill";
    case worker_kind::decode: return "decode";
    case worker_kind::colocated: return "colocated";
  }
  return "?";
}
std::optional<worker_kind> parse_worker_kind(std::string_view s) {
  return parse_by_name(s, std::array{worker_kind::prefill, worker_kind::decode, worker_kind::colocated});
}

std::string_view to_string(node_role r) {
  switch (r) {
    case node_role::prefill: return "prefill";
    case node_role::decode: return "decode";
  }
  return "?";
}
std::optional<node_role> parse_node_role(std::string_view s) {
  return parse_by_name(s, std::array{node_role::prefill, node_role::decode});
}

std::string_view to_string(kv_transport_kind k) {
  switch (k) {
    case kv_transport_kind::handoff: return "handoff";
    case kv_transport_kind::local: return "local";
    case kv_transport_kind::shm: return "shm";
    case kv_transport_kind::channel: return "channel";
  }
  return "?";
}
std::optional<kv_transport_kind> parse_kv_transport_kind(std::string_view s) {
  return parse_by_name(s, std::array{kv_transport_kind::handoff, kv_transport_kind::local, kv_transport_kind::shm,
                                     kv_transport_kind::channel});
}

std::string_view to_string(channel_mode m) {
  switch (m) {
    case channel_mode::automatic: return "auto";
    case channel_mode::tcp: return "tcp";
    case channel_mode::shm: return "shm";
  }
  return "?";
}
std::optional<channel_mode> parse_channel_mode(std::string_view s) {
  return parse_by_name(s, std::array{channel_mode::automatic, channel_mode::tcp, channel_mode::shm});
}

std::string_view to_string(actor_kind k) {
  switch (k) {
    case actor_kind::prefill: return "prefill";
    case actor_kind::decode: return "decode";
    case actor_kind::colocated: return "colocated";
    case actor_kind::kv_link: return "kv_link";
    case actor_kind::request: return "request";
    case actor_kind::router: return "router";
    case actor_kind::kv_store: return "kv_store";
  }
  return "?";
}
std::optional<actor_kind> parse_actor_kind(std::string_view s) {
  return parse_by_name(s,
                       std::array{actor_kind::prefill, actor_kind::decode, actor_kind::colocated, actor_kind::kv_link,
                                  actor_kind::request, actor_kind::router, actor_kind::kv_store});
}

std::string actor_name::str() const {
  std::string s(to_string(kind));
  switch (kind) {
    case actor_kind::router:
    case actor_kind::kv_store: return s;
    case actor_kind::kv_link:
      s += "-p";
      s += std::to_string(index);
      s += "-d";
      s += std::to_string(decode);
      return s;
    case actor_kind::prefill:
    case actor_kind::decode:
    case actor_kind::colocated:
    case actor_kind::request:
      s += '-';
      s += std::to_string(index);
      return s;
  }
  return s;
}

actor_name worker_name(worker_kind k, int32_t index) { return {actor_kind_of(k), index, -1}; }
actor_name link_name(int32_t prefill, int32_t decode) { return {actor_kind::kv_link, prefill, decode}; }
actor_name request_name(request_id id) { return {actor_kind::request, int64_t(id), -1}; }

std::optional<actor_name> parse_actor_name(std::string_view s) {
  const auto dash = s.find('-');
  const auto kind = parse_actor_kind(s.substr(0, dash));
  if (!kind) return std::nullopt;
  if (*kind == actor_kind::router || *kind == actor_kind::kv_store) {
    if (dash != std::string_view::npos) return std::nullopt;
    return actor_name{*kind, -1, -1};
  }
  if (dash == std::string_view::npos) return std::nullopt;
  const std::string_view rest = s.substr(dash + 1);
  int64_t a = 0, b = 0;
  if (*kind == actor_kind::kv_link) {
    const auto d = rest.find("-d");
    if (rest.size() < 2 || rest[0] != 'p' || d == std::string_view::npos) return std::nullopt;
    if (!parse_number(rest.substr(1, d - 1), a) || !parse_number(rest.substr(d + 2), b)) return std::nullopt;
    if (a > INT32_MAX || b > INT32_MAX) return std::nullopt;
    return actor_name{*kind, a, int32_t(b)};
  }
  if (!parse_number(rest, a)) return std::nullopt;
  if (*kind != actor_kind::request && a > INT32_MAX) return std::nullopt;
  return actor_name{*kind, a, -1};
}

}  // namespace tandem
