// The worker core without actors: the stop rule per sampled token, and a sequence table driven
// through the steps the prefill, decode and colocated workers run (events in -> state out).
#include <gtest/gtest.h>

#include "runtime/scheduler/worker_core.h"

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
    sequence s;
    s.spec = spec(1, r.prompt, r.max_tokens, r.resumed);
    s.spec.sampling.frequency_penalty = 0.5f;  // keeps its output
    s.generated = r.generated_before;
    s.last = 5;
    const auto o = take_token(s, 99, r.eog, r.n_ctx);
    EXPECT_EQ(o.emit, r.emit);
    EXPECT_EQ(o.index, r.index);
    EXPECT_EQ(o.end, r.end);
    EXPECT_EQ(s.generated, r.generated_before + (r.emit ? 1 : 0));
    EXPECT_EQ(s.last, r.emit ? 99 : 5);
    EXPECT_EQ(s.output.size(), r.emit ? 1u : 0u);
  }
}

struct entry : sequence {
  int handle = 0;  // what a worker keeps beside it (its request actor)
};

// One colocated worker's life: three prompts, chunked, one finishing and decoding, a pause, a
// cancellation in and out of a step.
TEST(WorkerCore, TableThroughPrefillDecodeAndCancellation) {
  sequence_table<entry> t;
  t.add(spec(1, 20));
  t.add(spec(2, 6));
  t.add(spec(3, 6));
  ASSERT_EQ(t.waiting(), (std::deque<request_id>{1, 2, 3}));
  EXPECT_EQ(t.waiting_load().tokens, 32);
  EXPECT_EQ(t.waiting_load().requests, 3);

  // Step 1: 16 of r1's prompt, all of r2's (r2 samples token 0).
  step_work w;
  EXPECT_TRUE(t.find(1)->announce());
  EXPECT_FALSE(t.find(1)->announce());
  w.chunks.push_back(chunk_item(*t.find(1), {1, 0, 16, false}));
  w.chunks.push_back(chunk_item(*t.find(2), {2, 0, 6, true}));
  EXPECT_EQ(w.chunks[0].tokens.size(), 16u);
  EXPECT_EQ(w.chunks[0].tokens.front(), 10);
  EXPECT_EQ(w.chunks[1].first_index, 0);
  EXPECT_EQ(t.cancel(1), cancel_outcome::after_step);  // in the step: dropped when it returns
  EXPECT_EQ(t.cancel(3), cancel_outcome::now);         // waiting: the worker drops it now
  t.erase(3);
  EXPECT_EQ(t.cancel(3), cancel_outcome::unknown);
  EXPECT_EQ(t.add_decodes(w), 0);  // nothing decodes yet

  const auto held = t.release_step();
  ASSERT_EQ(held, (std::vector<request_id>{1, 2}));
  EXPECT_EQ(t.find(1)->prefilled, 16);
  EXPECT_TRUE(t.find(1)->cancelled);
  t.erase(1);
  entry& r2 = *t.find(2);
  EXPECT_EQ(r2.prefilled, 6);
  t.start_decoding(r2);
  EXPECT_TRUE(t.waiting().empty());
  EXPECT_EQ(take_token(r2, 42, false, 64).end, finish_reason::none);

  // Step 2: r2 decodes from token 42 at index 1; paused, it is skipped.
  step_work w2;
  ASSERT_EQ(t.add_decodes(w2), 1);
  EXPECT_EQ(w2.decodes[0].id, 2u);
  EXPECT_EQ(w2.decodes[0].last, 42);
  EXPECT_EQ(w2.decodes[0].index, 1);
  EXPECT_EQ(t.release_step(), (std::vector<request_id>{2}));
  EXPECT_EQ(t.find(2)->prefilled, 6);  // decoding: its prompt figure stays
  EXPECT_TRUE(t.pause(2, true));
  step_work w3;
  EXPECT_EQ(t.add_decodes(w3), 0);
  EXPECT_FALSE(t.pause(7, true));
}

// A migrated request on a prefill or colocated worker: its prompt ends with the output made so
// far; the last chunk samples the next index with that output for its penalties.
TEST(WorkerCore, MigratedRequestGoesOnFromItsResumedOutput) {
  sequence_table<entry> t;
  auto s = spec(5, 9, 8, 3);
  s.sampling.presence_penalty = 0.3f;
  s.sampling.repetition_penalty = 1.1f;
  entry& e = t.add(std::move(s));
  EXPECT_EQ(e.generated, 3);
  EXPECT_EQ(e.output, (std::vector<token_id>{16, 17, 18}));
  ASSERT_TRUE(e.penalty_prompt);
  EXPECT_EQ(e.penalty_prompt->size(), 9u);
  const auto first = chunk_item(e, {5, 0, 4, false});
  EXPECT_TRUE(first.output.empty());  // only the last chunk samples
  step_returned(e);
  const auto last = chunk_item(e, {5, 4, 5, true});
  EXPECT_EQ(last.first_index, 3);
  EXPECT_EQ(last.output, (std::vector<token_id>{16, 17, 18}));
  EXPECT_EQ(last.tokens, (std::vector<token_id>{14, 15, 16, 17, 18}));
  step_returned(e);
  EXPECT_EQ(e.prefilled, 9);
  EXPECT_EQ(take_token(e, 7, false, 64).index, 3);
}

// A prompt waiting for blocks another prompt computes counts only the rest as its load.
TEST(WorkerCore, WaitingLoadCountsExpectedReuse) {
  sequence_table<entry> t;
  t.add(spec(1, 40)).reuse.expected_reuse = 32;
  entry& b = t.add(spec(2, 40));
  b.seq = 9;  // started: what it has is prefilled, not expected
  b.prefilled = 16;
  b.reuse.expected_reuse = 32;
  EXPECT_EQ(t.waiting_load().tokens, 8 + 24);
  // Added again (a retried prefill of the same id): one entry, one place in the queue.
  t.add(spec(2, 40));
  EXPECT_EQ(t.waiting().size(), 2u);
  EXPECT_EQ(t.size(), 2u);
}

}  // namespace
}  // namespace tandem::sched
