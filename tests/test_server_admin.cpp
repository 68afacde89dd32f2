// tandem serve end to end, operating it: /health, /v1/models, the pages and /metrics; the API
// and admin keys; /admin/state and /admin/kill (answered within its bound when the router
// cannot answer).
#include <gtest/gtest.h>

#include <chrono>

#include "tests/support/server_fixture.h"

using namespace tandem;
using namespace tandem::testing_support;
using namespace std::chrono_literals;

TEST_F(ServerTest, HealthModelsAndMetrics) {
  start();
  reply h;
  EXPECT_TRUE(eventually([&] {  // ready once the workers have joined
    h = request(http::verb::get, "/health");
    return h.status == 200;
  })) << "/health never said ready";
  EXPECT_EQ(h.status, 200) << h.body;
  EXPECT_EQ(json::parse(h.body)["status"], "ok");
  auto m = request(http::verb::get, "/v1/models");
  ASSERT_EQ(m.status, 200);
  EXPECT_EQ(json::parse(m.body)["data"][0]["id"], "tiny");
  auto page = request(http::verb::get, "/");
  EXPECT_EQ(page.status, 200);
  EXPECT_NE(page.body.find("WebSocket"), std::string::npos);
  EXPECT_EQ(request(http::verb::get, "/dashboard").status, 200);
  (void)request(http::verb::post, "/v1/completions", R"({"model":"tiny","prompt":"hi","max_tokens":3})");
  auto metrics = request(http::verb::get, "/metrics");
  EXPECT_EQ(metrics.status, 200);
  EXPECT_NE(metrics.body.find("tandem_requests_total"), std::string::npos);
}

// Issue 22 item 7: /admin/kill answers within a bound whatever the pipeline is doing. Here
// the pipeline's only actor thread is blocked (a stalled KV link holds it for 5 s): the kill
// cannot be decided, and the answer is a 503 after the bound (2 s), not a wait for the router.
TEST_F(ServerTest, AdminKillAnswersWithinItsBoundWhenTheRouterCannot) {
  server::server_config sc;
  sc.admin_key = "boss";
  serving_config pc;
  pc.pools.scheduler_threads = 1;
  start(sc, pc);
  pipe->inject(fault_kind::stall_link, 1, 5000ms);
  auto h = pipe->submit({.prompt = "Once upon a time", .max_tokens = 4, .ignore_eos = true});
  auto& injected = pipe->metrics().get_counter("tandem_faults_injected_total", "", {{"kind", "stall_link"}});
  ASSERT_TRUE(eventually([&] { return injected.value() >= 1; })) << "the armed stall never met a KV link";
  ASSERT_EQ(injected.value(), 1.0);
  const auto t0 = std::chrono::steady_clock::now();
  auto r = request(http::verb::post, "/admin/kill", R"({"kind": "decode"})", "boss");
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.status, 503) << r.body;
  EXPECT_NE(r.body.find("did not answer within 2000 ms"), std::string::npos) << r.body;
  EXPECT_LT(waited, 4.0) << "the admin call waited for the blocked router";
  // Once the link lets go, the request finishes and the next kill is decided as usual.
  EXPECT_EQ(h.wait(30s).error, errc::ok);
  EXPECT_EQ(request(http::verb::post, "/admin/kill", R"({"kind": "decode", "index": 0})", "boss").status, 200);
}

TEST_F(ServerTest, KeysGuardTheApiAndAdmin) {
  server::server_config sc;
  sc.api_key = "secret";
  sc.admin_key = "boss";
  start(sc);
  const std::string body = R"({"model":"tiny","prompt":"x","max_tokens":2})";
  EXPECT_EQ(request(http::verb::post, "/v1/completions", body).status, 401);
  EXPECT_EQ(request(http::verb::post, "/v1/completions", body, "wrong").status, 401);
  EXPECT_EQ(request(http::verb::post, "/v1/completions", body, "secret").status, 200);
  EXPECT_EQ(request(http::verb::get, "/admin/state", "", "secret").status, 401);
  auto st = request(http::verb::get, "/admin/state", "", "boss");
  EXPECT_EQ(st.status, 200);
  const json state = json::parse(st.body);
  EXPECT_TRUE(state["workers"].is_array());
  EXPECT_TRUE(state["router"]["requests"].contains("decoding"));
  EXPECT_EQ(state["router"]["prefill_queue"], 0);
  EXPECT_EQ(state["router"]["tracked"], 0);
  EXPECT_TRUE(state["router"]["listed"].is_array());
  EXPECT_EQ(state["router"]["kv_links"], 1);
  EXPECT_TRUE(state["live_connections"].is_number_integer());

  // Issue 22 item 8: out-of-range admin fields are refused, not clamped or taken as "any";
  // every admin 404 is an error object.
  auto admin = [&](const std::string& path, const json& b) {
    auto r = request(http::verb::post, path, b.dump(), "boss");
    const json j = json::parse(r.body, nullptr, false);
    EXPECT_TRUE(j.contains("error") && j["error"].contains("message")) << path << " " << b.dump() << " -> " << r.body;
    return std::pair{r.status, j.contains("error") ? j["error"].value("param", json()).dump() : std::string()};
  };
  EXPECT_EQ(admin("/admin/kill", {{"kind", "decode"}, {"index", -1}}), (std::pair{400, std::string("\"index\"")}));
  EXPECT_EQ(admin("/admin/kill", {{"kind", "decode"}, {"index", 7}}).first, 404);  // no decode worker 7
  EXPECT_EQ(admin("/admin/fault", {{"fault", "stall"}, {"count", 0}}), (std::pair{400, std::string("\"count\"")}));
  EXPECT_EQ(admin("/admin/fault", {{"fault", "stall"}, {"count", -1}}).first, 400);
  EXPECT_EQ(admin("/admin/fault", {{"fault", "stall"}, {"stall_ms", int64_t(1e15)}}),
            (std::pair{400, std::string("\"stall_ms\"")}));
  EXPECT_EQ(admin("/admin/nope", json::object()).first, 404);
  // Nothing was armed or killed by those: the next request is served as usual.
  EXPECT_EQ(request(http::verb::post, "/v1/completions", body, "secret").status, 200);
}
