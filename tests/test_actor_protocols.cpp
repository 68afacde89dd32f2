// Actor protocols under CAF's deterministic test coordinator: every message is delivered by
// the test (sched.run()), so the interleavings below are exact, not timing-dependent. Fake
// peers stand in for the real workers and record what they are sent.
#include <gtest/gtest.h>

#include <caf/all.hpp>
#include <caf/scheduler/test_coordinator.hpp>
#include <filesystem>
#include <future>
#include <thread>

#include "actors/kv_link.h"
#include "actors/router.h"
#include "tests/support/eventually.h"
#include "tests/test_models.h"

using namespace tandem;
using testing_support::eventually;

namespace {

struct log_t {
  std::vector<std::string> lines;
  std::vector<caf::response_promise> held;  // arrive() requests not answered yet
  std::vector<uint32_t> prefill_epochs;
  int count(const std::string& prefix) const {
    int n = 0;
    for (const auto& l : lines) n += l.rfind(prefix, 0) == 0;
    return n;
  }
};
using log_ptr = std::shared_ptr<log_t>;

struct fixture : ::testing::Test {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  caf::scheduler::test_coordinator* sched = nullptr;

  void SetUp() override {
    cfg.set("scheduler.policy", caf::atom("testing"));
    cfg.set("logger.verbosity", caf::atom("quiet"));
    sys = std::make_unique<caf::actor_system>(cfg);
    sched = &dynamic_cast<caf::scheduler::test_coordinator&>(sys->scheduler());
  }
  void TearDown() override { sched->run(); }
  void run() { sched->run(); }
};

// Records what it gets; anything else is dropped. (Arguments on every spawn: CAF 0.17
// dereferences a null tuple for argument-less ones.)
caf::behavior recorder(caf::event_based_actor* self, log_ptr log, std::string name) {
  self->set_default_handler([log, name](caf::scheduled_actor*, caf::message_view&) -> caf::result<caf::message> {
    log->lines.push_back(name + ":other");
    return caf::message{};
  });
  return {
      [log, name](kv_atom, uint64_t bytes, double) { log->lines.push_back(name + ":kv " + std::to_string(bytes)); },
      [log, name](const request_event& ev) {
        log->lines.push_back(name + ":event " + std::string(to_string(ev.kind)));
      },
      [log, name](state_atom, request_state s) { log->lines.push_back(name + ":state " + std::string(to_string(s))); },
  };
}

// Stands in for a decode worker: reserves whatever is asked, holds arrive() open until the
// test answers it, records pieces and cancels.
caf::behavior fake_decode(caf::event_based_actor* self, log_ptr log) {
  self->set_default_handler(caf::drop);
  return {
      [log](reserve_atom, request_id id, int32_t) {
        log->lines.push_back("decode:reserve " + std::to_string(id));
        return true;
      },
      [self, log](arrive_atom, request_spec& spec, request_actor&, kv_blocks_ptr&, std::vector<token_id>&) {
        log->lines.push_back("decode:arrive " + std::to_string(spec.id));
        auto rp = self->make_response_promise();
        log->held.push_back(rp);
        return rp;
      },
      [log](kv_piece_atom, request_id id, uint32_t epoch, kv_blocks_ptr&) {
        log->lines.push_back("decode:piece " + std::to_string(id) + "@" + std::to_string(epoch));
      },
      [log](cancel_atom, request_id id) { log->lines.push_back("decode:cancel " + std::to_string(id)); },
      [log](load_atom) { log->lines.push_back("decode:load"); },
      [log](release_atom) {  // the test's cue: answer the held arrivals (from inside the actor)
        for (auto& rp : log->held) rp.deliver(true);
        log->held.clear();
      },
  };
}

// Stands in for a prefill worker: records the jobs and ship orders it gets.
caf::behavior fake_prefill(caf::event_based_actor* self, log_ptr log, std::string name) {
  self->set_default_handler(caf::drop);
  return {
      [log, name](prefill_atom, request_spec& spec, request_actor&) {
        log->lines.push_back(name + ":prefill " + std::to_string(spec.id));
        log->prefill_epochs.push_back(spec.epoch);
      },
      [log, name](ship_atom, request_id id, kv_link_actor&) {
        log->lines.push_back(name + ":ship " + std::to_string(id));
      },
      [log, name](cancel_atom, request_id id) { log->lines.push_back(name + ":cancel " + std::to_string(id)); },
  };
}

// Watches actors and records their ends.
caf::behavior watcher(caf::event_based_actor* self, log_ptr log, std::vector<caf::actor> targets) {
  for (auto& t : targets) self->monitor(t);
  self->set_down_handler([log](caf::down_msg&) { log->lines.push_back("down"); });
  return {[](int32_t) {}};
}

// Sends one transfer to the link the way a prefill worker does and records the answer.
caf::behavior transfer_client(caf::event_based_actor* self, log_ptr log, kv_link_actor link, request_spec spec,
                              request_actor req) {
  auto kv = std::make_shared<const std::vector<kv_block_export>>();
  self->request(link, caf::infinite, transfer_atom::value, spec, req, kv, std::vector<token_id>{7})
      .then([log](bool ok) { log->lines.push_back(std::string("client:reply ") + (ok ? "true" : "false")); },
            [log](caf::error&) { log->lines.push_back("client:error"); });
  return {[](int32_t) {}};
}

kv_blocks_ptr one_piece(request_id id, uint32_t epoch) {
  kv_block_export b;
  b.layer_begin = 0;
  b.layer_end = 1;
  b.pos_end = 3;
  b.block_size = 16;  // [1 layer][2][1 head][16][2]: a shape a receiver accepts
  b.n_kv_head = 1;
  b.head_dim = 2;
  b.payload.assign(64, 1.0f);
  b.request = id;
  b.epoch = epoch;
  b.checksum = b.compute_checksum();
  return std::make_shared<const std::vector<kv_block_export>>(1, b);
}

std::shared_ptr<const model> tiny() {
  static const std::shared_ptr<const model> m = testing_support::tiny_model("protocols");
  return m;
}

// A disaggregated router on the tiny model, with its own metrics registry.
router_options disaggregated_router_options() {
  router_options ro;
  ro.core.mode = serving_mode::disaggregated;
  ro.core.context_length = 128;
  ro.request_ctx.mdl = tiny();
  ro.request_ctx.metrics = std::make_shared<metrics::registry>();
  ro.request_ctx.live_requests = std::make_shared<std::atomic<int64_t>>(0);
  return ro;
}

}  // namespace

