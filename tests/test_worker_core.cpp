// The worker core without actors: the stop rule per sampled token, and the prefill, decode and
// colocated workers' requests as tables of (event in -> commands out, phases after), one per
// lifecycle and recovery path the kill, fault and chaos tests exercise end to end.
#include <gtest/gtest.h>

#include <deque>
#include <optional>
#include <set>
#include <sstream>

#include "runtime/scheduler/worker_core.h"
#include "tests/support/trace_table.h"

namespace tandem::sched {
namespace {

request_spec spec(request_id id, int32_t prompt_tokens, int32_t max_tokens = 8, int32_t resumed = 0) {
  request_spec s;
  s.id = id;
  for (int32_t i = 0; i < prompt_tokens; ++i) s.prompt.push_back(10 + i);
  s.max_tokens = max_tokens;
  s.resumed = resumed;
  return s;
}

struct stop_row {
  const char* what;
  int32_t prompt, resumed, max_tokens, n_ctx, generated_before;
  bool eog;
  bool emit;
  int32_t index;
  finish_reason end;
};

TEST(WorkerCore, OneStopRuleForEverySampledToken) {
  const stop_row rows[] = {
      {"first token, room left", 4, 0, 8, 64, 0, false, true, 0, finish_reason::none},
      {"a stop token is not output", 4, 0, 8, 64, 3, true, false, 3, finish_reason::stop},
      {"max_tokens reached: output, then length", 4, 0, 8, 64, 7, false, true, 7, finish_reason::length},
      {"max_tokens 1", 4, 0, 1, 64, 0, false, true, 0, finish_reason::length},
      {"prompt of n_ctx - 1: token 0 goes on", 63, 0, 8, 64, 0, false, true, 0, finish_reason::none},
      {"prompt of n_ctx - 1: token 1 is the last", 63, 0, 8, 64, 1, false, true, 1, finish_reason::length},
      {"prompt of exactly n_ctx: its one token", 64, 0, 8, 64, 0, false, true, 0, finish_reason::length},
      {"migrated: goes on from its resumed tokens", 7, 3, 8, 64, 3, false, true, 3, finish_reason::none},
      {"migrated: max_tokens counts the resumed ones", 7, 3, 4, 64, 3, false, true, 3, finish_reason::length},
      {"migrated near the edge: the context counts the original prompt", 66, 3, 8, 64, 3, false, true, 3,
       finish_reason::length},
      {"stop beats length", 4, 0, 1, 64, 0, true, false, 0, finish_reason::stop},
  };
  for (const auto& r : rows) {
    SCOPED_TRACE(r.what);
    auto s = spec(1, r.prompt, r.max_tokens, r.resumed);
    s.sampling.frequency_penalty = 0.5f;  // keeps its output
    int32_t generated = r.generated_before;
    std::vector<token_id> output;
    token_id last = 5;
    const auto o = take_token(s, generated, output, last, 99, r.eog, r.n_ctx);
    EXPECT_EQ(o.emit, r.emit);
    EXPECT_EQ(o.index, r.index);
    EXPECT_EQ(o.end, r.end);
    EXPECT_EQ(generated, r.generated_before + (r.emit ? 1 : 0));
    EXPECT_EQ(last, r.emit ? 99 : 5);
    EXPECT_EQ(output.size(), r.emit ? 1u : 0u);
  }
}

// ---- the tables ----

namespace wk = worker;
constexpr token_id eos = 2;

// Commands as short text, so that a table reads as a trace.
std::string show(const wk::command& c) {
  std::ostringstream o;
  std::visit(
      [&](const auto& x) {
        using C = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<C, wk::cmd::answer>) o << "answer #" << x.ticket << " " << x.outcome.to_string();
        else if constexpr (std::is_same_v<C, wk::cmd::ask_store>) o << "store? #" << x.ask << " " << x.keys.size();
        else if constexpr (std::is_same_v<C, wk::cmd::start_step>) {
          o << "step";
          for (auto s : x.work.frees) o << " -s" << s;
          for (const auto& im : x.work.imports) {
            o << " +r" << im.id << "@" << im.index;
            if (!im.feed.empty()) o << " feed " << im.feed.size();
          }
          for (const auto& d : x.work.decodes) o << " r" << d.id << "@" << d.index;
          for (const auto& c : x.work.chunks) o << " p" << c.id << ":" << c.tokens.size() << (c.last ? "!" : "");
          for (auto [id, link] : x.streams) o << " ~r" << id << ">l" << link;
        } else if constexpr (std::is_same_v<C, wk::cmd::token>)
          o << "token r" << x.id << " #" << x.index << " " << x.tok;
        else if constexpr (std::is_same_v<C, wk::cmd::done>) o << "done r" << x.id << " " << to_string(x.reason);
        else if constexpr (std::is_same_v<C, wk::cmd::fail>) o << "fail r" << x.id << " " << to_string(x.code);
        else if constexpr (std::is_same_v<C, wk::cmd::tell_request>)
          o << "request r" << x.id << " " << to_string(x.state) << " " << x.cached_tokens;
        else if constexpr (std::is_same_v<C, wk::cmd::tell_router>)
          o << "router r" << x.id << " " << to_string(x.state);
        else if constexpr (std::is_same_v<C, wk::cmd::publish>) o << "publish s" << x.seq << " from " << x.from_block;
        else if constexpr (std::is_same_v<C, wk::cmd::report_load>) o << "load";
        else if constexpr (std::is_same_v<C, wk::cmd::forget>) o << "forget r" << x.id;
        else if constexpr (std::is_same_v<C, wk::cmd::prefilled>)
          o << "prefilled r" << x.id << (x.finished ? " finished" : "");
        else if constexpr (std::is_same_v<C, wk::cmd::ship_started>) o << "ship r" << x.id;
        else if constexpr (std::is_same_v<C, wk::cmd::transfer>)
          o << "transfer r" << x.id << " l" << x.link << " kv " << x.kv->size() << " +" << x.generated.size();
        else if constexpr (std::is_same_v<C, wk::cmd::transfer_failed>)
          o << "transfer failed r" << x.id << " e" << x.epoch << " l" << x.link;
        else static_assert(sizeof(C) == 0, "a command without a rendering");
      },
      c);
  return o.str();
}

// n KV blocks tagged as request `id`'s, of prefill attempt `epoch` (n = 0: a streamed set's
// closing message).
kv_blocks_ptr blocks(request_id id, uint32_t epoch, int n) {
  auto v = std::make_shared<std::vector<kv_block_export>>(size_t(n));
  for (auto& b : *v) {
    b.request = id;
    b.epoch = epoch;
  }
  return v;
}

request_spec attempt(request_id id, int32_t prompt_tokens, uint32_t epoch = 1) {
  auto s = spec(id, prompt_tokens);
  s.epoch = epoch;
  return s;
}

using trow = testing::trace_row<wk::event, wk::phase>;

// An engine as the core sees it: blocks by count, prefix reuse by what a test sets.
struct fake_engine : engine_port {
  bool prefix = false;
  int32_t free = 100;  // available blocks
  int32_t cached = 0;  // prompt tokens its cache holds of any prompt
  std::set<request_id> blocked;  // prompts that wait for another's next block
  int32_t blocked_reuse = 0;  // ... and what they will find then
  seq_id next_seq = 1;
  mutable int exports = 0;  // whole sets exported again
  int cached_blocks = 0;  // blocks from the store it was given

