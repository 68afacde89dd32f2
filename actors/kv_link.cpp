#include "actors/kv_link.h"

#include "actors/error.h"

#include "transport/local/local_transport.h"
#include "transport/shm/shm_transport.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
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

uint64_t payload_bytes(const std::vector<kv_block_export>& kv) {
  uint64_t bytes = 0;
  for (const auto& b : kv) bytes += b.payload.size() * sizeof(float);
  return bytes;
}

// Bytes moved for a request, taking `ms`: told to its actor (its timings) and counted.
void account_moved(kv_link_actor::stateful_pointer<kv_link_state> self, const request_actor& req, uint64_t bytes,
                   double ms) {
  auto& st = self->state;
  st.bytes += bytes;
  self->send(req, kv_atom::value, bytes, ms);
  if (st.opts.metrics)
    st.opts.metrics->get_counter("tandem_kv_link_bytes_total", "Bytes of KV moved by a link", {{"link", st.label}})
        .inc(double(bytes));
}

// One more transfer handed to the decode worker.
void count_transfer(kv_link_actor::stateful_pointer<kv_link_state> self) {
  auto& st = self->state;
  ++st.transfers;
  if (st.opts.metrics)
    st.opts.metrics->get_counter("tandem_kv_link_transfers_total", "KV transfers by a link", {{"link", st.label}})
        .inc();
}

// Moves blocks through the link's transport (or hands them over) and accounts for them.
// The blocks as they land on the decode side; null (with why in `err`) when the transport failed.
kv_blocks_ptr move(kv_link_actor::stateful_pointer<kv_link_state> self, const request_actor& req,
                   const kv_blocks_ptr& kv, status& err) {
  auto& st = self->state;
  if (kv->empty()) return kv;  // the closing transfer of a streamed prefill
  const auto t0 = steady::now();
  const uint64_t bytes = payload_bytes(*kv);
  kv_blocks_ptr landed = kv;
  if (st.opts.transport != kv_transport_kind::handoff) {
    landed = move_through(*st.transport, *kv, err);
    if (!landed) {
      if (err.ok())
        err = {errc::io_error, "the " + std::string(to_string(st.opts.transport)) + " transport lost the KV blocks"};
      return nullptr;
    }
  }
  landed = st.opts.faults->land(std::move(landed));  // (a copy: a handed-over set is still the prefill side's)
  account_moved(self, req, bytes, std::chrono::duration<double, std::milli>(steady::now() - t0).count());
  return landed;
}

// "channel": sends blocks to the decode process's receiver, which stages them at its decode
// worker before acknowledging. Not waited for here (frames pipeline); settle_all() waits.
void send_frame(kv_link_actor::stateful_pointer<kv_link_state> self, const request_actor& req, request_id id,
                uint32_t epoch, kv_blocks_ptr kv) {
  auto& st = self->state;
  // (A damaged block is refused by the receiver's checksum check.)
  kv = st.opts.faults->land(std::move(kv));
  auto frame = std::make_shared<transport::kv_frame>();
  frame->target = st.opts.target;
  frame->request = id;
  frame->epoch = epoch;
  frame->blocks = kv;
  const uint64_t bytes = payload_bytes(*kv);
  st.unacked.push_back({st.sender->submit(std::move(frame)), id, req, bytes, steady::now()});
}

// Accounts for one acknowledged (or failed) frame; false if it failed.
bool settle_frame(kv_link_actor::stateful_pointer<kv_link_state> self, const kv_link_state::unacked_frame& f,
                  const transport::transfer_status& ts) {
  auto& st = self->state;
  if (ts.state != transport::transfer_state::done) {
    spdlog::warn("{}: a frame failed: {}", st.label, ts.error.to_string());
    if (st.opts.metrics)
      st.opts.metrics
          ->get_counter("tandem_kv_link_failed_frames_total", "KV frames a link could not deliver",
                        {{"link", st.label}})
          .inc();
    return false;
  }
  account_moved(self, f.req, f.bytes, std::chrono::duration<double, std::milli>(steady::now() - f.sent).count());
  return true;
}

// Forgets frames already acknowledged (without waiting), so a long stream holds few sets.
void reap_frames(kv_link_actor::stateful_pointer<kv_link_state> self) {
  auto& st = self->state;
  std::vector<kv_link_state::unacked_frame> left;
  for (auto& f : st.unacked) {
    auto ts = st.sender->poll(f.id);
    if (ts.state == transport::transfer_state::pending) left.push_back(std::move(f));
    else if (!settle_frame(self, f, ts)) st.failed_frames.insert(f.request);  // shows at its closing transfer
  }
  st.unacked = std::move(left);
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

// "channel": closing transfers whose frames have all settled go on to the decode worker (or
// fail back to the prefill side's lease if one of them failed). Never blocks: the sender tells
// the link (tick) when a frame settles, so a link waiting for acknowledgements still answers
// heartbeats, releases and other requests' pieces.
void settle_closing(kv_link_actor::stateful_pointer<kv_link_state> self) {
  auto& st = self->state;
  reap_frames(self);
  for (auto it = st.closing.begin(); it != st.closing.end();) {
    const request_id id = it->spec.id;
    if (std::any_of(st.unacked.begin(), st.unacked.end(), [&](const auto& f) { return f.request == id; })) {
      ++it;
      continue;
    }
    auto c = std::move(*it);
    it = st.closing.erase(it);
    --st.in_flight;
    if (st.failed_frames.erase(id) != 0) {
      c.promise.deliver(
          to_caf_error({errc::io_error, "a KV frame of request " + std::to_string(id) + " was not acknowledged"}));
    } else {
      count_transfer(self);
      forward(self, std::move(c.spec), std::move(c.req), std::make_shared<const std::vector<kv_block_export>>(),
              std::move(c.generated), c.promise);
    }
  }
  if (st.in_flight == 0 && st.retiring) self->quit();
}

// Fault injection: the link blocks (and the thread it runs on), answering nothing meanwhile.
void maybe_stall(kv_link_actor::stateful_pointer<kv_link_state> self) {
  const auto d = self->state.opts.faults->block_link();
  for (auto until = steady::now() + d; steady::now() < until;)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
}

}  // namespace

