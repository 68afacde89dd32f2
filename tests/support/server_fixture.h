#pragma once
// What the server tests (test_server_*.cpp) share: tandem serve end to end, in process: a
// pipeline on the tiny synthetic model behind the real HTTP/WebSocket server on a free loopback
// port (ServerTest), driven by plain Beast clients.
#include <gtest/gtest.h>

#include <boost/asio.hpp>
#include <boost/beast.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/eventually.h"
#include "tests/test_models.h"
#include "tools/server/http_server.h"

namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using json = nlohmann::json;

namespace tandem::testing_support {

using namespace std::chrono_literals;

inline std::shared_ptr<const model> tiny() {
  static const std::shared_ptr<const model> m = tiny_model("server");
  return m;
}

// A model with a context long enough for a tools prompt (1024), with Qwen 3's chat template.
inline std::shared_ptr<const model> small() {
  static const std::shared_ptr<const model> m = [] {
    const auto p = std::filesystem::temp_directory_path() / "tandem-test-models" / "server-small-f32.gguf";
    std::filesystem::create_directories(p.parent_path());
    if (!std::filesystem::exists(p)) synthesize_model(find_synth_preset("small"), kernels::dtype::f32, p.string(), 7);
    return model::load(p.string());
  }();
  return m;
}
inline std::shared_ptr<const chat_template> qwen3_template(const tokenizer& tok) {
  std::ifstream in(std::string(TANDEM_TEST_DATA_DIR) + "/templates/qwen3.jinja");
  std::stringstream ss;
  ss << in.rdbuf();
  return std::make_shared<const chat_template>(chat_template::for_vocab(ss.str(), tok));
}

struct reply {
  int status = 0;
  std::string body;
  std::string retry_after;
};

class ServerTest : public ::testing::Test {
 protected:
  std::unique_ptr<pipeline> pipe;
  std::unique_ptr<server::http_server> srv;
  std::thread runner;
  uint16_t port = 0;

  void start(server::server_config sc = {}, serving_config pc = {}, std::shared_ptr<const model> m = nullptr,
             std::shared_ptr<const chat_template> chat = nullptr) {
    if (!m) m = tiny();
    pc.model.loaded = m;
    pc.pools.kv_blocks_per_worker = 256;
    pipe = std::make_unique<pipeline>(pc);
    server::served_model sm{"tiny", m->config().n_ctx, std::move(chat), m->config().n_vocab};
    sc.port = 0;
    srv = std::make_unique<server::http_server>(*pipe, sm, sc);
    port = srv->port();
    runner = std::thread([this] { srv->run(); });
  }
  void TearDown() override {
    if (srv) srv->stop();
    if (runner.joinable()) runner.join();
    srv.reset();
    pipe.reset();
  }

  reply request(http::verb verb, const std::string& target, const std::string& body = "",
                const std::string& auth = "") {
    net::io_context ioc;
    beast::tcp_stream s(ioc);
    s.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port));
    http::request<http::string_body> req(verb, target, 11);
    req.set(http::field::host, "localhost");
    if (!auth.empty()) req.set(http::field::authorization, "Bearer " + auth);
    if (!body.empty()) {
      req.set(http::field::content_type, "application/json");
      req.body() = body;
    }
    req.prepare_payload();
    http::write(s, req);
    beast::flat_buffer buf;
    http::response_parser<http::string_body> p;
    p.body_limit(64 << 20);
    http::read(s, buf, p);
    reply r;
    r.status = p.get().result_int();
    r.body = p.get().body();
    r.retry_after = std::string(p.get()[http::field::retry_after]);
    beast::error_code ec;
    s.socket().shutdown(tcp::socket::shutdown_both, ec);
    return r;
  }

  // What the pipeline alone answers for the same request (the reference).
  std::string direct(const std::string& prompt, int32_t max_tokens, sampling_params sp) {
    return pipe->submit({.prompt = prompt, .max_tokens = max_tokens, .sampling = sp}).wait(30s).text;
  }

  // Kv pools full again and no request actor alive.
  void expect_clean() {
    pipeline_stats st;
    EXPECT_TRUE(eventually([&] {
      st = pipe->stats();
      bool clean = st.live_requests == 0;
      for (const auto& w : st.workers) clean = clean && w.kv_free_blocks == w.kv_total_blocks && w.reserved_blocks == 0;
      return clean;
    })) << "requests or KV blocks still held: "
        << st.live_requests << " live requests";
  }
};

inline std::vector<json> sse_events(const std::string& body, bool& done) {
  std::vector<json> out;
  done = false;
  size_t pos = 0;
  while ((pos = body.find("data: ", pos)) != std::string::npos) {
    const size_t end = body.find("\n\n", pos);
    const std::string data = body.substr(pos + 6, end - pos - 6);
    pos = end;
    if (data == "[DONE]") {
      done = true;
      break;
    }
    out.push_back(json::parse(data));
  }
  return out;
}

}  // namespace tandem::testing_support
