#include "tools/server/http_server.h"

#include <boost/asio.hpp>
#include <boost/beast.hpp>
#include <algorithm>
#include <array>
#include <atomic>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <unordered_map>
#include <set>
#include <thread>

#include "runtime/oplog.h"
#include "tools/server/openai_stream.h"
#include "tools/server/pages.h"

namespace tandem::server {

namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
namespace net = boost::asio;
using tcp = net::ip::tcp;

namespace {

// How long /admin/kill waits for the router to pick its victim (issue 22 item 7: /admin/*
// answers within a bound, whatever the pipeline is doing).
constexpr std::chrono::milliseconds admin_kill_wait{2000};

std::string chunk(const std::string& data) {
  char head[24];
  std::snprintf(head, sizeof(head), "%zx\r\n", data.size());
  return head + data + "\r\n";
}

std::string bearer(const http::request<http::string_body>& req) {
  const auto h = req[http::field::authorization];
  const std::string_view v(h.data(), h.size());
  return v.rfind("Bearer ", 0) == 0 ? std::string(v.substr(7)) : std::string();
}

std::string query_param(std::string_view target, std::string_view key) {
  const auto q = target.find('?');
  if (q == std::string_view::npos) return {};
  std::string_view rest = target.substr(q + 1);
  while (!rest.empty()) {
    const auto amp = rest.find('&');
    const std::string_view kv = rest.substr(0, amp);
    const auto eq = kv.find('=');
    if (eq != std::string_view::npos && kv.substr(0, eq) == key) return std::string(kv.substr(eq + 1));
    if (amp == std::string_view::npos) break;
    rest = rest.substr(amp + 1);
  }
  return {};
}

}  // namespace

struct http_server::impl : std::enable_shared_from_this<impl> {
  pipeline& pipe;
  served_model mdl;
  server_config cfg;
  // WebSocket sessions alive (the drain waits for their close); before ioc, which destroys the
  // sessions it still holds when it goes.
  std::atomic<int64_t> websockets{0};
  std::atomic<int64_t> http_writing{0};  // HTTP sessions with bytes still to write (the drain waits)
  net::io_context ioc;
  // On a strand of its own: its accept handler (which arms the next accept) and stop()'s close
  // run on different io threads otherwise, and an Asio acceptor used from two threads at once
  // crashed (SIGSEGV in start_op when a close met a re-armed accept: issue 22 item 5).
  tcp::acceptor acceptor{net::make_strand(ioc)};
  std::atomic<bool> draining{false};
  std::atomic<int64_t> in_flight{0};  // generation requests not finished
  std::atomic<int64_t> next_id{1};

  // When the grace period ends, every session still streaming is told (the documented
  // shutting_down error) before the server stops: one hook per live session, each reaching
  // its session through a weak pointer on the session's own strand.
  std::mutex sessions_mu;
  struct session_hooks {
    std::weak_ptr<void> session;
    std::function<void()> grace_over;  // posts the session's grace_over on its strand
    std::function<void()> release;  // once the io_context has stopped: drop self-references
  };
  std::vector<session_hooks> grace_hooks;

  impl(pipeline& p, served_model m, server_config c) : pipe(p), mdl(std::move(m)), cfg(std::move(c)) {}
  void accept();
  template <class Session>
  void watch_grace(const std::shared_ptr<Session>& s) {
    std::lock_guard<std::mutex> lk(sessions_mu);
    // Gone sessions are dropped here, so the list stays as long as the live sessions.
    std::erase_if(grace_hooks, [](const auto& h) { return h.session.expired(); });
    std::weak_ptr<Session> w = s;
    grace_hooks.push_back({w,
                           [w] {
                             if (auto live = w.lock()) net::dispatch(live->executor(), [live] { live->grace_over(); });
                           },
                           [w] {
                             if (auto live = w.lock()) live->release();
                           }});
  }
  void grace_over() {
    std::lock_guard<std::mutex> lk(sessions_mu);
    for (auto& h : grace_hooks) h.grace_over();
  }
  // After run(): nothing runs on the sessions any more; a session that kept itself alive for
  // a generation lets go, so it is destroyed with what the io_context still holds.
  void release_sessions() {
    std::vector<session_hooks> hooks;
    {
      std::lock_guard<std::mutex> lk(sessions_mu);
      hooks.swap(grace_hooks);
    }
    for (auto& h : hooks) h.release();
  }
};

namespace {

// Sessions and handlers point at the server without owning it: they only run inside run(), and
// the io_context (a member of the impl) destroys whatever is still queued when the server goes.
// Only the pipeline's notify callbacks, which come from actor threads, hold a weak_ptr and
// lock it to post.
using impl_ptr = http_server::impl*;

// The pipeline's notify callback for a session, run on actor threads: wakes the session's pump
// on its strand. It holds nothing of Asio's (no executor), because the connection actor may let
// go of it after the io_context is gone; it reaches the session only through the io_context.
template <class Session>
std::function<void()> waker(std::weak_ptr<Session> session, std::weak_ptr<http_server::impl> server) {
  return [session, server] {
    const auto alive = server.lock();  // keeps the io_context alive while posting
    if (!alive) return;
    net::post(alive->ioc, [session] {
      if (auto s = session.lock()) net::dispatch(s->executor(), [s] { s->pump(); });
    });
  };
}

// ---------------------------------------------------------------- HTTP session

class http_session : public std::enable_shared_from_this<http_session> {
 public:
  http_session(tcp::socket&& s, impl_ptr srv) : stream_(std::move(s)), srv_(std::move(srv)) {}
  void start() {
    srv_->watch_grace(shared_from_this());
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->read(); });
  }