kv_link_actor::behavior_type kv_link_behavior(kv_link_actor::stateful_pointer<kv_link_state> self,
                                              decode_worker_actor decode, kv_link_options opts) {
  self->state.opts = std::move(opts);
  if (!self->state.opts.faults) self->state.opts.faults = no_faults();  // (null given: none)
  self->state.label = self->state.opts.name.str();
  self->state.decode = std::move(decode);
  const bool channel = self->state.opts.transport == kv_transport_kind::channel;
  switch (self->state.opts.transport) {
    case kv_transport_kind::channel: {
      self->state.sender = std::make_unique<transport::kv_sender>(
          transport::sender_options{self->state.opts.kv_address, self->state.opts.channel_mode});
      // One tick in the mailbox at a time, however many frames settle meanwhile. Weak: a frame
      // settling as the link ends must not keep it alive (nor end it on the sender's thread).
      auto ticking = std::make_shared<std::atomic<bool>>(false);
      self->state.ticking = ticking;
      self->state.sender->on_settled([me = self->address(), ticking] {
        if (ticking->exchange(true)) return;
        if (auto a = caf::actor_cast<caf::actor>(me)) caf::anon_send(a, tick_atom::value);
      });
      self->state.sender->connect();  // before the first request needs it (ring set-up: ~10 ms)
      break;
    }
    case kv_transport_kind::shm: self->state.transport = std::make_unique<transport::shm_transport>(); break;
    case kv_transport_kind::local:
    case kv_transport_kind::handoff: self->state.transport = std::make_unique<transport::local_transport>(); break;
  }
  return {
      [self, channel](transfer_atom, request_spec& spec, request_actor& req, kv_blocks_ptr& kv,
                      std::vector<token_id>& generated) -> caf::result<bool> {
        auto& st = self->state;
        if (!kv) return to_caf_error({errc::invalid_argument, "a transfer without its KV"});
        maybe_stall(self);
        if (channel) {
          // The set (or, after a streamed prefill, its last blocks) goes as one more frame; once
          // every frame is acknowledged it is staged at the decode worker, and the closing
          // arrive (an empty set) completes it there.
          if (!kv->empty() && !st.opts.faults->lose_piece()) send_frame(self, req, spec.id, spec.epoch, kv);
          auto rp = self->make_response_promise<bool>();
          st.closing.push_back({std::move(spec), std::move(req), std::move(generated), rp});
          ++st.in_flight;
          settle_closing(self);
          return rp;
        }
        status moved;
        kv_blocks_ptr landed = move(self, req, kv, moved);
        if (!landed) return to_caf_error(moved);
        count_transfer(self);
        auto rp = self->make_response_promise<bool>();
        if (const auto held = st.opts.faults->hold_back(); held.count() > 0) {  // held back, then delivered
          const uint64_t key = st.next_held++;
          st.held[key] = {std::move(spec), std::move(req), std::move(landed), std::move(generated), rp};
          ++st.in_flight;
          self->delayed_send(self, held, resume_atom::value, key);
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
      [self, channel](kv_piece_atom, request_id id, uint32_t epoch, request_actor& req, kv_blocks_ptr& kv) {
        if (!kv) return;
        if (self->state.opts.faults->lose_piece()) return;  // lost in flight: the set is incomplete at arrival
        // A piece that fails to move is simply not staged: the decode side then finds the set
        // incomplete at arrival and refuses it, so nothing decodes on partial KV.
        maybe_stall(self);
        if (channel) {
          reap_frames(self);
          send_frame(self, req, id, epoch, kv);
          if (auto& m = self->state.opts.metrics)
            m->get_counter("tandem_kv_link_pieces_total", "KV pieces streamed by a link while prefill ran",
                           {{"link", self->state.label}})
                .inc();
          return;
        }
        status lost;  // a piece that does not land is found missing at the closing arrive
        if (kv_blocks_ptr landed = move(self, req, kv, lost)) {
          if (const auto held = self->state.opts.faults->hold_back(); held.count() > 0) {
            // It arrives late, possibly after the set was found incomplete (and shipped again whole).
            self->delayed_send(self->state.decode, held, kv_piece_atom::value, id, epoch, std::move(landed));
            return;
          }
          self->send(self->state.decode, kv_piece_atom::value, id, epoch, std::move(landed));
          if (auto& m = self->state.opts.metrics)
            m->get_counter("tandem_kv_link_pieces_total", "KV pieces streamed by a link while prefill ran",
                           {{"link", self->state.label}})
                .inc();
        }
      },
      [self](tick_atom) {
        if (self->state.ticking) self->state.ticking->store(false);
        if (self->state.sender) settle_closing(self);
      },
      [self](release_atom) {
        self->state.retiring = true;
        if (self->state.in_flight == 0) self->quit();
      },
  };
}

}  // namespace tandem
