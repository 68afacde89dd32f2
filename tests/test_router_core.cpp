// The router core as a state machine, without actors: tables of (event in -> commands out,
// phases after), one per lifecycle and recovery path the chaos tests exercise end to end.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "runtime/oplog.h"
#include "runtime/scheduler/router_core.h"
#include "tests/support/trace_table.h"

namespace tandem::sched {
namespace {

using namespace std::chrono_literals;

// Commands as short text, so that a table reads as a trace.
std::string show(const command& c) {
  std::ostringstream o;
  auto side = [](pool_side s) { return s == pool_side::prefill ? "p" : "d"; };
  std::visit(
      [&](const auto& x) {
        using C = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<C, cmd::admit>) o << "admit r" << x.spec.id << " @" << x.position;
        else if constexpr (std::is_same_v<C, cmd::refuse>) o << "refuse " << to_string(x.code);
        else if constexpr (std::is_same_v<C, cmd::set_state>) o << "state r" << x.id << " " << to_string(x.state);
        else if constexpr (std::is_same_v<C, cmd::fail>) o << "fail r" << x.id << " " << to_string(x.code);
        else if constexpr (std::is_same_v<C, cmd::ask_resume>) o << "resume? r" << x.id;
        else if constexpr (std::is_same_v<C, cmd::ask_store>) o << "store? r" << x.id << " " << x.keys.size();
        else if constexpr (std::is_same_v<C, cmd::prefill>)
          o << "prefill p" << x.worker << " r" << x.spec.id << " e" << x.spec.epoch;
        else if constexpr (std::is_same_v<C, cmd::reserve>)
          o << "reserve d" << x.worker << " r" << x.id << " #" << x.ticket;
        else if constexpr (std::is_same_v<C, cmd::fetch>) o << "fetch d" << x.worker << " r" << x.spec.id;
        else if constexpr (std::is_same_v<C, cmd::ship>) o << "ship p" << x.p << "->d" << x.d << " r" << x.id;
        else if constexpr (std::is_same_v<C, cmd::cancel>) o << "cancel " << side(x.side) << x.worker << " r" << x.id;
        else if constexpr (std::is_same_v<C, cmd::release>) {
          o << "release p" << x.worker << " r" << x.id;
          if (x.epoch) o << " e" << *x.epoch;
        } else if constexpr (std::is_same_v<C, cmd::pause>) o << "pause " << side(x.side) << x.worker << " r" << x.id;
        else if constexpr (std::is_same_v<C, cmd::ask_load>) o << "load? d" << x.worker;
        else if constexpr (std::is_same_v<C, cmd::open_link>) o << "link p" << x.p << "->d" << x.d;
        else if constexpr (std::is_same_v<C, cmd::link_lost>) o << "link lost p" << x.p << "->d" << x.d;
        else if constexpr (std::is_same_v<C, cmd::kill_link>) o << "kill link p" << x.p << "->d" << x.d;
        else if constexpr (std::is_same_v<C, cmd::kill_worker>) o << "kill " << side(x.side) << x.worker.index;
        else if constexpr (std::is_same_v<C, cmd::isolate>) o << "isolate " << side(x.side) << x.index;
        else if constexpr (std::is_same_v<C, cmd::check_orphan>) o << "orphan? r" << x.id;
        else if constexpr (std::is_same_v<C, cmd::check_stranded>) o << "stranded?";
        else static_assert(sizeof(C) == 0, "a command without a rendering");
      },
      c);
  return o.str();
}

request_spec spec(int32_t prompt_tokens, int32_t max_tokens = 8) {
  request_spec s;
  for (int32_t i = 0; i < prompt_tokens; ++i) s.prompt.push_back(1 + i);
  s.max_tokens = max_tokens;
  return s;
}

decode_worker_load room(int32_t worker, int32_t blocks = 100) { return {worker, true, blocks, blocks, 0, 0}; }

using row = testing::trace_row<event, phase>;

class RouterCore : public ::testing::Test {
 protected:
  void make(serving_mode mode, int prefill, int decode, bool store = false) {
    router_core_config c;
    c.mode = mode;
    c.context_length = 256;
    c.block_size = 16;
    c.store = store;
    c.max_migrations = 2;
    c.max_transfer_retries = 1;
    c.stall_timeout = 100ms;
    core = std::make_unique<router_core>(c, &metrics, [this] { return now; });
    for (int i = 0; i < prefill; ++i) core->on(ev::joined{pool_side::prefill, i});
    for (int i = 0; i < decode; ++i) core->on(ev::joined{pool_side::decode, i});
    for (int p = 0; p < prefill; ++p)
      for (int d = 0; d < decode; ++d) core->on(ev::link_up{p, d});
    for (int d = 0; d < decode; ++d) core->on(ev::decode_load{room(d)});
  }
  worker_ref ref(pool_side s, int32_t i) const { return {i, core->gen(s, i)}; }
  worker_ref P(int32_t i) const { return ref(pool_side::prefill, i); }
  worker_ref D(int32_t i) const { return ref(pool_side::decode, i); }

