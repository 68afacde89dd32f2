#include "tools/bench/compare.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "tools/bench/client.h"

namespace tandem::bench {
namespace {

using json = nlohmann::json;

// A server child: `tandem serve` on a free port (its URL read from its log), or an external
// server's shell command with "{port}" replaced by a free port (ready when GET /v1/models
// answers 200). Its log goes to a temporary file. Stopped (SIGTERM, then SIGKILL) when destroyed.
class server_process {
 public:
  static server_process start_tandem(const std::string& bin, const std::vector<std::string>& args) {
    std::vector<std::string> all = {bin, "serve"};
    all.insert(all.end(), args.begin(), args.end());
    return server_process(all, "");
  }
  static server_process start_command(std::string command) {
    const int port = free_port();
    for (size_t at; (at = command.find("{port}")) != std::string::npos;) command.replace(at, 6, std::to_string(port));
    return server_process({"/bin/sh", "-c", "exec " + command}, "http://127.0.0.1:" + std::to_string(port));
  }
  server_process(server_process&& o) noexcept : pid_(o.pid_), log_(std::move(o.log_)), url_(std::move(o.url_)) {
    o.pid_ = -1;
  }
  server_process& operator=(server_process&&) = delete;
  ~server_process() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      int status = 0;
      for (int i = 0; i < 300 && waitpid(pid_, &status, WNOHANG) != pid_; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      if (waitpid(pid_, &status, WNOHANG) == 0) {
        kill(pid_, SIGKILL);
        waitpid(pid_, &status, 0);
      }
    }
    if (!log_.empty()) {
      std::error_code ec;
      std::filesystem::remove(log_, ec);
    }
  }
  const std::string& url() const { return url_; }

 private:
  // known_url empty: tandem serve, which logs the URL it serves on.
  server_process(std::vector<std::string> all, std::string known_url) : url_(std::move(known_url)) {
    log_ = (std::filesystem::temp_directory_path() /
            ("tandem-bench-" + std::to_string(getpid()) + "-" + std::to_string(counter_++) + ".log"))
               .string();
    std::vector<char*> argv;
    for (auto& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_ = fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      const int fd = open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      const int null = open("/dev/null", O_RDWR);
      if (fd >= 0) dup2(fd, 2);
      if (null >= 0) dup2(null, 0);
      if (fd >= 0) dup2(fd, 1);
      execv(argv[0], argv.data());
      _exit(127);
    }
    const bool tandem = url_.empty();
    static const std::regex re(R"(on http://([0-9.]+):(\d+))");
    for (int i = 0; i < 2400; ++i) {  // up to 120 s (a model may be made or loaded first)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      std::ifstream in(log_);
      std::stringstream ss;
      ss << in.rdbuf();
      const std::string text = ss.str();
      if (tandem) {
        std::smatch m;
        if (std::regex_search(text, m, re)) {
          url_ = "http://" + std::string(m[1]) + ":" + std::string(m[2]);
          return;
        }
      } else {
        try {
          if (http_call(parse_url(url_), "GET", "/v1/models", "", "").status == 200) return;
        } catch (const std::exception&) {  // not listening yet
        }
      }
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        throw std::runtime_error(std::string(tandem ? "tandem serve" : all.back()) + " exited before serving:\n" +
                                 text.substr(text.size() > 2000 ? text.size() - 2000 : 0));
      }
    }
    throw std::runtime_error("the server did not start within 120 s (log: " + log_ + ")");
  }
  // A port no one listens on now (the child binds it a moment later).
  static int free_port() {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      if (fd >= 0) close(fd);
      throw std::runtime_error("no free port for the external server");
    }
    close(fd);
    return ntohs(a.sin_port);
  }

  static inline int counter_ = 0;
  pid_t pid_ = -1;
  std::string log_, url_;
};

const char* admin_key = "bench-compare";

