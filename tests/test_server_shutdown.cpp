// tandem serve end to end, stopping it: in-flight requests drain; streams that outlive the grace
// period are told why they end; a drain under load ends every stream cleanly, every time.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "tests/support/server_fixture.h"

using namespace tandem;
using namespace tandem::testing_support;
using namespace std::chrono_literals;

TEST_F(ServerTest, ShutdownDrainsInFlightRequests) {
  server::server_config sc;
  sc.grace = 20s;
  start(sc);
  std::thread client([&] {
    auto r = request(http::verb::post, "/v1/completions",
                     R"({"model":"tiny","prompt":"x","max_tokens":60,"ignore_eos":true})");
    EXPECT_EQ(r.status, 200);
    EXPECT_EQ(json::parse(r.body)["usage"]["completion_tokens"], 60);
  });
  // (EXPECT: the client thread must be joined whatever happens.)
  EXPECT_TRUE(eventually([&] { return pipe->stats().live_requests > 0; })) << "the request never reached the pipeline";
  srv->stop();  // no new requests; the one in flight finishes
  runner.join();  // run() returns once it has
  client.join();
}

// Issue 22 item 6: when the grace period ends with streams still running, each gets the
// documented shutting_down error (an SSE error event then [DONE]; a WebSocket error frame,
// then close 1001 "shutting_down") instead of a cut connection.
TEST_F(ServerTest, GraceEndTellsStreamsWhyTheyEnd) {
  server::server_config sc;
  sc.grace = 300ms;
  start(sc);
  pipe->inject(fault_kind::stall, 4, 3000ms);  // steps hang: the requests outlive the grace period
  std::string sse_body;
  std::thread http_client([&] {
    sse_body = request(http::verb::post, "/v1/completions",
                       R"({"model":"tiny","prompt":"x","max_tokens":60,"ignore_eos":true,"stream":true})")
                   .body;
  });
  net::io_context ioc;
  websocket::stream<tcp::socket> ws(ioc);
  ws.next_layer().connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port));
  ws.handshake("localhost", "/ws");
  ws.write(net::buffer(json({{"type", "generate"}, {"id", "g"}, {"prompt", "Once"}, {"max_tokens", 60}}).dump()));
  EXPECT_TRUE(eventually([&] { return pipe->stats().live_requests >= 2; }))  // (the client thread is joined below)
      << "the two streams never both reached the pipeline";
  srv->stop();
  std::vector<json> frames;
  beast::error_code ec;
  for (;;) {
    beast::flat_buffer b;
    ws.read(b, ec);
    if (ec) break;
    frames.push_back(json::parse(beast::buffers_to_string(b.data())));
  }
  EXPECT_EQ(ec, websocket::error::closed) << ec.message();
  EXPECT_EQ(ws.reason().code, websocket::close_code::going_away);
  EXPECT_EQ(std::string(ws.reason().reason.c_str()), "shutting_down");
  bool told = false;
  for (const auto& f : frames) told = told || (f["type"] == "error" && f["id"] == "g" && f["code"] == "shutting_down");
  EXPECT_TRUE(told) << json(frames).dump();
  runner.join();
  http_client.join();
  bool done = false;
  const auto events = sse_events(sse_body, done);
  EXPECT_TRUE(done) << sse_body;
  ASSERT_FALSE(events.empty()) << sse_body;
  EXPECT_EQ(events.back()["error"]["code"], "shutting_down") << sse_body;
}