  void run(const std::vector<row>& rows) { testing::run_trace(*core, rows, show); }
  double counter(const std::string& name) { return testing::counter_total(metrics, name); }

  metrics::registry metrics;
  clock::time_point now = clock::time_point{} + 1h;
  std::unique_ptr<router_core> core;
};

constexpr auto waiting_ = phase::waiting;
constexpr auto prefilling_ = phase::prefilling;
constexpr auto direct_ = phase::direct;
constexpr auto decoding_ = phase::decoding;
constexpr auto migrating_ = phase::migrating;

TEST_F(RouterCore, DisaggregatedLifecycle) {
  make(serving_mode::disaggregated, 1, 1);
  run({
      // Dispatched to prefill and queued for decode credits at once (KV streams as it prefills).
      {ev::submit{spec(40)}, {"admit r1 @0", "prefill p0 r1 e1", "reserve d0 r1 #1"}, {{1, prefilling_}}},
      {ev::reserve_answer{1, 0, 1, ev::reply::granted}, {"ship p0->d0 r1"}, {{1, prefilling_}}},
      {ev::prefilled{1, 0, false}, {"state r1 transferring"}, {{1, prefilling_}}},
      {ev::ship_started{1}, {}, {{1, prefilling_}}},
      {ev::worker_state{1, pool_side::decode, D(0), request_state::decoding}, {}, {{1, decoding_}}},
      // A normal end: the workers end it themselves, nothing to cancel.
      {ev::ended{1, request_state::finished, 5.0}, {}, {{1, std::nullopt}}},
  });
  EXPECT_TRUE(core->prefill_queue().empty());
  EXPECT_TRUE(core->decode_queue().empty());
}

// Auto: a prompt whose uncached part fits in the decode worker's reported slack goes straight
// to it (no prefill, no link: it fetches with a feed); the figure is spent until the next
// report; a longer one goes to the prefill pool; a refusal there falls back to prefill.
TEST_F(RouterCore, AutoModePlacesShortPromptsOnTheirDecodeWorker) {
  make(serving_mode::automatic, 1, 1);
  const decode_worker_load slack{0, true, 100, 100, 0, 0, 64};  // it may compute 64 prompt tokens now
  run({
      {ev::decode_load{slack}, {}},
      {ev::submit{spec(40)}, {"admit r1 @0", "reserve d0 r1 #1"}, {{1, direct_}}},
      {ev::reserve_answer{1, 0, 1, ev::reply::granted}, {"fetch d0 r1"}, {{1, direct_}}},
      // 24 tokens of slack left until the worker reports again: 40 more go to the prefill pool.
      {ev::submit{spec(40)}, {"admit r2 @0", "prefill p0 r2 e1", "reserve d0 r2 #2"}, {{2, prefilling_}}},
      {ev::reserve_answer{2, 0, 2, ev::reply::granted}, {"ship p0->d0 r2"}},
      {ev::decode_load{slack}, {}},
      {ev::submit{spec(100)},
       {"admit r3 @0", "prefill p0 r3 e1", "reserve d0 r3 #3"},
       {{3, prefilling_}}},  // longer than the slack
      {ev::reserve_answer{3, 0, 3, ev::reply::granted}, {"ship p0->d0 r3"}},
      {ev::worker_state{1, pool_side::decode, D(0), request_state::decoding}, {}, {{1, decoding_}}},
      {ev::submit{spec(30)}, {"admit r4 @0", "reserve d0 r4 #4"}, {{4, direct_}}},
      {ev::reserve_answer{4, 0, 4, ev::reply::granted}, {"fetch d0 r4"}},
      // The worker refused it after all (its slack was spent meanwhile): the prefill pool computes it.
      {ev::fetch_answer{4, 1, false},
       {"cancel d0 r4", "state r4 queued", "prefill p0 r4 e2", "reserve d0 r4 #5"},
       {{4, prefilling_}}},
  });
  EXPECT_EQ(counter("tandem_router_local_prefill_total"), 2);
}

TEST_F(RouterCore, ColocatedWorkerDiesWhileDecodingTheRequestMigrates) {
  make(serving_mode::colocated, 2, 0);
  run({
      {ev::submit{spec(40)}, {"admit r1 @0", "prefill p0 r1 e1"}, {{1, prefilling_}}},
      {ev::worker_state{1, pool_side::prefill, P(0), request_state::decoding}, {}, {{1, decoding_}}},
      {ev::worker_down{pool_side::prefill, P(0)}, {"resume? r1"}, {{1, migrating_}}},
      // Prompt plus the three tokens it has, prefilled again elsewhere: a new attempt (epoch 2).
      {ev::resume_answer{1, std::vector<token_id>{7, 8, 9}},
       {"state r1 queued", "prefill p1 r1 e2"},
       {{1, prefilling_}}},
  });
  const entry* e = core->find(1);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->spec.resumed, 3);
  EXPECT_EQ(e->spec.prompt.size(), 43u);
  EXPECT_EQ(e->migrations, 1);
  // Decoding again: the operator's log says where from, where to and what was carried, once.
  const uint64_t before = oplog::recent().empty() ? 0 : oplog::recent().back().seq;
  run({{ev::worker_state{1, pool_side::prefill, P(1), request_state::decoding}, {}, {{1, decoding_}}}});
  run({{ev::worker_state{1, pool_side::prefill, P(1), request_state::decoding}, {}, {{1, decoding_}}}});
  std::vector<nlohmann::json> moved;
  for (const auto& r : oplog::recent(before))
    if (auto j = nlohmann::json::parse(r.json); j["event"] == "migrated") moved.push_back(j);
  ASSERT_EQ(moved.size(), 1u);
  EXPECT_EQ(moved[0]["from"], "colocated-0");
  EXPECT_EQ(moved[0]["to"], "colocated-1");
  EXPECT_EQ(moved[0]["tokens_carried"], 3);
  EXPECT_GE(moved[0]["recovery_ms"].get<double>(), 0.0);
}

