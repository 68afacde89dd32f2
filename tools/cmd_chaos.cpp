// `tandem chaos`: a soak against a running `tandem serve`. It keeps --concurrency requests in
// flight over one WebSocket, kills an actor of a kind through POST /admin/kill every --every
// for --for, then drains and reports: requests sent, finished, failed with an error, lost (no
// final event: must be 0), duplicated or skipped token indices (must be 0), KV blocks still
// held once every request has ended (must be 0), and how long the streams in flight at each
// kill took to move again (recovery time percentiles), and the server's resident memory and
// open descriptors (from its /metrics, sampled every second: at the start, their peak, and once
// settled after the drain) so that a soak (`--for 30m`) shows whether either grows. Exit status
// 1 if any must-be-0 is not.
//
// With --cluster it starts the server itself as several processes (a router, prefill and
// decode nodes: tools/chaos_cluster.h) and also kills processes with SIGKILL and partitions
// nodes; the report adds the nodes' memory and descriptors. A router process killed takes its
// clients' connections with it: the streams in flight then are counted as cut (the client saw
// the connection close; they are not lost), and the soak reconnects to the new router.
#include <utility>

#include <boost/asio.hpp>
#include <boost/beast.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <deque>
#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include <CLI/CLI.hpp>

#include "tools/bench/client.h"
#include "tools/bench/stats.h"
#include "tools/chaos_cluster.h"
#include "tools/commands.h"

namespace tandem::cli {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
using tcp = asio::ip::tcp;
using json = nlohmann::json;
using clock_type = std::chrono::steady_clock;

struct chaos_opts {
  std::string url = "http://127.0.0.1:8080", admin_key, api_key, kill = "random", every = "1s", duration = "30s",
              drain = "60s";
  int concurrency = 16, max_tokens = 48, seed = 1;
  bool json_out = false;
  // --cluster: the processes it starts itself
  bool cluster = false, netns = false;
  std::string model = "stories260K", partition_for = "3s", restart_after = "500ms", log_dir;
  int prefill_nodes = 2, decode_nodes = 2;
};

// A --kill value that names a cluster fault rather than an actor kind.
std::optional<cluster_fault> cluster_fault_of(const std::string& k) {
  for (auto f : {cluster_fault::prefill_process, cluster_fault::decode_process, cluster_fault::router_process,
                 cluster_fault::partition})
    if (k == to_string(f)) return f;
  return std::nullopt;
}

std::chrono::milliseconds parse_duration(const std::string& s, const char* flag) {
  try {
    return bench::parse_duration(s);
  } catch (const std::invalid_argument& e) {
    throw CLI::ValidationError(flag, e.what());
  }
}

using bench::endpoint;
using bench::http_call;

struct stream_state {
  int32_t next_index = 0;
  bool ended = false;
};

struct tally {
  int64_t sent = 0, finished = 0, failed = 0, duplicated = 0, skipped = 0, after_end = 0, cut = 0, reconnects = 0;
  std::map<std::string, int64_t> errors;  // by code
  std::vector<double> recovery_ms;
  std::vector<std::string> killed;
};

// The server's process gauges over the run (bytes and descriptors; -1: never read).
struct resource_track {
  int64_t start = -1, peak = -1, end = -1;
  void add(int64_t v, bool last = false) {
    if (v < 0) return;
    if (start < 0) start = v;
    peak = std::max(peak, v);
    if (last) end = v;
  }
  json to_json() const { return {{"start", start}, {"peak", peak}, {"end", end}}; }
};

// One value of an unlabelled series in a Prometheus text exposition (-1 if absent).
int64_t prometheus_value(const std::string& text, const std::string& name) {
  for (size_t at = text.find(name + " "); at != std::string::npos; at = text.find(name + " ", at + 1))
    if (at == 0 || text[at - 1] == '\n') return int64_t(std::strtod(text.c_str() + at + name.size() + 1, nullptr));
  return -1;
}

// A kill, and the streams in flight at that moment that have not moved since.
struct pending_recovery {
  clock_type::time_point at;
  std::set<std::string> waiting;
};

// One WebSocket connection's stream, queue and buffer. A connection that failed is kept (not
// freed) until the end: its handlers may still run, and its queued text must outlive them.
struct ws_connection {
  explicit ws_connection(asio::io_context& ioc) : ws(ioc) {}
  websocket::stream<beast::tcp_stream> ws;
  beast::flat_buffer buf;
  std::deque<std::string> out;
};

class soak {
 public:
  soak(const chaos_opts& o, endpoint ep, chaos_cluster* cluster)
      : o_(o), ep_(std::move(ep)), cluster_(cluster), rng_(uint64_t(o.seed)), kill_rng_(uint64_t(o.seed) * 7919 + 1) {}