std::vector<std::string> serve_args(const compare_options& o, const std::string& mode) {
  std::vector<std::string> a = {"--port", "0", "--admin-key", admin_key, "--max-queue", "100000"};
  if (!o.model.empty()) a.insert(a.end(), {"--model", o.model});
  const int t = std::max(1, o.total_threads);
  // The SLO-aware modes hold the TPOT SLO as their target (colocated-slo sizes its steps by it,
  // shared paces decode under it).
  std::string target;
  if (o.slos.tpot_s) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.6g", *o.slos.tpot_s * 1e3);
    target = buf;
  }
  if (mode == "colocated" || mode == "colocated-slo") {
    a.insert(a.end(), {"--mode", "colocated", "--colocated-workers", "1", "--threads", std::to_string(t)});
    if (mode == "colocated-slo" && !target.empty()) a.insert(a.end(), {"--tpot-target-ms", target});
  } else if (mode == "auto") {  // the two pools sharing the cores; short prompts computed where they decode
    a.insert(a.end(), {"--mode", "auto", "--prefill-workers", "1", "--decode-workers", "1", "--threads",
                       std::to_string(std::max(1, t / 2))});
    if (!target.empty()) a.insert(a.end(), {"--tpot-target-ms", target});
  } else {  // the same cores split between the pools (shared: each keeps its half while busy)
    a.insert(a.end(), {"--mode", "disaggregated", "--prefill-workers", "1", "--decode-workers", "1", "--threads",
                       std::to_string(std::max(1, t / 2))});
    if (mode == "shared") {
      a.push_back("--share-cores");
      if (!target.empty()) a.insert(a.end(), {"--tpot-target-ms", target});
    } else {
      a.push_back("--no-share-cores");
    }
  }
  a.insert(a.end(), o.extra_serve_args.begin(), o.extra_serve_args.end());
  return a;
}

bool holds(const serve_report& r, const compare_options& o) {
  return r.figures.failed == 0 && r.figures.slo_attainment >= o.attainment;
}

// Every 3 s (5 restarts in 10 s would degrade a pool), a worker killed through /admin/kill.
class killer {
 public:
  killer(const std::string& url, const std::string& kind) : ep_(parse_url(url)) {
    t_ = std::thread([this, kind] {
      while (!stop_.load()) {
        for (int i = 0; i < 60 && !stop_.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
        if (stop_.load()) break;
        try {
          if (http_call(ep_, "POST", "/admin/kill", admin_key, json{{"kind", kind}}.dump()).status == 200) ++kills_;
        } catch (const std::exception&) {}
      }
    });
  }
  ~killer() {
    stop_ = true;
    t_.join();
  }
  int kills() const { return kills_.load(); }

 private:
  endpoint ep_;
  std::atomic<bool> stop_{false};
  std::atomic<int> kills_{0};
  std::thread t_;
};

// The measured (not chaos) run of `mode` at `rate`, if there is one.
const mode_run* find_run(const compare_result& r, const std::string& mode, double rate) {
  for (const auto& m : r.runs)
    if (m.mode == mode && m.rate == rate) return &m;
  return nullptr;
}

}  // namespace

double explained_rate(const compare_result& r) {
  // The lowest rate both modes ran at which one holds the SLOs and the other does not (where the
  // verdict is decided); else the highest rate both ran.
  double decisive = 0, highest = 0;
  for (const auto& c : r.runs) {
    const mode_run* d = c.mode == "colocated" ? find_run(r, "disaggregated", c.rate) : nullptr;
    if (!d) continue;
    highest = std::max(highest, c.rate);
    if (c.held != d->held && (decisive == 0 || c.rate < decisive)) decisive = c.rate;
  }
  if (decisive > 0) return decisive;
  if (highest > 0) return highest;
  // Not both of those modes: the highest rate every contender ran.
  std::vector<std::string> names;
  for (const auto& [n, b] : r.best) names.push_back(n);
  for (const auto& c : r.runs) {
    bool all = true;
    for (const auto& n : names) all = all && find_run(r, n, c.rate) != nullptr;
    if (all) highest = std::max(highest, c.rate);
  }
  return highest;
}

double compare_result::best_rate(const std::string& contender) const {
  for (const auto& [n, b] : best)
    if (n == contender) return b;
  return 0;
}