TEST_F(RouterCore, PrefillWorkerDiesMidPrefillTheRequestStartsAgainElsewhere) {
  make(serving_mode::disaggregated, 2, 1);
  run({
      {ev::submit{spec(40)}, {"admit r1 @0", "prefill p0 r1 e1", "reserve d0 r1 #1"}},
      {ev::reserve_answer{1, 0, 1, ev::reply::granted}, {"ship p0->d0 r1"}},
      // Its credits go back and it goes to the front of the prefill queue, then to p1.
      {ev::worker_down{pool_side::prefill, P(0)},
       {"cancel d0 r1", "state r1 queued", "prefill p1 r1 e2", "reserve d0 r1 #2"},
       {{1, prefilling_}}},
  });
  EXPECT_EQ(counter("tandem_reprefills_total"), 1);
}

TEST_F(RouterCore, PrefillWorkerDiesWhileShippingAnOrphanCheckDecides) {
  make(serving_mode::disaggregated, 2, 1);
  run({
      {ev::submit{spec(40)}, {"admit r1 @0", "prefill p0 r1 e1", "reserve d0 r1 #1"}},
      {ev::reserve_answer{1, 0, 1, ev::reply::granted}, {"ship p0->d0 r1"}},
      {ev::prefilled{1, 0, false}, {"state r1 transferring"}},
      {ev::ship_started{1}, {}},
      // The link may still deliver what it holds: checked again later, not requeued now.
      {ev::worker_down{pool_side::prefill, P(0)}, {"orphan? r1"}, {{1, prefilling_}}},
      // Never arrived: prefilled again (its credits back first).
      {ev::orphan_check{1, 1}, {"cancel d0 r1", "resume? r1"}, {{1, migrating_}}},
      {ev::resume_answer{1, std::vector<token_id>{}}, {}, {{1, migrating_}}},  // it ended meanwhile
  });
}

TEST_F(RouterCore, OrphanCheckAfterDeliveryChangesNothing) {
  make(serving_mode::disaggregated, 2, 1);
  run({
      {ev::submit{spec(40)}, {"admit r1 @0", "prefill p0 r1 e1", "reserve d0 r1 #1"}},
      {ev::reserve_answer{1, 0, 1, ev::reply::granted}, {"ship p0->d0 r1"}},
      {ev::prefilled{1, 0, false}, {"state r1 transferring"}},
      {ev::ship_started{1}, {}},
      {ev::worker_down{pool_side::prefill, P(0)}, {"orphan? r1"}},
      {ev::worker_state{1, pool_side::decode, D(0), request_state::decoding}, {}, {{1, decoding_}}},
      {ev::orphan_check{1, 1}, {}, {{1, decoding_}}},
  });
}

