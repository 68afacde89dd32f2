#pragma once
// Waiting in tests for something that happens on another thread: poll a predicate, with a short
// backoff, until it holds or a deadline passes. Use it where a test would otherwise loop
// "check; sleep; until a deadline" by hand, with an assertion saying what did not happen:
//
//   ASSERT_TRUE(eventually([&] { return p.stats().live_requests == 0; })) << "requests still live";
//
// A fixed sleep stays in a test only where there is no event to wait on (time that must pass
// for a timeout to fire, a load generator's pacing); it then says why in a comment.
#include <algorithm>
#include <chrono>
#include <optional>
#include <thread>
#include <type_traits>
#include <utility>

namespace tandem::testing_support {

using namespace std::chrono_literals;

// Calls `p` until it returns true or `timeout` has passed; returns its last result (false: the
// deadline passed). It is called at least once, and once more after the deadline when the last
// call before it was false. Between calls it sleeps `poll`, doubling up to `max_poll` (pass
// max_poll = poll for a fixed interval, e.g. to catch a short-lived state).
template <class Predicate>
bool eventually(Predicate&& p, std::chrono::milliseconds timeout = 10s, std::chrono::milliseconds poll = 1ms,
                std::chrono::milliseconds max_poll = 32ms) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  max_poll = std::max(max_poll, poll);
  for (;;) {
    if (p()) return true;
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return false;
    std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(poll, deadline - now));
    poll = std::min(poll * 2, max_poll);
  }
}

// As eventually(), for a function that returns std::optional<T>: its first engaged result, or
// std::nullopt when the deadline passed without one.
template <class Function>
auto eventually_value(Function&& f, std::chrono::milliseconds timeout = 10s, std::chrono::milliseconds poll = 1ms,
                      std::chrono::milliseconds max_poll = 32ms) -> std::invoke_result_t<Function&> {
  std::invoke_result_t<Function&> out;
  eventually([&] { return (out = f()).has_value(); }, timeout, poll, max_poll);
  return out;
}

}  // namespace tandem::testing_support
