// The actor runtime end to end: disaggregated (1×1, 1×2) and colocated pipelines give exactly
// the tokens a lone engine gives; admission rejects and recovers; small KV pools make requests
// wait, never drop; cancellation in any state frees everything; nothing leaks.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <map>
#include <thread>

#include "actors/pipeline.h"
#include "runtime/grammar.h"
#include "tests/support/eventually.h"
#include "tests/test_models.h"

using namespace tandem;
using namespace std::chrono_literals;
using testing_support::alone;
using testing_support::eventually;
using testing_support::eventually_value;

namespace {

std::shared_ptr<const model> tiny() {
  static const std::shared_ptr<const model> m = testing_support::tiny_model("pipeline");
  return m;
}


std::vector<token_id> prompt_of(int n, int salt, int vocab) {
  std::vector<token_id> p;
  for (int i = 0; i < n; ++i) p.push_back(token_id(3 + (i * 31 + salt * 17) % (vocab - 3)));
  return p;
}

int expected_workers(pipeline& p) {
  const auto& c = p.config().pools;
  return c.mode == serving_mode::colocated ? c.colocated_workers : c.prefill_workers + c.decode_workers;
}

// Reads a connection until every request it carries has ended (or `wait` passes with no
// event): tokens by request, and how each ended (its finish reason, or "error:" and its code).
void read_all(connection& c, std::map<request_id, std::vector<token_id>>& got, std::map<request_id, std::string>& ends,
              std::chrono::milliseconds wait) {
  request_event ev;
  while (c.unfinished() > 0 && c.next(ev, wait)) {
    if (ev.kind == event_kind::token && ev.token >= 0) got[ev.id].push_back(ev.token);
    if (ev.kind == event_kind::done) ends[ev.id] = std::string(to_string(ev.finish_reason));
    if (ev.kind == event_kind::error) ends[ev.id] = "error:" + std::string(to_string(ev.code));
  }
}

// Every pool full again and every request actor gone (both settle shortly after the last event).
void expect_no_leaks(pipeline& p) {
  pipeline_stats s;
  const bool clean = eventually([&] {
    s = p.stats();
    // (No workers listed: the router is restarting; look again.)
    bool clean = s.live_requests == 0 && int(s.workers.size()) == expected_workers(p);
    for (const auto& w : s.workers) clean = clean && w.kv_free_blocks == w.kv_total_blocks && w.reserved_blocks == 0;
    return clean;
  });
  if (clean) return;
  // What is still held, in the last stats seen:
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
void expect_idle_gauges_free(pipeline& p) {
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

struct topology {
  std::string name;
  serving_mode mode;
  int prefill, decode;
  kv_transport_kind kv_transport = kv_transport_kind::local;
  bool stream_kv = true;
};

void PrintTo(const topology& t, std::ostream* os) { *os << t.name; }
class SameOutput : public ::testing::TestWithParam<topology> {};

}  // namespace

TEST_P(SameOutput, ConcurrentRequestsEqualALoneEngine) {
  const auto topo = GetParam();
  auto m = tiny();
  serving_config cfg;
  cfg.model.loaded = m;
  cfg.pools.mode = topo.mode;
  cfg.pools.prefill_workers = topo.prefill;
  cfg.pools.decode_workers = topo.decode;
  cfg.kv.transport = topo.kv_transport;
  cfg.kv.stream = topo.stream_kv;
  cfg.kv.stream_layer_group = 1;
  cfg.pools.kv_blocks_per_worker = 128;
  cfg.steps.chunk_size = 24;            // long prompts are chunked
  cfg.steps.prefill_token_budget = 64;
  cfg.steps.colocated_token_budget = 48;
  pipeline p(cfg);
  struct job {
    std::vector<token_id> prompt;
    sampling_params sp;
    int32_t max_tokens;
    request_handle h;
  };
  std::vector<job> jobs;
  for (int i = 0; i < 32; ++i) {
    job j;
    j.prompt = prompt_of(3 + (i * 13) % 90, i, m->config().n_vocab);
    j.sp = i % 2 == 0 ? sampling_params{.temperature = 0.0f}
                      : sampling_params{.temperature = 0.9f, .top_k = 20, .top_p = 0.9f, .seed = uint64_t(1000 + i)};
    j.max_tokens = 4 + i % 13;
    j.h = p.submit({.prompt_tokens = j.prompt, .max_tokens = j.max_tokens, .sampling = j.sp, .ignore_eos = true});
    jobs.push_back(std::move(j));
  }
  for (auto& j : jobs) {
    const auto r = j.h.wait(60s);
    ASSERT_EQ(r.error, errc::ok) << r.message;
    EXPECT_EQ(r.finish_reason, finish_reason::length);
    EXPECT_EQ(r.tokens, alone(*m, j.prompt, j.max_tokens, j.sp, true)) << "request " << r.id;
    EXPECT_EQ(r.timings.output_tokens, j.max_tokens);
    EXPECT_GT(r.timings.ttft_ms, 0);
    if (topo.mode == serving_mode::disaggregated) {
      EXPECT_GT(r.timings.kv_bytes, 0u);
    }
  }
  expect_no_leaks(p);
  // Prompts of several chunks had their decode worker reserved before prefill ended: their KV
  // went over the link in pieces while prefill ran (and the tokens above are still exact).
  const bool streamed = p.metrics().to_prometheus().find("tandem_kv_link_pieces_total") != std::string::npos;
  EXPECT_EQ(streamed, topo.mode == serving_mode::disaggregated && topo.stream_kv);
}

INSTANTIATE_TEST_SUITE_P(Topologies, SameOutput,
                         ::testing::Values(topology{"disagg_1x1", serving_mode::disaggregated, 1, 1},
                                           topology{"disagg_1x2", serving_mode::disaggregated, 1, 2},
                                           topology{"disagg_2x2", serving_mode::disaggregated, 2, 2},
                                           topology{"disagg_1x2_shm", serving_mode::disaggregated, 1, 2, kv_transport_kind::shm},
                                           topology{"disagg_1x2_handoff", serving_mode::disaggregated, 1, 2, kv_transport_kind::handoff},
                                           topology{"disagg_1x2_not_streamed", serving_mode::disaggregated, 1, 2, kv_transport_kind::local, false},
                                           topology{"colocated", serving_mode::colocated, 1, 1}),
                         [](const auto& info) { return info.param.name; });

TEST(Pipeline, StoriesMatchesTheReferenceInBothModes) {
  const std::string path = std::string(TANDEM_TEST_DATA_DIR) + "/stories260K.gguf";
  ASSERT_TRUE(std::filesystem::exists(path)) << "missing test data: " << path;
  const std::vector<token_id> expected = {432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 338, 401, 396, 267, 337,
                                          410, 408, 419, 292, 411, 322, 265, 282, 295, 433, 426, 385, 328, 432, 358, 394,
                                          261, 370, 432, 352, 266, 268, 388, 426, 338, 391, 266, 267, 337, 335, 312, 432,
                                          398, 312, 286, 267, 414, 270, 333, 415, 426, 13, 438, 310, 439, 419, 357, 336};
  for (auto mode : {serving_mode::disaggregated, serving_mode::colocated}) {
    pipeline p({.model = {.path = path}, .pools = {.mode = mode, .decode_workers = 2}});
    std::vector<request_handle> hs;
    for (int i = 0; i < 8; ++i) hs.push_back(p.submit({.prompt = "Once upon a time", .max_tokens = 64}));
    for (auto& h : hs) {
      const auto r = h.wait(60s);
      ASSERT_EQ(r.error, errc::ok) << r.message;
      EXPECT_EQ(r.tokens, expected) << to_string(mode);
      EXPECT_EQ(r.text.substr(0, 30), ", there was a little girl name");
    }
    expect_no_leaks(p);
  }
}

TEST(Pipeline, AdmissionRejectsEarlyAndRecovers) {
  serving_config cfg;
  cfg.model.loaded = tiny();
  cfg.scheduling.admission.max_prefill_queue = 2;
  cfg.steps.prefill_token_budget = 8;  // slow prefill: requests pile up
  cfg.steps.chunk_size = 8;
  pipeline p(cfg);
  std::vector<request_handle> hs;
  for (int i = 0; i < 40; ++i)
    hs.push_back(p.submit({.prompt_tokens = prompt_of(120, i, 300), .max_tokens = 2, .ignore_eos = true}));
  int rejected = 0, finished = 0;
  for (auto& h : hs) {
    const auto r = h.wait(60s);
    if (r.error == errc::overloaded) {
      ++rejected;
      EXPECT_GE(r.retry_after_ms, 50) << r.message;
      EXPECT_NE(r.message.find("prefill queue"), std::string::npos) << r.message;
    } else {
      ASSERT_EQ(r.error, errc::ok) << r.message;
      ++finished;
    }
  }
  EXPECT_GT(rejected, 0);
  EXPECT_GT(finished, 0);
  // Load gone: accepted again.
  auto r = p.submit({.prompt_tokens = prompt_of(10, 1, 300), .max_tokens = 3, .ignore_eos = true}).wait(30s);
  EXPECT_EQ(r.error, errc::ok) << r.message;
  EXPECT_EQ(r.tokens.size(), 3u);
  expect_no_leaks(p);
  const std::string prom = p.metrics().to_prometheus();
  EXPECT_NE(prom.find("tandem_rejections_total{reason=\"prefill_queue_full\"}"), std::string::npos);
}

TEST(Pipeline, SmallKvPoolsMakeRequestsWaitNotDrop) {
  for (auto mode : {serving_mode::disaggregated, serving_mode::colocated}) {
    serving_config cfg;
    cfg.model.loaded = tiny();
    cfg.pools.mode = mode;
    cfg.pools.kv_blocks_per_worker = 12;  // room for about two requests at a time
    pipeline p(cfg);
    std::vector<request_handle> hs;
    for (int i = 0; i < 16; ++i)
      hs.push_back(p.submit({.prompt_tokens = prompt_of(40, i, 300), .max_tokens = 40, .ignore_eos = true}));
    for (auto& h : hs) {
      const auto r = h.wait(60s);
      ASSERT_EQ(r.error, errc::ok) << r.message;
      EXPECT_EQ(r.tokens.size(), 40u);
    }
    expect_no_leaks(p);
  }
}

TEST(Pipeline, CancellationInEveryStateFreesEverything) {
  for (auto mode : {serving_mode::disaggregated, serving_mode::colocated}) {
    serving_config cfg;
    cfg.model.loaded = tiny();
    cfg.pools.mode = mode;
    cfg.pools.kv_blocks_per_worker = 64;
    cfg.steps.chunk_size = 8;
    cfg.steps.prefill_token_budget = 16;
    pipeline p(cfg);
    // Right away (queued), after acceptance, after the first token, in the middle of decoding.
    for (int when = 0; when < 4; ++when) {
      SCOPED_TRACE(std::string(to_string(mode)) + ", cancelled at stage " + std::to_string(when));
      std::vector<request_handle> hs;
      for (int i = 0; i < 6; ++i)
        hs.push_back(p.submit({.prompt_tokens = prompt_of(100, i + when, 300), .max_tokens = 200, .ignore_eos = true}));
      for (auto& h : hs) {
        request_event ev;
        int tokens = 0;
        bool cancelled = false;
        if (when == 0) {
          h.cancel();
          cancelled = true;
        }
        while (h.next(ev, 30s)) {
          if (!cancelled && ((when == 1 && ev.kind == event_kind::accepted) ||
                             (ev.kind == event_kind::token && ++tokens >= (when == 2 ? 1 : 5)))) {
            h.cancel();
            cancelled = true;
          }
          if (ev.kind == event_kind::done) {
            EXPECT_EQ(ev.finish_reason, finish_reason::cancelled);
          }
          ASSERT_NE(ev.kind, event_kind::error) << ev.message;
        }
      }
      expect_no_leaks(p);
    }
  }
}

// One connection (one actor) carries many requests: their events share one queue, each exact;
// abandoning one drops its events; closing the connection cancels the rest and ends its actor.
TEST(Pipeline, ConnectionCarriesManyRequestsAndClosingItCancelsThem) {
  auto m = tiny();
  serving_config cfg;
  cfg.model.loaded = m;
  cfg.pools.kv_blocks_per_worker = 64;
  pipeline p(cfg);
  {
    connection c = p.connect(nullptr);
    std::map<request_id, std::vector<token_id>> prompts, got;
    for (int i = 0; i < 4; ++i) {
      auto prompt = prompt_of(5 + 7 * i, i, m->config().n_vocab);
      const request_id id = c.submit({.prompt_tokens = prompt, .max_tokens = 6 + i, .ignore_eos = true});
      prompts[id] = prompt;
    }
    const request_id bad = c.submit({.prompt_tokens = {5, 99999}, .max_tokens = 3});
    EXPECT_EQ(c.unfinished(), 5u);
    std::map<request_id, std::string> ends;
    read_all(c, got, ends, 30s);
    request_event ev;
    EXPECT_EQ(ends[bad], "error:invalid_argument");
    for (const auto& [id, prompt] : prompts) {
      EXPECT_EQ(ends[id], "length");
      EXPECT_EQ(got[id], alone(*m, prompt, int32_t(got[id].size()), {.temperature = 0.0f}, true));
      EXPECT_EQ(got[id].size(), size_t(6 + (id - prompts.begin()->first)));
    }
    EXPECT_EQ(p.stats().live_connections, 1);

    // Abandoned: none of its events are seen again, and it ends.
    const request_id dropped = c.submit({.prompt_tokens = prompt_of(40, 9, 300), .max_tokens = 200, .ignore_eos = true});
    ASSERT_TRUE(c.next(ev, 30s));
    EXPECT_EQ(ev.id, dropped);
    c.abandon(dropped);
    EXPECT_EQ(c.unfinished(), 0u);
    EXPECT_FALSE(c.next(ev, 200ms));

    // Closed while two long requests decode: both cancelled, their KV freed, the actor gone.
    const request_id r1 = c.submit({.prompt_tokens = prompt_of(60, 1, 300), .max_tokens = 200, .ignore_eos = true});
    const request_id r2 = c.submit({.prompt_tokens = prompt_of(70, 2, 300), .max_tokens = 200, .ignore_eos = true});
    int tokens = 0;
    while (tokens < 4 && c.next(ev, 30s)) tokens += ev.kind == event_kind::token;
    ASSERT_EQ(tokens, 4);
    // Unread, they pause (holding their KV) and the router lists both where they are.
    pipeline_stats st;
    EXPECT_TRUE(eventually([&] {
      st = p.stats(10);
      return st.requests.size() == 2 && st.requests[0].state == "decoding" && st.requests[1].state == "decoding";
    })) << "the router never listed both requests decoding";
    ASSERT_EQ(st.requests.size(), 2u);
    EXPECT_EQ(st.requests[0].id, r1);
    EXPECT_EQ(st.requests[1].id, r2);
    for (const auto& r : st.requests) {
      EXPECT_EQ(r.state, "decoding");
      EXPECT_EQ(r.prefill_worker, "prefill-0");
      EXPECT_EQ(r.decode_worker, "decode-0");
      EXPECT_EQ(r.max_tokens, 200);
    }
    EXPECT_EQ(st.requests[0].prompt_tokens, 60);
    EXPECT_EQ(p.stats(1).requests.size(), 1u);  // the list is bounded
    EXPECT_EQ(st.kv_links, 1);
    c.close();
    EXPECT_FALSE(c.open());
  }
  expect_no_leaks(p);
  EXPECT_TRUE(eventually([&] { return p.stats().live_connections == 0; })) << "the closed connection's actor lives on";
  EXPECT_EQ(p.stats().live_connections, 0);
}

// Issue 22 item 2: a client that stops reading slows only its own requests. Client A submits
// more long requests than a worker has decode slots (default limits) and reads nothing: its
// requests pause, and while another client waits they give their slots up (parked). Client B's
// request is served all the same (before, it waited behind A's paused requests for as long as
// A did not read); when A reads at last, every one of its outputs is exact.
TEST(Pipeline, AClientThatStopsReadingDoesNotLockOthersOut) {
  auto m = tiny();
  for (serving_mode mode : {serving_mode::disaggregated, serving_mode::colocated}) {
    SCOPED_TRACE(std::string(to_string(mode)));
    serving_config cfg;
    cfg.model.loaded = m;
    cfg.pools.mode = mode;
    pipeline p(cfg);
    connection a = p.connect(nullptr), b = p.connect(nullptr);
    const int n = cfg.steps.max_batch + 6;
    std::map<request_id, std::vector<token_id>> prompts, got;
    for (int i = 0; i < n; ++i) {
      auto prompt = prompt_of(12 + i % 9, 100 + i, m->config().n_vocab);
      prompts[a.submit({.prompt_tokens = prompt, .max_tokens = 200, .sampling = {.temperature = 0.0f}, .ignore_eos = true})] =
          prompt;
    }
    // A's requests take every decode slot of a worker (and stay, paused, as A reads nothing).
    auto full = [&] {
      for (const auto& w : p.stats().workers)
        if (w.active >= cfg.steps.max_batch) return true;
      return false;
    };
    // (Seen once is enough: as A's paused requests are parked for its own waiting ones, the
    // count moves, so a second look can find a slot free for a moment.)
    EXPECT_TRUE(eventually(full)) << "client A's requests never filled a worker's decode slots";
    const auto b_prompt = prompt_of(15, 7, m->config().n_vocab);
    const request_id bid = b.submit({.prompt_tokens = b_prompt, .max_tokens = 16, .sampling = {.temperature = 0.0f}, .ignore_eos = true});
    std::vector<token_id> b_got;
    request_event ev;
    bool done = false;
    while (!done && b.next(ev, 60s)) {
      EXPECT_EQ(ev.id, bid);
      if (ev.kind == event_kind::token && ev.token >= 0) b_got.push_back(ev.token);
      done = ev.kind == event_kind::done || ev.kind == event_kind::error;
    }
    ASSERT_TRUE(done) << "client B was not served while client A did not read";
    EXPECT_EQ(b_got, alone(*m, b_prompt, 16, {.temperature = 0.0f}, true));
    EXPECT_GT(p.metrics().get_counter("tandem_router_parked_total", "", {}).value(), 0.0);
    // A reads now: its parked requests resume where they stopped, exactly.
    std::map<request_id, std::string> ends;
    read_all(a, got, ends, 120s);
    ASSERT_EQ(a.unfinished(), 0u);
    for (const auto& [id, prompt] : prompts) {
      EXPECT_EQ(ends[id], "length") << id;
      EXPECT_EQ(got[id], alone(*m, prompt, 200, {.temperature = 0.0f}, true)) << id;
    }
    a.close();
    b.close();
    expect_no_leaks(p);
  }
}

TEST(Pipeline, BadRequestsGetClearErrors) {
  pipeline p({.model = {.loaded = tiny()}});
  auto r = p.submit({.prompt_tokens = {5, 99999}, .max_tokens = 3}).wait(5s);
  EXPECT_EQ(r.error, errc::invalid_argument);
  r = p.submit({.prompt = "x", .max_tokens = 0}).wait(5s);
  EXPECT_EQ(r.error, errc::invalid_argument);
  r = p.submit({.prompt = "x", .sampling = {.temperature = -2}}).wait(5s);
  EXPECT_EQ(r.error, errc::invalid_argument);
  r = p.submit({.prompt_tokens = prompt_of(400, 0, 300), .max_tokens = 3}).wait(5s);  // context is 256
  EXPECT_EQ(r.error, errc::context_overflow) << r.message;
  r = p.submit({.prompt = "hello", .max_tokens = 3, .ignore_eos = true}).wait(10s);
  EXPECT_EQ(r.error, errc::ok) << r.message;
  expect_no_leaks(p);
}
// Any worker killed while requests decode: nothing is lost. Requests not decoding yet are
// prefilled again; decoding ones migrate (prompt plus tokens so far prefilled again, decoding
// goes on), so every stream is complete, in order, and equal to a run without the fault.
TEST(Pipeline, KilledWorkersLoseNothingAndOutputsStayExact) {
  for (const worker_kind pool : {worker_kind::decode, worker_kind::prefill, worker_kind::colocated}) {
    SCOPED_TRACE(to_string(pool));
    auto m = tiny();
    serving_config cfg;
    cfg.model.loaded = m;
    cfg.pools.mode = pool == worker_kind::colocated ? serving_mode::colocated : serving_mode::disaggregated;
    pipeline p(cfg);
    struct job {
      std::vector<token_id> prompt;
      sampling_params sp;
      request_handle h;
    };
    std::vector<job> jobs;
    // Grammars that cannot complete within 120 tokens (so every request runs to its length).
    const std::string grammars[] = {"root ::= [a-z ]{600,}",
                                    "root ::= item{600,}\nitem ::= \"(\" [a-z]* \")\" | [0-9]"};
    for (int i = 0; i < 8; ++i) {
      job j;
      j.prompt = prompt_of(60, i, 300);
      j.sp = i % 2 == 0 ? sampling_params{.temperature = 0.0f}
                        : sampling_params{.temperature = 0.9f, .top_k = 20, .seed = uint64_t(50 + i)};
      // A grammar resumes exactly too: the matcher's state is a function of the output so far.
      if (i >= 6) {
        ASSERT_TRUE(j.sp.set_grammar(grammars[i - 6]).ok());
      }
      if (i >= 2 && i < 6) {  // logit_bias and min_tokens resume exactly too (functions of index and logits)
        for (token_id t = 10; t < 40; t += 3) {
          j.sp.bias_tokens.push_back(t);
          j.sp.bias_values.push_back(i == 2 ? 4.0f : -3.0f);
        }
        j.sp.min_tokens = 100;
        j.sp.frequency_penalty = i == 3 ? 0.7f : 0.0f;  // the penalties read the output so far,
        j.sp.presence_penalty = i >= 4 ? 1.5f : 0.0f;   // carried across the kill
        j.sp.repetition_penalty = i == 5 ? 1.4f : 1.0f;  // reads the prompt too
      }
      j.h = p.submit({.prompt_tokens = j.prompt, .max_tokens = 120, .sampling = j.sp, .ignore_eos = true});
      jobs.push_back(std::move(j));
    }
    // Killed once the first request is decoding (token 2 comes from a decode step).
    std::vector<token_id> first;
    request_event ev;
    while (jobs[0].h.next(ev, 10s)) {
      if (ev.kind == event_kind::token && ev.token >= 0) first.push_back(ev.token);
      if (first.size() >= 3) break;
    }
    ASSERT_TRUE(p.kill_worker(pool, 0));
    for (size_t i = 0; i < jobs.size(); ++i) {
      auto r = jobs[i].h.wait(30s);
      ASSERT_EQ(r.error, errc::ok) << i << ": " << r.message;
      EXPECT_EQ(r.finish_reason, finish_reason::length);
      if (i == 0) r.tokens.insert(r.tokens.begin(), first.begin(), first.end());
      EXPECT_EQ(r.tokens, alone(*m, jobs[i].prompt, 120, jobs[i].sp, true)) << "request " << i;
      if (i >= 6) {
        grammar_matcher gm(grammar::compile(grammars[i - 6]), nullptr);
        EXPECT_TRUE(gm.accept_bytes(m->tok().decode(r.tokens))) << m->tok().decode(r.tokens);
      }
    }
    // The kill is asynchronous: the router counts the restart when the worker's down message
    // arrives, and a killed prefill worker holds up no decoding request, so the requests can all
    // end before that (seen under ASan on 2 cores). Waited for, within a bound.
    auto& restarts = p.metrics().get_counter("tandem_restarts_total", "", {{"kind", std::string(to_string(pool))}});
    EXPECT_TRUE(eventually([&] { return restarts.value() >= 1; })) << "the kill was never counted as a restart";
    EXPECT_EQ(restarts.value(), 1);
    const std::string prom = p.metrics().to_prometheus();
    EXPECT_NE(prom.find("tandem_restarts_total{kind=\"" + std::string(to_string(pool)) + "\"} 1"), std::string::npos);
    if (pool != worker_kind::prefill) {  // the first request was decoding on the killed worker
      EXPECT_NE(prom.find("tandem_migrations_total"), std::string::npos);
    }
    // The supervisor restarted it: new work succeeds.
    EXPECT_TRUE(eventually(
        [&] {
          return p.submit({.prompt_tokens = prompt_of(20, 1, 300), .max_tokens = 5, .ignore_eos = true}).wait(10s).error ==
                 errc::ok;
        },
        60s, 20ms))
        << "no request succeeded after the restart";
    expect_no_leaks(p);
  }
}

// Shared cores (pools.share_cores): the prefill and decode workers compute on as many of the
// process's cores as the other leaves, decode paced while a prompt computes; the tokens are a
// lone engine's (the kernels do not depend on the thread count), also across a kill of either
// worker (the killed one's pool leaves the share, its restart joins it).
TEST(Pipeline, SharedCoresKeepOutputsExactThroughKills) {
  for (const worker_kind pool : {worker_kind::decode, worker_kind::prefill}) {
    SCOPED_TRACE(to_string(pool));
    auto m = tiny();
    serving_config cfg;
    cfg.model.loaded = m;
    cfg.pools.share_cores = true;
    cfg.pools.threads_per_worker = 1;  // 2 cores shared
    cfg.steps.decode_pace_ms = 4;
    cfg.steps.prefill_token_budget = 32;  // prompts of several steps, so prefill and decode overlap
    pipeline p(cfg);
    std::vector<std::vector<token_id>> prompts;
    std::vector<request_handle> hs;
    const sampling_params greedy{.temperature = 0.0f};
    for (int i = 0; i < 6; ++i) {
      prompts.push_back(prompt_of(90 + 7 * i, i, 300));
      hs.push_back(p.submit({.prompt_tokens = prompts.back(), .max_tokens = 80, .sampling = greedy, .ignore_eos = true}));
    }
    std::vector<token_id> first;
    request_event ev;
    while (hs[0].next(ev, 10s)) {
      if (ev.kind == event_kind::token && ev.token >= 0) first.push_back(ev.token);
      if (first.size() >= 3) break;
    }
    ASSERT_TRUE(p.kill_worker(pool, 0));
    for (size_t i = 0; i < hs.size(); ++i) {
      auto r = hs[i].wait(30s);
      ASSERT_EQ(r.error, errc::ok) << i << ": " << r.message;
      if (i == 0) r.tokens.insert(r.tokens.begin(), first.begin(), first.end());
      EXPECT_EQ(r.tokens, alone(*m, prompts[i], 80, greedy, true)) << "request " << i;
    }
    expect_no_leaks(p);
  }
}

// Auto mode: a prompt whose uncached part fits in the decode worker's slack (at most one
// prefill step's budget: 64 tokens here) is computed by the decode worker itself, a longer one
// by the prefill pool (over the KV link); the tokens are a lone engine's either way, also
// across a kill of the decode worker while short and long ones decode there.
TEST(Pipeline, AutoModeComputesShortPromptsOnTheDecodeWorkerExactly) {
  auto m = tiny();
  serving_config cfg;
  cfg.model.loaded = m;
  cfg.pools.mode = serving_mode::automatic;
  cfg.steps.prefill_token_budget = 64;
  pipeline p(cfg);
  auto counter = [&](const std::string& name) {  // summed over its labels
    const auto j = nlohmann::json::parse(p.metrics().to_json());
    double sum = 0;
    if (j["counters"].contains(name))
      for (const auto& x : j["counters"][name]) sum += x["value"].get<double>();
    return sum;
  };
  // (Once the decode worker's first report is in: requests sent before it go to the prefill pool.)
  ASSERT_EQ(p.submit({.prompt_tokens = prompt_of(10, 98, 300), .max_tokens = 4}).wait(30s).error, errc::ok);
  // A short one now: its decode worker computes it, and its request names it as such.
  const auto warm = p.submit({.prompt_tokens = prompt_of(10, 99, 300), .max_tokens = 4}).wait(30s);
  ASSERT_EQ(warm.error, errc::ok);
  EXPECT_EQ(warm.timings.prefill_worker, "decode-0");
  EXPECT_EQ(warm.timings.decode_worker, "decode-0");
  std::vector<std::vector<token_id>> prompts;
  std::vector<request_handle> hs;
  const sampling_params greedy{.temperature = 0.0f};
  for (int i = 0; i < 8; ++i) {
    prompts.push_back(prompt_of(i % 2 ? 20 + 3 * i : 120 + 9 * i, i, 300));  // short, long, short, ...
    hs.push_back(p.submit({.prompt_tokens = prompts.back(), .max_tokens = 60, .sampling = greedy, .ignore_eos = true}));
  }
  std::vector<token_id> first;
  request_event ev;
  while (hs[0].next(ev, 10s)) {
    if (ev.kind == event_kind::token && ev.token >= 0) first.push_back(ev.token);
    if (first.size() >= 3) break;
  }
  ASSERT_TRUE(p.kill_worker(worker_kind::decode, 0));
  for (size_t i = 0; i < hs.size(); ++i) {
    auto r = hs[i].wait(30s);
    ASSERT_EQ(r.error, errc::ok) << i << ": " << r.message;
    if (i == 0) r.tokens.insert(r.tokens.begin(), first.begin(), first.end());
    EXPECT_EQ(r.tokens, alone(*m, prompts[i], 60, greedy, true)) << "request " << i;
    // A long prompt (past the 64-token budget) is never computed on the decode worker, also
    // when it is prefilled again after the kill. (A short one may be placed there twice: once
    // before the kill, again after it, so the counter below bounds nothing about long ones.)
    if (i % 2 == 0) {
      EXPECT_EQ(r.timings.prefill_worker, "prefill-0") << "request " << i;
    }
  }
  const double local = counter("tandem_router_local_prefill_total");
  EXPECT_GE(local, 1) << "no short prompt was computed on the decode worker" << p.metrics().to_prometheus();
  EXPECT_GE(counter("tandem_kv_link_transfers_total"), 4) << "the long prompts went over the KV link";
  expect_no_leaks(p);
}

// A request actor killed mid-decode: its reader gets an error, and everything it held is freed.
TEST(Pipeline, KilledRequestActorEndsWithAnErrorAndFreesItsKv) {
  for (auto mode : {serving_mode::disaggregated, serving_mode::colocated}) {
    SCOPED_TRACE(std::string(to_string(mode)));
    serving_config cfg;
    cfg.model.loaded = tiny();
    cfg.pools.mode = mode;
    pipeline p(cfg);
    auto h = p.submit({.prompt_tokens = prompt_of(60, 3, 300), .max_tokens = 200, .ignore_eos = true});
    auto other = p.submit({.prompt_tokens = prompt_of(30, 4, 300), .max_tokens = 20, .ignore_eos = true});
    request_event ev;
    while (h.next(ev, 10s) && !(ev.kind == event_kind::token && ev.index >= 2)) {
    }
    ASSERT_TRUE(p.kill_request(h.id()));
    const auto r = h.wait(30s);
    EXPECT_EQ(r.error, errc::worker_failed) << r.message;
    EXPECT_EQ(other.wait(30s).error, errc::ok);  // everyone else goes on
    expect_no_leaks(p);
    EXPECT_FALSE(p.kill_request(h.id()));
  }
}

// Past the migration limit a request ends with a clear error instead of moving forever.
TEST(Pipeline, MigrationLimitEndsTheRequestClearly) {
  serving_config cfg;
  cfg.model.loaded = tiny();
  cfg.scheduling.max_migrations = 0;
  pipeline p(cfg);
  // Every step 20 ms slower, so that the 200 tokens cannot all come before the kill lands (on
  // a loaded machine the request once finished first).
  p.inject(fault_kind::stall, 1000, std::chrono::milliseconds(20));
  auto h = p.submit({.prompt_tokens = prompt_of(60, 3, 300), .max_tokens = 200, .ignore_eos = true});
  request_event ev;
  while (h.next(ev, 10s) && !(ev.kind == event_kind::token && ev.index >= 2)) {
  }
  ASSERT_TRUE(p.kill_worker(worker_kind::decode, 0));
  const auto r = h.wait(30s);
  EXPECT_EQ(r.error, errc::worker_failed);
  EXPECT_NE(r.message.find("migration limit"), std::string::npos) << r.message;
  expect_no_leaks(p);
}

// The one stop rule at the edge of the context, in every mode: a prompt of n_ctx - 1 tokens
// gets two tokens (the last sampled from the last position), one of n_ctx tokens gets one (it
// ends in the prefill worker, where it once went on to decode and failed there), one of
// n_ctx + 1 is refused up front.
TEST(Pipeline, ContextEdgeEndsTheSameInEveryMode) {
  const int32_t n_ctx = tiny()->config().n_ctx;
  for (const auto mode : {serving_mode::disaggregated, serving_mode::colocated}) {
    SCOPED_TRACE(std::string(to_string(mode)));
    serving_config cfg;
    cfg.model.loaded = tiny();
    cfg.pools.mode = mode;
    pipeline p(cfg);
    for (const int32_t n : {n_ctx - 1, n_ctx, n_ctx + 1}) {
      SCOPED_TRACE(n);
      const auto prompt = prompt_of(n, 5, tiny()->config().n_vocab);
      const auto r = p.submit({.prompt_tokens = prompt, .max_tokens = 10, .ignore_eos = true}).wait(30s);
      if (n > n_ctx) {
        EXPECT_EQ(r.error, errc::context_overflow) << r.message;
        continue;
      }
      EXPECT_EQ(r.error, errc::ok) << r.message;
      EXPECT_EQ(r.finish_reason, finish_reason::length);
      EXPECT_EQ(int32_t(r.tokens.size()), n_ctx + 1 - n);
      EXPECT_EQ(r.tokens, alone(*tiny(), prompt, 10, {.temperature = 0.0f}, true));
    }
    expect_no_leaks(p);
  }
}

// Fault injection by kind or by the name kill() returns; unknown kinds are refused clearly.
TEST(Pipeline, KillsByKindAndByName) {
  serving_config cfg;
  cfg.model.loaded = tiny();
  cfg.pools.prefill_workers = 1;
  cfg.pools.decode_workers = 2;
  pipeline p(cfg);
  auto until_named = [&](const std::string& what) {  // an actor not started (or joined) yet is tried again
    return eventually_value([&]() -> std::optional<std::string> {
             auto name = p.kill(what);
             return name.empty() ? std::nullopt : std::optional(name);
           }).value_or("");
  };
  EXPECT_EQ(until_named("decode-1"), "decode-1");
  EXPECT_EQ(until_named("kv_link-p0-d0"), "kv_link-p0-d0");
  EXPECT_EQ(until_named("prefill"), "prefill-0");  // the only one of its kind
  EXPECT_THROW(p.kill("nonsense"), failure);
  EXPECT_EQ(p.kill("request-424242"), "");  // no such request
  // Still serving afterwards, exactly.
  const auto prompt = prompt_of(12, 3, tiny()->config().n_vocab);
  auto r = p.submit({.prompt_tokens = prompt, .max_tokens = 8, .ignore_eos = true}).wait();
  EXPECT_EQ(r.finish_reason, finish_reason::length) << r.message;
  EXPECT_EQ(r.tokens, testing_support::alone(*tiny(), prompt, 8, {.temperature = 0.0f}, true));
}

// A client that goes away while its requests are being recovered (their decode worker, or the
// router, was just killed) gets nothing more, and everything they held is freed.
TEST(Pipeline, ClientLeavingDuringRecoveryFreesEverything) {
  for (const std::string kind : {"decode", "router", "kv_link"}) {
    SCOPED_TRACE(kind);
    serving_config cfg;
    cfg.model.loaded = tiny();
    cfg.pools.kv_blocks_per_worker = 128;
    pipeline p(cfg);
    auto c = p.connect(nullptr);
    for (int i = 0; i < 8; ++i)
      c.submit({.prompt_tokens = prompt_of(20 + i, i, tiny()->config().n_vocab), .max_tokens = 150, .ignore_eos = true});
    request_event ev;
    int tokens = 0;
    while (tokens < 8 && c.next(ev, 30s)) tokens += ev.kind == event_kind::token;
    ASSERT_EQ(tokens, 8) << "the requests never got going";
    ASSERT_TRUE(eventually([&] { return !p.kill(kind).empty(); })) << "no " << kind << " actor to kill";
    c.close();
    EXPECT_FALSE(c.next(ev, 10ms)) << "an event after the client left";
    expect_no_leaks(p);
    EXPECT_EQ(p.stats().live_connections, 0);
  }
}

// Past its restart intensity a pool stays empty (degraded): what waits for it ends with
// worker_failed instead of hanging, new requests are refused at once, the metrics say so. A
// restart within the intensity only delays requests.
// Issue 22: the router pushed past its restart intensity no longer stays degraded for good:
// requests are refused (an error, not a hang) until the root starts it again after its
// backoff, and then it serves exactly as before.
TEST(Pipeline, RouterPastItsRestartIntensityRecoversAfterItsBackoff) {
  auto m = tiny();
  serving_config cfg;
  cfg.model.loaded = m;
  cfg.pools.max_router_restarts = 1;
  cfg.pools.recover_after = 1500ms;
  pipeline p(cfg);
  const sampling_params greedy{.temperature = 0.0f};
  const auto prompt = prompt_of(20, 3, m->config().n_vocab);
  auto r = p.submit({.prompt_tokens = prompt, .max_tokens = 8, .sampling = greedy, .ignore_eos = true}).wait(30s);
  ASSERT_EQ(r.error, errc::ok) << r.message;
  // Killed twice (one restart allowed in the window): degraded.
  for (int k = 0; k < 2; ++k) {
    ASSERT_TRUE(eventually([&] { return !p.kill("router").empty(); })) << "kill " << k << ": no router to kill";
    if (k == 0) {  // the restarted router is up before the second kill
      ASSERT_TRUE(eventually(
          [&] { return p.submit({.prompt_tokens = prompt, .max_tokens = 1, .sampling = greedy}).wait(30s).error == errc::ok; },
          60s, 10ms))
          << "the router restarted after the first kill never served";
    }
  }
  ASSERT_TRUE(eventually([&] { return p.degraded(); })) << "two router kills did not degrade the pipeline";
  EXPECT_EQ(p.metrics().get_gauge("tandem_pool_degraded", "", {{"pool", "router"}}).value(), 1);
  r = p.submit({.prompt_tokens = prompt, .max_tokens = 8, .sampling = greedy, .ignore_eos = true}).wait(30s);
  EXPECT_EQ(r.error, errc::worker_failed) << r.message;
  EXPECT_NE(r.message.find("tries again by itself"), std::string::npos) << r.message;
  EXPECT_GE(r.retry_after_ms, 1000) << "a hint to retry once the backoff is over";
  // After the backoff it serves again by itself, exactly.
  ASSERT_TRUE(eventually([&] { return !p.degraded(); })) << "still degraded 10 s after a 1.5 s backoff";
  EXPECT_EQ(p.metrics().get_gauge("tandem_pool_degraded", "", {{"pool", "router"}}).value(), 0);
  EXPECT_EQ(p.metrics().get_counter("tandem_pool_recoveries_total", "", {{"pool", "router"}}).value(), 1);
  r = p.submit({.prompt_tokens = prompt, .max_tokens = 8, .sampling = greedy, .ignore_eos = true}).wait(30s);
  ASSERT_EQ(r.error, errc::ok) << r.message;
  EXPECT_EQ(r.tokens, alone(*m, prompt, 8, greedy, true));
  expect_no_leaks(p);
}

// Issue 22: a pool past its restart intensity is degraded (refuses at once, not a hang), and
// does not stay so: after its backoff it starts its workers again and serves exactly.
TEST(Pipeline, PoolPastItsRestartIntensityIsDegradedAndRefusesThenRecovers) {
  auto m = tiny();
  serving_config cfg;
  cfg.model.loaded = m;
  cfg.pools.max_worker_restarts = 1;
  cfg.pools.restart_window = 60000ms;
  cfg.pools.recover_after = 4000ms;  // past the 2 s after which waiting requests end
  pipeline p(cfg);
  auto kill_decode = [&p] {  // a worker not joined yet (start-up, restart) is tried again
    return eventually_value([&]() -> std::optional<std::string> {
             auto name = p.kill(actor_kind::decode, 0);
             return name.empty() ? std::nullopt : std::optional(name);
           }).value_or("");
  };
  ASSERT_EQ(kill_decode(), "decode-0");  // restarted: within the intensity
  auto during = p.submit({.prompt_tokens = prompt_of(20, 1, 300), .max_tokens = 8, .ignore_eos = true});
  EXPECT_EQ(during.wait(30s).error, errc::ok);  // queued while it restarted, then served
  ASSERT_EQ(kill_decode(), "decode-0");  // the second death: past the intensity, no restart
  auto waiting = p.submit({.prompt_tokens = prompt_of(20, 2, 300), .max_tokens = 8, .ignore_eos = true});
  const auto r = waiting.wait(30s);
  EXPECT_EQ(r.error, errc::worker_failed) << r.message;
  auto later = p.submit({.prompt_tokens = prompt_of(20, 3, 300), .max_tokens = 8, .ignore_eos = true});
  const auto t0 = std::chrono::steady_clock::now();
  const auto r2 = later.wait(30s);
  EXPECT_EQ(r2.error, errc::worker_failed) << r2.message;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s) << "refused at once, not after the stranded delay";
  EXPECT_EQ(p.metrics().get_gauge("tandem_pool_degraded", "", {{"pool", "decode"}}).value(), 1);
  EXPECT_EQ(p.snapshot()->degraded_pools, std::vector<std::string>{"decode"});
  // The backoff ends: the pool starts decode-0 again and serving resumes by itself, exactly.
  auto& degraded = p.metrics().get_gauge("tandem_pool_degraded", "", {{"pool", "decode"}});
  EXPECT_TRUE(eventually([&] { return degraded.value() == 0; })) << "still degraded 10 s after a 4 s backoff";
  EXPECT_EQ(degraded.value(), 0);
  EXPECT_EQ(p.metrics().get_counter("tandem_pool_recoveries_total", "", {{"pool", "decode"}}).value(), 1);
  EXPECT_TRUE(eventually([&] { return p.snapshot()->degraded_pools.empty(); }))
      << "the snapshot still lists a degraded pool";
  const sampling_params greedy{.temperature = 0.0f};
  const auto prompt = prompt_of(20, 4, m->config().n_vocab);
  generation_result r3;
  (void)eventually(  // until the restarted worker has joined the router; the assertion says why not
      [&] {
        r3 = p.submit({.prompt_tokens = prompt, .max_tokens = 8, .sampling = greedy, .ignore_eos = true}).wait(30s);
        return r3.error == errc::ok;
      },
      60s, 20ms);
  ASSERT_EQ(r3.error, errc::ok) << r3.message;
  EXPECT_EQ(r3.tokens, alone(*m, prompt, 8, greedy, true));
  expect_no_leaks(p);
}

// Prefix reuse through the workers: requests that share a long prefix, sent together, compute
// it once (the others wait for the blocks it makes, then take them), and every output is what
// a lone engine gives, with the cache on or off.
TEST(Pipeline, SharedPrefixIsComputedOnceAndOutputsAreUnchanged) {
  auto m = tiny();
  const int V = m->config().n_vocab;
  const auto shared = prompt_of(160, 99, V);  // 10 full blocks
  for (auto mode : {serving_mode::disaggregated, serving_mode::colocated})
    for (bool cache : {true, false}) {
      SCOPED_TRACE(std::string(to_string(mode)) + (cache ? " with" : " without") + " the prefix cache");
      serving_config cfg;
      cfg.model.loaded = m;
      cfg.pools.mode = mode;
      cfg.kv.prefix_cache = cache;
      cfg.pools.kv_blocks_per_worker = 256;
      pipeline p(cfg);
      std::vector<std::pair<std::vector<token_id>, sampling_params>> reqs;
      std::vector<request_handle> hs;
      for (int i = 0; i < 12; ++i) {
        auto prompt = shared;
        for (auto t : prompt_of(20, 200 + i, V)) prompt.push_back(t);
        const auto sp = i % 2 == 0 ? sampling_params{.temperature = 0.0f}
                                   : sampling_params{.temperature = 0.8f, .top_k = 40, .seed = uint64_t(7 + i)};
        hs.push_back(p.submit({.prompt_tokens = prompt, .max_tokens = 8, .sampling = sp, .ignore_eos = true}));
        reqs.emplace_back(std::move(prompt), sp);
      }
      for (size_t i = 0; i < hs.size(); ++i) {
        const auto r = hs[i].wait(60s);
        ASSERT_EQ(r.error, errc::ok) << r.message;
        EXPECT_EQ(r.tokens, alone(*m, reqs[i].first, 8, reqs[i].second, true)) << "request " << i;
      }
      const double computed = p.metrics().get_counter("tandem_prompt_tokens_computed_total", "").value();
      if (cache) {
        // The first computes 180 tokens; each of the other 11 takes the 160 shared ones.
        EXPECT_EQ(computed, 180 + 11 * 20);
        EXPECT_EQ(p.metrics().get_counter("tandem_prefix_cache_hit_tokens_total", "").value(), 11 * 160);
      } else {
        EXPECT_EQ(computed, 12 * 180);
      }
      expect_idle_gauges_free(p);
    }
}

// The next turn of a conversation (prompt, answer, new message) reuses the earlier turn's
// prompt and answer in either mode.
TEST(Pipeline, NextTurnReusesTheEarlierTurn) {
  auto m = tiny();
  const int V = m->config().n_vocab;
  for (auto mode : {serving_mode::disaggregated, serving_mode::colocated}) {
    SCOPED_TRACE(std::string(to_string(mode)));
    serving_config cfg;
    cfg.model.loaded = m;
    cfg.pools.mode = mode;
    cfg.pools.kv_blocks_per_worker = 256;
    pipeline p(cfg);
    auto turn = prompt_of(100, 5, V);
    double hits_before = 0;
    size_t prev_len = 0;
    for (int k = 0; k < 3; ++k) {
      const sampling_params greedy{.temperature = 0.0f};
      const auto r = p.submit({.prompt_tokens = turn, .max_tokens = 20, .sampling = greedy, .ignore_eos = true}).wait(60s);
      ASSERT_EQ(r.error, errc::ok) << r.message;
      EXPECT_EQ(r.tokens, alone(*m, turn, 20, greedy, true)) << "turn " << k;
      const double hits = p.metrics().get_counter("tandem_prefix_cache_hit_tokens_total", "").value();
      // The earlier turn's KV, whole blocks of it: its prompt and the 19 answer tokens decoded
      // after the first (the last one is never fed back). Disaggregated, the answer's blocks
      // come from the host store, where its decode worker published them.
      if (k > 0) {
        EXPECT_EQ(hits - hits_before, double((prev_len + 19) / 16 * 16));
      }
      hits_before = hits;
      prev_len = turn.size();
      turn.insert(turn.end(), r.tokens.begin(), r.tokens.end());
      for (auto t : prompt_of(10, 50 + k, V)) turn.push_back(t);
    }
    expect_no_leaks(p);
  }
}

// KV-aware routing: with two prefill workers and two prompt families, each family's requests
// go where its prefix is cached, so each prefix is computed once in all. (The weight 4 makes
// the cached prefix outweigh any queue these twelve requests can build; at 1, a family
// member may rightly go to an idle worker rather than queue behind its own family.)
TEST(Pipeline, RequestsGoWhereTheirPrefixIsCached) {
  auto m = tiny();
  const int V = m->config().n_vocab;
  for (double overlap_weight : {4.0, 0.0}) {
    SCOPED_TRACE("overlap weight " + std::to_string(overlap_weight));
    serving_config cfg;
    cfg.model.loaded = m;
    cfg.pools.prefill_workers = 2;
    cfg.pools.decode_workers = 1;
    cfg.scheduling.route_overlap_weight = overlap_weight;
    cfg.pools.kv_blocks_per_worker = 256;
    pipeline p(cfg);
    std::vector<request_handle> hs;
    std::vector<std::vector<token_id>> prompts;
    for (int i = 0; i < 12; ++i) {
      auto prompt = prompt_of(160, 300 + i % 2, V);  // family i % 2: 10 shared blocks
      for (auto t : prompt_of(20, 400 + i, V)) prompt.push_back(t);
      hs.push_back(p.submit({.prompt_tokens = prompt, .max_tokens = 4, .sampling = {.temperature = 0.0f}, .ignore_eos = true}));
      prompts.push_back(std::move(prompt));
      std::this_thread::sleep_for(5ms);  // pacing: requests arrive over time, as a client's would
    }
    for (size_t i = 0; i < hs.size(); ++i) {
      const auto r = hs[i].wait(60s);
      ASSERT_EQ(r.error, errc::ok) << r.message;
      EXPECT_EQ(r.tokens, alone(*m, prompts[i], 4, {.temperature = 0.0f}, true));
    }
    const double computed = p.metrics().get_counter("tandem_prompt_tokens_computed_total", "").value();
    if (overlap_weight > 0) {
      EXPECT_EQ(computed, 2 * 180 + 10 * 20);  // one full prompt per family, suffixes for the rest
      EXPECT_EQ(p.metrics().get_counter("tandem_router_prefix_routed_tokens_total", "").value(), 10 * 160);
    } else {
      EXPECT_GE(computed, 2 * 180 + 10 * 20);  // load alone: families may land on both workers
    }
    expect_no_leaks(p);
  }
}

namespace {
// Sends prompts to prefill workers in turn, whatever they hold: what one worker computed
// reaches the other only through the host store.
class round_robin : public prefill_placement {
 public:
  int32_t choose(std::span<const prefill_worker_load> w, int32_t) const override {
    for (size_t tries = 0; tries < w.size(); ++tries) {
      const size_t i = next_++ % w.size();
      if (w[i].alive) return int32_t(i);
    }
    return -1;
  }