// A link replaced by a restart retires: it finishes the transfer it has in flight (the
// prefill side gets its answer) and only then ends.
TEST_F(fixture, RetiredLinkFinishesItsTransferThenEnds) {
  auto log = std::make_shared<log_t>();
  auto decode = sys->spawn(fake_decode, log);
  auto req = caf::actor_cast<request_actor>(sys->spawn(recorder, log, std::string("req")));
  auto link = sys->spawn(kv_link_behavior, caf::actor_cast<decode_worker_actor>(decode),
                         kv_link_options{link_name(0, 0), kv_transport_kind::local, nullptr});
  // (Handles kept: an actor nobody references ends as unreachable.)
  auto watch = sys->spawn(watcher, log, std::vector<caf::actor>{caf::actor_cast<caf::actor>(link)});
  run();

  // A piece streamed during prefill: moved, accounted to the request, staged at decode.
  caf::anon_send(link, kv_piece_atom::value, request_id(5), uint32_t(2), req, one_piece(5, 2));
  run();
  EXPECT_EQ(log->count("decode:piece 5@2"), 1);
  EXPECT_EQ(log->count("req:kv 256"), 1);

  // The closing transfer: decode holds it open.
  request_spec spec;
  spec.id = 5;
  spec.epoch = 2;
  auto client = sys->spawn(transfer_client, log, link, spec, req);
  run();
  ASSERT_EQ(log->held.size(), 1u);
  EXPECT_EQ(log->count("client:"), 0);

  caf::anon_send(link, release_atom::value);  // retire while the transfer is in flight
  run();
  EXPECT_EQ(log->count("down"), 0) << "a retiring link ends only when idle";

  caf::anon_send(decode, release_atom::value);
  run();
  EXPECT_EQ(log->count("client:reply true"), 1);
  EXPECT_EQ(log->count("down"), 1);
  for (auto& a : {decode, caf::actor_cast<caf::actor>(req), watch, client})
    caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
}