// Issue 22 item 5: a SIGTERM drain (stop()) while streams run and clients keep connecting,
// in a loop: every stream ends with its last token or the documented shutting_down error,
// never a cut; the server neither crashes nor hangs (an accept re-armed on one io thread
// while stop() closed the acceptor on another crashed it in about one run in 3 of this
// binary; the suite runs this under ASan too).
TEST_F(ServerTest, DrainsUnderLoadEndEveryStreamCleanlyEveryTime) {
  for (int round = 0; round < 8; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    server::server_config sc;
    sc.grace = 300ms;
    start(sc);
    // Odd rounds: steps hang past the grace period, so the streams are told shutting_down;
    // even rounds: they finish within it.
    if (round % 2) pipe->inject(fault_kind::stall, 2, 1000ms);
    std::atomic<bool> stopping{false};
    std::vector<std::string> sse(6);
    std::vector<std::thread> clients;
    for (size_t i = 0; i < sse.size(); ++i)
      clients.emplace_back([&, i] {
        net::io_context ioc;
        beast::tcp_stream s(ioc);
        beast::error_code ec;
        s.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port), ec);
        http::request<http::string_body> req(http::verb::post, "/v1/completions", 11);
        req.set(http::field::host, "localhost");
        req.set(http::field::content_type, "application/json");
        req.body() = json({{"model", "tiny"},
                           {"prompt", "Once upon"},
                           {"max_tokens", 40 + 40 * int(i)},
                           {"ignore_eos", true},
                           {"stream", true}})
                         .dump();
        req.prepare_payload();
        if (!ec) http::write(s, req, ec);
        beast::flat_buffer buf;
        http::response_parser<http::string_body> p;
        if (!ec) http::read(s, buf, p, ec);
        // Not accepted before the acceptor closed (refused, or reset from the listen queue
        // before any byte came back), or a 503 (it came after the stop): no request was made.
        // An error once the response had begun is a cut stream, and fails below.
        if ((ec && !p.is_header_done()) || (!ec && p.get().result_int() == 503)) return;
        sse[i] = p.get().body();
        if (ec) sse[i] += "\n(cut: " + ec.message() + ")";
      });
    std::vector<std::string> ws_end(4);
    for (size_t i = 0; i < ws_end.size(); ++i)
      clients.emplace_back([&, i] {
        net::io_context ioc;
        websocket::stream<tcp::socket> ws(ioc);
        beast::error_code ec;
        ws.next_layer().connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port), ec);
        if (!ec) ws.handshake("localhost", "/ws", ec);
        if (ec) return void(ws_end[i] = "refused");  // the server was stopping already
        ws.write(net::buffer(json({{"type", "generate"},
                                   {"id", "g"},
                                   {"prompt", "Once"},
                                   {"max_tokens", 60 + 40 * int(i)},
                                   {"ignore_eos", true}})
                                 .dump()),
                 ec);
        for (;;) {
          beast::flat_buffer b;
          ws.read(b, ec);
          if (ec) break;
          const json f = json::parse(beast::buffers_to_string(b.data()));
          if (f["type"] == "done") ws_end[i] = "done";
          if (f["type"] == "error") ws_end[i] = f.value("code", "?");
        }
        if (ws_end[i].empty()) ws_end[i] = "cut: " + ec.message();
      });
    // Clients that keep connecting while the server stops.
    std::thread knocker([&] {
      while (!stopping) {
        net::io_context ioc;
        tcp::socket s(ioc);
        beast::error_code ec;
        s.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port), ec);
        if (!ec) net::write(s, net::buffer(std::string("GET /health HTTP/1.1\r\nHost: x\r\n\r\n")), ec);
      }
    });
    // An idle keep-alive connection: one answer, then nothing asked.
    net::io_context idle_ioc;
    beast::tcp_stream idle(idle_ioc);
    idle.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port));
    http::request<http::string_body> hreq(http::verb::get, "/health", 11);
    hreq.set(http::field::host, "localhost");
    http::write(idle, hreq);
    beast::flat_buffer idle_buf;
    http::response<http::string_body> hres;
    http::read(idle, idle_buf, hres);
    ASSERT_TRUE(hres.keep_alive());
    // Most streams running when the server stops; not a condition of the test (short ones may
    // have ended, late ones be refused): after 2 s it stops whatever the count.
    (void)eventually([&] { return pipe->stats().live_requests >= 6; }, 2s);
    srv->stop();
    runner.join();  // run() returns: the drain ended
    {  // the idle connection was closed by the server, not left open
      beast::error_code ec;
      http::response<http::string_body> more;
      idle.expires_after(5s);
      http::read(idle, idle_buf, more, ec);
      EXPECT_EQ(ec, http::error::end_of_stream) << ec.message();
    }
    stopping = true;
    knocker.join();
    for (auto& t : clients) t.join();
    for (size_t i = 0; i < sse.size(); ++i) {
      bool done = false;
      const auto events = sse_events(sse[i], done);
      if (sse[i].empty()) continue;  // refused: it came after the stop
      EXPECT_TRUE(done) << "stream " << i << " was cut: " << sse[i];
      if (done && !events.empty()) {
        const json& last = events.back();
        const bool finished =
            last.contains("choices") && !last["choices"].empty() && last["choices"][0]["finish_reason"].is_string();
        const bool told = last.contains("error") && last["error"]["code"] == "shutting_down";
        EXPECT_TRUE(finished || told) << "stream " << i << " ends with " << last.dump();
      }
    }
    for (size_t i = 0; i < ws_end.size(); ++i)
      EXPECT_TRUE(ws_end[i] == "done" || ws_end[i] == "shutting_down" || ws_end[i] == "refused")
          << "websocket " << i << ": " << ws_end[i];
    srv.reset();
    pipe.reset();
  }
}
