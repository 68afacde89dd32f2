#include "actors/decode_worker.h"

namespace tandem {

using namespace worker_actor;
using self_ptr = decode_worker_actor::stateful_pointer<decode_worker_state>;

decode_worker_actor::behavior_type decode_worker_behavior(self_ptr self, std::shared_ptr<const model> m,
                                                          worker_options opts, router_actor router) {
  init_worker(self->state, worker_kind::decode, std::move(m), std::move(opts), std::move(router));
  report_load(self);
  // A request's handle stays while the core holds it (cmd::forget); one refused at once goes.
  auto keep_handle = [self](request_id id, const request_actor& req) {
    self->state.requests.insert_or_assign(id, req);
  };
  auto drop_unheld = [self](request_id id) {
    if (!self->state.core->find(id)) self->state.requests.erase(id);
  };
  return {
      [self](reserve_atom, request_id id, int32_t max_total_tokens) -> caf::result<bool> {
        auto rp = self->make_response_promise<bool>();
        on_event(self, wk::ev::reserve{await_answer(self, rp), id, max_total_tokens});
        return rp;
      },
      [self, keep_handle, drop_unheld](arrive_atom, request_spec& spec, request_actor& req, kv_blocks_ptr& kv,
                                       std::vector<token_id>& generated) -> caf::result<bool> {
        auto rp = self->make_response_promise<bool>();
        const request_id id = spec.id;
        const uint64_t ticket = await_answer(self, rp);
        keep_handle(id, req);
        on_event(self, wk::ev::transfer{ticket, std::move(spec), std::move(kv), std::move(generated)});
        drop_unheld(id);
        kick(self);
        return rp;
      },
      [self, keep_handle, drop_unheld](fetch_atom, request_spec& spec, request_actor& req) -> caf::result<bool> {
        auto rp = self->make_response_promise<bool>();
        const request_id id = spec.id;
        const uint64_t ticket = await_answer(self, rp);
        keep_handle(id, req);
        on_event(self, wk::ev::fetch{ticket, std::move(spec)});
        drop_unheld(id);
        kick(self);
        return rp;
      },
      [self](kv_piece_atom, request_id id, uint32_t epoch, kv_blocks_ptr& kv) {
        on_event(self, wk::ev::kv_piece{id, epoch, std::move(kv)});
      },
      [self](cancel_atom, request_id id) {
        on_event(self, wk::ev::cancel{id});
        kick(self);
      },
      [self](pause_atom, request_id id, bool pause) {
        on_event(self, wk::ev::pause{id, pause});
        kick(self);
      },
      step_handler(self),
      [self](load_atom) { report_load(self); },
      [self](tick_atom) {
        auto& st = self->state;
        st.pace_pending = false;
        kick(self);
        if (!st.we->busy) st.we->eng->set_busy(false);
      },
      [self](stats_atom) {
        auto& st = self->state;
        return st.we->stats(st.opts, &st.core->ledger(), st.core->holding());
      },
  };
}

}  // namespace tandem