TEST_F(RouterCore, DecodeWorkerDiesBeforeTheKvArrivesItIsReservedElsewhere) {
  make(serving_mode::disaggregated, 1, 2);
  run({
      {ev::submit{spec(40)}, {"admit r1 @0", "prefill p0 r1 e1", "reserve d0 r1 #1"}},
      {ev::reserve_answer{1, 0, 1, ev::reply::granted}, {"ship p0->d0 r1"}},
      // Still prefilling: only its decode claim moves (the new link resends everything).
      {ev::worker_down{pool_side::decode, D(0)}, {"reserve d1 r1 #2"}, {{1, prefilling_}}},
      {ev::reserve_answer{2, 1, 1, ev::reply::granted}, {"ship p0->d1 r1"}},
  });
}

TEST_F(RouterCore, DecodeWorkerDiesWhileDecodingUpToTheMigrationLimit) {
  make(serving_mode::disaggregated, 1, 2);
  run({
      {ev::submit{spec(40)}, {"admit r1 @0", "prefill p0 r1 e1", "reserve d0 r1 #1"}},
      {ev::reserve_answer{1, 0, 1, ev::reply::granted}, {"ship p0->d0 r1"}},
      {ev::prefilled{1, 0, false}, {"state r1 transferring"}},
      {ev::worker_state{1, pool_side::decode, D(0), request_state::decoding}, {}, {{1, decoding_}}},
      // Its lease on p0 (if any is left) ends; it asks its actor for the tokens so far.
      {ev::worker_down{pool_side::decode, D(0)}, {"release p0 r1", "resume? r1"}, {{1, migrating_}}},
      {ev::resume_answer{1, std::vector<token_id>{5}}, {"state r1 queued", "prefill p0 r1 e2", "reserve d1 r1 #2"}},
      {ev::reserve_answer{2, 1, 1, ev::reply::granted}, {"ship p0->d1 r1"}},
      {ev::prefilled{1, 0, false}, {"state r1 transferring"}},
      {ev::worker_state{1, pool_side::decode, D(1), request_state::decoding}, {}, {{1, decoding_}}},
      // No decode worker left: looked at again soon (restarting, or degraded).
      {ev::worker_down{pool_side::decode, D(1)}, {"release p0 r1", "resume? r1", "stranded?"}, {{1, migrating_}}},
      {ev::joined{pool_side::decode, 0}, {"link p0->d0", "load? d0"}},
      {ev::link_up{0, 0}, {}},
  });
  // (D(0) is read when a table is built: the restarted incarnation gets a table of its own.)
  run({
      {ev::decode_load{room(0)}, {}},
      {ev::resume_answer{1, std::vector<token_id>{5, 6}}, {"state r1 queued", "prefill p0 r1 e3", "reserve d0 r1 #3"}},
      {ev::reserve_answer{3, 0, 1, ev::reply::granted}, {"ship p0->d0 r1"}},
      {ev::prefilled{1, 0, false}, {"state r1 transferring"}},
      {ev::worker_state{1, pool_side::decode, D(0), request_state::decoding}, {}, {{1, decoding_}}},
      // A third death: past max_migrations (2), it ends with worker_failed.
      {ev::worker_down{pool_side::decode, D(0)}, {"fail r1 worker_failed", "stranded?"}, {{1, decoding_}}},
      // Ended by that error: a lease its prefill worker may still hold ends too.
      {ev::ended{1, request_state::failed, 0}, {"cancel p0 r1"}, {{1, std::nullopt}}},
  });
  EXPECT_EQ(counter("tandem_migrations_total"), 2);
}

TEST_F(RouterCore, FailedTransfersShipAgainThenPrefillAgain) {
  make(serving_mode::disaggregated, 1, 1);
  run({
      {ev::submit{spec(40)}, {"admit r1 @0", "prefill p0 r1 e1", "reserve d0 r1 #1"}},
      {ev::reserve_answer{1, 0, 1, ev::reply::granted}, {"ship p0->d0 r1"}},
      {ev::prefilled{1, 0, false}, {"state r1 transferring"}},
      // From the lease, once (max_transfer_retries = 1) ...
      {ev::transfer_failed{1, 1, 0}, {"ship p0->d0 r1"}, {{1, prefilling_}}},
      // ... then prefilled again: lease released, credits back.
      {ev::transfer_failed{1, 1, 0}, {"release p0 r1", "cancel d0 r1", "resume? r1"}, {{1, migrating_}}},
      // A report of the old attempt after the new one started is stale: that lease ends.
      {ev::resume_answer{1, std::vector<token_id>{4}}, {"state r1 queued", "prefill p0 r1 e2", "reserve d0 r1 #2"}},
      {ev::transfer_failed{1, 1, 0}, {"release p0 r1 e1"}, {{1, prefilling_}}},
  });
  EXPECT_EQ(counter("tandem_kv_transfer_retries_total"), 1);
}

