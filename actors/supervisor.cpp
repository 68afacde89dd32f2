#include "actors/supervisor.h"

#include "actors/error.h"
#include "runtime/oplog.h"

namespace tandem {
namespace {

using self_ptr = caf::stateful_actor<pool_supervisor_state>*;

std::string child_name(const pool_options& o, int32_t i) {
  return o.kind == actor_kind::kv_store ? std::string("kv_store")
                                        : std::string(to_string(o.kind)) + "-" + std::to_string(i);
}

pool_health health_of(self_ptr self) {
  return {self->state.opts.metrics.get(), std::string(to_string(self->state.opts.kind))};
}

}  // namespace

caf::behavior pool_supervisor(self_ptr self, pool_options opts, worker_spawner spawn) {
  auto& st = self->state;
  st.opts = std::move(opts);
  st.spawn = std::move(spawn);
  st.intensity =
      restart_intensity({st.opts.max_restarts, st.opts.window, st.opts.recover_after, st.opts.recover_after_max});
  health_of(self).set(false);  // the series exists (0) from the start, for dashboards and alerts
  for (int32_t i = 0; i < st.opts.size; ++i) (*st.children)[i] = st.spawn(self, i);
  // The pool's workers do not outlive it (shutdown, or escalation above it).
  self->attach_functor([children = st.children] {
    for (auto& [i, c] : *children)
      if (c) caf::anon_send_exit(c, caf::exit_reason::user_shutdown);
  });
  self->set_down_handler([self](caf::down_msg& dm) {
    auto& st = self->state;
    for (auto& [i, c] : *st.children) {
      if (!c || c.address() != dm.source) continue;
      c = nullptr;
      switch (st.intensity.failed(std::chrono::steady_clock::now())) {
        case restart_intensity::verdict::restart:
          oplog::event(oplog::level::warn, "restart",
                       {{"actor", child_name(st.opts, i)}, {"reason", exit_reason_text(dm.reason)}});
          c = st.spawn(self, i);
          return;
        case restart_intensity::verdict::degrade:
          health_of(self).degraded(child_name(st.opts, i), exit_reason_text(dm.reason), st.opts.max_restarts,
                                   st.opts.window, st.intensity);
          if (st.intensity.backoff().count() > 0) self->delayed_send(self, st.intensity.backoff(), recover_atom::value);
          return;
        case restart_intensity::verdict::ignore:  // degraded already: it stays down until recovery
          return;
      }
      return;
    }
  });
  return {
      [self](degraded_atom) { return self->state.intensity.degraded(); },
      [self](recover_atom) {
        auto& st = self->state;
        if (!st.intensity.degraded()) return;
        st.intensity.recover(std::chrono::steady_clock::now());
        health_of(self).recovered(st.intensity);
        for (auto& [i, c] : *st.children)
          if (!c) c = st.spawn(self, i);
      },
  };
}

void pool_health::set(bool degraded) const {
  if (metrics)
    metrics->get_gauge("tandem_pool_degraded", "1 when a pool exceeded its restart intensity", {{"pool", pool}})
        .set(degraded ? 1 : 0);
}

void pool_health::degraded(const std::string& actor, const std::string& reason, int32_t max_restarts,
                           std::chrono::milliseconds window, const restart_intensity& ri) const {
  oplog::event(oplog::level::error, "pool_degraded",
               {{"pool", pool},
                {"actor", actor},
                {"reason", reason},
                {"max_restarts", max_restarts},
                {"window_s", double(window.count()) / 1000},
                {"recover_in_s", double(ri.backoff().count()) / 1000}});
  set(true);
}

void pool_health::recovered(const restart_intensity& ri) const {
  oplog::event(
      oplog::level::info, "pool_recovered",
      {{"pool", pool},
       {"degraded_s", std::chrono::duration<double>(std::chrono::steady_clock::now() - ri.degraded_since()).count()}});
  set(false);
  if (metrics)
    metrics
        ->get_counter("tandem_pool_recoveries_total",
                      "Times a degraded pool started its workers again after its backoff", {{"pool", pool}})
        .inc();
}

}  // namespace tandem
