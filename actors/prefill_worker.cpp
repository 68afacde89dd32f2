#include "actors/prefill_worker.h"

namespace tandem {

using namespace worker_actor;
using self_ptr = prefill_worker_actor::stateful_pointer<prefill_worker_state>;

prefill_worker_actor::behavior_type prefill_worker_behavior(self_ptr self, std::shared_ptr<const model> m,
                                                            worker_options opts, router_actor router) {
  init_worker(self->state, worker_kind::prefill, std::move(m), std::move(opts), std::move(router));
  return {
      [self](prefill_atom, request_spec& spec, request_actor& req) {
        self->state.requests.insert_or_assign(spec.id, std::move(req));
        on_event(self, wk::ev::prompt{std::move(spec)});
        kick(self);
        report_load(self);
      },
      [self](ship_atom, request_id id, kv_link_actor& link) {
        on_event(self, wk::ev::ship{id, link_id_of(self, link)});
      },
      [self](release_atom, request_id id) {
        on_event(self, wk::ev::release{id, std::nullopt});
        kick(self);
      },
      [self](release_atom, request_id id, uint32_t epoch) {
        on_event(self, wk::ev::release{id, epoch});
        kick(self);
      },
      [self](down_atom, kv_link_actor& link) {
        // A link died: a transfer it had taken will never be answered (its promise died
        // with it), so it fails now rather than at the timeout.
        if (auto it = self->state.link_ids.find(link.address()); it != self->state.link_ids.end())
          on_event(self, wk::ev::link_down{it->second});
      },
      [self](cancel_atom, request_id id) {
        on_event(self, wk::ev::cancel{id});
        kick(self);
        report_load(self);
      },
      [](pause_atom, request_id, bool) {},  // prefill emits one token: nothing to pause
      step_handler(self),
      [self](stats_atom) {
        auto& st = self->state;
        return st.we->stats(st.opts, nullptr, st.core->holding());
      },
  };
}

}  // namespace tandem