// A link to another process never blocks on its frames' acknowledgements: while the receiver
// sits on a frame, the link answers heartbeats (the router's stall check) and the transfer
// waits; once the frame is acknowledged, the sender ticks the link and the transfer goes on to
// the decode worker. (It used to block its own thread in the wait, which needed a detached
// actor, and CAF 0.17 could hang at shutdown on a killed detached link.)
TEST_F(fixture, ChannelLinkAnswersWhileItsFrameWaitsForTheReceiver) {
  auto log = std::make_shared<log_t>();
  std::promise<void> let_go;
  auto gate = let_go.get_future().share();
  std::atomic<int> frames{0};
  transport::receiver_options ro;
  ro.allow_shm = false;
  transport::kv_receiver receiver(ro, [&frames, gate](transport::kv_frame&&) {
    ++frames;
    gate.wait();  // the acknowledgement waits for the test
  });
  auto decode = sys->spawn(fake_decode, log);
  auto req = caf::actor_cast<request_actor>(sys->spawn(recorder, log, std::string("req")));
  kv_link_options o;
  o.name = link_name(0, 0);
  o.transport = kv_transport_kind::channel;
  o.channel_mode = channel_mode::tcp;
  o.kv_address = receiver.address();
  auto link = sys->spawn(kv_link_behavior, caf::actor_cast<decode_worker_actor>(decode), o);
  run();

  request_spec spec;
  spec.id = 9;
  spec.epoch = 1;
  auto client = sys->spawn(
      [log](caf::event_based_actor* self, kv_link_actor link, request_spec spec, request_actor req) -> caf::behavior {
        self->request(link, caf::infinite, transfer_atom::value, spec, req, one_piece(9, 1), std::vector<token_id>{7})
            .then([log](bool ok) { log->lines.push_back(std::string("client:reply ") + (ok ? "true" : "false")); },
                  [log](caf::error&) { log->lines.push_back("client:error"); });
        return {[](int32_t) {}};
      },
      link, spec, req);
  run();
  ASSERT_TRUE(eventually([&] { return frames.load() > 0; })) << "the frame never reached the receiver";
  ASSERT_EQ(frames.load(), 1) << "the frame reached the receiver";

  auto pinger = sys->spawn(
      [log](caf::event_based_actor* self, kv_link_actor link) -> caf::behavior {
        self->request(link, caf::infinite, heartbeat_atom::value)
            .then([log](bool) { log->lines.push_back("ping:answered"); }, [log](caf::error&) {});
        return {[](int32_t) {}};
      },
      link);
  run();
  EXPECT_EQ(log->count("ping:answered"), 1) << "a link waiting for an acknowledgement still answers";
  EXPECT_EQ(log->count("decode:arrive"), 0) << "not handed on before its frame is acknowledged";
  EXPECT_EQ(log->count("client:"), 0);

  let_go.set_value();
  EXPECT_TRUE(eventually([&] {
    run();  // delivers the sender's tick
    return log->count("decode:arrive") > 0;
  })) << "the acknowledged frame was never handed on to the decode worker";
  EXPECT_EQ(log->count("decode:arrive 9"), 1);
  EXPECT_EQ(log->count("req:kv 256"), 1) << "the frame's bytes are accounted to its request";
  caf::anon_send(decode, release_atom::value);
  run();
  EXPECT_EQ(log->count("client:reply true"), 1);
  for (auto& a : {decode, caf::actor_cast<caf::actor>(req), caf::actor_cast<caf::actor>(link), client, pinger})
    caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  run();
}

// Decode credits are reserved as soon as a prompt is dispatched (so its KV can stream); when
// its prefill worker dies, the credits go back, the prompt is re-prefilled elsewhere under a
// new epoch, and new credits are reserved for it.
TEST_F(fixture, PrefillDeathRequeuesUnderANewEpochAndReturnsCredits) {
  auto log = std::make_shared<log_t>();
  const router_options ro = disaggregated_router_options();
  auto router = sys->spawn(router_behavior, ro);
  auto p0 = sys->spawn(fake_prefill, log, std::string("p0"));
  auto p1 = sys->spawn(fake_prefill, log, std::string("p1"));
  auto d0 = sys->spawn(fake_decode, log);
  caf::anon_send(router, join_atom::value, int32_t(0), caf::actor_cast<prefill_worker_actor>(p0));
  caf::anon_send(router, join_atom::value, int32_t(1), caf::actor_cast<prefill_worker_actor>(p1));
  caf::anon_send(router, join_atom::value, int32_t(0), caf::actor_cast<decode_worker_actor>(d0));
  caf::anon_send(router, load_atom::value, decode_worker_load{0, true, 64, 64, 0, 8});
  run();

  request_spec spec;
  spec.prompt = {1, 5, 9, 13};
  spec.max_tokens = 8;
  auto sub = caf::actor_cast<subscriber_actor>(sys->spawn(recorder, log, std::string("sub")));
  caf::anon_send(router, submit_atom::value, spec, sub, uint64_t(1));
  run();
  EXPECT_EQ(log->count("sub:event accepted"), 1);
  ASSERT_EQ(log->count("p0:prefill 1"), 1);  // both idle: the first
  EXPECT_EQ(log->count("decode:reserve 1"), 1) << "credits reserved at dispatch";
  EXPECT_EQ(log->count("p0:ship 1"), 1) << "the prefill worker is told where to stream";

  caf::anon_send_exit(p0, caf::exit_reason::kill);
  run();
  EXPECT_EQ(log->count("decode:cancel 1"), 1) << "the dead attempt's credits go back";
  ASSERT_EQ(log->count("p1:prefill 1"), 1) << "re-prefilled on the surviving worker";
  ASSERT_EQ(log->prefill_epochs.size(), 2u);
  EXPECT_GT(log->prefill_epochs[1], log->prefill_epochs[0]);
  EXPECT_EQ(log->count("decode:reserve 1"), 2);
  EXPECT_EQ(log->count("p1:ship 1"), 1);
  EXPECT_EQ(log->count("sub:event error"), 0);
  EXPECT_EQ(ro.request_ctx.metrics->to_prometheus().find("tandem_rejections_total"), std::string::npos);

  caf::anon_send_exit(router, caf::exit_reason::user_shutdown);
  for (auto& a : {p1, d0}) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  run();
}