TEST_F(RouterCore, ALinkThatDiesIsReplacedAndAwaitingRequestsShipOverTheNewOne) {
  make(serving_mode::disaggregated, 1, 1);
  run({
      {ev::link_down{0, 0}, {"link lost p0->d0", "link p0->d0"}},
      {ev::submit{spec(40)}, {"admit r1 @0", "prefill p0 r1 e1", "reserve d0 r1 #1"}},
      // Credits held, no link yet: it waits for the link, then ships.
      {ev::reserve_answer{1, 0, 1, ev::reply::granted}, {}},
      {ev::link_up{0, 0}, {"ship p0->d0 r1"}},
      {ev::link_stuck{0, 0}, {"kill link p0->d0", "link lost p0->d0", "link p0->d0"}},
  });
  EXPECT_FALSE(core->link_ready(0, 0));
}

TEST_F(RouterCore, RefusedAndFailedReservationsWaitForAFreshReport) {
  make(serving_mode::disaggregated, 1, 2);
  run({
      {ev::submit{spec(40)}, {"admit r1 @0", "prefill p0 r1 e1", "reserve d0 r1 #1"}},
      // Refused (a stale view of d0): back to the front, a fresh report asked for; d1 next.
      {ev::reserve_answer{1, 0, 1, ev::reply::refused, errc::refused}, {"load? d0", "reserve d1 r1 #2"}},
      // No answer (d1 stuck): left out until it reports; d0 has reported nothing new either.
      {ev::reserve_answer{2, 1, 1, ev::reply::failed, errc::timeout}, {}},
      {ev::decode_load{room(0)}, {"reserve d0 r1 #3"}},
      {ev::reserve_answer{3, 0, 1, ev::reply::granted}, {"ship p0->d0 r1"}},
  });
  // Why, by code, in the metrics.
  const std::string prom = metrics.to_prometheus();
  EXPECT_NE(prom.find("tandem_router_reservation_errors_total{code=\"refused\"} 1"), std::string::npos) << prom;
  EXPECT_NE(prom.find("tandem_router_reservation_errors_total{code=\"timeout\"} 1"), std::string::npos) << prom;
}

TEST_F(RouterCore, DecodeWorkerDiesDuringAReservationItsLateGrantIsGivenBack) {
  make(serving_mode::disaggregated, 1, 2);
  run({
      {ev::submit{spec(40)}, {"admit r1 @0", "prefill p0 r1 e1", "reserve d0 r1 #1"}},
      {ev::worker_down{pool_side::decode, D(0)}, {"reserve d1 r1 #2"}},
      {ev::reserve_answer{1, 0, 1, ev::reply::granted}, {"cancel d0 r1"}},
      {ev::reserve_answer{2, 1, 1, ev::reply::granted}, {"ship p0->d1 r1"}},
  });
}

TEST_F(RouterCore, DoneInPrefillGivesTheDecodeCreditsBack) {
  make(serving_mode::disaggregated, 1, 1);
  run({
      {ev::submit{spec(40, 1)}, {"admit r1 @0", "prefill p0 r1 e1", "reserve d0 r1 #1"}},
      {ev::reserve_answer{1, 0, 1, ev::reply::granted}, {"ship p0->d0 r1"}},
      {ev::prefilled{1, 0, true}, {"cancel d0 r1"}, {{1, prefilling_}}},
      {ev::ended{1, request_state::finished, 0}, {}, {{1, std::nullopt}}},
  });
}

// The end of a request done in prefill can overtake its prefill worker's report (they come
// from different actors): the decode reservation is given back all the same (found by the e2e
// test's 50 concurrent one-token requests, where it leaked one reservation in ~1000).
TEST_F(RouterCore, DoneInPrefillWhoseEndComesFirstGivesTheDecodeCreditsBack) {
  make(serving_mode::disaggregated, 1, 1);
  run({
      {ev::submit{spec(40, 1)}, {"admit r1 @0", "prefill p0 r1 e1", "reserve d0 r1 #1"}},
      {ev::reserve_answer{1, 0, 1, ev::reply::granted}, {"ship p0->d0 r1"}},
      {ev::ended{1, request_state::finished, 0}, {"cancel d0 r1"}, {{1, std::nullopt}}},
      {ev::prefilled{1, 0, true}, {}, {{1, std::nullopt}}},
  });
}

