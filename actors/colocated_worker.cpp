#include "actors/colocated_worker.h"

namespace tandem {

using namespace worker_actor;
using self_ptr = prefill_worker_actor::stateful_pointer<colocated_worker_state>;

prefill_worker_actor::behavior_type colocated_worker_behavior(self_ptr self, std::shared_ptr<const model> m,
                                                              worker_options opts, router_actor router) {
  init_worker(self->state, worker_kind::colocated, std::move(m), std::move(opts), std::move(router));
  return {
      [self](prefill_atom, request_spec& spec, request_actor& req) {
        const request_id id = spec.id;
        self->state.requests.insert_or_assign(id, std::move(req));
        on_event(self, wk::ev::prompt{std::move(spec)});
        if (!self->state.core->find(id)) {  // refused (more KV than the worker has)
          self->state.requests.erase(id);
          return;
        }
        kick(self);
        report_load(self);
      },
      [](ship_atom, request_id, kv_link_actor&) {},  // colocated: the KV never leaves
      [](release_atom, request_id) {},
      [](release_atom, request_id, uint32_t) {},  // no leases: its KV never leaves it
      [](down_atom, kv_link_actor&) {},
      [self](cancel_atom, request_id id) {
        on_event(self, wk::ev::cancel{id});
        kick(self);
        report_load(self);
      },
      [self](pause_atom, request_id id, bool pause) {
        on_event(self, wk::ev::pause{id, pause});
        kick(self);
      },
      step_handler(self),
      [self](stats_atom) {
        auto& st = self->state;
        return st.we->stats(st.opts, &st.core->ledger(), st.core->holding());
      },
  };
}

}  // namespace tandem