std::vector<std::string> contender_names(const compare_options& o) {
  std::vector<std::string> n = o.modes;
  for (size_t i = 0; i < o.against.size(); ++i) {
    const auto& e = o.against[i];
    std::string name = e.name;
    if (name.empty() && !e.command.empty()) {  // the program's file name: llama-server
      std::istringstream words(e.command);
      words >> name;
      name = std::filesystem::path(name).filename().string();
    }
    if (name.empty()) name = o.against.size() == 1 ? "external" : "external-" + std::to_string(i + 1);
    n.push_back(name);
  }
  return n;
}

mode_run median_of_rounds(const std::vector<const mode_run*>& rounds, const compare_options& o) {
  std::vector<const mode_run*> by_goodput = rounds;
  std::sort(by_goodput.begin(), by_goodput.end(),
            [](auto* a, auto* b) { return a->report.figures.goodput < b->report.figures.goodput; });
  mode_run m = *by_goodput[by_goodput.size() / 2];
  auto med = [&](auto field) {
    std::vector<double> v;
    for (auto* r : rounds) v.push_back(field(r->report.figures));
    return median(std::move(v));
  };
  auto& f = m.report.figures;
  f.goodput = med([](const run_figures& x) { return x.goodput; });
  f.request_throughput = med([](const run_figures& x) { return x.request_throughput; });
  f.slo_attainment = med([](const run_figures& x) { return x.slo_attainment; });
  f.failed = int64_t(med([](const run_figures& x) { return double(x.failed); }));
  f.ttft_s.p50 = med([](const run_figures& x) { return x.ttft_s.p50; });
  f.ttft_s.p90 = med([](const run_figures& x) { return x.ttft_s.p90; });
  f.tpot_s.p50 = med([](const run_figures& x) { return x.tpot_s.p50; });
  f.tpot_s.p90 = med([](const run_figures& x) { return x.tpot_s.p90; });
  if (m.report.server.is_object()) {
    std::vector<double> h;
    for (auto* r : rounds)
      if (r->report.server.is_object()) h.push_back(r->report.server.value("handoff_ms_mean", 0.0));
    m.report.server["handoff_ms_mean"] = median(std::move(h));
  }
  m.held = holds(m.report, o);
  return m;
}