  bool prefix_cache() const override { return prefix; }
  int32_t cached_prefix_tokens(std::span<const token_id>) const override { return cached; }
  void cache_blocks(std::span<const block_key>, const std::vector<kv_block_export>& b) override {
    cached_blocks += int(b.size());
  }
  seq_id start_prompt(request_id id, std::span<const token_id>, prefix_claims&, int32_t& reused) override {
    reused = blocked.count(id) ? blocked_reuse : cached;
    return blocked.count(id) ? 0 : next_seq++;
  }
  int32_t available_blocks() const override { return free; }
  int32_t blocks_needed(seq_id, int32_t tokens) const override { return (tokens + 15) / 16; }
  int32_t blocks_freed_by(seq_id) const override { return 0; }
  kv_blocks_ptr export_all(seq_id, request_id id, uint32_t epoch) const override {
    ++exports;
    return blocks(id, epoch, 3);
  }
};

class WorkerCoreTable : public ::testing::Test {
 protected:
  void make(int32_t total_blocks = 64, int32_t max_batch = 4, double local_prefill_ms = 0,
            worker_kind kind = worker_kind::decode) {
    wk::config c;
    c.kind = kind;
    c.token_budget = budget;
    c.chunk_size = chunk;
    c.stream_kv = true;
    c.n_ctx = 256;
    c.block_size = 16;
    c.total_blocks = total_blocks;
    c.max_batch = max_batch;
    c.prefix_salt = 7;
    c.store = store;
    c.local_prefill_target_ms = local_prefill_ms;
    c.prefill_token_budget = 256;
    c.ends_generation = [](const request_spec&, token_id t) { return t == eos; };
    c.faults = faults;
    c.metrics = &metrics;
    core = std::make_unique<worker_core>(c, &eng);
  }
  // A step's result: imports (id, engine sequence, outcome), then tokens (id, token).
  wk::ev::step_returned returned(std::vector<step_result::imported> imports,
                                 std::vector<std::pair<request_id, token_id>> tokens, status error = {}) {
    return returned_prompts({}, std::move(tokens), {}, std::move(error), std::move(imports));
  }
  // ... of prompts: the sequences it created, tokens, the KV sets it exported (3 blocks each).
  wk::ev::step_returned returned_prompts(std::vector<step_result::created> created,
                                         std::vector<std::pair<request_id, token_id>> tokens,
                                         std::vector<request_id> exported = {}, status error = {},
                                         std::vector<step_result::imported> imports = {}) {
    auto& r = *results.emplace_back(std::make_unique<step_result>());
    r.error = std::move(error);
    r.imports = std::move(imports);
    r.created_seqs = std::move(created);
    for (request_id id : exported) r.exports.push_back({id, blocks(id, 1, 3)});
    for (auto [id, t] : tokens) r.tokens.push_back({id, t, 0, nullptr});
    r.batch_tokens = int32_t(r.tokens.size());
    r.ms = 5;
    return {&r};
  }
  // Request 1 streams to its decode worker over link 1 as its prompt computes (the worker was
  // reserved first); its closing transfer is in flight after token 0.
  std::vector<trow> streamed_and_shipped() {
    return {
        {wk::ev::prompt{attempt(1, 40)}, {}},
        {wk::ev::ship{1, 1}, {}},
        {wk::ev::plan{}, {"request r1 prefilling 0", "step p1:40! ~r1>l1"}},
        {returned_prompts({{1, 5}}, {{1, 42}}),
         {"token r1 #0 42", "prefilled r1", "ship r1", "transfer r1 l1 kv 0 +1"}},
    };
  }
  void run(const std::vector<trow>& rows) {
    testing::run_trace(*core, rows, [](const wk::command& c) { return show(c); });
  }
  double counter(const std::string& name) { return testing::counter_total(metrics, name); }

