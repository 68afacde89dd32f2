#pragma once
// The kinds a deployment is made of, as enums with one spelling each: flags, JSON, metrics
// labels and logs go through to_string/parse, never through string compares in the code.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "runtime/request_types.h"

namespace tandem {

// How a pipeline serves. disaggregated: a prefill pool and a decode pool joined by KV links; colocated: workers that
// do both (chunked prefill mixed into decode steps); automatic ("auto"): the disaggregated
// pools, with each prompt placed by its uncached length (a short one is computed by the decode
// worker it will decode on, inside that worker's TPOT slack; a long one by the prefill pool) and,
// in one process, the workers sharing the cores.
enum class serving_mode : uint8_t { disaggregated, colocated, automatic };
// Whether the mode has a prefill and a decode pool (disaggregated and auto).
constexpr bool splits_phases(serving_mode m) { return m != serving_mode::colocated; }
std::string_view to_string(serving_mode m);
std::optional<serving_mode> parse_serving_mode(std::string_view s);

// What a worker actor does (and the pool it is in).
enum class worker_kind : uint8_t { prefill, decode, colocated };
std::string_view to_string(worker_kind k);
std::optional<worker_kind> parse_worker_kind(std::string_view s);

// The role of a process that joins a router (`tandem serve --role prefill|decode --join`).
enum class node_role : uint8_t { prefill, decode };
std::string_view to_string(node_role r);
std::optional<node_role> parse_node_role(std::string_view s);
constexpr worker_kind worker_kind_of(node_role r) {
  return r == node_role::prefill ? worker_kind::prefill : worker_kind::decode;
}

// How a KV link moves a request's blocks to its decode worker: handed over without a copy
// (one process), copied through the in-process transport, through a shared-memory arena in
// this process, or over a KV channel to a decode worker in another process.
enum class kv_transport_kind : uint8_t { handoff, local, shm, channel };
std::string_view to_string(kv_transport_kind k);
std::optional<kv_transport_kind> parse_kv_transport_kind(std::string_view s);

// How a KV channel between processes carries frames: shared memory when both ends are on one
// host and TCP otherwise (automatic), or only one of them (shm is refused across hosts).
enum class channel_mode : uint8_t { automatic, tcp, shm };
std::string_view to_string(channel_mode m);  // "auto", "tcp", "shm"
std::optional<channel_mode> parse_channel_mode(std::string_view s);

// What fault injection can kill (pipeline::kill, /admin/kill, `tandem chaos --kill`).
enum class actor_kind : uint8_t { prefill, decode, colocated, kv_link, request, router, kv_store };
std::string_view to_string(actor_kind k);
std::optional<actor_kind> parse_actor_kind(std::string_view s);
constexpr actor_kind actor_kind_of(worker_kind k) {
  switch (k) {
    case worker_kind::prefill: return actor_kind::prefill;
    case worker_kind::decode: return actor_kind::decode;
    case worker_kind::colocated: return actor_kind::colocated;
  }
  return actor_kind::prefill;
}

// One actor, named as kill() returns it, the logs print it and a link's metrics label it:
// "decode-1", "kv_link-p0-d1" (prefill worker 0 to decode worker 1), "request-17", "router",
// "kv_store".
struct actor_name {
  actor_kind kind = actor_kind::router;
  int64_t index = -1;  // the worker or prefill index, the request id; -1: none (router, store)
  int32_t decode = -1;  // kv_link: the decode worker
  std::string str() const;
  bool operator==(const actor_name&) const = default;
};
actor_name worker_name(worker_kind k, int32_t index);
actor_name link_name(int32_t prefill, int32_t decode);
actor_name request_name(request_id id);
// A name as str() writes it; nullopt for anything else (a bare kind has no index: see
// parse_actor_kind).
std::optional<actor_name> parse_actor_name(std::string_view s);

}  // namespace tandem