 private:
  mutable size_t next_ = 0;
};
}  // namespace

TEST(Pipeline, HostStoreServesPrefixesToOtherWorkers) {
  auto m = tiny();
  const int V = m->config().n_vocab;
  for (bool store : {true, false}) {
    SCOPED_TRACE(store ? "with the store" : "without");
    serving_config cfg;
    cfg.model.loaded = m;
    cfg.pools.prefill_workers = 2;
    cfg.scheduling.prefill_policy = std::make_shared<round_robin>();
    cfg.kv.store_memory_bytes = store ? 64ll << 20 : 0;
    cfg.pools.kv_blocks_per_worker = 256;
    pipeline p(cfg);
    for (int i = 0; i < 6; ++i) {
      auto prompt = prompt_of(160, 77, V);
      for (auto t : prompt_of(20, 500 + i, V)) prompt.push_back(t);
      // Every other one with repetition_penalty, which reads the whole prompt whichever path
      // (a prefill worker, or straight to a decode worker from the store) samples its first token.
      sampling_params sp{.temperature = 0.0f};
      if (i % 2 == 1) sp.repetition_penalty = 1.6f;
      const auto r = p.submit({.prompt_tokens = prompt, .max_tokens = 4, .sampling = sp, .ignore_eos = true}).wait(60s);
      ASSERT_EQ(r.error, errc::ok) << r.message;
      EXPECT_EQ(r.tokens, alone(*m, prompt, 4, sp, true)) << "request " << i;
    }
    const double computed = p.metrics().get_counter("tandem_prompt_tokens_computed_total", "").value();
    // With the store, worker 1's first prompt fetches the 160 tokens worker 0 computed.
    EXPECT_EQ(computed, store ? 180 + 5 * 20 : 2 * 180 + 4 * 20);
    if (store) {
      EXPECT_GT(p.metrics().get_counter("tandem_kv_store_blocks_total", "", {{"event", "fetched"}}).value(), 0);
    }
    expect_no_leaks(p);
  }
}

// Killing the store while requests fetch from it and publish to it loses nothing: fetches
// that get no answer compute instead, a fresh store takes over, outputs stay exact.
TEST(Pipeline, KillingTheHostStoreLosesNoRequest) {
  auto m = tiny();
  const int V = m->config().n_vocab;
  for (auto mode : {serving_mode::disaggregated, serving_mode::colocated}) {
    SCOPED_TRACE(std::string(to_string(mode)));
    serving_config cfg;
    cfg.model.loaded = m;
    cfg.pools.mode = mode;
    cfg.pools.prefill_workers = 2;
    cfg.pools.colocated_workers = 2;
    cfg.scheduling.prefill_policy = std::make_shared<round_robin>();
    cfg.pools.kv_blocks_per_worker = 256;
    pipeline p(cfg);
    std::vector<std::pair<std::vector<token_id>, request_handle>> reqs;
    int kills = 0;
    for (int i = 0; i < 40; ++i) {
      auto prompt = prompt_of(96, 600 + i % 3, V);
      for (auto t : prompt_of(10 + i % 7, 700 + i, V)) prompt.push_back(t);
      auto h = p.submit({.prompt_tokens = prompt, .max_tokens = 6, .sampling = {.temperature = 0.0f}, .ignore_eos = true});
      reqs.emplace_back(std::move(prompt), std::move(h));
      if (i % 8 == 4) kills += p.kill("kv_store") == "kv_store";
      std::this_thread::sleep_for(2ms);  // pacing: the kills land among requests arriving over time
    }
    for (auto& [prompt, h] : reqs) {
      const auto r = h.wait(60s);
      ASSERT_EQ(r.error, errc::ok) << r.message;
      EXPECT_EQ(r.tokens, alone(*m, prompt, 6, {.temperature = 0.0f}, true));
    }
    EXPECT_GE(kills, 4);
    expect_no_leaks(p);
  }
}

// A prompt whose full blocks are all in the host store goes straight to a decode worker, which
// fetches them and computes only the tail: no prefill worker, no KV link; the output is what a
// lone engine gives. With the store emptied (killed) it takes the prefill path again.
TEST(Pipeline, WholePromptInTheStoreGoesStraightToDecode) {
  auto m = tiny();
  const int V = m->config().n_vocab;
  serving_config cfg;
  cfg.model.loaded = m;
  cfg.pools.kv_blocks_per_worker = 256;
  pipeline p(cfg);
  const auto direct = [&] { return p.metrics().get_counter("tandem_router_direct_to_decode_total", "").value(); };
  const auto computed = [&] { return p.metrics().get_counter("tandem_prompt_tokens_computed_total", "").value(); };
  const sampling_params greedy{.temperature = 0.0f}, seeded{.temperature = 0.9f, .top_k = 30, .seed = 5};
  const auto prompt = prompt_of(103, 21, V);  // 6 full blocks before the last token, a 7-token tail
  for (int i = 0; i < 2; ++i) {
    const auto& sp = i == 0 ? greedy : seeded;
    const auto r = p.submit({.prompt_tokens = prompt, .max_tokens = 12, .sampling = sp, .ignore_eos = true}).wait(60s);
    ASSERT_EQ(r.error, errc::ok) << r.message;
    EXPECT_EQ(r.tokens, alone(*m, prompt, 12, sp, true));
    EXPECT_EQ(r.timings.kv_bytes > 0, i == 0);  // the direct one moved no KV over a link
  }
  // The first computed all 103 prompt tokens on the prefill worker; the second only the tail,
  // on the decode worker.
  EXPECT_EQ(direct(), 1);
  EXPECT_EQ(computed(), 103 + 7);
  // The next turn of that conversation is not whole in the store: prefill path.
  auto longer = prompt;
  for (auto t : prompt_of(30, 22, V)) longer.push_back(t);
  const auto r2 = p.submit({.prompt_tokens = longer, .max_tokens = 5, .sampling = greedy, .ignore_eos = true}).wait(60s);
  ASSERT_EQ(r2.error, errc::ok) << r2.message;
  EXPECT_EQ(r2.tokens, alone(*m, longer, 5, greedy, true));
  EXPECT_EQ(direct(), 1);
  // A new, empty store: the same prompt is prefilled again (and is exact).
  auto& stored = p.metrics().get_gauge("tandem_kv_store_blocks", "", {{"tier", "memory"}});
  ASSERT_GT(stored.value(), 0);
  ASSERT_EQ(p.kill("kv_store"), "kv_store");
  ASSERT_TRUE(eventually([&] { return stored.value() == 0; })) << "no fresh, empty store took the killed one's place";
  const auto r3 = p.submit({.prompt_tokens = prompt, .max_tokens = 12, .sampling = greedy, .ignore_eos = true}).wait(60s);
  ASSERT_EQ(r3.error, errc::ok) << r3.message;
  EXPECT_EQ(r3.tokens, alone(*m, prompt, 12, greedy, true));
  EXPECT_EQ(direct(), 1) << "sent straight to decode from an empty store";
  expect_no_leaks(p);
}

// Direct-to-decode requests under decode kills and store kills: each either finishes exactly
// or recovers (reserved again, fetched again, or prefilled); nothing leaks.
TEST(Pipeline, DirectRequestsSurviveDecodeAndStoreKills) {
  auto m = tiny();
  const int V = m->config().n_vocab;
  serving_config cfg;
  cfg.model.loaded = m;
  cfg.pools.decode_workers = 2;
  cfg.pools.kv_blocks_per_worker = 256;
  pipeline p(cfg);
  const sampling_params greedy{.temperature = 0.0f};
  std::vector<std::vector<token_id>> prompts;
  for (int f = 0; f < 3; ++f) {  // put three prompts in the store
    prompts.push_back(prompt_of(70 + 16 * f, 40 + f, V));
    ASSERT_EQ(p.submit({.prompt_tokens = prompts.back(), .max_tokens = 2, .sampling = greedy, .ignore_eos = true}).wait(60s).error,
              errc::ok);
  }
  // The second prompt's requests with repetition_penalty: sent straight to a decode worker,
  // their first token is sampled there from the whole prompt's logits, the prompt read too.
  auto sp_of = [&](int f) {
    sampling_params sp = greedy;
    if (f == 1) sp.repetition_penalty = 1.6f;
    return sp;
  };
  std::vector<std::pair<int, request_handle>> hs;
  for (int i = 0; i < 30; ++i) {
    hs.emplace_back(i % 3, p.submit({.prompt_tokens = prompts[size_t(i % 3)], .max_tokens = 10, .sampling = sp_of(i % 3),
                                     .ignore_eos = true}));
    if (i % 10 == 3) p.kill(actor_kind::decode, i % 2);
    if (i == 17) p.kill("kv_store");
    std::this_thread::sleep_for(3ms);  // pacing: the kills land among requests arriving over time
  }
  for (auto& [f, h] : hs) {
    const auto r = h.wait(60s);
    ASSERT_EQ(r.error, errc::ok) << r.message;
    EXPECT_EQ(r.tokens, alone(*m, prompts[size_t(f)], 10, sp_of(f), true));
  }
  EXPECT_GT(p.metrics().get_counter("tandem_router_direct_to_decode_total", "").value(), 0);
  expect_no_leaks(p);
}
