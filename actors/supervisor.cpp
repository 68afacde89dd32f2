#include "actors/supervisor.h"

#include "actors/error.h"
#include "runtime/oplog.h"

namespace tandem {
namespace {

using self_ptr = caf::stateful_actor<pool_supervisor_state>*;

std::string child_name(const pool_options& o, int32_t i) {
  return o.kind == actor_kind::kv_store ? std::string("kv_store") : std::string(to_string(o.kind)) + "-" + std::to_string(i);
}


void set_degraded(self_ptr self, bool on) {
  auto& o = self->state.opts;
  if (!o.metrics) return;
  o.metrics->get_gauge("tandem_pool_degraded", "1 when a pool exceeded its restart intensity", {{"pool", std::string(to_string(o.kind))}})
      .set(on ? 1 : 0);
}

}  // namespace

caf::behavior pool_supervisor(self_ptr self, pool_options opts, worker_spawner spawn) {
  auto& st = self->state;
  st.opts = std::move(opts);
  st.spawn = std::move(spawn);
  st.intensity = restart_intensity({st.opts.max_restarts, st.opts.window, st.opts.recover_after, st.opts.recover_after_max});
  set_degraded(self, false);  // the series exists (0) from the start, for dashboards and alerts
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
          oplog::event(oplog::level::warn, "restart", {{"actor", child_name(st.opts, i)}, {"reason", exit_reason_text(dm.reason)}});
          c = st.spawn(self, i);
          return;
        case restart_intensity::verdict::degrade:
          oplog::event(oplog::level::error, "pool_degraded",
                       {{"pool", std::string(to_string(st.opts.kind))},
                        {"actor", child_name(st.opts, i)},
                        {"reason", exit_reason_text(dm.reason)},
                        {"max_restarts", st.opts.max_restarts},
                        {"window_s", double(st.opts.window.count()) / 1000},
                        {"recover_in_s", double(st.intensity.backoff().count()) / 1000}});
          set_degraded(self, true);
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
        oplog::event(oplog::level::info, "pool_recovered",
                     {{"pool", std::string(to_string(st.opts.kind))},
                      {"degraded_s", std::chrono::duration<double>(std::chrono::steady_clock::now() - st.intensity.degraded_since()).count()}});
        for (auto& [i, c] : *st.children)
          if (!c) c = st.spawn(self, i);
        set_degraded(self, false);
        if (st.opts.metrics)
          st.opts.metrics
              ->get_counter("tandem_pool_recoveries_total", "Times a degraded pool started its workers again after its backoff",
                            {{"pool", std::string(to_string(st.opts.kind))}})
              .inc();
      },
  };
}

}  // namespace tandem
