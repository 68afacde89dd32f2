#include "actors/kv_link.h"

#include "transport/local/local_transport.h"
#include "transport/shm/shm_transport.h"

#include <thread>

namespace tandem {
namespace {

// Copies the blocks through the transport into landing buffers: the path every transport
// (shared memory, TCP) takes, with the same registration, batch and completion steps.
kv_blocks_ptr move_through(transport::kv_transport& t, const std::vector<kv_block_export>& src, status& err) {
  auto dst = std::make_shared<std::vector<kv_block_export>>();
  dst->reserve(src.size());
  std::vector<transport::copy_op> ops;
  std::vector<transport::region_id> regions;
  for (const auto& b : src) {
    kv_block_export landed = b.without_payload();
    landed.payload.resize(b.payload.size());  // the landing buffer
    dst->push_back(std::move(landed));
  }
  for (size_t i = 0; i < src.size(); ++i) {
    const size_t bytes = src[i].payload.size() * sizeof(float);
    const auto from = t.register_memory(const_cast<float*>(src[i].payload.data()), bytes);
    const auto to = t.register_memory((*dst)[i].payload.data(), bytes);
    regions.push_back(from);
    regions.push_back(to);
    ops.push_back({from, 0, to, 0, bytes});
  }
  const auto id = t.submit(std::move(ops));
  transport::transfer_status ts;
  do {
    ts = t.poll(id);
  } while (ts.state == transport::transfer_state::pending);
  for (auto r : regions) (void)t.unregister_memory(r);
  if (ts.state == transport::transfer_state::failed) {
    err = ts.error;
    return nullptr;
  }
  return dst;
}

// Moves blocks through the link's transport (or hands them over) and accounts for them.
kv_blocks_ptr move(kv_link_actor::stateful_pointer<kv_link_state> self, const request_actor& req,
                   const kv_blocks_ptr& kv) {
  auto& st = self->state;
  if (kv->empty()) return kv;  // the closing transfer of a streamed prefill
  const auto t0 = steady::now();
  uint64_t bytes = 0;
  for (const auto& b : *kv) bytes += b.payload.size() * sizeof(float);
  kv_blocks_ptr landed = kv;
  if (st.opts.transport != "handoff") {
    status err;
    landed = move_through(*st.transport, *kv, err);
    if (!landed) return nullptr;
  }
  if (st.opts.faults && st.opts.faults->take(fault_kind::corrupt_kv)) {
    // Fault injection: one value changes in flight. A handed-over set is the prefill side's
    // own (its lease), so the damage goes to a copy.
    auto damaged = std::make_shared<std::vector<kv_block_export>>(*landed);
    for (auto& b : *damaged)
      if (!b.payload.empty()) {
        b.payload[b.payload.size() / 2] += 1.0f;
        break;
      }
    landed = std::move(damaged);
  }
  const double ms = std::chrono::duration<double, std::milli>(steady::now() - t0).count();
  st.bytes += bytes;
  self->send(req, kv_atom::value, bytes, ms);
  if (st.opts.metrics)
    st.opts.metrics->get_counter("tandem_kv_link_bytes_total", "Bytes of KV moved by a link", {{"link", st.opts.name}})
        .inc(double(bytes));
  return landed;
}

// Hands landed blocks to the decode worker; its answer (complete, checksummed, imported) goes
// back to the prefill side, whose lease ends on `true`.
void forward(kv_link_actor::stateful_pointer<kv_link_state> self, request_spec spec, request_actor req,
             kv_blocks_ptr landed, std::vector<token_id> generated, caf::typed_response_promise<bool> rp) {
  auto& st = self->state;
  ++st.in_flight;
  auto settle = [self] {
    if (--self->state.in_flight == 0 && self->state.retiring) self->quit();
  };
  self->request(st.decode, std::chrono::seconds(60), arrive_atom::value, std::move(spec), std::move(req),
                std::move(landed), std::move(generated))
      .then(
          [rp, settle](bool ok) mutable {
            rp.deliver(ok);
            settle();
          },
          [rp, settle](caf::error& e) mutable {
            rp.deliver(std::move(e));
            settle();
          });
}

// Fault injection: the link blocks (its thread too), answering nothing meanwhile.
void maybe_stall(kv_link_actor::stateful_pointer<kv_link_state> self) {
  auto& f = self->state.opts.faults;
  if (!f || !f->take(fault_kind::stall_link)) return;
  for (auto until = steady::now() + f->stall_duration(); steady::now() < until;)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
}

}  // namespace

kv_link_actor::behavior_type kv_link_behavior(kv_link_actor::stateful_pointer<kv_link_state> self,
                                              decode_worker_actor decode, kv_link_options opts) {
  self->state.opts = std::move(opts);
  self->state.decode = std::move(decode);
  if (self->state.opts.transport == "shm") self->state.transport = std::make_unique<transport::shm_transport>();
  else self->state.transport = std::make_unique<transport::local_transport>();
  return {
      [self](transfer_atom, request_spec& spec, request_actor& req, kv_blocks_ptr& kv,
             std::vector<token_id>& generated) -> caf::result<bool> {
        auto& st = self->state;
        if (!kv) return false;
        maybe_stall(self);
        kv_blocks_ptr landed = move(self, req, kv);
        if (!landed) return false;
        ++st.transfers;
        if (st.opts.metrics)
          st.opts.metrics->get_counter("tandem_kv_link_transfers_total", "KV transfers by a link", {{"link", st.opts.name}})
              .inc();
        auto rp = self->make_response_promise<bool>();
        if (st.opts.faults && st.opts.faults->take(fault_kind::delay_kv)) {  // held back, then delivered
          const uint64_t key = st.next_held++;
          st.held[key] = {std::move(spec), std::move(req), std::move(landed), std::move(generated), rp};
          ++st.in_flight;
          self->delayed_send(self, st.opts.faults->stall_duration(), resume_atom::value, key);
          return rp;
        }
        forward(self, std::move(spec), std::move(req), std::move(landed), std::move(generated), rp);
        return rp;
      },
      [self](resume_atom, uint64_t key) {
        auto& st = self->state;
        auto it = st.held.find(key);
        if (it == st.held.end()) return;
        auto h = std::move(it->second);
        st.held.erase(it);
        --st.in_flight;
        forward(self, std::move(h.spec), std::move(h.req), std::move(h.kv), std::move(h.generated), h.promise);
      },
      [](heartbeat_atom) { return true; },
      [self](kv_piece_atom, request_id id, uint32_t epoch, request_actor& req, kv_blocks_ptr& kv) {
        if (!kv) return;
        if (self->state.opts.faults && self->state.opts.faults->take(fault_kind::drop_kv)) {
          return;  // lost in flight: the set is incomplete at arrival
        }
        // A piece that fails to move is simply not staged: the decode side then finds the set
        // incomplete at arrival and refuses it, so nothing decodes on partial KV.
        maybe_stall(self);
        if (kv_blocks_ptr landed = move(self, req, kv)) {
          if (self->state.opts.faults && self->state.opts.faults->take(fault_kind::delay_kv)) {
            // It arrives late, possibly after the set was found incomplete (and shipped again whole).
            self->delayed_send(self->state.decode, self->state.opts.faults->stall_duration(), kv_piece_atom::value, id,
                               epoch, std::move(landed));
            return;
          }
          self->send(self->state.decode, kv_piece_atom::value, id, epoch, std::move(landed));
          if (auto& m = self->state.opts.metrics)
            m->get_counter("tandem_kv_link_pieces_total", "KV pieces streamed by a link while prefill ran",
                           {{"link", self->state.opts.name}})
                .inc();
        }
      },
      [self](release_atom) {
        self->state.retiring = true;
        if (self->state.in_flight == 0) self->quit();
      },
  };
}

}  // namespace tandem
