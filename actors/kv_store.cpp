#include "actors/kv_store.h"

#include "actors/supervisor.h"

namespace tandem {
namespace {

using self_ptr = kv_store_actor::stateful_pointer<kv_store_state>;

void export_metrics(self_ptr self) {
  auto& st = self->state;
  if (!st.metrics) return;
  auto& m = *st.metrics;
  const kv_store_stats now = st.store->stats();
  for (auto [tier, bytes, blocks] : {std::tuple{"memory", now.memory_bytes, now.memory_blocks},
                                     std::tuple{"disk", now.disk_bytes, now.disk_blocks}}) {
    m.get_gauge("tandem_kv_store_bytes", "Bytes of KV blocks the host KV store holds, per tier", {{"tier", tier}})
        .set(double(bytes));
    m.get_gauge("tandem_kv_store_blocks", "KV blocks the host KV store holds, per tier", {{"tier", tier}})
        .set(double(blocks));
  }
  const std::string help = "KV store block events: published, fetched, spilled to disk, evicted, corrupted (dropped)";
  auto add = [&](const char* event, uint64_t now_v, uint64_t before) {
    m.get_counter("tandem_kv_store_blocks_total", help, {{"event", event}}).inc(double(now_v - before));
  };
  add("published", now.published, st.reported.published);
  add("fetched", now.fetched, st.reported.fetched);
  add("spilled", now.spilled, st.reported.spilled);
  add("evicted", now.evicted, st.reported.evicted);
  add("corrupted", now.corrupted, st.reported.corrupted);
  st.reported = now;
}

}  // namespace

kv_store_actor::behavior_type kv_store_behavior(self_ptr self, kv_store_options opts,
                                                std::shared_ptr<metrics::registry> metrics) {
  self->state.store = std::make_unique<kv_block_store>(std::move(opts));
  self->state.metrics = std::move(metrics);
  export_metrics(self);
  return {
      [self](publish_atom, const std::vector<uint64_t>& keys, const kv_blocks_ptr& blocks) {
        if (!blocks || blocks->size() != keys.size()) return;  // malformed: nothing is filed
        self->state.store->put(keys, *blocks);
        export_metrics(self);
      },
      [self](lookup_atom, const std::vector<uint64_t>& keys) { return self->state.store->count(keys); },
      [self](fetch_atom, const std::vector<uint64_t>& keys) -> kv_blocks_ptr {
        auto out = std::make_shared<const std::vector<kv_block_export>>(self->state.store->get(keys));
        export_metrics(self);
        return out;
      },
  };
}

caf::actor spawn_kv_store_pool(caf::actor_system& sys, const kv_store_options& opts,
                               std::shared_ptr<kv_store_directory> dir, pool_options pool) {
  pool.kind = actor_kind::kv_store;
  pool.size = 1;
  auto metrics = pool.metrics;
  return sys.spawn(pool_supervisor, std::move(pool), [dir, opts, metrics](caf::event_based_actor* self, int32_t) {
    auto s = self->spawn<caf::monitored>(kv_store_behavior, opts, metrics);
    dir->set(s);
    return caf::actor_cast<caf::actor>(s);
  });
}

}  // namespace tandem
