#pragma once
// What the state-machine tests (test_router_core, test_worker_core) share: a table of rows,
// each an event in, the commands it gives (rendered as text by the test's `show`, so that a
// table reads as a trace) and the phases of some requests after it; and a counter's total.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "runtime/metrics.h"
#include "runtime/request_types.h"

namespace tandem::testing {

template <class Event, class Phase>
struct trace_row {
  Event in;
  std::vector<std::string> out;  // commands, in order
  std::vector<std::pair<request_id, std::optional<Phase>>> after;  // nullopt: forgotten (may be left out)
};

// Feeds each row's event to `core` (`on(event) -> commands`, `find(id) -> entry*` with
// `current()`) and checks its commands and the phases after it, naming the row that differs.
template <class Core, class Event, class Phase, class Show>
void run_trace(Core& core, const std::vector<trace_row<Event, Phase>>& rows, Show show) {
  for (size_t i = 0; i < rows.size(); ++i) {
    std::vector<std::string> got;
    for (const auto& c : core.on(rows[i].in)) got.push_back(show(c));
    EXPECT_EQ(got, rows[i].out) << "row " << i;
    for (const auto& [id, ph] : rows[i].after) {
      const auto* e = core.find(id);
      if (!ph) {
        EXPECT_EQ(e, nullptr) << "row " << i << ": r" << id << " should be forgotten";
      } else if (!e) {
        ADD_FAILURE() << "row " << i << ": r" << id << " is gone, expected " << to_string(*ph);
      } else {
        EXPECT_EQ(to_string(e->current()), to_string(*ph)) << "row " << i << ": r" << id;
      }
    }
  }
}

// A counter's value summed over its labels (0 when it was never counted).
inline double counter_total(const metrics::registry& m, const std::string& name) {
  const auto j = nlohmann::json::parse(m.to_json());
  double sum = 0;
  if (j["counters"].contains(name))
    for (const auto& s : j["counters"][name]) sum += s["value"].get<double>();
  return sum;
}

}  // namespace tandem::testing