TEST_F(RouterCore, ACancelledRequestIsFreedWhereverItIs) {
  make(serving_mode::disaggregated, 1, 1);
  run({
      {ev::submit{spec(40)}, {"admit r1 @0", "prefill p0 r1 e1", "reserve d0 r1 #1"}},
      {ev::submit{spec(40)}, {"admit r2 @0", "prefill p0 r2 e1"}},
      {ev::reserve_answer{1, 0, 1, ev::reply::granted}, {"ship p0->d0 r1", "reserve d0 r2 #2"}},
      {ev::ended{1, request_state::cancelled, 0}, {"cancel p0 r1", "cancel d0 r1"}, {{1, std::nullopt}}},
      // Cancelled while its reservation is in flight: the grant is given back.
      {ev::ended{2, request_state::cancelled, 0}, {"cancel p0 r2"}, {{2, std::nullopt}}},
      {ev::reserve_answer{2, 0, 2, ev::reply::granted}, {"cancel d0 r2"}},
  });
  EXPECT_EQ(core->size(), 0u);
}

TEST_F(RouterCore, StorePromptsGoStraightToDecodeAndFallBackToPrefill) {
  make(serving_mode::disaggregated, 1, 1, /*store=*/true);
  run({
      {ev::submit{spec(40)}, {"admit r1 @0", "store? r1 2"}, {{1, waiting_}}},
      // The store holds both full blocks before the last token: no prefill worker, no link.
      {ev::store_answer{1, 2}, {"reserve d0 r1 #1"}, {{1, direct_}}},
      {ev::reserve_answer{1, 0, 1, ev::reply::granted}, {"fetch d0 r1"}},
      // The blocks left the store: prefilled after all (and never sent direct again).
      {ev::fetch_answer{1, 1, false},
       {"cancel d0 r1", "state r1 queued", "prefill p0 r1 e2", "reserve d0 r1 #2"},
       {{1, prefilling_}}},
  });
  EXPECT_EQ(counter("tandem_router_direct_fallbacks_total"), 1);
}

TEST_F(RouterCore, AStrandedPoolEndsItsRequestsAndRefusesNewOnes) {
  make(serving_mode::disaggregated, 1, 1);
  run({
      {ev::submit{spec(40)}, {"admit r1 @0", "prefill p0 r1 e1", "reserve d0 r1 #1"}},
      {ev::worker_down{pool_side::prefill, P(0)}, {"state r1 queued", "stranded?"}, {{1, waiting_}}},
      {ev::stranded_check{}, {"fail r1 worker_failed"}},
      {ev::submit{spec(10)}, {"refuse worker_failed"}},
      // A worker joining again clears it.
      {ev::joined{pool_side::prefill, 0}, {"link p0->d0", "prefill p0 r1 e2"}},
  });
}

TEST_F(RouterCore, AdmissionRefusesWhatCannotFit) {
  make(serving_mode::disaggregated, 1, 1);
  run({{ev::submit{spec(300)}, {"refuse context_overflow"}}});
  EXPECT_EQ(core->size(), 0u);
}

TEST_F(RouterCore, StalledWorkersAreKilled) {
  make(serving_mode::disaggregated, 1, 1);
  run({
      {ev::heartbeat{pool_side::prefill, P(0), true, 3}, {}},
      {ev::heartbeat{pool_side::decode, D(0), false, 0}, {}},
  });
  now += 200ms;
  run({
      {ev::heartbeat{pool_side::prefill, P(0), true, 3}, {"kill p0"}},  // the same step for too long
      {ev::heartbeat{pool_side::decode, D(0), false, 0}, {}},  // idle is not stalled
      {ev::heartbeat_missed{pool_side::decode, D(0)}, {"kill d0"}},  // no answer at all
      {ev::heartbeat_missed{pool_side::decode, {0, 99}}, {}},  // an incarnation long gone
  });
}

TEST_F(RouterCore, ALostNodesWorkerIsIsolatedAndItsRequestsRecovered) {
  make(serving_mode::disaggregated, 2, 1);
  run({
      {ev::submit{spec(40)}, {"admit r1 @0", "prefill p0 r1 e1", "reserve d0 r1 #1"}},
      {ev::worker_lost{pool_side::prefill, 0},
       {"isolate p0", "state r1 queued", "prefill p1 r1 e2"},
       {{1, prefilling_}}},
      // Its late down message changes nothing more.
      {ev::worker_down{pool_side::prefill, P(0)}, {}},
      {ev::reserve_answer{1, 0, 1, ev::reply::granted}, {"cancel d0 r1", "reserve d0 r1 #2"}},
  });
  EXPECT_FALSE(core->link_ready(0, 0));
  EXPECT_TRUE(core->link_ready(1, 0));
}

