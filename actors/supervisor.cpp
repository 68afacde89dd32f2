#include "actors/supervisor.h"

namespace tandem {

caf::behavior pool_supervisor(caf::stateful_actor<pool_supervisor_state>* self, pool_options opts,
                              worker_spawner spawn) {
  auto& st = self->state;
  st.opts = std::move(opts);
  st.spawn = std::move(spawn);
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
      const auto now = std::chrono::steady_clock::now();
      std::erase_if(st.restarts, [&](auto t) { return now - t > st.opts.window; });
      if (int32_t(st.restarts.size()) >= st.opts.max_restarts) {
        st.degraded = true;
        if (st.opts.metrics)
          st.opts.metrics->get_gauge("tandem_pool_degraded", "1 when a pool exceeded its restart intensity",
                                     {{"pool", std::string(to_string(st.opts.kind))}})
              .set(1);
        return;
      }
      st.restarts.push_back(now);
      c = st.spawn(self, i);
      return;
    }
  });
  return {
      [self](degraded_atom) { return self->state.degraded; },
  };
}

}  // namespace tandem