  int run() {
    const auto every = parse_duration(o_.every, "--every"), total = parse_duration(o_.duration, "--for"),
               drain = parse_duration(o_.drain, "--drain");
    connect();
    start_ = clock_type::now();
    for (int i = 0; i < o_.concurrency; ++i) submit();
    read(c_.get());
    // The killer: its own thread (admin calls block); what it learns goes to the io thread.
    std::thread killer([&] {
      for (auto next = start_ + every; next < start_ + total; next += every) {
        std::this_thread::sleep_until(next);
        std::string name;
        try {
          name = strike();
        } catch (const std::exception& e) {
          spdlog::warn("kill failed: {}", e.what());
          continue;
        }
        if (name.empty()) continue;  // nothing of that kind alive at that moment
        asio::post(ioc_, [this, name, at = clock_type::now()] {
          t_.killed.push_back(name);
          pending_recovery p{at, {}};
          for (auto& [id, s] : streams_)
            if (!s.ended) p.waiting.insert(id);
          if (!p.waiting.empty()) recoveries_.push_back(std::move(p));
        });
      }
    });
    // The sampler: the server's memory and descriptors every second until the drain ends; with
    // --cluster it also starts again what died and heals partitions, every 100 ms.
    std::atomic<bool> sampling{true};
    std::thread sampler([&] {
      for (int tick = 0; sampling; ++tick) {
        if (cluster_) cluster_->tend();
        if (tick % 10 == 0) sample(false);
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    });
    asio::steady_timer stop_timer(ioc_, total);
    stop_timer.async_wait([this, drain](beast::error_code) {
      submitting_ = false;
      drain_deadline_ = clock_type::now() + drain;
      check_drained();
    });
    asio::steady_timer tick(ioc_);
    std::function<void()> arm = [&] {
      tick.expires_after(std::chrono::milliseconds(200));
      tick.async_wait([&](beast::error_code ec) {
        if (ec || done_) return;
        check_drained();
        if (!done_) arm();
      });
    };
    arm();
    ioc_.run();
    killer.join();
    if (cluster_) {  // nothing stays stopped or cut for the settled figures
      for (int i = 0; i < 100; ++i, std::this_thread::sleep_for(std::chrono::milliseconds(100))) cluster_->tend();
    }
    sampling = false;
    sampler.join();
    return report();
  }

 private:
  // What --kill names, one of them at random for "random" (with --cluster: a process kill, a
  // partition, or an actor kill through /admin/kill; the router process one time in ten).
  std::string strike() {
    std::string kind = o_.kill;
    if (cluster_ && kind == "random") {
      static const char* kinds[] = {"prefill_process", "decode_process", "partition", "random",
                                    "prefill_process", "decode_process", "partition", "random",
                                    "decode_process",  "router_process"};
      kind = kinds[kill_rng_() % 10];
    }
    if (auto f = cluster_fault_of(kind)) {
      if (!cluster_) throw std::runtime_error("--kill " + kind + " needs --cluster");
      return cluster_->strike(*f);
    }
    auto res = http_call(ep_, "POST", "/admin/kill", o_.admin_key, json{{"kind", kind}}.dump());
    if (res.status == 401 || res.status == 400) throw std::runtime_error("/admin/kill: " + res.body);
    return res.status == 200 ? json::parse(res.body).value("name", "") : "";
  }

  void connect() {
    auto c = std::make_unique<ws_connection>(ioc_);
    beast::get_lowest_layer(c->ws).connect(tcp::resolver(ioc_).resolve(ep_.host, ep_.port));
    c->ws.set_option(websocket::stream_base::decorator([key = o_.api_key](websocket::request_type& r) {
      if (!key.empty()) r.set(http::field::authorization, "Bearer " + key);
    }));
    c->ws.handshake(ep_.host, "/ws");
    if (c_) dead_.push_back(std::move(c_));
    c_ = std::move(c);
  }

  void sample(bool last) {
    if (cluster_) {
      const auto u = cluster_->resources();
      std::lock_guard lock(sample_mu_);
      rss_.add(u.router_rss, last);
      fds_.add(u.router_fds, last);
      node_rss_.add(u.nodes_rss, last);
      node_fds_.add(u.nodes_fds, last);
      return;
    }
    try {
      const auto res = http_call(ep_, "GET", "/metrics", "");
      if (res.status != 200) return;
      std::lock_guard lock(sample_mu_);
      rss_.add(prometheus_value(res.body, "process_resident_memory_bytes"), last);
      fds_.add(prometheus_value(res.body, "process_open_fds"), last);
    } catch (const std::exception&) {
      // a missed sample: the next one counts
    }
  }

  void submit() {
    if (!submitting_) return;
    static const char* words[] = {"Once",  "upon", "a",   "time", "there", "was", "a",    "little", "girl", "who",
                                  "loved", "the",  "sun", "and",  "the",   "big", "tree", "in",     "the",  "park"};
    std::string prompt;
    const int n = 2 + int(rng_() % 40);
    for (int i = 0; i < n; ++i) prompt += (i ? " " : "") + std::string(words[rng_() % 20]);
    const std::string id = "c" + std::to_string(next_id_++);
    json msg = {{"type", "generate"},
                {"id", id},
                {"prompt", prompt},
                {"max_tokens", 4 + int(rng_() % uint64_t(o_.max_tokens))},
                {"temperature", 0}};
    streams_[id];
    ++t_.sent;
    c_->out.push_back(msg.dump());
    if (c_->out.size() == 1) write(c_.get());
  }

  void write(ws_connection* c) {
    c->ws.async_write(asio::buffer(c->out.front()), [this, c](beast::error_code ec, size_t) {
      if (c != c_.get()) return;  // a connection given up already
      if (ec) return fail("write", ec);
      c->out.pop_front();
      if (!c->out.empty()) write(c);
    });
  }

  void read(ws_connection* c) {
    c->ws.async_read(c->buf, [this, c](beast::error_code ec, size_t) {
      if (c != c_.get()) return;
      if (ec) {
        if (!done_) fail("read", ec);
        return;
      }
      on_message(beast::buffers_to_string(c->buf.data()));
      c->buf.consume(c->buf.size());
      read(c);
    });
  }

  void on_message(const std::string& text) {
    const json m = json::parse(text, nullptr, false);
    if (!m.is_object() || !m.contains("id")) return;
    const std::string id = m["id"].get<std::string>(), type = m.value("type", "");
    auto it = streams_.find(id);
    if (it == streams_.end()) return;
    auto& s = it->second;
    for (auto r = recoveries_.begin(); r != recoveries_.end();) {  // this stream moved again
      if (r->waiting.erase(id) && r->waiting.empty()) {
        t_.recovery_ms.push_back(std::chrono::duration<double, std::milli>(clock_type::now() - r->at).count());
        r = recoveries_.erase(r);
      } else {
        ++r;
      }
    }
    if (s.ended) {
      ++t_.after_end;
      return;
    }
    if (type == "token") {
      const int32_t index = m.value("index", -1);
      if (index < s.next_index) ++t_.duplicated;
      else if (index > s.next_index) t_.skipped += index - s.next_index;
      s.next_index = std::max(s.next_index, index + 1);
    } else if (type == "done" || type == "error") {
      s.ended = true;
      double retry_after_ms = 0;
      if (type == "done") ++t_.finished;
      else {
        ++t_.failed;
        ++t_.errors[m.value("code", "?")];
        retry_after_ms = m.value("retry_after_ms", 0.0);
      }
      check_drained();
      if (retry_after_ms <= 0) return submit();
      // As a well-behaved client does: the next request after the server's hint (at most 1 s).
      auto t = std::make_shared<asio::steady_timer>(
          ioc_, std::chrono::milliseconds(int64_t(std::min(retry_after_ms, 1000.0))));
      t->async_wait([this, t, c = c_.get()](beast::error_code ec) {
        if (!ec && c == c_.get() && !done_) submit();  // (a reconnect submits afresh)
      });
    }
  }

  void check_drained() {
    if (done_ || submitting_) return;
    const bool all_ended = std::all_of(streams_.begin(), streams_.end(), [](auto& kv) { return kv.second.ended; });
    if (!all_ended && clock_type::now() < drain_deadline_) return;
    done_ = true;
    reconnect_timer_.cancel();
    if (c_) beast::get_lowest_layer(c_->ws).close();
  }

  void fail(const char* what, beast::error_code ec) {
    beast::get_lowest_layer(c_->ws).close();
    if (!cluster_) {
      spdlog::error("WebSocket {} failed: {}", what, ec.message());
      done_ = true;
      submitting_ = false;
      return;
    }
    // The router process died (a strike): its streams are cut, not lost (this client saw the
    // connection close); connect to the one that replaces it and go on.
    spdlog::warn("WebSocket {} failed ({}): reconnecting", what, ec.message());
    dead_.push_back(std::move(c_));
    for (auto& [id, s] : streams_)
      if (!s.ended) s.ended = true, ++t_.cut;
    recoveries_.clear();
    give_up_at_ = clock_type::now() + std::chrono::seconds(60);
    reconnect();
  }

  void reconnect() {
    reconnect_timer_.expires_after(std::chrono::milliseconds(200));
    reconnect_timer_.async_wait([this](beast::error_code ec) {
      if (ec || done_) return;
      try {
        connect();
      } catch (const std::exception& e) {
        if (clock_type::now() < give_up_at_) return reconnect();
        spdlog::error("cannot reconnect: {}", e.what());
        done_ = true;
        submitting_ = false;
        return;
      }
      ++t_.reconnects;
      for (int i = 0; i < o_.concurrency; ++i) submit();
      read(c_.get());
      check_drained();
    });
  }

  // KV blocks held once every request has ended (waits for the server to settle).
  int64_t leaked_blocks() {
    int64_t held = -1;
    for (int i = 0; i < 50; ++i) {
      auto res = http_call(ep_, "GET", "/admin/state", o_.admin_key);
      if (res.status != 200) throw std::runtime_error("/admin/state: " + res.body);
      const json st = json::parse(res.body);
      held = 0;
      for (const auto& w : st.value("workers", json::array()))
        held += w.value("kv_total_blocks", 0) - w.value("kv_free_blocks", 0) + w.value("reserved_blocks", 0);
      if (held == 0 && st.value("live_requests", 0) == 0) return 0;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    return held;
  }

  // "decode-1" → decode, "decode_process decode-node-3 (pid 9)" → decode_process.
  std::map<std::string, int> kills_by_kind() const {
    std::map<std::string, int> by_kind;
    for (auto& k : t_.killed) ++by_kind[k.substr(0, std::min(k.find('-'), k.find(' ')))];
    return by_kind;
  }

  int report() {
    int64_t lost = 0;
    for (auto& [id, s] : streams_) lost += !s.ended;
    int64_t leaked = -1;
    try {
      leaked = leaked_blocks();
    } catch (const std::exception& e) {
      spdlog::error("could not read /admin/state: {}", e.what());
    }
    sample(true);  // settled: every request ended (leaked_blocks waited for it)
    const double secs = std::chrono::duration<double>(clock_type::now() - start_).count();
    const bench::summary rec = bench::summarize(t_.recovery_ms);
    json j = {
        {"seconds", secs},
        {"kills", t_.killed.size()},
        {"kills_by_kind", kills_by_kind()},
        {"requests_sent", t_.sent},
        {"finished", t_.finished},
        {"failed_with_error", t_.failed},
        {"errors", t_.errors},
        {"lost", lost},
        {"duplicated_tokens", t_.duplicated},
        {"skipped_tokens", t_.skipped},
        {"events_after_end", t_.after_end},
        {"leaked_blocks", leaked},
        {"server_resident_bytes", rss_.to_json()},
        {"server_open_fds", fds_.to_json()},
        {"recovery_ms",
         {{"count", t_.recovery_ms.size()}, {"p50", rec.p50}, {"p90", rec.p90}, {"p99", rec.p99}, {"max", rec.max}}}};
    std::string troubles;
    if (cluster_) {
      j["cut_by_router_process_death"] = t_.cut;
      j["reconnects"] = t_.reconnects;
      j["process_restarts"] = cluster_->restarts();
      j["nodes_resident_bytes"] = node_rss_.to_json();
      j["nodes_open_fds"] = node_fds_.to_json();
      troubles = cluster_->troubles();
      j["process_troubles"] = troubles;
    }
    const bool ok = lost == 0 && t_.duplicated == 0 && t_.skipped == 0 && t_.after_end == 0 && leaked == 0 &&
                    t_.sent > 0 && troubles.empty();
    j["ok"] = ok;
    if (o_.json_out) {
      std::printf("%s\n", j.dump().c_str());
    } else {
      const std::string against = cluster_ ? "a router with " + std::to_string(o_.prefill_nodes) + " prefill and " +
                                                 std::to_string(o_.decode_nodes) + " decode processes"
                                           : o_.url;
      std::printf("tandem chaos: %.1f s against %s, killing %s every %s\n", secs, against.c_str(), o_.kill.c_str(),
                  o_.every.c_str());
      std::printf("  kills            %zu", t_.killed.size());
      for (auto& [k, n] : kills_by_kind()) std::printf("  %s:%d", k.c_str(), n);
      std::printf("\n  requests sent    %lld\n  finished         %lld\n  failed (error)   %lld", (long long)t_.sent,
                  (long long)t_.finished, (long long)t_.failed);
      for (auto& [c, n] : t_.errors) std::printf("  %s:%lld", c.c_str(), (long long)n);
      std::printf(
          "\n  lost             %lld   (must be 0)\n  duplicated tokens %lld  (must be 0)\n  skipped tokens   %lld   "
          "(must be 0)\n"
          "  events after end %lld   (must be 0)\n  leaked blocks    %lld   (must be 0)\n",
          (long long)lost, (long long)t_.duplicated, (long long)t_.skipped, (long long)t_.after_end, (long long)leaked);
      std::printf("  recovery ms      p50 %.1f  p90 %.1f  p99 %.1f  max %.1f  (%zu kills with streams in flight)\n",
                  rec.p50, rec.p90, rec.p99, rec.max, t_.recovery_ms.size());
      const double mib = 1024.0 * 1024.0;
      std::printf("  server memory    start %.1f MiB  peak %.1f MiB  end %.1f MiB\n", double(rss_.start) / mib,
                  double(rss_.peak) / mib, double(rss_.end) / mib);
      std::printf("  server open fds  start %lld  peak %lld  end %lld\n", (long long)fds_.start, (long long)fds_.peak,
                  (long long)fds_.end);
      if (cluster_) {
        std::printf("  nodes memory     start %.1f MiB  peak %.1f MiB  end %.1f MiB  (all nodes together)\n",
                    double(node_rss_.start) / mib, double(node_rss_.peak) / mib, double(node_rss_.end) / mib);
        std::printf("  nodes open fds   start %lld  peak %lld  end %lld\n", (long long)node_fds_.start,
                    (long long)node_fds_.peak, (long long)node_fds_.end);
        std::printf(
            "  processes started again %d; streams cut by a router process's death %lld (reconnected %lld times)\n",
            cluster_->restarts(), (long long)t_.cut, (long long)t_.reconnects);
        if (!troubles.empty()) std::printf("  process logs with a crash or sanitizer report:\n%s", troubles.c_str());
      }
      std::printf("  %s\n", ok ? "OK" : "FAILED");
    }
    return ok ? 0 : 1;
  }

  const chaos_opts& o_;
  endpoint ep_;
  asio::io_context ioc_;
  chaos_cluster* cluster_;  // with --cluster
  std::unique_ptr<ws_connection> c_;  // null while reconnecting
  std::vector<std::unique_ptr<ws_connection>> dead_;
  asio::steady_timer reconnect_timer_{ioc_};
  clock_type::time_point give_up_at_{};
  std::map<std::string, stream_state> streams_;
  std::vector<pending_recovery> recoveries_;
  std::mt19937_64 rng_, kill_rng_;
  tally t_;
  std::mutex sample_mu_;
  resource_track rss_, fds_, node_rss_, node_fds_;
  uint64_t next_id_ = 1;
  bool submitting_ = true, done_ = false;
  clock_type::time_point start_, drain_deadline_ = clock_type::time_point::max();
};

}  // namespace

void add_chaos(CLI::App& app) {
  auto o = std::make_shared<chaos_opts>();
  auto* cmd = app.add_subcommand("chaos", std::string(chaos_description));
  cmd->add_option("--url", o->url, "The server (http://HOST:PORT)")->capture_default_str();
  cmd->add_option(
         "--kill", o->kill,
         "What to kill: an actor kind (through /admin/kill) or, with --cluster, prefill_process, decode_process, "
         "router_process (SIGKILL) or partition")
      ->check(CLI::IsMember({"prefill", "decode", "colocated", "kv_link", "request", "router", "kv_store", "random",
                             "prefill_process", "decode_process", "router_process", "partition"}))
      ->capture_default_str();
  cmd->add_option("--every", o->every, "Time between kills (250ms, 2s, 1m)")->capture_default_str();
  cmd->add_option("--for", o->duration, "How long to send requests and kill")->capture_default_str();
  cmd->add_option("--drain", o->drain, "After that, how long to wait for the requests in flight")
      ->capture_default_str();
  cmd->add_option("--concurrency", o->concurrency, "Requests kept in flight")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  cmd->add_option("--max-tokens", o->max_tokens, "Largest max_tokens of a request")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  cmd->add_option("--admin-key", o->admin_key, "The server's --admin-key (required without --cluster)");
  cmd->add_option("--api-key", o->api_key, "The server's --api-key, if it has one");
  cmd->add_option("--seed", o->seed, "Prompts and lengths are drawn from this seed")->capture_default_str();
  cmd->add_flag("--json", o->json_out, "Print the summary as one JSON object");
  cmd->add_flag("--cluster", o->cluster,
                "Start the server as processes (a router, prefill and decode nodes) and kill and partition them too");
  cmd->add_option("--model", o->model, "--cluster: the model the processes serve")->capture_default_str();
  cmd->add_option("--prefill-nodes", o->prefill_nodes, "--cluster: prefill processes")
      ->check(CLI::Range(1, 16))
      ->capture_default_str();
  cmd->add_option("--decode-nodes", o->decode_nodes, "--cluster: decode processes")
      ->check(CLI::Range(1, 16))
      ->capture_default_str();
  cmd->add_flag(
      "--netns", o->netns,
      "--cluster: each node in its own network namespace on a bridge, a partition cuts its link (needs root); "
      "without it a partition stops the process (SIGSTOP)");
  cmd->add_option("--partition-for", o->partition_for, "--cluster: how long a partition lasts")->capture_default_str();
  cmd->add_option("--restart-after", o->restart_after, "--cluster: a dead process is started again after this")
      ->capture_default_str();
  cmd->add_option("--log-dir", o->log_dir, "--cluster: the processes' logs (default: a new directory under /tmp)");
  cmd->callback([o, cmd] {
    (void)parse_duration(o->every, "--every");
    (void)parse_duration(o->duration, "--for");
    (void)parse_duration(o->drain, "--drain");
    const bool cluster_kill = cluster_fault_of(o->kill).has_value();
    if (cluster_kill && !o->cluster) throw CLI::ValidationError("--kill", "'" + o->kill + "' needs --cluster");
    if (!o->cluster) {
      for (const char* f : {"--netns", "--partition-for", "--restart-after", "--log-dir", "--prefill-nodes",
                            "--decode-nodes", "--model"})
        if (cmd->count(f) > 0) throw CLI::ValidationError(f, "is for --cluster");
    }
    std::unique_ptr<chaos_cluster> cluster;
    endpoint ep;
    if (o->cluster) {
      chaos_cluster_options co;
      co.tandem_binary = sibling_binary("tandem").string();  // the processes serve
      co.model = resolve_model_path(o->model);
      co.prefill = o->prefill_nodes;
      co.decode = o->decode_nodes;
      co.netns = o->netns;
      co.partition_for = parse_duration(o->partition_for, "--partition-for");
      co.restart_after = parse_duration(o->restart_after, "--restart-after");
      if (o->admin_key.empty()) o->admin_key = "chaos-" + std::to_string(::getpid());
      co.admin_key = o->admin_key;
      co.log_dir = o->log_dir.empty()
                       ? std::filesystem::temp_directory_path() / ("tandem-chaos-" + std::to_string(::getpid()))
                       : std::filesystem::path(o->log_dir);
      try {
        cluster = std::make_unique<chaos_cluster>(co);
      } catch (const std::runtime_error& e) {
        throw CLI::RuntimeError(std::string("tandem chaos --cluster: ") + e.what(), 2);
      }
      spdlog::info("cluster up: router on 127.0.0.1:{}, {} prefill and {} decode processes; logs in {}",
                   cluster->http_port(), co.prefill, co.decode, co.log_dir.string());
      ep = {"127.0.0.1", cluster->http_port()};
    } else {
      if (o->admin_key.empty()) throw CLI::RequiredError("--admin-key");
      try {
        ep = bench::parse_url(o->url);
      } catch (const std::invalid_argument& e) {
        throw CLI::ValidationError("--url", e.what());
      }
    }
    soak s(*o, ep, cluster.get());
    if (const int rc = s.run(); rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace tandem::cli