TEST_F(RouterCore, RequestsOfADeadRouterRejoinWithTheirTokens) {
  make(serving_mode::disaggregated, 1, 1);
  request_spec r = spec(40);
  r.id = 7;
  run({
      // First among the new ones, its tokens so far the end of its prompt; not admitted again.
      {ev::rejoin{r, {11, 12}}, {"prefill p0 r7 e1", "reserve d0 r7 #1"}, {{7, prefilling_}}},
      {ev::rejoin{r, {11, 12}}, {}},  // once
  });
  EXPECT_EQ(core->find(7)->spec.resumed, 2);
  EXPECT_EQ(core->find(7)->spec.prompt.size(), 42u);
  EXPECT_EQ(counter("tandem_router_rejoins_total"), 1);
}

TEST_F(RouterCore, PauseGoesWhereTheRequestDecodes) {
  make(serving_mode::disaggregated, 1, 1);
  run({
      {ev::submit{spec(40)}, {"admit r1 @0", "prefill p0 r1 e1", "reserve d0 r1 #1"}},
      {ev::pause{1, true}, {}},  // no credits held yet: nowhere to pause it
      {ev::reserve_answer{1, 0, 1, ev::reply::granted}, {"ship p0->d0 r1"}},
      {ev::pause{1, true}, {"pause d0 r1"}},
      {ev::worker_state{1, pool_side::decode, D(0), request_state::decoding}, {}},
      {ev::pause{1, false}, {"pause d0 r1"}},
      {ev::pause{99, true}, {}},  // unknown
  });
  make(serving_mode::colocated, 1, 0);
  run({
      {ev::submit{spec(40)}, {"admit r1 @0", "prefill p0 r1 e1"}},
      {ev::pause{1, true}, {"pause p0 r1"}},
  });
}

request_spec from(uint64_t client, int32_t prompt_tokens, int32_t max_tokens = 8) {
  request_spec s = spec(prompt_tokens, max_tokens);
  s.client = client;
  return s;
}
constexpr auto parked_ = phase::parked;

TEST_F(RouterCore, PausedRequestsGiveUpTheirSlotWhileOthersWait) {
  // Issue 22 item 2: a client that stops reading must not keep its slots and KV from others.
  make(serving_mode::disaggregated, 1, 1);
  run({
      {ev::submit{from(7, 40)}, {"admit r1 @0", "prefill p0 r1 e1", "reserve d0 r1 #1"}},
      {ev::reserve_answer{1, 0, 1, ev::reply::granted}, {"ship p0->d0 r1"}},
      {ev::prefilled{1, 0, false}, {"state r1 transferring"}},
      {ev::worker_state{1, pool_side::decode, D(0), request_state::decoding}, {}, {{1, decoding_}}},
      // Nothing waits: paused on its worker, it keeps its slot.
      {ev::pause{1, true}, {"pause d0 r1"}, {{1, decoding_}}},
      {ev::decode_load{room(0, 0)}, {}, {{1, decoding_}}},  // no credits left on d0
      // Another client's request comes: the paused one is taken off d0 (slot, credits and KV
      // freed, its prefill lease ended) and a fresh load report asked for.
      {ev::submit{from(8, 40)},
       {"admit r2 @0", "cancel d0 r1", "release p0 r1", "load? d0", "prefill p0 r2 e1"},
       {{1, parked_}, {2, prefilling_}}},
      {ev::decode_load{room(0)}, {"reserve d0 r2 #2"}},
      {ev::pause{1, true}, {}, {{1, parked_}}},  // parked already
      // Its client caught up: its tokens are asked for, then it is prefilled again with them
      // (the first of the queue: its client has nothing in service).
      {ev::pause{1, false}, {"resume? r1"}, {{1, migrating_}}},
      {ev::resume_answer{1, std::vector<token_id>{5, 6, 7}},
       {"state r1 queued", "prefill p0 r1 e2"},
       {{1, prefilling_}}},
  });
  EXPECT_EQ(core->find(1)->spec.resumed, 3);
  EXPECT_EQ(core->find(1)->spec.prompt.size(), 43u);
  EXPECT_EQ(core->find(1)->migrations, 0);  // not a migration: no limit spent
  EXPECT_EQ(counter("tandem_router_parked_total"), 1);
  EXPECT_EQ(counter("tandem_migrations_total"), 0);
  // A parked request that ends (its client went away) holds nothing anywhere.
  run({
      {ev::reserve_answer{2, 0, 2, ev::reply::granted}, {"ship p0->d0 r2", "reserve d0 r1 #3"}},
      {ev::worker_state{2, pool_side::decode, D(0), request_state::decoding}, {}, {{2, decoding_}}},
      {ev::pause{2, true}, {"pause d0 r2"}, {{2, decoding_}}},  // r1's reservation is out: nothing waits
      {ev::submit{from(9, 40)},
       {"admit r3 @0", "cancel d0 r2", "release p0 r2", "load? d0", "prefill p0 r3 e1"},
       {{2, parked_}}},
      {ev::ended{2, request_state::cancelled, 0}, {}, {{2, std::nullopt}}},
  });
  EXPECT_EQ(counter("tandem_router_parked_total"), 2);
}

