#pragma once
// What the pipeline tests (test_pipeline_*.cpp) share: the tiny model, prompts made from a
// salt, reading a connection to its end, and the checks that nothing leaked once idle.
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "actors/pipeline.h"
#include "tests/support/eventually.h"
#include "tests/test_models.h"

namespace tandem::testing_support {

inline std::shared_ptr<const model> tiny() {
  static const std::shared_ptr<const model> m = tiny_model("pipeline");
  return m;
}

inline std::vector<token_id> prompt_of(int n, int salt, int vocab) {
  std::vector<token_id> p;
  for (int i = 0; i < n; ++i) p.push_back(token_id(3 + (i * 31 + salt * 17) % (vocab - 3)));
  return p;
}

inline int expected_workers(pipeline& p) {
  const auto& c = p.config().pools;
  return c.mode == serving_mode::colocated ? c.colocated_workers : c.prefill_workers + c.decode_workers;
}

// Reads a connection until every request it carries has ended (or `wait` passes with no
// event): tokens by request, and how each ended (its finish reason, or "error:" and its code).
inline void read_all(connection& c, std::map<request_id, std::vector<token_id>>& got,
                     std::map<request_id, std::string>& ends, std::chrono::milliseconds wait) {
  request_event ev;
  while (c.unfinished() > 0 && c.next(ev, wait)) {
    if (ev.kind == event_kind::token && ev.token >= 0) got[ev.id].push_back(ev.token);
    if (ev.kind == event_kind::done) ends[ev.id] = std::string(to_string(ev.finish_reason));
    if (ev.kind == event_kind::error) ends[ev.id] = "error:" + std::string(to_string(ev.code));
  }
}

// Every pool full again and every request actor gone (both settle shortly after the last event).
inline void expect_no_leaks(pipeline& p) {
  pipeline_stats s;
  const bool settled = eventually([&] {
    s = p.stats();
    // (No workers listed: the router is restarting; look again.)
    bool clean = s.live_requests == 0 && int(s.workers.size()) == expected_workers(p);
    for (const auto& w : s.workers) clean = clean && w.kv_free_blocks == w.kv_total_blocks && w.reserved_blocks == 0;
    return clean;
  });
  if (settled) return;
  // Not within 10 s: what the last stats seen still show held.
  EXPECT_EQ(s.live_requests, 0);
  EXPECT_EQ(int(s.workers.size()), expected_workers(p)) << "workers missing";
  for (const auto& w : s.workers) {
    EXPECT_EQ(w.kv_free_blocks, w.kv_total_blocks) << w.name;
    EXPECT_EQ(w.reserved_blocks, 0) << w.name;
  }
}

// Issue 22 item 3: once idle, every worker's tandem_worker_kv_free_blocks gauge reads what
// /admin/state reads (all blocks free, those the prefix cache keeps included), not a count
// that looks like a leak.
inline void expect_idle_gauges_free(pipeline& p) {
  expect_no_leaks(p);
  const std::string prom = p.metrics().to_prometheus();
  int seen = 0;
  for (const auto& w : p.stats().workers) {
    const std::string key = "tandem_worker_kv_free_blocks{worker=\"" + w.name + "\"} ";
    const size_t at = prom.find(key);
    if (at == std::string::npos) continue;  // a worker that has not stepped yet
    ++seen;
    EXPECT_EQ(std::stod(prom.substr(at + key.size())), double(w.kv_total_blocks)) << w.name;
  }
  EXPECT_GT(seen, 0) << prom.substr(0, 2000);
}

}  // namespace tandem::testing_support