  void release() { keep_alive_.reset(); }

  // The drain is over. A request still running gets the shutting_down error (an SSE error
  // event and [DONE], or a 503), not a cut connection; an idle keep-alive connection (or the
  // dashboard feed) is closed, as a server going away does, rather than left open.
  void grace_over() {
    if (!answer_) {
      if (!writing_ && !sending_) close();
      return;
    }
    close_after_ = true;
    const auto why = error_from(errc::shutting_down, "the server is shutting down: the grace period ended", 0);
    carry_out(answer_->on(in::abort{why}));
  }

 private:
  using request_t = http::request<http::string_body>;

  beast::tcp_stream stream_;
  impl_ptr srv_;
  beast::flat_buffer buf_;
  std::optional<http::request_parser<http::string_body>> parser_;
  request_t req_;
  // Streaming (SSE) and pending generation state.
  connection conn_;  // opened with the first generation; its actor subscribes to its requests
  std::array<char, 1024> peek_;  // what the disconnect watch reads
  std::shared_ptr<http_session> keep_alive_;  // set while a generation runs (see generate)
  bool watching_ = false, read_after_watch_ = false;
  std::optional<openai_stream> answer_;  // the generation request's answer, while it runs
  std::deque<std::string> out_;
  size_t out_bytes_ = 0;
  bool writing_ = false;
  bool close_after_ = false;
  std::shared_ptr<net::steady_timer> feed_timer_;  // set while serving /dashboard/feed
  bool sending_ = false;  // a whole response (send) is being written

