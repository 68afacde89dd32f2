// tandem serve end to end, its connections: a WebSocket interleaves requests, cancels, and frees
// what a vanished client held; pipelined HTTP/1.1 posts are both answered; slow headers,
// oversized frames, bad UTF-8 and too many requests on one connection are closed or refused.
#include <gtest/gtest.h>

#include <map>

#include "tests/support/server_fixture.h"

using namespace tandem;
using namespace tandem::testing_support;
using namespace std::chrono_literals;

TEST_F(ServerTest, WebSocketInterleavesCancelsAndFreesOnDisconnect) {
  start();
  net::io_context ioc;
  websocket::stream<beast::tcp_stream> ws(ioc);
  beast::get_lowest_layer(ws).connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port));
  ws.handshake("localhost", "/ws");
  auto send = [&](const json& j) { ws.write(net::buffer(j.dump())); };
  auto recv = [&] {
    beast::flat_buffer b;
    ws.read(b);
    return json::parse(beast::buffers_to_string(b.data()));
  };

  // Two requests at once on one connection: each stream complete and equal to the pipeline's.
  send({{"type", "generate"}, {"id", "a"}, {"prompt", "Once upon a time"}, {"max_tokens", 8}, {"ignore_eos", true}});
  send({{"type", "generate"}, {"id", 7}, {"prompt", "The dog"}, {"max_tokens", 5}, {"ignore_eos", true}});
  std::map<std::string, std::string> text;
  std::map<std::string, int> tokens;
  int done = 0;
  while (done < 2) {
    const json f = recv();
    ASSERT_NE(f["type"], "error") << f.dump();
    const std::string id = f["id"].get<std::string>();
    if (f["type"] == "token") {
      EXPECT_EQ(f["index"], tokens[id]++);
      text[id] += f["text"].get<std::string>();
    }
    if (f["type"] == "done") {
      ++done;
      EXPECT_EQ(f["finish_reason"], "length");
      EXPECT_TRUE(f["timings"].contains("ttft_ms"));
    }
  }
  EXPECT_EQ(tokens["a"], 8);
  EXPECT_EQ(tokens["7"], 5);
  const sampling_params greedy{.temperature = 0.0f};
  EXPECT_EQ(text["a"],
            pipe->submit({.prompt = "Once upon a time", .max_tokens = 8, .sampling = greedy, .ignore_eos = true})
                .wait(30s)
                .text);

  // Bad frames get error frames; the connection stays usable.
  send({{"type", "dance"}, {"id", "x"}});
  EXPECT_EQ(recv()["type"], "error");
  ws.write(net::buffer(std::string("{oops")));
  EXPECT_EQ(recv()["code"], "invalid_argument");
  send({{"type", "generate"}, {"id", "y"}});
  EXPECT_EQ(recv()["type"], "error");

  // Cancel: the request ends with done/cancelled. (As long as the tiny model's context allows:
  // 100 tokens could all be generated before the cancel arrived when the suite ran in parallel.)
  send({{"type", "generate"}, {"id", "long"}, {"prompt", "Once"}, {"max_tokens", 240}, {"ignore_eos", true}});
  for (json f = recv(); f["type"] != "token"; f = recv()) {}
  send({{"type", "cancel"}, {"id", "long"}});
  std::string reason;
  while (reason.empty()) {
    const json f = recv();
    ASSERT_NE(f["type"], "error") << f.dump();
    if (f["type"] == "done") reason = f["finish_reason"].get<std::string>();
  }
  EXPECT_EQ(reason, "cancelled");

  // A client that vanishes mid-generation: its request is cancelled and its KV freed.
  send({{"type", "generate"}, {"id", "gone"}, {"prompt", "Once"}, {"max_tokens", 100}, {"ignore_eos", true}});
  for (json f = recv(); f["type"] != "token"; f = recv()) {}
  beast::get_lowest_layer(ws).socket().close();
  expect_clean();
}