compare_result run_compare(const compare_options& o) {
  compare_result res;
  const auto names = contender_names(o);
  const int32_t rounds = std::max(o.rounds, 1);
  std::vector<double> best(names.size(), 0);
  int32_t context = 0;
  // Round after round, every contender on a fresh server in turn (interleaved: a drift of the
  // machine's speed falls on all of them alike), each round with new prompt contents.
  for (int32_t round = 0; round < rounds; ++round)
    for (size_t ci = 0; ci < names.size(); ++ci) {
      const std::string& mode = names[ci];
      const bool ours = ci < o.modes.size();
      const external_server* ext = ours ? nullptr : &o.against[ci - o.modes.size()];
      std::optional<server_process> srv;
      if (ours) srv.emplace(server_process::start_tandem(o.tandem_binary, serve_args(o, mode)));
      else if (!ext->command.empty()) srv.emplace(server_process::start_command(ext->command));
      serve_options so;
      so.url = srv ? srv->url() : ext->url;
      // tandem's WebSocket sends a frame for every token, also one whose text is held back (an
      // incomplete UTF-8 sequence, a possible stop string); SSE, like OpenAI's, only sends
      // visible text, which would time a later token as the first. Against another server every
      // contender is measured over the OpenAI API instead: the same client for all.
      so.api = o.against.empty() ? "ws" : "openai";
      so.slos = o.slos;
      so.seed = o.seed;
      so.progress = o.progress;
      const served_info info = query_server(so);
      so.model = info.model;
      // One context for every contender: the first one's (a server with parallel slots, as
      // llama-server -np, may report all of them together), unless given.
      if (context == 0) context = o.max_context > 0 ? o.max_context : info.context_length;
      std::vector<trace_entry> base;
      workload w;
      if (parse_workload(o.trace, w)) {
        trace_options t{.kind = w, .requests = o.requests, .rate = 1.0, .seed = o.seed, .max_context = context};
        base = make_trace(t);
      } else if (!o.mooncake_file.empty()) {
        auto m = o.mooncake;
        m.max_context = context;
        auto t = load_mooncake_trace(o.mooncake_file, m);
        if (round == 0) spdlog::info("trace: {}", t.scaling);
        base = std::move(t.entries);
      } else {
        base = load_trace(o.trace);
      }
      {  // warm-up, not measured: the first requests of a fresh server pay page faults and spin-ups
        serve_options quiet = so;
        quiet.progress = false;
        std::vector<trace_entry> warm(base.begin(), base.begin() + std::min<size_t>(base.size(), 4));
        quiet.seed = o.seed + 0x5eed;  // prompts of its own: the servers' prefix caches must not
        (void)run_serve_bench(quiet, at_rate(warm, 2.0));  // serve the measured runs' prompts
      }
      uint64_t run_index = 0;
      auto run_at = [&](double rate) {
        spdlog::info("{}: {} requests at {:.3g} req/s{}", mode, base.size(), rate,
                     rounds > 1 ? " (round " + std::to_string(round + 1) + " of " + std::to_string(rounds) + ")" : "");
        // Every rate (and round) replays the same lengths and arrivals with new prompt contents:
        // replaying the same prompts would measure the prefix cache, not the modes. Contenders
        // get the same contents at the same rate and round.
        serve_options run_so = so;
        run_so.seed = o.seed + 1000 * ++run_index + 1000000 * uint64_t(round);
        mode_run r{mode, rate, run_serve_bench(run_so, at_rate(base, rate))};
        const bool ok = r.held = holds(r.report, o);
        spdlog::info("{} at {:.3g} req/s: goodput {:.3f} req/s, {:.0f}% meet the SLOs{}", mode, rate,
                     r.report.figures.goodput, 100 * r.report.figures.slo_attainment, ok ? "" : " (missed)");
        if (ok) best[ci] = std::max(best[ci], rate);
        (rounds > 1 ? res.round_runs : res.runs).push_back(std::move(r));
        return ok;
      };
      if (!o.rates.empty()) {
        for (double r : o.rates) run_at(r);
      } else {
        // Doubling until the SLOs are missed, then the point halfway to it.
        double rate = 0.25, missed = 0;
        for (int i = 0; i < 9; ++i, rate *= 2)
          if (!run_at(rate)) {
            missed = rate;
            break;
          }
        if (missed > 0 && best[ci] > 0) run_at(best[ci] * 1.5);
      }
      if (o.with_chaos && best[ci] > 0 && ours) {
        spdlog::info("{}: again at {:.3g} req/s, a worker killed every 3 s", mode, best[ci]);
        killer k(so.url, mode.rfind("colocated", 0) == 0 ? "colocated" : "random");
        mode_run r{mode, best[ci], run_serve_bench(so, at_rate(base, best[ci]))};
        r.report.server["kills"] = k.kills();
        res.chaos_runs.push_back(std::move(r));
      }
    }
  if (rounds > 1) {  // the table: each contender's median at each rate (run_compare's caller gave rates)
    std::fill(best.begin(), best.end(), 0);
    for (size_t ci = 0; ci < names.size(); ++ci)
      for (double rate : o.rates) {
        std::vector<const mode_run*> at;
        for (const auto& r : res.round_runs)
          if (r.mode == names[ci] && r.rate == rate) at.push_back(&r);
        if (at.empty()) continue;
        res.runs.push_back(median_of_rounds(at, o));
        if (res.runs.back().held) best[ci] = std::max(best[ci], rate);
      }
  }
  for (size_t ci = 0; ci < names.size(); ++ci) res.best.emplace_back(names[ci], best[ci]);

  // The verdict, and why: what colocated decode steps lose to prefill, and what the split costs.
  res.explained_rate = explained_rate(res);
  res.verdict = modes_verdict(res, o);
  for (const std::string& more : {shared_verdict(res, o), auto_verdict(res, o), against_verdict(res, o)})
    if (!more.empty()) res.verdict += (res.verdict.empty() ? "" : ". ") + more;
  return res;
}

namespace {

bool has_mode(const compare_options& o, const std::string& m) {
  return std::find(o.modes.begin(), o.modes.end(), m) != o.modes.end();
}

std::string slo_text(const compare_options& o) {
  std::string slos;
  if (o.slos.ttft_s) slos += "TTFT <= " + std::to_string(int(*o.slos.ttft_s * 1e3)) + " ms";
  if (o.slos.tpot_s)
    slos += std::string(slos.empty() ? "" : " and ") + "TPOT <= " + std::to_string(int(*o.slos.tpot_s * 1e3)) + " ms";
  return slos.empty() ? "no SLO" : slos;
}

std::string ratio(double a, double b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2fx", a / b);
  return buf;
}

}  // namespace