  void read() {
    if (watching_) {  // one read at a time: end the disconnect watch first, read when it has
      read_after_watch_ = true;
      beast::error_code ec;
      stream_.socket().cancel(ec);
      return;
    }
    parser_.emplace();
    parser_->body_limit(srv_->cfg.max_body_bytes);
    parser_->header_limit(16 * 1024);
    stream_.expires_after(srv_->cfg.header_timeout);
    http::async_read(stream_, buf_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) { self->on_read(ec); });
  }

  void on_read(beast::error_code ec) {
    // The client went, or the drain closed an idle keep-alive connection: nothing to answer.
    if (ec == http::error::end_of_stream || ec == beast::error::timeout || ec == net::error::connection_reset ||
        ec == net::error::eof || ec == net::error::operation_aborted) {
      return close();
    }
    if (ec == http::error::body_limit) {
      req_ = {};
      return send_error(api_error{413, "invalid_request_error",
                                  "the request body exceeds " + std::to_string(srv_->cfg.max_body_bytes) + " bytes", "",
                                  "invalid_argument"},
                        true);
    }
    if (ec) {
      req_ = {};
      return send_error(
          api_error{400, "invalid_request_error", "malformed HTTP request: " + ec.message(), "", "invalid_argument"},
          true);
    }
    req_ = parser_->release();
    stream_.expires_never();
    if (websocket::is_upgrade(req_)) return upgrade();
    route();
  }

  // ---- responses

  void send(http::status status, std::string body, std::string content_type, bool close = false,
            std::vector<std::pair<std::string, std::string>> extra = {}) {
    auto res = std::make_shared<http::response<http::string_body>>(status, req_.version());
    res->set(http::field::server, "tandem");
    res->set(http::field::content_type, content_type);
    for (auto& [k, v] : extra) res->set(k, v);
    res->body() = std::move(body);
    res->keep_alive(!close && req_.keep_alive());
    res->prepare_payload();
    close_after_ = !res->keep_alive();
    ++srv_->http_writing;  // the drain's end waits for it (closing)
    sending_ = true;
    http::async_write(stream_, *res, [self = shared_from_this(), res](beast::error_code ec, size_t) {
      --self->srv_->http_writing;
      self->sending_ = false;
      if (ec || self->close_after_) return self->close();
      self->read();
    });
  }

  void send_json(http::status status, const json& j, std::vector<std::pair<std::string, std::string>> extra = {}) {
    send(status, j.dump(-1, ' ', false, json::error_handler_t::replace), "application/json", false, std::move(extra));
  }

  // `logged`: the generation that failed has its log line already (out::finished).
  void send_error(const api_error& e, bool close = false, bool logged = false) {
    if (!logged) {
      server::request_log r;
      r.endpoint = std::string(req_.target().substr(0, req_.target().find('?')));
      r.protocol = "http";
      r.status = e.http_status;
      r.error = e.code.empty() ? e.type : e.code;
      r.message = e.message;
      server::log_request(r);
    }
    std::vector<std::pair<std::string, std::string>> extra;
    if (e.http_status == 429 || e.http_status == 503)
      extra.emplace_back("Retry-After", std::to_string(std::max<int64_t>(1, int64_t((e.retry_after_ms + 999) / 1000))));
    send(http::status(e.http_status), error_body(e).dump(-1, ' ', false, json::error_handler_t::replace),
         "application/json", close, std::move(extra));
  }

  void close() {
    conn_.close();  // the client is gone: its request is cancelled, its KV freed
    if (answer_) carry_out(answer_->on(in::client_gone{}));
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    stream_.socket().close(ec);
  }

  // ---- routing

  void route() {
    const std::string target(req_.target());
    const std::string path = target.substr(0, target.find('?'));
    const auto method = req_.method();
    auto only = [&](http::verb v) {
      if (method == v) return true;
      send_error(api_error{405, "invalid_request_error",
                           "method " + std::string(req_.method_string()) + " is not allowed on " + path, "",
                           "invalid_argument"});
      return false;
    };
    if (path == "/health") {
      if (only(http::verb::get)) health();
      return;
    }
    if (path == "/metrics") {
      if (only(http::verb::get)) {
        metrics::update_process_metrics(srv_->pipe.metrics());
        send(http::status::ok, srv_->pipe.metrics().to_prometheus(), "text/plain; version=0.0.4");
      }
      return;
    }
    if (path == "/dashboard/feed") {
      if (only(http::verb::get)) feed();
      return;
    }
    if (path == "/" || path == "/dashboard") {
      if (only(http::verb::get))
        send(http::status::ok, std::string(path == "/" ? chat_page() : dashboard_page()), "text/html; charset=utf-8");
      return;
    }
    if (path.rfind("/admin/", 0) == 0) return admin(path);
    if (path.rfind("/v1/", 0) == 0) {
      if (!srv_->cfg.api_key.empty() && bearer(req_) != srv_->cfg.api_key)
        return send_error(api_error{401, "invalid_request_error",
                                    "missing or wrong API key (Authorization: Bearer KEY)", "", "unauthorized"});
      if (path == "/v1/models") {
        if (only(http::verb::get))
          send_json(http::status::ok, {{"object", "list"},
                                       {"data", json::array({{{"id", srv_->mdl.id},
                                                              {"object", "model"},
                                                              {"created", 0},
                                                              {"owned_by", "tandem"},
                                                              {"max_model_len", srv_->mdl.context_length}}})}});
        return;
      }
      if (path == "/v1/completions" || path == "/v1/chat/completions") {
        if (only(http::verb::post)) generate(path == "/v1/chat/completions");
        return;
      }
    }
    send_error(api_error{404, "invalid_request_error", "no such endpoint: " + path, "", "not_found"});
  }

  // From the pipeline's latest snapshot: this thread never waits on an actor.
  void health() {
    const auto st = srv_->pipe.snapshot();
    if (!st) return send_json(http::status::service_unavailable, {{"status", "starting"}});
    int prefill = 0, decode = 0, colocated = 0;
    for (const auto& w : st->workers) {
      prefill += w.name.rfind("prefill", 0) == 0;
      decode += w.name.rfind("decode", 0) == 0;
      colocated += w.name.rfind("colocated", 0) == 0;
    }
    // Pools past their restart intensity: not restarted any more (the router: until the root
    // starts it again after its backoff).
    const json degraded = st->degraded_pools;
    const bool disagg = splits_phases(srv_->pipe.config().pools.mode);
    const bool workers_up = disagg ? prefill > 0 && decode > 0 : colocated > 0;
    const bool ready = !srv_->draining && workers_up && !st->router_degraded;
    const char* status = ready               ? (degraded.empty() ? "ok" : "degraded")
                         : !degraded.empty() ? "degraded"
                                             : "unavailable";
    json j = {{"status", status},
              {"mode", std::string(to_string(srv_->pipe.config().pools.mode))},
              {"workers", {{"prefill", prefill}, {"decode", decode}, {"colocated", colocated}}},
              {"degraded_pools", degraded},
              {"live_requests", st->live_requests}};
    if (srv_->pipe.cluster_port() != 0) {  // a router process: its members (other processes)
      j["cluster_port"] = srv_->pipe.cluster_port();
      j["nodes"] = json::parse(st->cluster_nodes, nullptr, false);
    }
    send_json(ready ? http::status::ok : http::status::service_unavailable, j);
  }

  void admin(const std::string& path) {
    if (srv_->cfg.admin_key.empty())
      return send_error(
          api_error{404, "invalid_request_error", "admin endpoints are off (start with --admin-key)", "", "not_found"});
    if (bearer(req_) != srv_->cfg.admin_key && query_param(std::string(req_.target()), "key") != srv_->cfg.admin_key)
      return send_error(api_error{401, "invalid_request_error", "missing or wrong admin key", "", "unauthorized"});
    if (path == "/admin/state" && req_.method() == http::verb::get)
      return send_json(http::status::ok, state_json(*srv_));
    if (path == "/admin/kill" && req_.method() == http::verb::post) {
      // {"kind": "prefill|decode|colocated|kv_link|request|router|random", "index": N (optional:
      // a random one of the kind)}; {"pool": ..., "index": N} as before.
      const json b = json::parse(req_.body(), nullptr, false);
      const char* usage =
          "body: {\"kind\": \"prefill|decode|colocated|kv_link|request|router|random\", \"index\": N (optional)}";
      if (!b.is_object()) return send_error(api_error{400, "invalid_request_error", usage, "", "invalid_argument"});
      const char* key = b.contains("kind") ? "kind" : "pool";
      if (!b.contains(key) || !b[key].is_string() || (b.contains("index") && !b["index"].is_number_integer()))
        return send_error(api_error{400, "invalid_request_error", usage, "", "invalid_argument"});
      if (b.contains("index") && b["index"].get<int64_t>() < 0)
        return send_error(api_error{400, "invalid_request_error",
                                    "'index' must be >= 0 (leave it out for a random one)", "index",
                                    "invalid_argument"});
      std::string killed;
      try {
        // Bounded: a router that cannot answer now (its threads busy or blocked) gets a 503, not
        // an admin call (and an I/O thread) waiting on it.
        killed = srv_->pipe.kill(b[key].get<std::string>(), b.contains("index") ? int(b["index"].get<int64_t>()) : -1,
                                 admin_kill_wait);
      } catch (const failure& f) {
        if (f.code() == errc::timeout) return send_error(api_error{503, "server_error", f.what(), "", "timeout"});
        return send_error(api_error{400, "invalid_request_error", f.what(), key, "invalid_argument"});
      }
      if (killed.empty())
        return send_error(
            api_error{404, "invalid_request_error", "nothing of that kind and index is alive", key, "not_found"});
      beast::error_code ec;
      const auto peer = stream_.socket().remote_endpoint(ec);
      oplog::event(
          oplog::level::warn, "kill",
          {{"actor", killed}, {"by", "/admin/kill"}, {"from", ec ? std::string("?") : peer.address().to_string()}});
      return send_json(http::status::ok, {{"killed", true}, {"name", killed}});
    }
    if (path == "/admin/fault" && req_.method() == http::verb::post) {
      // {"fault": "corrupt_kv|drop_kv|delay_kv|fail_alloc|stall|stall_link", "count": N (default 1), "stall_ms": M}
      const json b = json::parse(req_.body(), nullptr, false);
      fault_kind f;
      if (!b.is_object() || !b.contains("fault") || !b["fault"].is_string() ||
          !parse_fault_kind(b["fault"].get<std::string>(), f) ||
          (b.contains("count") && !b["count"].is_number_integer()) ||
          (b.contains("stall_ms") && !b["stall_ms"].is_number_integer()))
        return send_error(api_error{400, "invalid_request_error",
                                    "body: {\"fault\": \"corrupt_kv|drop_kv|delay_kv|fail_alloc|stall|stall_link\", "
                                    "\"count\": N, \"stall_ms\": M}",
                                    "", "invalid_argument"});
      // Out of range is refused, not clamped: a count of 0 arms nothing, so it is no request.
      if (b.contains("count") && (b["count"].get<int64_t>() < 1 || b["count"].get<int64_t>() > 1000))
        return send_error(
            api_error{400, "invalid_request_error", "'count' must be in 1..1000", "count", "invalid_argument"});
      if (b.contains("stall_ms") && (b["stall_ms"].get<int64_t>() < 1 || b["stall_ms"].get<int64_t>() > 600000))
        return send_error(
            api_error{400, "invalid_request_error", "'stall_ms' must be in 1..600000", "stall_ms", "invalid_argument"});
      const int count = b.contains("count") ? int(b["count"].get<int64_t>()) : 1;
      const auto stall = std::chrono::milliseconds(b.contains("stall_ms") ? b["stall_ms"].get<int64_t>() : 5000);
      srv_->pipe.inject(f, count, stall);
      return send_json(http::status::ok, {{"armed", count}, {"fault", b["fault"]}});
    }
    send_error(api_error{404, "invalid_request_error", "no such admin endpoint: " + path, "", "not_found"});
  }

 public:
  static json state_json(http_server::impl& s) {
    const auto snap = s.pipe.snapshot();  // never waits on an actor
    if (!snap) return json{{"starting", true}};
    const pipeline_stats& st = *snap;
    json workers = json::array();
    for (const auto& w : st.workers)
      workers.push_back({{"name", w.name},
                         {"kv_total_blocks", w.kv_total_blocks},
                         {"kv_free_blocks", w.kv_free_blocks},
                         {"reserved_blocks", w.reserved_blocks},
                         {"active", w.active},
                         {"max_batch", w.max_batch},
                         {"steps", w.steps},
                         {"busy", w.busy},
                         {"step_sequences", w.step_sequences},
                         {"step_prefill_tokens", w.step_prefill_tokens}});
    json by_state = json::object();
    int64_t tracked = 0;
    for (const auto& [name, n] : st.requests_by_state) {
      by_state[name] = n;
      tracked += n;
    }
    json listed = json::array();
    for (const auto& r : st.requests)
      listed.push_back({{"id", r.id},
                        {"state", r.state},
                        {"prefill_worker", r.prefill_worker},
                        {"decode_worker", r.decode_worker},
                        {"prompt_tokens", r.prompt_tokens},
                        {"max_tokens", r.max_tokens}});
    return {{"mode", std::string(to_string(s.pipe.config().pools.mode))},
            {"model", s.mdl.id},
            {"live_requests", st.live_requests},
            {"live_connections", st.live_connections},
            {"router",
             {{"prefill_queue", st.prefill_queue},
              {"decode_queue", st.decode_queue},
              {"requests", by_state},
              {"tracked", tracked},
              {"listed", listed},
              {"kv_links", st.kv_links},
              {"retiring_kv_links", st.retiring_kv_links}}},
            {"in_flight", s.in_flight.load()},
            {"workers", workers},
            {"nodes", json::parse(st.cluster_nodes, nullptr, false)},
            {"events", recent_events()},
            {"metrics", json::parse(s.pipe.metrics().to_json(), nullptr, false)}};
  }

  // The supervision events kept for the timeline (runtime/oplog), with their time and number.
  static json recent_events() {
    json out = json::array();
    for (const auto& r : oplog::recent()) {
      json e = json::parse(r.json, nullptr, false);
      if (!e.is_object()) continue;
      e["seq"] = r.seq;
      e["unix_ms"] = r.unix_ms;
      out.push_back(std::move(e));
    }
    return out;
  }

 private:
  // ---- generation over HTTP (JSON or SSE): openai_stream makes the answer, this writes it

  void generate(bool chat) {
    if (srv_->draining)
      return send_error(api_error{503, "server_error", "the server is shutting down", "", "shutting_down"});
    const json body = json::parse(req_.body(), nullptr, false);
    if (body.is_discarded())
      return send_error(api_error{400, "invalid_request_error", "the body is not valid JSON", "", "invalid_argument"});
    api_request req;
    auto err = chat ? parse_chat_completion(body, srv_->mdl, req, req_.body())
                    : parse_completion(body, srv_->mdl, req, req_.body());
    if (err) return send_error(*err);
    // Tokenized once here: the n choices share the ids, and return_token_ids shows them.
    const tokenizer& tok = srv_->pipe.get_model().tok();
    req.gen.prompt_tokens = prompt_ids(tok, req.gen);
    answer_.emplace(std::move(req), stream_context{.model = srv_->mdl.id, .tok = &tok, .serial = srv_->next_id++});
    ++srv_->in_flight;
    if (!conn_.open()) {
      conn_ = srv_->pipe.connect(waker(weak_from_this(), srv_->weak_from_this()));
    }
    carry_out(answer_->start());
    // While it generates, the session is reached only through the pipeline's waker (a weak
    // pointer): this keeps it alive even when no socket operation is pending (a pipelined
    // request filled the watch; issue 22 item 1: the session was destroyed and both answers
    // lost). Released with the generation.
    keep_alive_ = shared_from_this();
    watch_disconnect();
  }

  // While generating, nothing else is read; a read kept pending meanwhile learns at once when
  // the client goes (EOF or reset), so its request is cancelled rather than run for nobody.
  // Bytes that arrive instead (a pipelined request) are kept for their turn.
  void watch_disconnect() {
    watching_ = true;
    stream_.async_read_some(
        net::buffer(peek_), [self = shared_from_this(), serial = answer_->serial()](beast::error_code ec, size_t n) {
          self->watching_ = false;
          if (n > 0) self->buf_.commit(net::buffer_copy(self->buf_.prepare(n), net::buffer(self->peek_.data(), n)));
          if (self->read_after_watch_) {
            self->read_after_watch_ = false;
            return self->read();
          }
          const bool same = self->answer_ && self->answer_->serial() == serial;
          if (ec && ec != net::error::operation_aborted && same) return self->close();
          // Bytes of a pipelined request: kept, and the watch goes on (up to a bound on what is
          // buffered), so a client that then goes away is still noticed.
          if (!ec && same && self->buf_.size() < kMaxPipelinedBytes) self->watch_disconnect();
        });
  }
  static constexpr size_t kMaxPipelinedBytes = size_t(1) << 20;

  // What the answer asks for, in order.
  void carry_out(std::vector<output> outputs) {
    for (auto& o : outputs)
      std::visit(
          [this](auto& c) {
            using C = std::decay_t<decltype(c)>;
            if constexpr (std::is_same_v<C, out::submit>) {
              answer_->submitted(c.choice, conn_.submit(std::move(c.request)));
            } else if constexpr (std::is_same_v<C, out::cancel>) {
              conn_.cancel(c.id);
            } else if constexpr (std::is_same_v<C, out::open_sse>) {
              start_sse();
            } else if constexpr (std::is_same_v<C, out::sse>) {
              write_raw(chunk(c.event));
            } else if constexpr (std::is_same_v<C, out::close_sse>) {
              write_raw("0\r\n\r\n");
            } else if constexpr (std::is_same_v<C, out::respond>) {
              send_json(http::status::ok, c.body);
            } else if constexpr (std::is_same_v<C, out::refuse>) {
              send_error(c.error, false, true);
            } else if constexpr (std::is_same_v<C, out::finished>) {
              // Its log line, then it is forgotten (what follows in `outputs` is written still).
              server::log_request(c.log);
              answer_.reset();
              keep_alive_.reset();
              --srv_->in_flight;
            } else {
              static_assert(sizeof(C) == 0, "an output without its translation");
            }
          },
          o);
  }

 public:
  auto executor() { return stream_.get_executor(); }
  // Takes events while the outgoing queue has room: a slow reader pauses its requests.
  void pump() {
    request_event ev;
    while (answer_ && out_bytes_ < srv_->cfg.outgoing_limit_bytes && conn_.try_next(ev)) carry_out(answer_->on(ev));
  }

 private:
  void start_sse() {
    std::string head =
        "HTTP/1.1 200 OK\r\nServer: tandem\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
        "Transfer-Encoding: chunked\r\n";
    head += req_.keep_alive() ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
    close_after_ = !req_.keep_alive();
    write_raw(std::move(head));
  }

  // Raw bytes in order, one write at a time; when the queue drains, either the next request
  // is read (keep-alive) or more events are taken.
  void write_raw(std::string s) {
    out_bytes_ += s.size();
    out_.push_back(std::move(s));
    if (!writing_) write_next();
  }

  // writing_, counted in http_writing: the drain's end waits for the last bytes of a response
  // (a stream's final chunk, an error event) rather than stopping under them.
  void set_writing(bool w) {
    if (w != writing_) srv_->http_writing += w ? 1 : -1;
    writing_ = w;
  }

  void write_next() {
    if (out_.empty()) {
      set_writing(false);
      if (answer_) return pump();
      if (close_after_) return close();
      if (feed_timer_) return;  // the feed writes on its timer
      return read();
    }
    set_writing(true);
    net::async_write(stream_, net::buffer(out_.front()), [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec) {
        self->set_writing(false);
        return self->close();
      }
      self->out_bytes_ -= self->out_.front().size();
      self->out_.pop_front();
      self->write_next();
    });
  }

  void upgrade();

  // The dashboard's live view: the pipeline's state as an SSE event every second, until the
  // client goes away.
  void feed() {
    start_sse();
    feed_timer_ = std::make_shared<net::steady_timer>(stream_.get_executor());
    feed_tick();
  }
  void feed_tick() {
    if (srv_->draining) {
      write_raw("0\r\n\r\n");
      close_after_ = true;
      return;
    }
    if (out_bytes_ < 64 * 1024) write_raw(chunk(sse_event(state_json(*srv_))));
    feed_timer_->expires_after(std::chrono::seconds(1));
    feed_timer_->async_wait([self = shared_from_this()](beast::error_code ec) {
      if (!ec && self->stream_.socket().is_open()) self->feed_tick();
    });
  }
};

