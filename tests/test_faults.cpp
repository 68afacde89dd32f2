// The fault seam: no_faults() never injects; an injector answers each hook from its armed
// counts, once per armed fault, and counts what it injected.
#include <gtest/gtest.h>

#include "runtime/fault_injection.h"

using namespace tandem;
using namespace std::chrono_literals;

namespace {

fault_hooks::blocks one_block() {
  auto v = std::make_shared<std::vector<kv_block_export>>(1);
  (*v)[0].payload = {1.0f, 2.0f, 3.0f, 4.0f};
  return v;
}

}  // namespace

TEST(Faults, NoFaultsInjectsNothing) {
  auto h = no_faults();
  ASSERT_TRUE(h);
  EXPECT_EQ(h, no_faults());  // one shared instance
  const auto kv = one_block();
  EXPECT_EQ(h->step_stall(), 0ms);
  EXPECT_FALSE(h->refuse_reservation());
  EXPECT_EQ(h->land(kv), kv);
  EXPECT_FALSE(h->lose_piece());
  EXPECT_EQ(h->hold_back(), 0ms);
  EXPECT_EQ(h->block_link(), 0ms);
}

TEST(Faults, EachArmedFaultIsMetOnceAtItsHook) {
  auto metrics = std::make_shared<metrics::registry>();
  fault_injector f(metrics);
  f.set_stall(250ms);
  const struct {
    fault_kind kind;
    std::function<bool(fault_hooks&)> met;  // the hook answered "inject"
  } table[] = {
      {fault_kind::stall, [](fault_hooks& h) { return h.step_stall() == 250ms; }},
      {fault_kind::fail_alloc, [](fault_hooks& h) { return h.refuse_reservation(); }},
      {fault_kind::drop_kv, [](fault_hooks& h) { return h.lose_piece(); }},
      {fault_kind::delay_kv, [](fault_hooks& h) { return h.hold_back() == 250ms; }},
      {fault_kind::stall_link, [](fault_hooks& h) { return h.block_link() == 250ms; }},
      {fault_kind::corrupt_kv,
       [](fault_hooks& h) {
         const auto kv = one_block();
         const auto landed = h.land(kv);
         if (landed == kv) return false;
         EXPECT_EQ(std::vector<float>((*kv)[0].payload.begin(), (*kv)[0].payload.end()),
                   (std::vector<float>{1, 2, 3, 4}))
             << "the sender's own set is never damaged";
         return landed->size() == 1 && (*landed)[0].payload != (*kv)[0].payload;
       }},
  };
  for (const auto& row : table) {
    SCOPED_TRACE(to_string(row.kind));
    EXPECT_FALSE(row.met(f)) << "not armed: nothing";
    f.arm(row.kind, 2);
    EXPECT_TRUE(row.met(f));
    EXPECT_TRUE(row.met(f));
    EXPECT_FALSE(row.met(f)) << "both taken";
    EXPECT_EQ(f.armed(row.kind), 0);
    EXPECT_EQ(metrics->get_counter("tandem_faults_injected_total", "", {{"kind", to_string(row.kind)}}).value(), 2.0);
  }
}
