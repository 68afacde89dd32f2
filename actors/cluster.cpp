#include "actors/cluster.h"

#include "runtime/oplog.h"

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "actors/error.h"

namespace tandem {
namespace {

using self_ptr = cluster_actor::stateful_pointer<cluster_state>;
using json = nlohmann::json;

caf::error refuse(self_ptr self, const std::string& why) {
  ++self->state.refusals;
  if (auto& m = self->state.opts.metrics)
    m->get_counter("tandem_cluster_refusals_total", "Nodes refused at join time (version, model, settings)").inc();
  spdlog::warn("cluster: refused a node: {}", why);
  return to_caf_error({errc::unsupported, why});
}

void update_gauges(self_ptr self) {
  auto& m = self->state.opts.metrics;
  if (!m) return;
  for (node_role r : {node_role::prefill, node_role::decode}) {
    const auto& ms = self->state.members;
    const auto count = std::count_if(ms.begin(), ms.end(), [r](const auto& m) { return m.second.role == r; });
    m->get_gauge("tandem_cluster_nodes", "Worker processes joined to this router",
                 {{"role", std::string(to_string(r))}})
        .set(double(count));
  }
}

// Why a member is let go.
enum class loss : uint8_t { disconnected, heartbeat, router_restarted };
std::string_view to_string(loss l) {
  switch (l) {
    case loss::disconnected: return "disconnected";
    case loss::heartbeat: return "heartbeat";
    case loss::router_restarted: return "router_restarted";
  }
  return "?";
}

// A member is gone (its connection closed, or its heartbeats stopped): its workers are dead to
// the router, which recovers their requests as for any worker that died. The node is told (if
// it can still hear): it stops those workers and may join again as a new member.
void lose(self_ptr self, uint64_t id, loss reason) {
  auto& st = self->state;
  auto it = st.members.find(id);
  if (it == st.members.end()) return;
  auto n = std::move(it->second);
  st.members.erase(it);
  ++st.losses;
  oplog::event(oplog::level::warn, "node_lost",
               {{"node", int64_t(n.id)},
                {"role", std::string(to_string(n.role))},
                {"name", n.name},
                {"reason", std::string(to_string(reason))},
                {"workers", json(n.indices).dump()},
                {"member_s", std::chrono::duration<double>(steady::now() - n.joined).count()}});
  if (auto& m = st.opts.metrics)
    m->get_counter("tandem_cluster_losses_total", "Worker processes lost", {{"reason", std::string(to_string(reason))}})
        .inc();
  self->demonitor(n.agent.address());
  self->send(n.agent, lost_atom::value, n.id);
  if (auto router = st.opts.routers ? st.opts.routers->get() : router_actor{})
    for (int32_t index : n.indices) self->send(router, down_atom::value, index, n.role == node_role::prefill);
  update_gauges(self);
}

// The member whose workers of that role include global index `index`.
const cluster_state::member* member_of(self_ptr self, node_role role, int32_t index) {
  for (const auto& [id, n] : self->state.members)
    if (n.role == role && std::find(n.indices.begin(), n.indices.end(), index) != n.indices.end()) return &n;
  return nullptr;
}

}  // namespace

cluster_actor::behavior_type cluster_behavior(self_ptr self, cluster_options opts) {
  auto& st = self->state;
  st.opts = std::move(opts);
  st.next_prefill = st.opts.first_prefill_index;
  st.next_decode = st.opts.first_decode_index;
  self->set_down_handler([self](caf::down_msg& dm) {
    for (const auto& [id, n] : self->state.members)
      if (n.agent.address() == dm.source) return lose(self, id, loss::disconnected);
  });
  self->set_error_handler([](caf::error&) {});  // a refused or timed-out ask must not end it
  const auto tick = std::max(std::chrono::milliseconds(20), st.opts.heartbeat_timeout / 4);
  self->delayed_send(self, tick, tick_atom::value);
  update_gauges(self);
  return {
      [self](hello_atom, uint32_t version) -> caf::result<bool> {
        if (version != wire_version)
          return refuse(self, "wire version " + std::to_string(version) + " is not this router's (" +
                                  std::to_string(wire_version) + "): run the same tandem release on every node");
        return true;
      },
      [self](join_atom, node_hello& h, caf::actor& agent) -> caf::result<node_welcome, router_actor> {
        auto& st = self->state;
        if (h.workers < 1 || h.workers > 1024) return refuse(self, "a node must bring 1 to 1024 workers");
        if (h.model_id != st.opts.model_id)
          return refuse(self, "the node serves another model (identity " + std::to_string(h.model_id) +
                                  ", the router's is " + std::to_string(st.opts.model_id) + ")");
        if (h.role == node_role::decode && h.kv_address.empty())
          return refuse(self, "a decode node must give its KV address");
        auto router = st.opts.routers ? st.opts.routers->get() : router_actor{};
        if (!router) return refuse(self, "the router is not running");
        if (router != st.router) {  // (members of an earlier router are let go at the next tick)
          if (!st.members.empty()) return refuse(self, "the router is restarting; join again in a moment");
          st.router = router;
        }
        cluster_state::member n;
        n.role = h.role;
        n.name = std::move(h.name);
        n.host = std::move(h.host);
        n.device = std::move(h.device);
        n.kv_address = std::move(h.kv_address);
        n.threads = h.threads;
        n.kv_blocks = h.kv_blocks;
        n.id = st.next_id++;
        n.agent = caf::actor_cast<node_actor>(agent);
        n.joined = n.last_heartbeat = steady::now();
        int32_t& next = n.role == node_role::prefill ? st.next_prefill : st.next_decode;
        for (int32_t i = 0; i < h.workers; ++i) n.indices.push_back(next++);
        node_welcome w{n.id,          n.indices,          st.opts.kv,
                       st.opts.steps, st.opts.kv_channel, std::max<int64_t>(10, st.opts.heartbeat_timeout.count() / 5)};
        self->monitor(agent);
        oplog::event(oplog::level::info, "node_joined",
                     {{"node", int64_t(n.id)},
                      {"role", std::string(to_string(n.role))},
                      {"name", n.name},
                      {"device", n.device},
                      {"workers", json(n.indices).dump()}});
        ++st.joins;
        if (auto& m = st.opts.metrics) m->get_counter("tandem_cluster_joins_total", "Worker processes joined").inc();
        st.members.emplace(n.id, std::move(n));
        update_gauges(self);
        return {std::move(w), router};
      },
      [self](heartbeat_atom, uint64_t id) {
        auto it = self->state.members.find(id);
        if (it == self->state.members.end()) return false;
        it->second.last_heartbeat = steady::now();
        return true;
      },
      [self](link_atom, int32_t p, int32_t d, decode_worker_actor& decode) -> caf::result<kv_link_actor> {
        const auto* from = member_of(self, node_role::prefill, p);
        const auto* to = member_of(self, node_role::decode, d);
        if (!from) return to_caf_error({errc::worker_failed, "prefill worker " + std::to_string(p) + " is on no node"});
        if (!to) return to_caf_error({errc::worker_failed, "decode worker " + std::to_string(d) + " is on no node"});
        auto rp = self->make_response_promise<kv_link_actor>();
        self->request(from->agent, std::chrono::seconds(5), link_atom::value, p, d, std::move(decode), to->kv_address)
            .then([rp](kv_link_actor& l) mutable { rp.deliver(std::move(l)); },
                  [rp](caf::error& e) mutable { rp.deliver(std::move(e)); });
        return rp;
      },
      [self](nodes_atom) {
        json out = json::array();
        const auto now = steady::now();
        for (const auto& [id, n] : self->state.members)
          out.push_back({{"id", n.id},
                         {"role", std::string(to_string(n.role))},
                         {"name", n.name},
                         {"device", n.device},
                         {"workers", n.indices},
                         {"threads", n.threads},
                         {"kv_blocks", n.kv_blocks},
                         {"kv_address", n.kv_address},
                         {"since_heartbeat_ms",
                          std::chrono::duration_cast<std::chrono::milliseconds>(now - n.last_heartbeat).count()},
                         {"up_s", std::chrono::duration<double>(now - n.joined).count()}});
        return out.dump();
      },
      [self](tick_atom) {
        auto& st = self->state;
        const auto now = steady::now();
        std::vector<uint64_t> silent;
        for (const auto& [id, n] : st.members)
          if (now - n.last_heartbeat > st.opts.heartbeat_timeout) silent.push_back(id);
        for (auto id : silent) lose(self, id, loss::heartbeat);
        // The root restarted the router: its workers elsewhere still report to the dead one.
        // Their nodes join the new one afresh (as rest_for_one restarts the pools in one
        // process); the request actors rejoin it by themselves.
        const auto current = st.opts.routers ? st.opts.routers->get() : router_actor{};
        if (current != st.router) {
          std::vector<uint64_t> all;
          for (const auto& [id, n] : st.members) all.push_back(id);
          for (auto id : all) lose(self, id, loss::router_restarted);
          st.router = current;
        }
        self->delayed_send(self, std::max(std::chrono::milliseconds(20), st.opts.heartbeat_timeout / 4),
                           tick_atom::value);
      },
  };
}

}  // namespace tandem