// ---------------------------------------------------------------- WebSocket session

// One request of a WebSocket: its text as a generation (openai_stream.h), its token frames
// numbered from 0.
struct ws_request {
  api_request req;
  request_id rid = 0;
  generation gen;
  int32_t index = 0;  // tokens sent so far
};

class ws_session : public std::enable_shared_from_this<ws_session> {
 public:
  ws_session(tcp::socket&& s, impl_ptr srv) : ws_(std::move(s)), srv_(std::move(srv)) { ++srv_->websockets; }
  ~ws_session() { --srv_->websockets; }
  void start(http::request<http::string_body> req) {
    conn_ = srv_->pipe.connect(waker(weak_from_this(), srv_->weak_from_this()));
    srv_->watch_grace(shared_from_this());
    ws_.read_message_max(srv_->cfg.max_frame_bytes);
    ws_.set_option(websocket::stream_base::timeout::suggested(beast::role_type::server));
    ws_.async_accept(req, [self = shared_from_this()](beast::error_code ec) {
      if (!ec) self->read();
    });
  }

 private:
  websocket::stream<beast::tcp_stream> ws_;
  impl_ptr srv_;
  beast::flat_buffer buf_;
  connection conn_;  // its actor subscribes to every request of this WebSocket
  std::map<std::string, std::unique_ptr<ws_request>> gens_;  // by client id
  std::unordered_map<request_id, std::string> keys_;  // client id by request id
  std::deque<std::string> out_;
  size_t out_bytes_ = 0;
  bool writing_ = false;
  bool closed_ = false;
  bool closing_ = false;  // grace over: close (1001, "shutting_down") once the queue is written

