#include "actors/wire.h"

#include "actors/cluster.h"
#include "actors/protocol.h"

namespace tandem {

void register_wire_types(caf::actor_system_config& cfg) {
  // Message elements (top level) that cross processes; nested types travel inside them.
  // add_message_type<T> also adds std::vector<T> under "std::vector<NAME>".
  cfg.add_message_type<request_spec>("tandem::request_spec");
  cfg.add_message_type<token_logprobs>("tandem::token_logprobs");
  cfg.add_message_type<prefill_worker_load>("tandem::prefill_worker_load");
  cfg.add_message_type<decode_worker_load>("tandem::decode_worker_load");
  cfg.add_message_type<worker_stats>("tandem::worker_stats");
  cfg.add_message_type<kv_blocks_ptr>("tandem::kv_blocks");
  cfg.add_message_type<request_state>("tandem::request_state");
  cfg.add_message_type<finish_reason>("tandem::finish_reason");
  cfg.add_message_type<errc>("tandem::errc");
  cfg.add_message_type<std::vector<token_id>>("std::vector<int32_t>");
  cfg.add_message_type<std::vector<uint64_t>>("std::vector<uint64_t>");
  cfg.add_message_type<node_hello>("tandem::node_hello");
  cfg.add_message_type<node_welcome>("tandem::node_welcome");
  // Handles.
  cfg.add_message_type<request_actor>("tandem::request_actor");
  cfg.add_message_type<subscriber_actor>("tandem::subscriber_actor");
  cfg.add_message_type<prefill_worker_actor>("tandem::prefill_worker_actor");
  cfg.add_message_type<decode_worker_actor>("tandem::decode_worker_actor");
  cfg.add_message_type<kv_link_actor>("tandem::kv_link_actor");
  cfg.add_message_type<router_actor>("tandem::router_actor");
  cfg.add_message_type<cluster_actor>("tandem::cluster_actor");
  cfg.add_message_type<node_actor>("tandem::node_actor");
}

}  // namespace tandem