// Issue 22 item 1: HTTP/1.1 pipelining. Two generating POSTs written in one go, well past
// 512 bytes together, get both answers, in order.
TEST_F(ServerTest, PipelinedPostsAreBothAnswered) {
  start();
  for (size_t pad : {100u, 600u, 3000u}) {
    SCOPED_TRACE("padding " + std::to_string(pad));
    auto post = [&](const std::string& prompt, int n) {
      const std::string body = json({{"model", "tiny"},
                                     {"prompt", prompt},
                                     {"max_tokens", n},
                                     {"ignore_eos", true},
                                     {"user", std::string(pad, 'u')}})
                                   .dump();
      return "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
             std::to_string(body.size()) + "\r\n\r\n" + body;
    };
    net::io_context ioc;
    tcp::socket s(ioc);
    s.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port));
    net::write(s, net::buffer(post("Once upon a time", 20) + post("The dog", 5)));
    beast::flat_buffer buf;
    for (int want : {20, 5}) {
      SCOPED_TRACE("answer of " + std::to_string(want) + " tokens");
      http::response<http::string_body> res;
      beast::error_code ec;
      http::read(s, buf, res, ec);
      ASSERT_FALSE(ec) << ec.message();
      ASSERT_EQ(res.result_int(), 200) << res.body();
      EXPECT_EQ(json::parse(res.body())["usage"]["completion_tokens"], want);
    }
  }
  expect_clean();
}

TEST_F(ServerTest, SlowHeadersOversizedFramesAndBadUtf8AreClosed) {
  server::server_config sc;
  sc.header_timeout = 300ms;
  sc.max_frame_bytes = 1024;
  sc.max_requests_per_connection = 2;
  start(sc);
  net::io_context ioc;
  {  // Headers that never finish: closed after the timeout.
    beast::tcp_stream s(ioc);
    s.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port));
    net::write(s.socket(), net::buffer(std::string("GET /health HTTP/1.1\r\nHost: x\r\n")));
    char c;
    beast::error_code ec;
    s.socket().read_some(net::buffer(&c, 1), ec);  // blocks until the server gives up on us
    EXPECT_TRUE(ec == net::error::eof || ec == net::error::connection_reset) << ec.message();
  }
  auto connect_ws = [&](websocket::stream<beast::tcp_stream>& ws) {
    beast::get_lowest_layer(ws).connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port));
    ws.handshake("localhost", "/ws");
  };
  {  // Too many requests on one connection: the extra one gets an error, the others go on.
    websocket::stream<beast::tcp_stream> ws(ioc);
    connect_ws(ws);
    for (const char* id : {"1", "2", "3"})
      ws.write(net::buffer(
          json({{"type", "generate"}, {"id", id}, {"prompt", "Once"}, {"max_tokens", 60}, {"ignore_eos", true}})
              .dump()));
    int done = 0;
    bool refused = false;
    while (done < 2) {
      beast::flat_buffer b;
      ws.read(b);
      const json f = json::parse(beast::buffers_to_string(b.data()));
      if (f["type"] == "error") {
        EXPECT_EQ(f["id"], "3");
        EXPECT_EQ(f["code"], "overloaded");
        refused = true;
      }
      done += f["type"] == "done";
    }
    EXPECT_TRUE(refused);
  }
  {  // A message over the frame limit: closed with 1009.
    websocket::stream<beast::tcp_stream> ws(ioc);
    connect_ws(ws);
    ws.write(net::buffer(std::string(2000, ' ')));
    beast::flat_buffer b;
    beast::error_code ec;
    ws.read(b, ec);
    EXPECT_TRUE(ec) << "the connection must end";  // (closed, or the teardown's socket error)
    EXPECT_EQ(ws.reason().code, websocket::close_code::too_big);
  }
  {  // A text frame that is not UTF-8: closed with 1007.
    websocket::stream<beast::tcp_stream> ws(ioc);
    connect_ws(ws);
    ws.write(net::buffer(std::string("{\"x\":\"\xff\xfe\"}")));
    beast::flat_buffer b;
    beast::error_code ec;
    ws.read(b, ec);
    EXPECT_TRUE(ec) << "the connection must end";
    EXPECT_EQ(ws.reason().code, websocket::close_code::bad_payload);
  }
  // Everyone else is still served.
  EXPECT_EQ(request(http::verb::post, "/v1/completions", R"({"model":"tiny","prompt":"ok","max_tokens":2})").status,
            200);
  expect_clean();
}