 public:
  void release() {}

  // The drain is over (every request done, or the grace period ran out): each request still
  // running gets the shutting_down error frame, then the connection closes with 1001 and that
  // reason (an idle one too: a client is told the server goes away, not left reading).
  void grace_over() {
    if (closed_ || closing_) return;
    for (const auto& [key, g] : gens_) {
      conn_.cancel(g->rid);
      send_frame({{"type", "error"},
                  {"id", key},
                  {"code", "shutting_down"},
                  {"message", "the server is shutting down: the grace period ended"}});
      log_end(key, *g, 503, "shutting_down", "the grace period ended");
    }
    srv_->in_flight -= int64_t(gens_.size());
    gens_.clear();
    keys_.clear();
    closing_ = true;
    if (!writing_) write_next();
  }

 private:
  void read() {
    ws_.async_read(buf_, [self = shared_from_this()](beast::error_code ec, size_t) { self->on_read(ec); });
  }

  void on_read(beast::error_code ec) {
    if (ec) return gone();
    const std::string text = beast::buffers_to_string(buf_.data());
    buf_.consume(buf_.size());
    if (!ws_.got_text()) {
      reject({{"type", "error"}, {"code", "invalid_argument"}, {"message", "frames must be JSON text frames"}});
      return read();
    }
    handle(text);
    read();
  }