// Colocated against disaggregated (both run): which holds the SLOs to the higher rate, and why.
std::string modes_verdict(const compare_result& res, const compare_options& o) {
  if (!has_mode(o, "colocated") || !has_mode(o, "disaggregated")) return "";
  std::ostringstream v;
  const double c = res.best_rate("colocated"), d = res.best_rate("disaggregated");
  const std::string slos = slo_text(o);
  char buf[512];
  if (c == 0 && d == 0) {
    std::snprintf(buf, sizeof buf, "neither mode holds %s for %.0f%% of requests at any rate tried", slos.c_str(),
                  100 * o.attainment);
  } else if (c == 0 || d == 0) {
    const bool dis = d > 0;
    double lowest = 1e300;
    for (const auto& m : res.runs)
      if (m.mode == "colocated" || m.mode == "disaggregated") lowest = std::min(lowest, m.rate);
    std::snprintf(
        buf, sizeof buf,
        "%s wins: it holds %s for %.0f%% of requests up to %.3g req/s; %s does not at any rate tried (from %.3g req/s)",
        dis ? "disaggregated" : "colocated", slos.c_str(), 100 * o.attainment, dis ? d : c,
        dis ? "colocated" : "disaggregated", lowest);
  } else if (d > c) {
    std::snprintf(
        buf, sizeof buf,
        "disaggregated wins: it holds %s for %.0f%% of requests up to %.3g req/s, colocated up to %.3g req/s (%s)",
        slos.c_str(), 100 * o.attainment, d, c, (std::to_string(d / c).substr(0, 4) + "x").c_str());
  } else if (c > d) {
    std::snprintf(
        buf, sizeof buf,
        "colocated wins: it holds %s for %.0f%% of requests up to %.3g req/s, disaggregated up to %.3g req/s (%s)",
        slos.c_str(), 100 * o.attainment, c, d, (std::to_string(c / d).substr(0, 4) + "x").c_str());
  } else {
    std::snprintf(buf, sizeof buf, "a tie: both hold %s for %.0f%% of requests up to %.3g req/s", slos.c_str(),
                  100 * o.attainment, c);
  }
  v << buf;
  const double common = res.explained_rate;
  if (const mode_run* cr = find_run(res, "colocated", common), *dr = find_run(res, "disaggregated", common); cr && dr) {
    const auto& cf = cr->report.figures;
    const auto& df = dr->report.figures;
    const double handoff =
        dr->report.server.is_object() ? double(dr->report.server.value("handoff_ms_mean", 0.0)) : 0.0;
    std::snprintf(
        buf, sizeof buf,
        ". Why, at %.3g req/s: colocated decode steps carry prefill chunks, TPOT p90 %.1f ms vs %.1f ms "
        "disaggregated (interference %+.1f ms per token); the split costs a KV handoff of %.2f ms per request "
        "(%.1f%% of the disaggregated mean TTFT, %.1f ms) and half the cores per phase (TTFT p90 %.1f ms vs %.1f ms "
        "colocated)",
        common, cf.tpot_s.p90 * 1e3, df.tpot_s.p90 * 1e3, (cf.tpot_s.p90 - df.tpot_s.p90) * 1e3, handoff,
        df.ttft_s.mean > 0 ? 100 * handoff / (df.ttft_s.mean * 1e3) : 0.0, df.ttft_s.mean * 1e3, df.ttft_s.p90 * 1e3,
        cf.ttft_s.p90 * 1e3);
    v << buf;
  }
  return v.str();
}