TEST_F(RouterCore, PausedColocatedRequestsGiveUpTheirSlotWhenPromptsWait) {
  make(serving_mode::colocated, 1, 0);
  run({
      {ev::submit{from(7, 40)}, {"admit r1 @0", "prefill p0 r1 e1"}},
      {ev::worker_state{1, pool_side::prefill, P(0), request_state::decoding}, {}, {{1, decoding_}}},
      {ev::pause{1, true}, {"pause p0 r1"}, {{1, decoding_}}},
      {ev::submit{from(8, 40)}, {"admit r2 @0", "cancel p0 r1", "prefill p0 r2 e1"}, {{1, parked_}}},
  });
}

TEST_F(RouterCore, WaitingRequestsArePlacedClientByClient) {
  // Max-min fairness: the next slot goes to the client with the fewest requests in service,
  // first come, first served within a client and between equals.
  make(serving_mode::colocated, 1, 0);
  run({
      {ev::prefill_load{{0, true, 5000, 9}}, {}},  // the worker is full: requests queue here
      {ev::submit{from(1, 40)}, {"admit r1 @0"}},
      {ev::submit{from(1, 40)}, {"admit r2 @1"}},
      {ev::submit{from(1, 40)}, {"admit r3 @2"}},
      {ev::submit{from(2, 40)}, {"admit r4 @3"}},
      {ev::submit{spec(40)}, {"admit r5 @4"}},  // a lone request: a client with none in service
      {ev::submit{from(2, 40)}, {"admit r6 @5"}},
      {ev::prefill_load{{0, true, 0, 0}},
       {"prefill p0 r1 e1", "prefill p0 r4 e1", "prefill p0 r5 e1", "prefill p0 r2 e1", "prefill p0 r6 e1",
        "prefill p0 r3 e1"}},
  });
}

TEST_F(RouterCore, LateReportsFromWhereARequestNoLongerIsChangeNothing) {
  make(serving_mode::disaggregated, 2, 2);
  run({
      {ev::submit{spec(40)}, {"admit r1 @0", "prefill p0 r1 e1", "reserve d0 r1 #1"}},
      {ev::reserve_answer{1, 0, 1, ev::reply::granted}, {"ship p0->d0 r1"}},
      // A decoding report from a worker that holds no credits for it is not where it is.
      {ev::worker_state{1, pool_side::decode, D(1), request_state::decoding}, {}, {{1, prefilling_}}},
      // A prefill report from another worker than its attempt's: that KV is wanted nowhere.
      {ev::prefilled{1, 1, false}, {"release p1 r1"}, {{1, prefilling_}}},
      {ev::ship_started{1}, {}},  // not prefilled yet: not shipping either
      {ev::ended{42, request_state::failed, 0}, {}},  // unknown request
  });
}

TEST_F(RouterCore, ViewShowsWhereEachRequestIs) {
  make(serving_mode::disaggregated, 1, 1);
  core->on(ev::submit{spec(40)});
  core->on(ev::submit{spec(40)});
  core->on(ev::reserve_answer{1, 0, 1, ev::reply::granted});
  core->on(ev::prefilled{1, 0, false});
  const router_view v = core->view(10);
  ASSERT_EQ(v.requests.size(), 2u);
  EXPECT_EQ(v.requests[0].state, request_state::transferring);
  EXPECT_EQ(v.requests[0].prefill_worker, 0);
  EXPECT_EQ(v.requests[0].decode_worker, 0);
  EXPECT_EQ(v.requests[1].state, request_state::prefilling);
  EXPECT_EQ(v.requests[1].decode_worker, -1);
  EXPECT_EQ(v.links, 1);
  EXPECT_EQ(v.by_state[size_t(request_state::prefilling)], 1);
}

}  // namespace
}  // namespace tandem::sched