  void handle(const std::string& text) {
    const json f = json::parse(text, nullptr, false);
    if (f.is_discarded() || !f.is_object())
      return reject({{"type", "error"}, {"code", "invalid_argument"}, {"message", "the frame is not a JSON object"}});
    const std::string type = f.contains("type") && f["type"].is_string() ? f["type"].get<std::string>() : "";
    const json id = f.contains("id") ? f["id"] : json();
    if (type == "cancel") {
      const std::string key = id.is_string()           ? id.get<std::string>()
                              : id.is_number_integer() ? std::to_string(id.get<int64_t>())
                                                       : "";
      auto it = gens_.find(key);
      if (it == gens_.end())
        return reject({{"type", "error"},
                       {"id", id},
                       {"code", "invalid_argument"},
                       {"message", "no request with this id in flight"}});
      conn_.cancel(it->second->rid);
      return;
    }
    if (type != "generate")
      return reject({{"type", "error"},
                     {"id", id},
                     {"code", "invalid_argument"},
                     {"message", "unknown frame type '" + type + "' (generate, cancel)"}});
    if (srv_->draining)
      return reject(
          {{"type", "error"}, {"id", id}, {"code", "shutting_down"}, {"message", "the server is shutting down"}});
    auto g = std::make_unique<ws_request>();
    if (auto err = parse_ws_generate(f, srv_->mdl, g->req, text))
      return reject({{"type", "error"}, {"id", id}, {"code", err->code}, {"message", err->message}});
    if (gens_.count(g->req.client_id))
      return reject({{"type", "error"},
                     {"id", id},
                     {"code", "invalid_argument"},
                     {"message", "a request with this id is in flight"}});
    if (gens_.size() >= srv_->cfg.max_requests_per_connection)
      return reject({{"type", "error"},
                     {"id", id},
                     {"code", "overloaded"},
                     {"message", "too many requests in flight on this connection (limit " +
                                     std::to_string(srv_->cfg.max_requests_per_connection) + ")"}});
    g->gen = generation(g->req.stop);
    ++srv_->in_flight;
    ws_request* raw = g.get();
    const std::string key = g->req.client_id;
    gens_.emplace(key, std::move(g));
    raw->rid = conn_.submit(raw->req.gen);
    keys_.emplace(raw->rid, key);
    pump();
  }