// Shared cores against the better of the fixed-core modes that ran.
std::string shared_verdict(const compare_result& res, const compare_options& o) {
  if (!has_mode(o, "shared")) return "";
  const double s = res.best_rate("shared");
  std::string other = "";
  double b = -1;
  for (const std::string m : {"colocated", "colocated-slo", "disaggregated"})
    if (has_mode(o, m) && res.best_rate(m) > b) b = res.best_rate(m), other = m;
  char buf[512];
  if (other.empty()) {
    std::snprintf(buf, sizeof buf, "shared cores hold %s up to %.3g req/s", slo_text(o).c_str(), s);
  } else {
    std::snprintf(buf, sizeof buf,
                  "shared cores (disaggregated, each phase computing on the cores the other leaves) hold %s up to %.3g "
                  "req/s, %s up to %.3g req/s%s",
                  slo_text(o).c_str(), s, other.c_str(), b, s > 0 && b > 0 ? (" (" + ratio(s, b) + ")").c_str() : "");
  }
  return buf;
}

// Auto against the best of tandem's other modes that ran.
std::string auto_verdict(const compare_result& res, const compare_options& o) {
  if (!has_mode(o, "auto")) return "";
  const double a = res.best_rate("auto");
  std::string other;
  double b = -1;
  for (const std::string m : {"colocated", "colocated-slo", "disaggregated", "shared"})
    if (has_mode(o, m) && res.best_rate(m) > b) b = res.best_rate(m), other = m;
  char buf[512];
  if (other.empty()) std::snprintf(buf, sizeof buf, "auto holds %s up to %.3g req/s", slo_text(o).c_str(), a);
  else
    std::snprintf(buf, sizeof buf,
                  "auto (shared cores, short prompts computed where they decode) holds %s up to %.3g req/s, %s up to "
                  "%.3g req/s%s",
                  slo_text(o).c_str(), a, other.c_str(), b, a > 0 && b > 0 ? (" (" + ratio(a, b) + ")").c_str() : "");
  return buf;
}

std::string against_verdict(const compare_result& r, const compare_options& o) {
  if (o.against.empty() || o.modes.empty()) return "";
  const auto names = contender_names(o);
  std::string ours;
  double b = -1;
  for (const auto& m : o.modes)
    if (r.best_rate(m) > b) b = r.best_rate(m), ours = m;
  std::ostringstream v;
  for (size_t i = o.modes.size(); i < names.size(); ++i) {
    const double e = r.best_rate(names[i]);
    // Goodput at the highest rate both ran: the sweep's steps are coarse.
    double rate = 0, g_ours = 0, g_ext = 0;
    for (const auto& run : r.runs) {
      if (run.mode != ours) continue;
      const mode_run* x = find_run(r, names[i], run.rate);
      if (x && run.rate > rate) rate = run.rate, g_ours = run.report.figures.goodput, g_ext = x->report.figures.goodput;
    }
    char theirs[96];
    if (e > 0) std::snprintf(theirs, sizeof theirs, "up to %.3g req/s", e);
    else std::snprintf(theirs, sizeof theirs, "at none of the rates tried");
    char buf[640];
    std::snprintf(buf, sizeof buf, "%sAgainst %s: tandem's best mode (%s) holds %s up to %.3g req/s, %s %s%s",
                  v.tellp() > 0 ? ". " : "", names[i].c_str(), ours.c_str(), slo_text(o).c_str(), b, names[i].c_str(),
                  theirs, b > 0 && e > 0 ? (" (" + ratio(b, e) + ")").c_str() : "");
    v << buf;
    if (rate > 0) {
      std::snprintf(buf, sizeof buf, "; at %.3g req/s goodput %.3f vs %.3f req/s%s", rate, g_ours, g_ext,
                    g_ext > 0 ? (" (" + ratio(g_ours, g_ext) + ")").c_str() : "");
      v << buf;
    }
  }
  return v.str();
}

