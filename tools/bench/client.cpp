#include "tools/bench/client.h"

#include <utility>  // before Asio: its awaitable.hpp uses std::exchange without including it

#include <boost/asio.hpp>
#include <boost/beast.hpp>
#include <nlohmann/json.hpp>

#include <deque>
#include <map>
#include <mutex>
#include <regex>
#include <stdexcept>
#include <thread>

namespace tandem::bench {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
using tcp = asio::ip::tcp;
using json = nlohmann::json;
using clock_type = std::chrono::steady_clock;

double since(clock_type::time_point t0) { return std::chrono::duration<double>(clock_type::now() - t0).count(); }

json prompt_json(const stream_request& r) {
  if (!r.prompt_text.empty()) return r.prompt_text;
  return json(r.prompt_tokens);
}

}  // namespace

endpoint parse_url(const std::string& url) {
  static const std::regex re(R"((?:https?|wss?)://([^/:]+)(?::(\d+))?/?)");
  std::smatch m;
  if (!std::regex_match(url, m, re)) throw std::invalid_argument("'" + url + "' is not http://HOST[:PORT]");
  return {m[1], m[2].matched ? std::string(m[2]) : "80"};
}

std::chrono::milliseconds parse_duration(const std::string& s) {
  static const std::regex re(R"((\d+(?:\.\d+)?)(ms|s|m))");
  std::smatch m;
  if (!std::regex_match(s, m, re)) throw std::invalid_argument("'" + s + "' is not a duration (e.g. 250ms, 2s, 1m)");
  const double v = std::stod(m[1]);
  return std::chrono::milliseconds(int64_t(m[2] == "ms" ? v : m[2] == "s" ? v * 1000 : v * 60000));
}

http_reply http_call(const endpoint& ep, const std::string& method, const std::string& target,
                     const std::string& bearer, const std::string& body, std::chrono::seconds timeout) {
  asio::io_context ioc;
  beast::tcp_stream s(ioc);
  s.expires_after(timeout);
  s.connect(tcp::resolver(ioc).resolve(ep.host, ep.port));
  http::request<http::string_body> req{http::string_to_verb(method), target, 11};
  req.set(http::field::host, ep.host);
  if (!bearer.empty()) req.set(http::field::authorization, "Bearer " + bearer);
  if (!body.empty()) {
    req.set(http::field::content_type, "application/json");
    req.body() = body;
  }
  req.prepare_payload();
  http::write(s, req);
  beast::flat_buffer buf;
  http::response_parser<http::string_body> p;
  p.body_limit(64u << 20);
  http::read(s, buf, p);
  return {int(p.get().result_int()), p.get().body()};
}

stream_result openai_stream(const endpoint& ep, const std::string& api_key, const stream_request& r,
                            std::chrono::seconds timeout) {
  stream_result out;
  const auto t0 = clock_type::now();
  try {
    asio::io_context ioc;
    beast::tcp_stream s(ioc);
    s.expires_after(timeout);
    s.connect(tcp::resolver(ioc).resolve(ep.host, ep.port));
    json body = {{"model", r.model},  {"prompt", prompt_json(r)}, {"max_tokens", r.max_tokens},
                 {"temperature", 0},  {"stream", true},           {"stream_options", {{"include_usage", true}}},
                 {"ignore_eos", true}};
    http::request<http::string_body> req{http::verb::post, "/v1/completions", 11};
    req.set(http::field::host, ep.host);
    req.set(http::field::content_type, "application/json");
    if (!api_key.empty()) req.set(http::field::authorization, "Bearer " + api_key);
    req.body() = body.dump();
    req.prepare_payload();
    http::write(s, req);
    beast::flat_buffer buf;
    http::response_parser<http::buffer_body> p;
    p.body_limit(boost::none);
    http::read_header(s, buf, p);
    std::string pending;
    char tmp[8192];
    bool done = false;
    while (!p.is_done()) {
      p.get().body().data = tmp;
      p.get().body().size = sizeof tmp;
      // read_some: back as soon as some of the body came (one event, usually). read() would
      // wait until the buffer is full, timing every token in it at the moment the last came
      // (whole short answers looked like one burst at their end).
      beast::error_code ec;
      http::read_some(s, buf, p, ec);
      if (ec == http::error::need_buffer) ec = {};
      if (ec) throw beast::system_error(ec);
      pending.append(tmp, sizeof tmp - p.get().body().size);
      if (p.get().result_int() != 200) continue;  // the whole error body, below
      // Server-sent events: "data: <json>" lines, events separated by a blank line.
      for (size_t end; (end = pending.find('\n')) != std::string::npos; pending.erase(0, end + 1)) {
        std::string line = pending.substr(0, end);
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (line.rfind("data:", 0) != 0) continue;
        const std::string data = line.substr(line.size() > 5 && line[5] == ' ' ? 6 : 5);
        if (data == "[DONE]") {
          done = true;
          continue;
        }
        const json j = json::parse(data, nullptr, false);
        if (j.is_discarded()) throw std::runtime_error("a stream event is not JSON: " + data.substr(0, 200));
        if (j.contains("error")) throw std::runtime_error("error event: " + j["error"].dump());
        if (j.contains("usage") && j["usage"].is_object()) {
          out.prompt_tokens = j["usage"].value("prompt_tokens", 0);
          out.output_tokens = j["usage"].value("completion_tokens", 0);
        }
        if (j.contains("choices") && j["choices"].is_array() && !j["choices"].empty()) {
          const auto& c = j["choices"][0];
          if (c.contains("text") && c["text"].is_string() && !c["text"].get<std::string>().empty())
            out.token_times_s.push_back(since(t0));
        }
      }
    }
    if (p.get().result_int() != 200)
      throw std::runtime_error("HTTP " + std::to_string(p.get().result_int()) + ": " + pending.substr(0, 300));
    if (!done) throw std::runtime_error("the stream ended without [DONE]");
    if (out.output_tokens == 0) out.output_tokens = int32_t(out.token_times_s.size());  // no usage: count chunks
    if (out.token_times_s.empty()) throw std::runtime_error("no token was streamed");
    out.ttft_s = out.token_times_s.front();
    out.e2e_s = since(t0);
    out.ok = true;
  } catch (const std::exception& e) {
    out.ok = false;
    out.error = e.what();
    out.e2e_s = since(t0);
  }
  return out;
}