 public:
  auto executor() { return ws_.get_executor(); }
  // Takes events, in arrival order across this connection's requests, while the outgoing
  // queue has room: a slow reader pauses its requests.
  void pump() {
    if (closed_) return;
    request_event ev;
    while (out_bytes_ < srv_->cfg.outgoing_limit_bytes && conn_.try_next(ev)) {
      const auto k = keys_.find(ev.id);
      if (k == keys_.end()) continue;
      const std::string key = k->second;
      ws_request& g = *gens_.at(key);
      if (ev.kind == event_kind::error) {
        json e = {{"type", "error"}, {"id", key}, {"code", std::string(to_string(ev.code))}, {"message", ev.message}};
        if (ev.retry_after_ms > 0) e["retry_after_ms"] = ev.retry_after_ms;
        send_frame(e);
        g.gen.timings = ev.timings;
        end(key, error_from(ev.code, ev.message, 0).http_status, to_string(ev.code), ev.message);
        continue;
      }
      if (ev.kind == event_kind::accepted) {
        send_frame({{"type", "accepted"}, {"id", key}, {"queue_position", ev.queue_position}});
        continue;
      }
      const bool was_ended = g.gen.ended;
      const auto [shown, stopped] = g.gen.apply(ev);
      if (stopped) conn_.cancel(g.rid);
      if (ev.kind == event_kind::token && !was_ended && (!shown.empty() || !g.gen.ended)) {
        json f = {{"type", "token"}, {"id", key}, {"index", g.index++}, {"text", shown}, {"token", ev.token}};
        if (ev.logprobs) add_ws_logprobs(f, srv_->pipe.get_model().tok(), *ev.logprobs);
        send_frame(f);
      }
      if (ev.kind == event_kind::done) {
        if (!shown.empty())
          send_frame({{"type", "token"}, {"id", key}, {"index", g.index++}, {"text", shown}, {"token", -1}});
        send_frame({{"type", "done"},
                    {"id", key},
                    {"finish_reason", std::string(to_string(g.gen.finish_reason))},
                    {"usage", usage_json(g.gen.timings)},
                    {"timings", timings_json(g.gen.timings)}});
        end(key, 200);
      }
    }
  }

 private:
  // A request ended (status: what its HTTP twin would have answered; 499: the client went).
  void end(const std::string& key, int status, std::string_view error = {}, std::string_view message = {}) {
    auto it = gens_.find(key);
    log_end(key, *it->second, status, error, message);
    keys_.erase(it->second->rid);
    gens_.erase(it);
    --srv_->in_flight;
  }

  // A frame refused before any generation started: the error frame, and its log line.
  void reject(const json& e) {
    server::request_log r;
    r.endpoint = "/ws";
    r.protocol = "ws";
    r.error = e.value("code", "invalid_argument");
    r.message = e.value("message", "");
    r.status = r.error == "overloaded" ? 429 : r.error == "shutting_down" ? 503 : 400;
    server::log_request(r);
    send_frame(e);
  }

  void log_end(const std::string& key, const ws_request& g, int status, std::string_view error,
               std::string_view message) {
    server::request_log r;
    r.id = int64_t(g.rid);
    r.ref = key;
    r.message = std::string(message);
    r.endpoint = "/ws";
    r.protocol = "ws";
    r.status = status;
    r.timings = g.gen.timings;
    r.output_tokens = int64_t(g.gen.tokens.size());
    r.finish = std::string(to_string(g.gen.finish_reason));
    r.error = std::string(error);
    server::log_request(r);
  }

  void send_frame(const json& j) {
    std::string s = j.dump(-1, ' ', false, json::error_handler_t::replace);
    out_bytes_ += s.size();
    out_.push_back(std::move(s));
    if (!writing_) write_next();
  }

  void write_next() {
    if (out_.empty() && closing_ && !closed_) {
      writing_ = true;
      ws_.async_close(websocket::close_reason(websocket::close_code::going_away, "shutting_down"),
                      [self = shared_from_this()](beast::error_code) {
                        self->writing_ = false;
                        self->gone();
                      });
      return;
    }
    if (out_.empty() || closed_) {
      writing_ = false;
      return;
    }
    writing_ = true;
    ws_.text(true);
    ws_.async_write(net::buffer(out_.front()), [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec) return self->gone();
      self->out_bytes_ -= self->out_.front().size();
      self->out_.pop_front();
      self->write_next();
      self->pump();  // room again
    });
  }

  // Closed or broken: every request of this connection is cancelled (their KV freed).
  void gone() {
    if (closed_) return;
    closed_ = true;
    for (const auto& [key, g] : gens_) log_end(key, *g, 499, "client_closed", "the connection closed");
    srv_->in_flight -= int64_t(gens_.size());
    gens_.clear();
    keys_.clear();
    conn_.close();
    out_.clear();
  }
};