// A decode worker dies while a request's KV streams to it (its prefill is not done): nothing
// is lost, so the request is reserved on another decode worker and its prefill worker gets
// the new link (and sends everything again).
TEST_F(fixture, DecodeDeathDuringStreamingReservesElsewhere) {
  auto log = std::make_shared<log_t>();
  const router_options ro = disaggregated_router_options();
  auto router = sys->spawn(router_behavior, ro);
  auto p0 = sys->spawn(fake_prefill, log, std::string("p0"));
  auto d0 = sys->spawn(fake_decode, log);
  auto log1 = std::make_shared<log_t>();
  auto d1 = sys->spawn(fake_decode, log1);
  caf::anon_send(router, join_atom::value, int32_t(0), caf::actor_cast<prefill_worker_actor>(p0));
  caf::anon_send(router, join_atom::value, int32_t(0), caf::actor_cast<decode_worker_actor>(d0));
  caf::anon_send(router, load_atom::value, decode_worker_load{0, true, 64, 64, 0, 8});
  run();
  auto sub = caf::actor_cast<subscriber_actor>(sys->spawn(recorder, log, std::string("sub")));
  request_spec spec;
  spec.prompt = {1, 5, 9, 13};
  caf::anon_send(router, submit_atom::value, spec, sub, uint64_t(1));
  run();
  ASSERT_EQ(log->count("decode:reserve 1"), 1);
  ASSERT_EQ(log->count("p0:ship 1"), 1);

  // The second decode worker joins (with room), then the first dies.
  caf::anon_send(router, join_atom::value, int32_t(1), caf::actor_cast<decode_worker_actor>(d1));
  caf::anon_send(router, load_atom::value, decode_worker_load{1, true, 64, 64, 0, 8});
  run();
  caf::anon_send_exit(d0, caf::exit_reason::kill);
  run();
  EXPECT_EQ(log1->count("decode:reserve 1"), 1) << "reserved on the surviving decode worker";
  EXPECT_EQ(log->count("p0:ship 1"), 2) << "the prefill worker got the new link";
  EXPECT_EQ(log->count("p0:prefill 1"), 1) << "no prefill is redone";
  EXPECT_EQ(log->count("sub:event error"), 0);

  caf::anon_send_exit(router, caf::exit_reason::user_shutdown);
  for (auto& a : {p0, d1}) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  run();
}

// Stands in for a worker (a fake_prefill or fake_decode) that also answers stats: at once while
// *slow is false, never while true (its promise is held: a worker busy starting, or far away).
caf::behavior stats_worker(caf::event_based_actor* self, log_ptr log, std::string name, std::shared_ptr<bool> slow,
                           std::shared_ptr<int32_t> free_blocks) {
  caf::message_handler stats{
      [=](stats_atom) -> caf::result<worker_stats> {
        if (*slow) {
          log->held.push_back(self->make_response_promise());
          return caf::delegated<worker_stats>{};
        }
        worker_stats s;
        s.name = name;
        s.kv_free_blocks = *free_blocks;
        return s;
      },
  };
  caf::behavior fake = name.rfind("decode", 0) == 0 ? fake_decode(self, log) : fake_prefill(self, log, name);
  return caf::behavior{stats.or_else(caf::message_handler{fake.as_behavior_impl()})};
}