json compare_result::to_json(const compare_options& o) const {
  json runs_j = json::array(), chaos_j = json::array(), best_j = json::object();
  for (const auto& [n, b] : best) best_j[n] = b;
  for (const auto& r : runs) runs_j.push_back({{"mode", r.mode}, {"rate", r.rate}, {"result", r.report.to_json()}});
  for (const auto& r : chaos_runs)
    chaos_j.push_back({{"mode", r.mode}, {"rate", r.rate}, {"result", r.report.to_json()}});
  json rounds_j = json::array();
  for (const auto& r : round_runs)
    rounds_j.push_back({{"mode", r.mode}, {"rate", r.rate}, {"result", r.report.to_json()}});
  json trace = o.trace;
  if (!o.mooncake_file.empty())
    trace = {{"kind", "mooncake"},
             {"file", o.mooncake_file},
             {"scale_tokens", o.mooncake.scale_tokens},
             {"from", o.mooncake.from},
             {"count", o.mooncake.count}};
  return {{"trace", trace},
          {"requests_per_run", o.mooncake_file.empty() ? size_t(o.requests) : o.mooncake.count},
          {"total_threads", o.total_threads},
          {"slo_ttft_ms", o.slos.ttft_s ? *o.slos.ttft_s * 1e3 : 0.0},
          {"slo_tpot_ms", o.slos.tpot_s ? *o.slos.tpot_s * 1e3 : 0.0},
          {"attainment", o.attainment},
          {"best_rate_colocated", best_rate("colocated")},
          {"best_rate_disaggregated", best_rate("disaggregated")},
          {"best_rate", best_j},
          {"api", o.against.empty() ? "ws" : "openai"},
          {"verdict", verdict},
          {"rounds", std::max(o.rounds, 1)},
          {"runs", runs_j},
          {"round_runs", rounds_j},
          {"chaos_runs", chaos_j}};
}

void print_compare(const compare_result& r, const compare_options& o) {
  int w = 14;  // the name column: as wide as the longest contender's name
  for (const auto& n : contender_names(o)) w = std::max(w, int(n.size()));
  std::printf("\n%-*s %8s | %9s %9s %6s | %9s %9s | %9s %9s | %8s\n", w, "mode", "req/s", "goodput", "thru", "SLO%",
              "TTFT p50", "TTFT p90", "TPOT p50", "TPOT p90", "handoff");
  auto row = [w](const mode_run& m, const char* tag) {
    const auto& f = m.report.figures;
    const double handoff = m.report.server.is_object() ? double(m.report.server.value("handoff_ms_mean", 0.0)) : 0.0;
    std::printf("%-*s %8.3g | %9.3f %9.3f %5.0f%% | %9.1f %9.1f | %9.2f %9.2f | %8.2f%s\n", w, m.mode.c_str(), m.rate,
                f.goodput, f.request_throughput, 100 * f.slo_attainment, f.ttft_s.p50 * 1e3, f.ttft_s.p90 * 1e3,
                f.tpot_s.p50 * 1e3, f.tpot_s.p90 * 1e3, handoff, tag);
  };
  for (const auto& m : r.runs) row(m, "");
  for (const auto& m : r.chaos_runs) row(m, "  (killing a worker every 3 s)");
  std::printf(
      "(ms; goodput and throughput in req/s; SLO%%: requests meeting the SLOs; target %.0f%%%s)\n", 100 * o.attainment,
      o.rounds > 1 ? ("; each figure the median of " + std::to_string(o.rounds) + " interleaved rounds").c_str() : "");
  if (o.rounds > 1) {  // the spread behind each median
    std::printf("goodput by round:\n");
    for (const auto& m : r.runs) {
      std::printf("  %-*s %8.3g |", w, m.mode.c_str(), m.rate);
      for (const auto& x : r.round_runs)
        if (x.mode == m.mode && x.rate == m.rate) std::printf(" %.3f", x.report.figures.goodput);
      std::printf("\n");
    }
  }
  for (const auto& m : r.chaos_runs) {
    const mode_run* calm = find_run(r, m.mode, m.rate);
    if (!calm) continue;
    std::printf(
        "chaos, %s: %d kills; goodput %.3f -> %.3f req/s (%.0f%% lost); longest stall of a stream %.0f ms (%.0f ms "
        "without kills)\n",
        m.mode.c_str(), int(m.report.server.value("kills", 0)), calm->report.figures.goodput, m.report.figures.goodput,
        calm->report.figures.goodput > 0 ? 100 * (1 - m.report.figures.goodput / calm->report.figures.goodput) : 0.0,
        m.report.figures.itl_s.max * 1e3, calm->report.figures.itl_s.max * 1e3);
  }
  std::printf("\nverdict: %s\n", r.verdict.c_str());
}

}  // namespace tandem::bench