  std::shared_ptr<fault_injector> faults = std::make_shared<fault_injector>();
  metrics::registry metrics;
  std::deque<std::unique_ptr<step_result>> results;
  std::unique_ptr<worker_core> core;
  fake_engine eng;
  int32_t budget = 64, chunk = 64;  // prompt tokens per step, per chunk
  bool store = true;
};

constexpr auto reserved_ = wk::phase::reserved;
constexpr auto fetching_ = wk::phase::fetching;
constexpr auto arriving_ = wk::phase::arriving;
constexpr auto importing_ = wk::phase::importing;
constexpr auto decoding_ = wk::phase::decoding;
constexpr auto leased_ = wk::phase::leased;
constexpr auto shipping_ = wk::phase::shipping;
constexpr auto waiting_ = wk::phase::waiting;
constexpr auto prefetching_ = wk::phase::fetching;
constexpr auto prefilling_ = wk::phase::prefilling;
constexpr std::nullopt_t gone = std::nullopt;

// Streamed while it prefilled, closed by the transfer with token 0, imported, decoded to its
// stop token; its blocks go to the store and are freed at the next step.
TEST_F(WorkerCoreTable, StreamedRequestLifecycle) {
  make();
  run({
      {wk::ev::reserve{1, 1, 48}, {"load", "answer #1 ok"}, {{1, reserved_}}},
      {wk::ev::kv_piece{1, 1, blocks(1, 1, 2)}, {}, {{1, reserved_}}},
      {wk::ev::transfer{2, attempt(1, 40), blocks(1, 1, 0), {42}}, {}, {{1, arriving_}}},
      {wk::ev::plan{}, {"step +r1@1"}, {{1, importing_}}},
      {returned({{1, 5, {}}}, {{1, 43}}),
       {"answer #2 ok", "request r1 decoding 0", "router r1 decoding", "token r1 #1 43"},
       {{1, decoding_}}},
      {wk::ev::plan{}, {"step r1@2"}},
      {wk::ev::plan{}, {}},  // one step at a time
      {returned({}, {{1, eos}}), {"done r1 stop", "publish s5 from 2", "forget r1"}, {{1, gone}}},
      {wk::ev::plan{}, {"step -s5"}},
  });
  EXPECT_EQ(core->ledger().free_blocks(), 64);
}

// Refusals say why (the router tells a refusal from no answer by the code), and only a
// reservation that was taken or refused for credits sends a fresh load report.
TEST_F(WorkerCoreTable, ReservationsAreRefusedWithWhy) {
  make(8, 2);
  run({
      {wk::ev::reserve{1, 1, 64}, {"load", "answer #1 ok"}, {{1, reserved_}}},
      {wk::ev::reserve{2, 2, 80},
       {"load", "answer #2 refused: not enough free KV blocks: 5 needed, 4 free"},
       {{2, gone}}},
      {wk::ev::reserve{3, 3, 16}, {"load", "answer #3 ok"}},
      {wk::ev::reserve{4, 4, 16}, {"answer #4 refused: the decode batch is full (2 sequences)"}, {{4, gone}}},
      {wk::ev::reserve{5, 1, 64}, {"load", "answer #5 ok"}},  // held already: a redelivery
  });
  faults->arm(fault_kind::fail_alloc, 1);  // chaos fail_alloc: as if the pool were full
  run({
      {wk::ev::reserve{6, 3, 16}, {"load", "answer #6 refused: fault injected: fail_alloc"}},
      {wk::ev::reserve{7, 3, 16}, {"load", "answer #7 ok"}},
  });
}

// A transfer is checked before it waits for a step: its reservation (gone when the router
// cancelled or moved the request on), its parts, and that every block is this attempt's.
TEST_F(WorkerCoreTable, TransfersOfNoReservationOrAnotherAttemptAreRefused) {
  make();
  run({
      {wk::ev::transfer{1, attempt(1, 40), blocks(1, 1, 3), {42}},
       {"answer #1 refused: no reservation for request 1 (cancelled, or moved on)"},
       {{1, gone}}},
      {wk::ev::reserve{2, 1, 48}, {"load", "answer #2 ok"}},
      {wk::ev::transfer{3, attempt(1, 40), nullptr, {42}},
       {"answer #3 invalid_argument: an arrival needs its KV and its first token"},
       {{1, reserved_}}},
      {wk::ev::transfer{4, attempt(1, 40, 2), blocks(1, 1, 3), {42}},
       {"answer #4 incompatible_kv: KV blocks of another request or prefill attempt"},
       {{1, reserved_}}},
      {wk::ev::transfer{5, attempt(1, 40), blocks(2, 1, 3), {42}},
       {"answer #5 incompatible_kv: KV blocks of another request or prefill attempt"},
       {{1, reserved_}}},
      {wk::ev::transfer{6, attempt(1, 40), blocks(1, 1, 3), {42}}, {}, {{1, arriving_}}},
  });
}

// Chaos drop_kv and corrupt_kv: an incomplete or corrupted set is refused at import; the
// reservation stays, and the prefill side's retry (the whole set again) imports.
TEST_F(WorkerCoreTable, RefusedImportKeepsTheReservationForTheRetry) {
  make();
  run({
      {wk::ev::reserve{1, 1, 48}, {"load", "answer #1 ok"}},
      {wk::ev::transfer{2, attempt(1, 40), blocks(1, 1, 3), {42}}, {}, {{1, arriving_}}},
      {wk::ev::plan{}, {"step +r1@1"}},
      {returned({}, {}), {"answer #2 incompatible_kv: the KV block set of request 1 was incomplete"}, {{1, reserved_}}},
      {wk::ev::transfer{3, attempt(1, 40), blocks(1, 1, 3), {42}}, {}, {{1, arriving_}}},
      {wk::ev::plan{}, {"step +r1@1"}},
      {returned({{1, 0, {errc::checksum_mismatch, "block 2"}}}, {}),
       {"answer #3 checksum_mismatch: block 2"},
       {{1, reserved_}}},
      {wk::ev::transfer{4, attempt(1, 40), blocks(1, 1, 3), {42}}, {}, {{1, arriving_}}},
      {wk::ev::plan{}, {"step +r1@1"}},
      {returned({{1, 6, {}}}, {{1, 50}}),
       {"answer #4 ok", "request r1 decoding 0", "router r1 decoding", "token r1 #1 50"},
       {{1, decoding_}}},
  });
  EXPECT_EQ(counter("tandem_kv_imports_refused_total"), 2);
}

// A second try of a transfer (its first link died, the router shipped it again) while the first
// waits or imports gets the first's outcome; one after the import is answered at once.
TEST_F(WorkerCoreTable, DuplicateTriesGetTheFirstTrysOutcome) {
  make();
  run({
      {wk::ev::reserve{1, 1, 48}, {"load", "answer #1 ok"}},
      {wk::ev::transfer{2, attempt(1, 40), blocks(1, 1, 3), {42}}, {}, {{1, arriving_}}},
      {wk::ev::transfer{3, attempt(1, 40), blocks(1, 1, 3), {42}}, {}, {{1, arriving_}}},
      {wk::ev::plan{}, {"step +r1@1"}},
      {wk::ev::transfer{4, attempt(1, 40), blocks(1, 1, 3), {42}}, {}, {{1, importing_}}},
      {returned({{1, 5, {}}}, {{1, 50}}),
       {"answer #2 ok", "answer #3 ok", "answer #4 ok", "request r1 decoding 0", "router r1 decoding",
        "token r1 #1 50"}},
      {wk::ev::transfer{5, attempt(1, 40), blocks(1, 1, 3), {42}}, {"answer #5 ok"}, {{1, decoding_}}},
  });
}

// Streamed pieces are staged by prefill attempt: an older attempt's are dropped, a newer one's
// replace them; the closing message completes them, a whole set supersedes them.
TEST_F(WorkerCoreTable, StreamedPiecesAreStagedByAttempt) {
  make();
  run({
      {wk::ev::kv_piece{9, 1, blocks(9, 1, 1)}, {}, {{9, gone}}},  // no reservation: stale
      {wk::ev::reserve{1, 1, 48}, {"load", "answer #1 ok"}},
      {wk::ev::kv_piece{1, 2, blocks(1, 2, 1)}, {}},
      {wk::ev::kv_piece{1, 1, blocks(1, 1, 1)}, {}},  // from the attempt that died
      {wk::ev::kv_piece{1, 3, blocks(1, 3, 2)}, {}},
      {wk::ev::kv_piece{1, 3, blocks(1, 3, 1)}, {}},
      {wk::ev::transfer{2, attempt(1, 40, 3), blocks(1, 3, 0), {42}}, {}, {{1, arriving_}}},
      {wk::ev::reserve{3, 2, 48}, {"load", "answer #3 ok"}},
      {wk::ev::kv_piece{2, 1, blocks(2, 1, 2)}, {}},
      {wk::ev::transfer{4, attempt(2, 40), blocks(2, 1, 3), {42}}, {}, {{2, arriving_}}},
  });
  EXPECT_EQ(std::get<wk::arriving>(core->find(1)->where).kv.size(), 3u);  // two pieces and the close
  EXPECT_EQ(std::get<wk::arriving>(core->find(2)->where).kv.size(), 1u);  // the whole set alone
}

// Cancellation in every phase frees everything: credits at once, or the engine's sequence at
// the next step (a cancelled import is not announced as decoding: the router moved it on).
TEST_F(WorkerCoreTable, CancellationInEveryPhase) {
  make();
  run({
      {wk::ev::reserve{1, 1, 48}, {"load", "answer #1 ok"}},
      {wk::ev::cancel{1}, {"forget r1", "load"}, {{1, gone}}},
      {wk::ev::cancel{1}, {"load"}},  // unknown: nothing to do
      {wk::ev::reserve{2, 2, 48}, {"load", "answer #2 ok"}},
      {wk::ev::transfer{3, attempt(2, 40), blocks(2, 1, 3), {42}}, {}},
      {wk::ev::cancel{2},
       {"answer #3 refused: request 2 was cancelled while its KV arrived", "forget r2", "load"},
       {{2, gone}}},
      {wk::ev::reserve{4, 3, 48}, {"load", "answer #4 ok"}},
      {wk::ev::transfer{5, attempt(3, 40), blocks(3, 1, 3), {42}}, {}},
      {wk::ev::plan{}, {"step +r3@1"}},
      {wk::ev::cancel{3}, {"load"}, {{3, importing_}}},
      {returned({{3, 7, {}}}, {{3, 50}}), {"answer #5 ok", "publish s7 from 2", "forget r3"}, {{3, gone}}},
      {wk::ev::reserve{6, 4, 48}, {"load", "answer #6 ok"}},
      {wk::ev::transfer{7, attempt(4, 40), blocks(4, 1, 3), {42}}, {}},
      {wk::ev::plan{}, {"step -s7 +r4@1"}},
      {returned({{4, 8, {}}}, {{4, 50}}),
       {"answer #7 ok", "request r4 decoding 0", "router r4 decoding", "token r4 #1 50"}},
      {wk::ev::pause{4, true}, {}},
      {wk::ev::plan{}, {}},  // paused: skipped
      {wk::ev::cancel{4}, {"publish s8 from 2", "forget r4", "load"}, {{4, gone}}},
      {wk::ev::reserve{8, 5, 48}, {"load", "answer #8 ok"}},
      {wk::ev::transfer{9, attempt(5, 40), blocks(5, 1, 3), {42}}, {}},
      {wk::ev::plan{}, {"step -s8 +r5@1"}},
      {returned({{5, 9, {}}}, {{5, 50}}),
       {"answer #9 ok", "request r5 decoding 0", "router r5 decoding", "token r5 #1 50"}},
      {wk::ev::plan{}, {"step r5@2"}},
      {wk::ev::cancel{5}, {"load"}, {{5, decoding_}}},  // in the step: dropped when it returns
      {returned({}, {{5, 51}}), {"publish s9 from 2", "forget r5"}, {{5, gone}}},
      {wk::ev::plan{}, {"step -s9"}},
  });
  EXPECT_EQ(core->ledger().free_blocks(), 64);
  EXPECT_EQ(core->holding(), 0);
}

// A step that fails (credits make it unreachable in normal operation) ends its requests clearly.
TEST_F(WorkerCoreTable, FailedStepEndsItsRequests) {
  make();
  run({
      {wk::ev::reserve{1, 1, 48}, {"load", "answer #1 ok"}},
      {wk::ev::transfer{2, attempt(1, 40), blocks(1, 1, 3), {42}}, {}},
      {wk::ev::plan{}, {"step +r1@1"}},
      {returned({{1, 5, {}}}, {{1, 50}}),
       {"answer #2 ok", "request r1 decoding 0", "router r1 decoding", "token r1 #1 50"}},
      {wk::ev::plan{}, {"step r1@2"}},
      {returned({}, {}, {errc::out_of_kv_blocks, "no room"}),
       {"fail r1 out_of_kv_blocks", "publish s5 from 2", "forget r1"},
       {{1, gone}}},
  });
}

// Straight from the store: the store's blocks and the prompt's tail (at most two blocks, or
// what the slack allows) are computed here; too little in the store is refused (the router
// prefills it); a fetch cancelled while the store is asked is refused when the answer comes.
TEST_F(WorkerCoreTable, PromptsStraightFromTheStore) {
  make();
  run({
      {wk::ev::reserve{1, 1, 48}, {"load", "answer #1 ok"}},
      {wk::ev::fetch{2, attempt(1, 40)}, {"store? #1 2"}, {{1, fetching_}}},
      {wk::ev::store_answer{1, blocks(0, 0, 2)}, {"request r1 prefilling 32"}, {{1, arriving_}}},
      {wk::ev::fetch{3, attempt(1, 40)}, {"answer #3 ok"}},  // here already
      {wk::ev::plan{}, {"step +r1@0 feed 8"}},
      {returned({{1, 4, {}}}, {{1, 60}}),
       {"answer #2 ok", "request r1 decoding 0", "router r1 decoding", "token r1 #0 60"},
       {{1, decoding_}}},
      {wk::ev::reserve{4, 2, 96}, {"load", "answer #4 ok"}},
      {wk::ev::fetch{5, attempt(2, 80)}, {"store? #2 4"}},
      {wk::ev::fetch{6, attempt(2, 80)}, {}},  // asked already: answered alike
      {wk::ev::store_answer{2, blocks(0, 0, 1)},
       {"answer #5 refused: the store holds 1 of the prompt's 4 blocks; 64 tokens are more than this worker computes "
        "now (32)",
        "answer #6 refused: the store holds 1 of the prompt's 4 blocks; 64 tokens are more than this worker computes "
        "now (32)"},
       {{2, reserved_}}},
      {wk::ev::fetch{7, attempt(3, 40)}, {"answer #7 refused: no reservation for request 3"}, {{3, gone}}},
      {wk::ev::reserve{8, 4, 48}, {"load", "answer #8 ok"}},
      {wk::ev::fetch{9, attempt(4, 1)}, {"answer #9 invalid_argument: a fetched prompt has two tokens or more"}},
      {wk::ev::fetch{10, attempt(4, 40)}, {"store? #3 2"}},
      {wk::ev::cancel{4}, {"forget r4", "load"}},
      {wk::ev::store_answer{3, blocks(0, 0, 2)},
       {"answer #10 refused: request 4 was cancelled while the store was asked"}},
      {wk::ev::store_answer{3, blocks(0, 0, 2)}, {}},  // answered once
  });
  EXPECT_EQ(counter("tandem_prefix_cache_hit_tokens_total"), 32);
  EXPECT_EQ(counter("tandem_prompt_tokens_computed_total"), 8);
}

// Auto mode: the prompt tokens it may compute are its slack over its fitted cost (two blocks
// before it has measured any), and after computing a prompt it reports afresh.
TEST_F(WorkerCoreTable, AutoModeReportsAfterComputingAPrompt) {
  make(64, 4, 40);
  EXPECT_EQ(core->decode_load(0).local_prefill_tokens, 32);
  run({
      {wk::ev::reserve{1, 1, 48}, {"load", "answer #1 ok"}},
      {wk::ev::fetch{2, attempt(1, 40)}, {"store? #1 2"}},
      {wk::ev::store_answer{1, nullptr},
       {"answer #2 refused: the store holds 0 of the prompt's 2 blocks; 40 tokens are "
        "more than this worker computes now (32)"}},
      {wk::ev::fetch{3, attempt(1, 40)}, {"store? #2 2"}},
      {wk::ev::store_answer{2, blocks(0, 0, 1)}, {"request r1 prefilling 16"}},
      {wk::ev::plan{}, {"step +r1@0 feed 24"}},
      {returned({{1, 4, {}}}, {{1, 60}}),
       {"answer #3 ok", "request r1 decoding 0", "router r1 decoding", "token r1 #0 60", "load"}},
  });
}

// ---- prompts: prefill and colocated workers ----

// A prefill worker's prompt: streamed to its decode worker as it computes (reserved before it
// finished), leased after token 0 and shipped at once, the lease ending when decode has it; one
// shipped only once the router says where; one that ends with its first token leases nothing.
TEST_F(WorkerCoreTable, PrefillLeaseLifecycle) {
  make(64, 4, 0, worker_kind::prefill);
  run({
      {wk::ev::prompt{attempt(1, 40)}, {}, {{1, waiting_}}},
      {wk::ev::ship{1, 1}, {}, {{1, waiting_}}},  // its decode worker is reserved already
      {wk::ev::plan{}, {"request r1 prefilling 0", "step p1:40! ~r1>l1"}, {{1, prefilling_}}},
      {returned_prompts({{1, 5}}, {{1, 42}}),
       {"token r1 #0 42", "prefilled r1", "ship r1", "transfer r1 l1 kv 0 +1"},
       {{1, shipping_}}},
      {wk::ev::transfer_answer{1, 9, {}}, {}, {{1, shipping_}}},  // over another link: stale
      {wk::ev::transfer_answer{1, 1, {}}, {"forget r1"}, {{1, gone}}},
      {wk::ev::prompt{attempt(2, 40)}, {}},
      {wk::ev::plan{}, {"request r2 prefilling 0", "step -s5 p2:40!"}},
      {returned_prompts({{2, 6}}, {{2, 42}}, {2}), {"token r2 #0 42", "prefilled r2"}, {{2, leased_}}},
      {wk::ev::ship{2, 3}, {"ship r2", "transfer r2 l3 kv 3 +1"}, {{2, shipping_}}},
      {wk::ev::release{2, 2}, {}, {{2, shipping_}}},  // of another attempt
      {wk::ev::release{2, 1}, {"forget r2"}, {{2, gone}}},
      {wk::ev::prompt{[] {
         auto s = attempt(3, 40);
         s.max_tokens = 1;
         return s;
       }()},
       {}},
      {wk::ev::plan{}, {"request r3 prefilling 0", "step -s6 p3:40!"}},
      {returned_prompts({{3, 7}}, {{3, 42}}, {3}),
       {"token r3 #0 42", "done r3 length", "prefilled r3 finished", "forget r3"},
       {{3, gone}}},
      {wk::ev::prompt{attempt(4, 40)}, {}},
      {wk::ev::plan{}, {"request r4 prefilling 0", "step -s7 p4:40!"}},
      {returned_prompts({{4, 8}}, {{4, 42}}, {4}), {"token r4 #0 42", "prefilled r4"}, {{4, leased_}}},
      {wk::ev::cancel{4}, {"forget r4"}, {{4, gone}}},
      {wk::ev::plan{}, {"step -s8"}},
  });
  EXPECT_EQ(eng.exports, 0);
}

// Chaos link and decode kills, drop_kv and corrupt_kv seen from the prefill side: a failed try
// (answered, or its link died) leaves the lease with the whole set to send again, which the next
// ship exports (when the engine is idle: a step in flight holds it until the step returns); a
// link replaced during the last streamed step gets the whole set too.
TEST_F(WorkerCoreTable, PrefillLeaseSurvivesFailedTransfers) {
  make(64, 4, 0, worker_kind::prefill);
  run(streamed_and_shipped());
  run({
      {wk::ev::transfer_answer{1, 1, {errc::checksum_mismatch, "block 1"}},
       {"transfer failed r1 e1 l1"},
       {{1, leased_}}},
      {wk::ev::ship{1, 1}, {"ship r1", "transfer r1 l1 kv 3 +1"}, {{1, shipping_}}},
      {wk::ev::link_down{2}, {}, {{1, shipping_}}},
      {wk::ev::link_down{1}, {"transfer failed r1 e1 l1"}, {{1, leased_}}},
      {wk::ev::ship{1, 2}, {"ship r1", "transfer r1 l2 kv 3 +1"}},  // exported once already
      // A link replaced while the last step streamed to the old one.
      {wk::ev::prompt{attempt(2, 40)}, {}},
      {wk::ev::ship{2, 1}, {}},
      {wk::ev::plan{}, {"request r2 prefilling 0", "step p2:40! ~r2>l1"}},
      {wk::ev::ship{2, 2}, {}, {{2, prefilling_}}},
      {returned_prompts({{2, 6}}, {{2, 42}}), {"token r2 #0 42", "prefilled r2", "ship r2", "transfer r2 l2 kv 3 +1"}},
      // A failed try while a step is in flight: the whole set waits for the engine.
      {wk::ev::prompt{attempt(3, 40)}, {}},
      {wk::ev::plan{}, {"request r3 prefilling 0", "step p3:40!"}},
      {wk::ev::transfer_answer{1, 2, {errc::worker_failed, "its decode worker died"}}, {"transfer failed r1 e1 l2"}},
      {wk::ev::ship{1, 3}, {"ship r1", "transfer r1 l3 kv 3 +1"}},  // its set is exported: no wait
      {wk::ev::prompt{attempt(4, 40)}, {}},
      {wk::ev::transfer_answer{9, 2, {errc::timeout, "no answer"}}, {}},  // no lease: counted only
      {returned_prompts({{3, 7}}, {{3, 42}}, {3}), {"token r3 #0 42", "prefilled r3"}},
      {wk::ev::plan{}, {"request r4 prefilling 0", "step p4:40!"}},
      {wk::ev::ship{4, 1}, {}},  // too late to stream: the whole set goes once it is done
  });
  EXPECT_EQ(eng.exports, 2);
  EXPECT_EQ(counter("tandem_kv_transfer_failures_total"), 4);
  EXPECT_EQ(core->holding(), 4);
}

// The whole set waits for an idle engine when a try failed after streaming (resend-all).
TEST_F(WorkerCoreTable, PrefillReexportWaitsForTheStepInFlight) {
  make(64, 4, 0, worker_kind::prefill);
  run(streamed_and_shipped());
  run({
      {wk::ev::prompt{attempt(2, 40)}, {}},
      {wk::ev::plan{}, {"request r2 prefilling 0", "step p2:40!"}},
      {wk::ev::transfer_answer{1, 1, {errc::incompatible_kv, "a piece was lost"}}, {"transfer failed r1 e1 l1"}},
      {wk::ev::ship{1, 2}, {}, {{1, leased_}}},  // the engine is busy: exported once idle
      {wk::ev::plan{}, {}},
      {returned_prompts({{2, 6}}, {{2, 42}}, {2}), {"token r2 #0 42", "prefilled r2"}},
      {wk::ev::plan{}, {"ship r1", "transfer r1 l2 kv 3 +1"}, {{1, shipping_}}},
  });
  EXPECT_EQ(eng.exports, 1);
}

// A prompt that can never fit the prefill worker's pool fails clearly; a failed step fails
// every prompt in it; a prompt cancelled in a step goes when the step returns.
TEST_F(WorkerCoreTable, PrefillPromptsThatCannotFinish) {
  make(2, 4, 0, worker_kind::prefill);
  eng.free = 2;
  run({
      {wk::ev::prompt{attempt(1, 40)}, {}},
      {wk::ev::plan{}, {"fail r1 out_of_kv_blocks", "forget r1"}, {{1, gone}}},
  });
  eng.free = 3;  // (the pool is the engine's: here what is free now)
  run({
      {wk::ev::prompt{attempt(2, 20)}, {}},
      {wk::ev::prompt{attempt(3, 8)}, {}},
      {wk::ev::plan{}, {"request r2 prefilling 0", "request r3 prefilling 0", "step p2:20! p3:8!"}},
      {wk::ev::cancel{3}, {}, {{3, prefilling_}}},
      {returned_prompts({{2, 5}, {3, 6}}, {}, {}, {errc::internal, "the forward pass failed"}),
       {"fail r2 internal", "forget r2", "forget r3"},
       {{2, gone}, {3, gone}}},
      {wk::ev::plan{}, {"step -s5 -s6"}},
  });
}

// A migrated request's prompt ends with the output made so far: chunked, only its last chunk
// samples, at the next index, with that output for its penalties; decode goes on from all of it.
TEST_F(WorkerCoreTable, MigratedPromptGoesOnFromItsResumedOutput) {
  budget = chunk = 4;
  make(64, 4, 0, worker_kind::prefill);
  auto s = spec(5, 9, 8, 3);
  s.epoch = 1;
  s.sampling.presence_penalty = 0.3f;
  s.sampling.repetition_penalty = 1.1f;
  run({{wk::ev::prompt{s}, {}}});
  auto first = core->on(wk::ev::plan{});
  ASSERT_EQ(first.size(), 2u);
  const auto& c0 = std::get<wk::cmd::start_step>(first[1]).work.chunks.at(0);
  EXPECT_TRUE(c0.output.empty());  // only the last chunk samples
  EXPECT_EQ(c0.tokens, (std::vector<token_id>{10, 11, 12, 13}));
  run({
      {returned_prompts({{5, 1}}, {}), {}},
      {wk::ev::plan{}, {"step p5:4"}},
      {returned_prompts({}, {}), {}},
  });
  EXPECT_EQ(core->waiting_load().tokens, 1);
  auto last = core->on(wk::ev::plan{});
  ASSERT_EQ(last.size(), 1u);
  const auto& c2 = std::get<wk::cmd::start_step>(last[0]).work.chunks.at(0);
  EXPECT_TRUE(c2.last);
  EXPECT_EQ(c2.first_index, 3);
  EXPECT_EQ(c2.output, (std::vector<token_id>{16, 17, 18}));
  ASSERT_TRUE(c2.prompt);
  EXPECT_EQ(c2.prompt->size(), 9u);
  run({
      {returned_prompts({}, {{5, 7}}, {5}), {"token r5 #3 7", "prefilled r5"}, {{5, leased_}}},
      {wk::ev::ship{5, 1}, {"ship r5", "transfer r5 l1 kv 3 +4"}},  // 16, 17, 18 and 7
  });
}

// Prefix reuse: a prompt asks the store for the blocks it lacks and claims them; a prompt like
// it counts them as reuse in its load and waits for them rather than fetch or compute them.
TEST_F(WorkerCoreTable, PromptsFetchTheirPrefixOnceAndAlikePromptsWait) {
  make(64, 4, 0, worker_kind::prefill);
  eng.prefix = true;
  run({
      {wk::ev::prompt{attempt(1, 40)}, {}},
      {wk::ev::plan{}, {"store? #1 2"}, {{1, prefetching_}}},
      {wk::ev::prompt{attempt(2, 40)}, {}, {{2, waiting_}}},
  });
  EXPECT_EQ(core->waiting_load().tokens, 40 + 8);  // the second expects the first's two blocks
  eng.blocked = {2};
  eng.blocked_reuse = 32;
  run({
      {wk::ev::plan{}, {}, {{2, waiting_}}},
      {wk::ev::store_answer{1, blocks(0, 0, 2)}, {}, {{1, waiting_}}},
  });
  eng.cached = 32;  // (the store's blocks, cached before it starts)
  run({
      {wk::ev::plan{}, {"request r1 prefilling 32", "step p1:8!"}, {{1, prefilling_}, {2, waiting_}}},
      {returned_prompts({}, {{1, 42}}, {1}), {"token r1 #0 42", "publish s1 from 2", "prefilled r1"}},
  });
  eng.blocked.clear();
  run({{wk::ev::plan{}, {"request r2 prefilling 32", "step p2:8!"}, {{2, prefilling_}}}});
  EXPECT_EQ(eng.cached_blocks, 2);
}

// A colocated worker's life: prompts chunked under its budget, decodes first; a cancellation in
// and out of a step; a pause; the stop rule.
TEST_F(WorkerCoreTable, ColocatedLifecycle) {
  budget = 22;
  chunk = 16;
  make(64, 4, 0, worker_kind::colocated);
  run({
      {wk::ev::prompt{attempt(1, 20)}, {}},
      {wk::ev::prompt{attempt(2, 6)}, {}},
      {wk::ev::prompt{attempt(3, 6)}, {}, {{3, waiting_}}},
  });
  EXPECT_EQ(core->waiting_load().tokens, 32);
  EXPECT_EQ(core->waiting_load().requests, 3);
  run({
      {wk::ev::plan{},
       {"request r1 prefilling 0", "request r2 prefilling 0", "step p1:16 p2:6!"},
       {{1, prefilling_}, {2, prefilling_}, {3, waiting_}}},
      {wk::ev::cancel{1}, {}, {{1, prefilling_}}},  // in the step: dropped when it returns
      {wk::ev::cancel{3}, {"forget r3"}, {{3, gone}}},
      {wk::ev::cancel{3}, {}},
      {returned_prompts({{1, 1}, {2, 2}}, {{2, 42}}),
       {"forget r1", "request r2 decoding 0", "router r2 decoding", "token r2 #0 42"},
       {{1, gone}, {2, decoding_}}},
      {wk::ev::plan{}, {"step -s1 r2@1"}},
      {wk::ev::pause{2, true}, {}},
      {returned_prompts({}, {{2, 43}}), {"token r2 #1 43"}},
      {wk::ev::plan{}, {}},  // paused: skipped
      {wk::ev::pause{2, false}, {}},
      {wk::ev::plan{}, {"step r2@2"}},
      {returned_prompts({}, {{2, eos}}), {"done r2 stop", "forget r2"}, {{2, gone}}},
      {wk::ev::plan{}, {"step -s2"}},
  });
  EXPECT_EQ(core->ledger().free_blocks(), 64);
}

// A colocated prompt starts only once its whole request's credits are held (in arrival order);
// one that can never fit is refused at once.
TEST_F(WorkerCoreTable, ColocatedPromptsWaitForCredits) {
  make(2, 4, 0, worker_kind::colocated);
  run({
      {wk::ev::prompt{attempt(3, 40)}, {"fail r3 out_of_kv_blocks"}, {{3, gone}}},
      {wk::ev::prompt{attempt(1, 20)}, {}},
      {wk::ev::prompt{attempt(2, 6)}, {}},
      {wk::ev::plan{}, {"request r1 prefilling 0", "step p1:20!"}, {{2, waiting_}}},
      {returned_prompts({{1, 1}}, {{1, 42}}), {"request r1 decoding 0", "router r1 decoding", "token r1 #0 42"}},
      {wk::ev::cancel{1}, {"forget r1"}, {{1, gone}}},
      {wk::ev::plan{}, {"request r2 prefilling 0", "step -s1 p2:6!"}, {{2, prefilling_}}},
  });
}

}  // namespace
}  // namespace tandem::sched