void http_session::upgrade() {
  if (!srv_->cfg.api_key.empty() && bearer(req_) != srv_->cfg.api_key &&
      query_param(std::string(req_.target()), "api_key") != srv_->cfg.api_key)
    return send_error(api_error{401, "invalid_request_error", "missing or wrong API key", "", "unauthorized"}, true);
  const std::string target(req_.target());
  if (target.substr(0, target.find('?')) != "/ws")
    return send_error(api_error{404, "invalid_request_error", "WebSocket endpoint is /ws", "", "not_found"}, true);
  std::make_shared<ws_session>(stream_.release_socket(), srv_)->start(std::move(req_));
}

void closing(impl_ptr im, std::shared_ptr<net::steady_timer> timer, std::chrono::steady_clock::time_point until);

// Shutdown: checks every 50 ms until no request is in flight or the grace period is over.
// Then each request still running is told why it ends (an SSE error event and [DONE], a
// WebSocket error frame) and every WebSocket is closed with 1001 "shutting_down" (idle ones
// too: before, they were left open with the server gone, and their clients read on).
void drain(impl_ptr im, std::shared_ptr<net::steady_timer> timer, std::chrono::steady_clock::time_point deadline) {
  const auto now = std::chrono::steady_clock::now();
  if (im->in_flight.load() > 0 && now < deadline) {
    timer->expires_after(std::chrono::milliseconds(50));
    timer->async_wait([im, timer, deadline](beast::error_code) { drain(im, timer, deadline); });
    return;
  }
  im->grace_over();
  closing(im, timer, now + std::chrono::milliseconds(500));
}

// The server stops once every WebSocket is closed and every HTTP response written (a stream's
// last chunk included: stopping at in_flight 0 once cut a stream that had just ended), or
// after 500 ms for a client that no longer reads. Checked every 5 ms, the first time after one
// wait: the sessions' farewells were just posted to their strands.
void closing(impl_ptr im, std::shared_ptr<net::steady_timer> timer, std::chrono::steady_clock::time_point until) {
  timer->expires_after(std::chrono::milliseconds(5));
  timer->async_wait([im, timer, until](beast::error_code) {
    if ((im->websockets.load() <= 0 && im->http_writing.load() <= 0) || std::chrono::steady_clock::now() >= until)
      return im->ioc.stop();
    closing(im, timer, until);
  });
}

}  // namespace

void http_server::impl::accept() {
  acceptor.async_accept(net::make_strand(ioc), [self = this](beast::error_code ec, tcp::socket s) {
    if (!self->acceptor.is_open()) return;
    if (!ec) {
      s.set_option(tcp::no_delay(true), ec);
      std::make_shared<http_session>(std::move(s), self)->start();
    }
    self->accept();
  });
}

http_server::http_server(pipeline& p, served_model m, server_config cfg)
    : impl_(std::make_shared<impl>(p, std::move(m), std::move(cfg))) {
  auto& im = *impl_;
  beast::error_code ec;
  const auto addr = net::ip::make_address(im.cfg.host, ec);
  if (ec) throw failure(errc::invalid_argument, "bad --host '" + im.cfg.host + "': " + ec.message());
  const tcp::endpoint ep(addr, im.cfg.port);
  im.acceptor.open(ep.protocol(), ec);
  if (!ec) im.acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) im.acceptor.bind(ep, ec);
  if (!ec) im.acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec)
    throw failure(errc::io_error,
                  "cannot listen on " + im.cfg.host + ":" + std::to_string(im.cfg.port) + ": " + ec.message());
}

http_server::~http_server() { stop(); }

uint16_t http_server::port() const { return impl_->acceptor.local_endpoint().port(); }

void http_server::run() {
  auto& im = *impl_;
  im.accept();
  // Asio's handler sees the signal whichever thread the kernel picks (OpenBLAS and CAF threads
  // included); the drain then runs on the io_context.
  std::optional<net::signal_set> signals;
  if (im.cfg.stop_on_signals) {
    signals.emplace(im.ioc, SIGINT, SIGTERM);
    signals->async_wait([this](beast::error_code ec, int sig) {
      if (ec) return;
      oplog::event(oplog::level::info, "draining",
                   {{"signal", sig},
                    {"in_flight", int64_t(impl_->in_flight.load())},
                    {"grace_s", double(impl_->cfg.grace.count()) / 1000}});
      stop();
    });
  }
  std::vector<std::thread> threads;
  for (int i = 1; i < std::max(1, im.cfg.io_threads); ++i) threads.emplace_back([&] { im.ioc.run(); });
  im.ioc.run();
  for (auto& t : threads) t.join();
  im.release_sessions();
}

void http_server::stop() {
  auto im = impl_;
  if (im->draining.exchange(true)) return;
  // Stop accepting (on the acceptor's strand); let in-flight requests finish within the grace
  // period, then stop.
  net::post(im->acceptor.get_executor(), [im] {
    beast::error_code ec;
    im->acceptor.close(ec);
    drain(im.get(), std::make_shared<net::steady_timer>(im->ioc), std::chrono::steady_clock::now() + im->cfg.grace);
  });
}

}  // namespace tandem::server