// ---------------------------------------------------------------------- WebSocket

struct ws_client::impl {
  asio::io_context ioc;
  websocket::stream<beast::tcp_stream> ws{ioc};
  beast::flat_buffer rbuf;
  std::deque<std::string> outbox;
  bool writing = false;
  struct pending {
    clock_type::time_point sent;
    stream_result r;
    std::function<void(stream_result)> done;
  };
  std::map<std::string, pending> inflight;
  uint64_t next_id = 0;
  // Keeps the I/O thread running after the connection failed, so that a later submit (a
  // conversation's next turn, sent when the one before ends) is answered with `broken`
  // rather than never run.
  asio::executor_work_guard<asio::io_context::executor_type> keep{ioc.get_executor()};
  std::string broken;  // why the connection is unusable; empty while it works
  std::thread io;

  void write_next() {
    if (writing || outbox.empty()) return;
    writing = true;
    ws.async_write(asio::buffer(outbox.front()), [this](beast::error_code ec, size_t) {
      writing = false;
      outbox.pop_front();
      if (ec) return fail_all("write: " + ec.message());
      write_next();
    });
  }
  void fail_all(const std::string& why) {
    if (broken.empty()) broken = why;
    auto all = std::move(inflight);
    inflight.clear();
    for (auto& [id, p] : all) {
      p.r.ok = false;
      p.r.error = why;
      p.r.e2e_s = since(p.sent);
      p.done(std::move(p.r));
    }
  }
  void read() {
    ws.async_read(rbuf, [this](beast::error_code ec, size_t) {
      if (ec) return fail_all("the connection ended: " + ec.message());
      const json f = json::parse(beast::buffers_to_string(rbuf.data()), nullptr, false);
      rbuf.consume(rbuf.size());
      if (f.is_object() && f.contains("id") && f["id"].is_string()) on_frame(f);
      read();
    });
  }
  void on_frame(const json& f) {
    auto it = inflight.find(f["id"].get<std::string>());
    if (it == inflight.end()) return;
    auto& p = it->second;
    const std::string type = f.value("type", "");
    if (type == "token") {
      p.r.token_times_s.push_back(since(p.sent));
      // -1: text held back for a stop string, carried by a frame of its own, no new token.
      const int64_t id = f.contains("token") && f["token"].is_number_integer() ? f["token"].get<int64_t>() : -1;
      if (id >= 0) {
        ++p.r.output_tokens;
        p.r.output_token_ids.push_back(int32_t(id));
      }
      return;
    }
    if (type != "done" && type != "error") return;
    p.r.e2e_s = since(p.sent);
    if (type == "error") {
      p.r.error = f.value("code", "") + ": " + f.value("message", "");
    } else if (p.r.token_times_s.empty()) {
      p.r.error = "no token was streamed";
    } else {
      p.r.ok = true;
      p.r.ttft_s = p.r.token_times_s.front();
      if (f.contains("usage") && f["usage"].is_object()) {
        p.r.prompt_tokens = f["usage"].value("prompt_tokens", 0);
        p.r.output_tokens = f["usage"].value("completion_tokens", p.r.output_tokens);
      }
    }
    auto done = std::move(p.done);
    auto r = std::move(p.r);
    inflight.erase(it);
    done(std::move(r));
  }
};

ws_client::ws_client(const endpoint& ep, const std::string& api_key) : impl_(std::make_unique<impl>()) {
  auto& i = *impl_;
  beast::get_lowest_layer(i.ws).connect(tcp::resolver(i.ioc).resolve(ep.host, ep.port));
  i.ws.set_option(websocket::stream_base::decorator([api_key](websocket::request_type& r) {
    if (!api_key.empty()) r.set(http::field::authorization, "Bearer " + api_key);
  }));
  i.ws.handshake(ep.host, "/ws");
  i.read();
  i.io = std::thread([&i] { i.ioc.run(); });
}

ws_client::~ws_client() {
  auto& i = *impl_;
  asio::post(i.ioc, [&i] {
    beast::error_code ec;
    beast::get_lowest_layer(i.ws).socket().shutdown(tcp::socket::shutdown_both, ec);
    beast::get_lowest_layer(i.ws).close();
  });
  i.keep.reset();  // run() returns once the close's handlers are done
  if (i.io.joinable()) i.io.join();
}

void ws_client::submit(const stream_request& r, std::function<void(stream_result)> done) {
  json f = {{"type", "generate"},
            {"prompt", prompt_json(r)},
            {"max_tokens", r.max_tokens},
            {"temperature", 0},
            {"ignore_eos", true}};
  asio::post(impl_->ioc, [this, f = std::move(f), done = std::move(done)]() mutable {
    auto& i = *impl_;
    if (!i.broken.empty()) {
      stream_result r;
      r.error = i.broken;
      return done(std::move(r));
    }
    const std::string id = "b" + std::to_string(i.next_id++);
    f["id"] = id;
    i.inflight[id] = {clock_type::now(), {}, std::move(done)};
    i.outbox.push_back(f.dump());
    i.write_next();
  });
}

}  // namespace tandem::bench