// Asks the router for its workers' stats and records what comes back.
caf::behavior stats_client(caf::event_based_actor* self, log_ptr log, router_actor router) {
  self->request(router, caf::infinite, stats_atom::value)
      .then(
          [log](std::vector<worker_stats>& ws) {
            std::sort(ws.begin(), ws.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
            std::string line = "stats:";
            for (const auto& w : ws) line += " " + w.name + "=" + std::to_string(w.kv_free_blocks);
            log->lines.push_back(line);
          },
          [log](caf::error& e) { log->lines.push_back("stats error " + caf::to_string(e)); });
  return {[](int32_t) {}};
}

// The stats behind every observer (/health, /admin/state, the dashboard, the gauges) wait for
// no worker: one slow to answer is given as it last answered, within a short bound (a remote
// worker still starting once kept the whole snapshot seconds old under load).
TEST_F(fixture, StatsGiveASlowWorkerAsItLastAnsweredWithoutWaitingForIt) {
  auto log = std::make_shared<log_t>();
  auto router = sys->spawn(router_behavior, disaggregated_router_options());
  auto slow = std::make_shared<bool>(false);
  auto free_p = std::make_shared<int32_t>(10), free_d = std::make_shared<int32_t>(20);
  auto p0 = sys->spawn(stats_worker, log, std::string("prefill-0"), std::make_shared<bool>(false), free_p);
  auto d0 = sys->spawn(stats_worker, log, std::string("decode-0"), slow, free_d);
  caf::anon_send(router, join_atom::value, int32_t(0), caf::actor_cast<prefill_worker_actor>(p0));
  caf::anon_send(router, join_atom::value, int32_t(0), caf::actor_cast<decode_worker_actor>(d0));
  run();
  auto c1 = sys->spawn(stats_client, log, router);
  run();
  ASSERT_EQ(log->count("stats:"), 1) << ::testing::PrintToString(log->lines);
  EXPECT_EQ(log->count("stats: decode-0=20 prefill-0=10"), 1) << log->lines.back();

  *slow = true;  // decode-0 stops answering; prefill-0 moves on
  *free_p = 11;
  *free_d = 5;
  auto c2 = sys->spawn(stats_client, log, router);
  run();
  EXPECT_EQ(log->count("stats:"), 1) << "answered before the bound with a worker pending";
  ASSERT_GT(sched->trigger_timeouts(), 0u);  // the stats ask's bound (and a heartbeat) passes
  run();
  EXPECT_EQ(log->count("stats: decode-0=20 prefill-0=11"), 1) << ::testing::PrintToString(log->lines);

  log->held.clear();  // (a promise is delivered from inside its actor only)
  for (auto a : {caf::actor_cast<caf::actor>(router), p0, d0, c1, c2})
    caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  run();
}

// Every decode worker down: new requests are refused at once with worker_failed (HTTP 503),
// not queued without bound; before any worker has joined, requests queue.
TEST_F(fixture, NoHealthyWorkerOfANeededKindRefusesNewRequests) {
  auto log = std::make_shared<log_t>();
  const router_options ro = disaggregated_router_options();
  auto router = sys->spawn(router_behavior, ro);
  auto sub = caf::actor_cast<subscriber_actor>(sys->spawn(recorder, log, std::string("sub")));
  request_spec spec;
  spec.prompt = {1, 2, 3};
  caf::anon_send(router, submit_atom::value, spec, sub, uint64_t(1));  // nothing joined yet: queued
  run();
  EXPECT_EQ(log->count("sub:event accepted"), 1);

  auto p0 = sys->spawn(fake_prefill, log, std::string("p0"));
  auto d0 = sys->spawn(fake_decode, log);
  caf::anon_send(router, join_atom::value, int32_t(0), caf::actor_cast<prefill_worker_actor>(p0));
  caf::anon_send(router, join_atom::value, int32_t(0), caf::actor_cast<decode_worker_actor>(d0));
  run();
  caf::anon_send_exit(d0, caf::exit_reason::kill);
  run();
  // Its supervisor would restart it at once: a request meanwhile queues.
  spec.id = 0;
  caf::anon_send(router, submit_atom::value, spec, sub, uint64_t(1));
  run();
  EXPECT_EQ(log->count("sub:event accepted"), 2);
  EXPECT_EQ(log->count("sub:event error"), 0);
  // None came back (the pool is degraded): the router's check a moment later ends what waits
  // for it, and refuses new requests at once.
  sched->trigger_timeouts();
  run();
  spec.id = 0;
  caf::anon_send(router, submit_atom::value, spec, sub, uint64_t(1));
  run();
  EXPECT_EQ(log->count("sub:event accepted"), 2);
  EXPECT_EQ(log->count("sub:event error"), 3);  // the two that waited, and the refused one
  EXPECT_NE(ro.request_ctx.metrics->to_prometheus().find("no_healthy_worker"), std::string::npos);

  caf::anon_send_exit(router, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(p0, caf::exit_reason::user_shutdown);
  run();
}
