#include "tools/bench/serve.h"

#include <dlfcn.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "tools/bench/client.h"

namespace tandem::bench {
namespace {

using json = nlohmann::json;
using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

// Prometheus text: each sample's value summed over its label sets, by metric name.
std::map<std::string, double> scrape(const endpoint& ep) {
  std::map<std::string, double> out;
  http_reply r;
  try {
    r = http_call(ep, "GET", "/metrics", "");
  } catch (const std::exception&) {
    return out;
  }
  if (r.status != 200) return out;
  std::istringstream in(r.body);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    const size_t name_end = line.find_first_of("{ ");
    const size_t value_at = line.rfind(' ');
    if (name_end == std::string::npos || value_at == std::string::npos || value_at + 1 >= line.size()) continue;
    try {
      out[line.substr(0, name_end)] += std::stod(line.substr(value_at + 1));
    } catch (const std::exception&) {}
  }
  return out;
}

// RAPL package energy counters (µJ), where the kernel exposes them (not in most VMs).
struct rapl_reading {
  std::vector<std::pair<double, double>> counters;  // (energy_uj, max_energy_range_uj)
};
std::optional<rapl_reading> read_rapl() {
  namespace fs = std::filesystem;
  const fs::path root = "/sys/class/powercap";
  std::error_code ec;
  if (!fs::exists(root, ec)) return std::nullopt;
  rapl_reading r;
  for (const auto& d : fs::directory_iterator(root, ec)) {
    const std::string name = d.path().filename().string();
    // Packages only ("intel-rapl:0"), not their sub-zones ("intel-rapl:0:0").
    if (name.rfind("intel-rapl:", 0) != 0 || name.find(':', 11) != std::string::npos) continue;
    double e = 0, range = 0;
    std::ifstream fe(d.path() / "energy_uj"), fr(d.path() / "max_energy_range_uj");
    if (!(fe >> e)) continue;  // present but unreadable (permissions): not available
    fr >> range;
    r.counters.emplace_back(e, range);
  }
  if (r.counters.empty()) return std::nullopt;
  return r;
}

// NVML's total energy counters (mJ, Volta and later), summed over the GPUs, read through
// dlopen so that the binary needs no NVIDIA library; nullopt where there is none.
std::optional<double> read_nvml_mj() {
  void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) return std::nullopt;
  using init_fn = int (*)();
  using count_fn = int (*)(unsigned*);
  using handle_fn = int (*)(unsigned, void**);
  using energy_fn = int (*)(void*, unsigned long long*);
  auto init = reinterpret_cast<init_fn>(dlsym(lib, "nvmlInit_v2"));
  auto shutdown = reinterpret_cast<init_fn>(dlsym(lib, "nvmlShutdown"));
  auto count = reinterpret_cast<count_fn>(dlsym(lib, "nvmlDeviceGetCount_v2"));
  auto handle = reinterpret_cast<handle_fn>(dlsym(lib, "nvmlDeviceGetHandleByIndex_v2"));
  auto energy = reinterpret_cast<energy_fn>(dlsym(lib, "nvmlDeviceGetTotalEnergyConsumption"));
  std::optional<double> total;
  unsigned n = 0;
  if (init && shutdown && count && handle && energy && init() == 0) {  // 0: NVML_SUCCESS
    if (count(&n) == 0 && n > 0) {
      double sum = 0;
      bool all = true;
      for (unsigned i = 0; i < n && all; ++i) {
        void* dev = nullptr;
        unsigned long long mj = 0;
        all = handle(i, &dev) == 0 && energy(dev, &mj) == 0;
        sum += double(mj);
      }
      if (all) total = sum;
    }
    shutdown();
  }
  dlclose(lib);
  return total;
}

// Token ids from a stream that `x` starts; each id is a step of a 64-bit mixer. Appends n.
void append_tokens(std::vector<int32_t>& to, size_t n, uint64_t x, int32_t vocab) {
  for (size_t k = 0; k < n; ++k) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 29;
    to.push_back(3 + int32_t(x % uint64_t(std::max(1, vocab))));
  }
}

// A request's own stream: unchanged from before shared prefixes, so the older traces still
// send the same prompts.
uint64_t request_stream(uint64_t seed, size_t index) { return seed * 0x9E3779B97F4A7C15ull + index; }

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// A prefix group's stream: from (seed, group) only, and hashed so that it does not start where
// a request's stream (seed * golden + index) does.
uint64_t group_stream(uint64_t seed, int32_t group) {
  return splitmix64(splitmix64(seed) ^ (0x7072656669780000ull + uint64_t(uint32_t(group))));
}

constexpr size_t no_turn = size_t(-1);

// For each entry, the entry of its conversation's previous turn (no_turn for none), checking
// that every turn k > 0 comes after turn k-1 in the (arrival-ordered) trace.
std::vector<size_t> previous_turns(const std::vector<trace_entry>& trace) {
  std::vector<size_t> prev(trace.size(), no_turn);
  std::map<int32_t, size_t> last;
  for (size_t i = 0; i < trace.size(); ++i) {
    const auto& e = trace[i];
    if (e.conversation < 0) continue;
    const auto it = last.find(e.conversation);
    if (e.turn > 0) {
      if (it == last.end() || trace[it->second].turn != e.turn - 1)
        throw std::invalid_argument("conversation " + std::to_string(e.conversation) + ": turn " +
                                    std::to_string(e.turn) + " does not follow turn " + std::to_string(e.turn - 1) +
                                    " in the trace");
      if (!e.prompt_text.empty()) throw std::invalid_argument("a conversation's turns need token-id prompts, not text");
      prev[i] = it->second;
    }
    last[e.conversation] = i;
  }
  return prev;
}

class progress_bar {
 public:
  progress_bar(bool on, size_t total) : on_(on), tty_(isatty(2) != 0), total_(total) {}
  void show(size_t done, size_t failed, size_t inflight, double elapsed, bool last = false) {
    if (!on_ || total_ == 0) return;
    const size_t tenth = done * 10 / total_;
    if (!tty_ && !last && tenth == last_tenth_) return;  // a log: a line per 10%
    last_tenth_ = tenth;
    const int width = 30, filled = int(double(width) * double(done) / double(total_));
    std::fprintf(stderr, "%s[%.*s%.*s] %zu/%zu done, %zu failed, %zu in flight, %.1f s%s", tty_ ? "\r" : "", filled,
                 "##############################", width - filled, "..............................", done, total_,
                 failed, inflight, elapsed, tty_ && !last ? "" : "\n");
    std::fflush(stderr);
  }

 private:
  bool on_, tty_;
  size_t total_, last_tenth_ = size_t(-1);
};

}  // namespace

// A block's stream: from (seed, block id) only, so every request with that id sends it alike.
uint64_t block_stream(uint64_t seed, int64_t id) {
  return splitmix64(splitmix64(seed ^ 0x626c6f636b000000ull) ^ uint64_t(id));
}

std::vector<int32_t> synthetic_prompt(const trace_entry& e, size_t index, const serve_options& o) {
  const size_t total = size_t(std::max(0, e.prompt_tokens));
  if (!e.block_ids.empty()) {  // block k from its id alone; the last one as long as the prompt has left
    std::vector<int32_t> p;
    p.reserve(total);
    for (size_t k = 0; k < e.block_ids.size() && p.size() < total; ++k)
      append_tokens(p, std::min(size_t(std::max(1, e.block_tokens)), total - p.size()),
                    block_stream(o.seed, e.block_ids[k]), o.vocab);
    append_tokens(p, total - p.size(), request_stream(o.seed, index), o.vocab);  // (ids that fall short: its own)
    return p;
  }
  const size_t shared = e.prefix_group >= 0 ? std::min(total, size_t(std::max(0, e.prefix_tokens))) : 0;
  std::vector<int32_t> p;
  p.reserve(total);
  if (shared > 0) append_tokens(p, shared, group_stream(o.seed, e.prefix_group), o.vocab);
  append_tokens(p, total - shared, request_stream(o.seed, index), o.vocab);
  return p;
}

std::vector<int32_t> next_turn_prompt(const std::vector<int32_t>& previous_prompt,
                                      const std::vector<int32_t>& previous_output, const trace_entry& e, size_t index,
                                      const serve_options& o) {
  std::vector<int32_t> p;
  p.reserve(previous_prompt.size() + previous_output.size() + size_t(std::max(0, e.new_tokens)));
  p.insert(p.end(), previous_prompt.begin(), previous_prompt.end());
  p.insert(p.end(), previous_output.begin(), previous_output.end());
  append_tokens(p, size_t(std::max(0, e.new_tokens)), request_stream(o.seed, index), o.vocab);
  return p;
}

served_info query_server(const serve_options& o) {
  served_info s;
  const endpoint ep = parse_url(o.url);
  const http_reply r = http_call(ep, "GET", "/v1/models", o.api_key);
  if (r.status != 200)
    throw std::runtime_error("GET /v1/models: HTTP " + std::to_string(r.status) + " " + r.body.substr(0, 200));
  const json j = json::parse(r.body, nullptr, false);
  if (j.is_discarded() || !j.contains("data") || !j["data"].is_array() || j["data"].empty())
    throw std::runtime_error("GET /v1/models: no model listed");
  const json& m = j["data"][0];
  s.model = m.value("id", "");
  s.context_length = m.value("max_model_len", m.value("context_length", 0));
  return s;
}

serve_report run_serve_bench(const serve_options& o, const std::vector<trace_entry>& trace) {
  const endpoint ep = parse_url(o.url);
  serve_report rep;
  const size_t n = trace.size();
  rep.outcomes.resize(n);
  rep.trace_shared_share = shared_prefix_share(trace);
  const std::vector<size_t> prev = previous_turns(trace);
  std::vector<char> needed(n, 0);  // a later turn resends this entry's output
  for (size_t p : prev)
    if (p != no_turn) needed[p] = 1;
  if (o.api != "ws" && std::find(needed.begin(), needed.end(), 1) != needed.end())
    throw std::invalid_argument(
        "multiturn needs --api ws: the OpenAI streaming API returns text, not token ids, and a turn's prompt must "
        "carry "
        "the exact tokens the previous turn produced");
  std::vector<stream_request> reqs(n);
  for (size_t i = 0; i < n; ++i) {
    reqs[i].model = o.model;
    reqs[i].max_tokens = trace[i].output_tokens;
    reqs[i].prompt_text = trace[i].prompt_text;
    // A later turn's prompt is built when the turn before it finishes.
    if (reqs[i].prompt_text.empty() && prev[i] == no_turn) reqs[i].prompt_tokens = synthetic_prompt(trace[i], i, o);
  }
  const auto before = scrape(ep);
  const auto rapl0 = read_rapl();
  const auto nvml0 = read_nvml_mj();

  std::mutex mu;
  std::condition_variable cv;
  size_t finished = 0, failed = 0, inflight = 0;
  enum : char { pending, succeeded, unsuccessful };
  std::vector<char> state(n, pending);
  std::vector<std::vector<int32_t>> outputs(n);  // token ids, kept while a later turn needs them
  auto finish_locked = [&](size_t i, request_outcome out, const std::string& error) {
    rep.outcomes[i] = std::move(out);
    state[i] = rep.outcomes[i].ok ? succeeded : unsuccessful;
    if (!rep.outcomes[i].ok) {
      ++failed;
      ++rep.errors[error.substr(0, std::min<size_t>(80, error.find('\n')))];
    }
    ++finished;
    cv.notify_all();
  };
  auto record = [&](size_t i, double send_s, stream_result r) {
    request_outcome out;
    out.ok = r.ok;
    out.send_s = send_s;
    out.ttft_s = r.ttft_s;
    out.e2e_s = r.e2e_s;
    out.prompt_tokens = r.prompt_tokens > 0 ? r.prompt_tokens : int32_t(reqs[i].prompt_tokens.size());
    out.output_tokens = r.output_tokens;
    for (size_t k = 1; k < r.token_times_s.size(); ++k)
      out.itl_s.push_back(r.token_times_s[k] - r.token_times_s[k - 1]);
    std::lock_guard<std::mutex> lk(mu);
    if (needed[i]) outputs[i] = std::move(r.output_token_ids);
    --inflight;
    finish_locked(i, std::move(out), r.error);
  };

  progress_bar bar(o.progress, n);
  const auto t0 = clock_type::now();
  std::unique_ptr<ws_client> ws;
  if (o.api == "ws") ws = std::make_unique<ws_client>(ep, o.api_key);
  // OpenAI: a pool of blocking clients; a request waits for a free one (counted as late).
  std::deque<size_t> ready;
  bool closing = false;
  std::vector<std::thread> pool;
  if (o.api != "ws") {
    const size_t threads = std::min<size_t>(n, size_t(std::max(1, o.max_concurrency)));
    for (size_t k = 0; k < threads; ++k)
      pool.emplace_back([&] {
        for (;;) {
          size_t i;
          {
            std::unique_lock<std::mutex> lk(mu);
            cv.wait(lk, [&] { return closing || !ready.empty(); });
            if (ready.empty()) return;
            i = ready.front();
            ready.pop_front();
          }
          const double send_s = seconds_since(t0);
          if (send_s > trace[i].arrival_s - trace.front().arrival_s + 0.05) {
            std::lock_guard<std::mutex> lk(mu);
            ++rep.arrivals_late;
          }
          record(i, send_s, openai_stream(ep, o.api_key, reqs[i], std::chrono::seconds(int64_t(o.request_timeout_s))));
        }
      });
  }
  auto arrival = [&](size_t i) {
    return t0 + std::chrono::duration_cast<clock_type::duration>(
                    std::chrono::duration<double>(trace[i].arrival_s - trace.front().arrival_s));
  };
  // Entries go out at their arrival; a later turn of a conversation at max(its arrival, the
  // end of the turn before), which makes a conversation a closed loop.
  size_t next = 0;  // the next entry to arrive
  std::vector<size_t> waiting;  // arrived, waiting for the previous turn, in arrival order
  {
    std::unique_lock<std::mutex> lk(mu);
    for (;;) {
      bar.show(finished, failed, inflight, seconds_since(t0));
      const auto now = clock_type::now();
      while (next < n && arrival(next) <= now) waiting.push_back(next++);
      for (size_t w = 0; w < waiting.size();) {
        const size_t i = waiting[w], p = prev[i];
        if (p != no_turn && state[p] == pending) {
          ++w;
          continue;
        }
        waiting.erase(waiting.begin() + std::ptrdiff_t(w));
        if (p != no_turn) {
          if (state[p] == unsuccessful) {  // its history is incomplete: counted as failed, not sent
            request_outcome out;
            out.send_s = seconds_since(t0);
            finish_locked(i, std::move(out),
                          "not sent: turn " + std::to_string(trace[p].turn) + " of its conversation failed");
            continue;
          }
          reqs[i].prompt_tokens = next_turn_prompt(reqs[p].prompt_tokens, outputs[p], trace[i], i, o);
          std::vector<int32_t>().swap(outputs[p]);
        }
        ++inflight;
        if (ws) {
          const double send_s = seconds_since(t0);
          ws->submit(reqs[i], [&record, i, send_s](stream_result r) { record(i, send_s, std::move(r)); });
        } else {
          ready.push_back(i);
          cv.notify_all();
        }
      }
      if (next >= n && waiting.empty()) break;
      // Until the next arrival, a finished request (which may release a turn), or 250 ms for
      // the progress bar.
      auto until = now + std::chrono::milliseconds(250);
      if (next < n) until = std::min(until, arrival(next));
      cv.wait_until(lk, until);
    }
    while (finished < n) {
      bar.show(finished, failed, inflight, seconds_since(t0));
      cv.wait_for(lk, std::chrono::milliseconds(250));
    }
    closing = true;
    cv.notify_all();
    bar.show(finished, failed, inflight, seconds_since(t0), true);
  }
  for (auto& t : pool) t.join();
  ws.reset();
  const double duration = seconds_since(t0);
  rep.figures = compute_figures(rep.outcomes, duration, o.slos);

  const auto after = scrape(ep);
  if (after.empty()) {
    rep.server = "not available (no Prometheus /metrics)";
  } else {
    auto diff = [&](const std::string& k) {
      auto a = after.find(k);
      auto b = before.find(k);
      return (a != after.end() ? a->second : 0.0) - (b != before.end() ? b->second : 0.0);
    };
    auto mean_ms = [&](const std::string& h) {
      const double c = diff(h + "_count");
      return c > 0 ? 1000.0 * diff(h + "_sum") / c : 0.0;
    };
    auto value = [&](const std::string& k) {
      auto a = after.find(k);
      return a != after.end() ? a->second : 0.0;
    };
    const double one_copy = value("tandem_model_weight_bytes");
    // The prefix cache's counters, null where the server does not export them (another server,
    // or a tandem without the cache): "not reported", never a made-up 0.
    auto reported = [&](const std::string& k) { return after.count(k) ? json(diff(k)) : json(nullptr); };
    const json hit = reported("tandem_prefix_cache_hit_tokens_total");
    const double prompt = diff("tandem_prompt_tokens_total");
    const json hit_ratio = hit.is_number() && prompt > 0 ? json(hit.get<double>() / prompt) : json(nullptr);
    rep.server = {
        {"kv_bytes_moved", diff("tandem_kv_link_bytes_total")},
        {"kv_transfers", diff("tandem_kv_link_transfers_total")},
        {"kv_transfer_ms_mean", mean_ms("tandem_request_kv_transfer_seconds")},
        {"handoff_ms_mean", mean_ms("tandem_request_handoff_seconds")},
        {"queue_wait_ms_mean",
         mean_ms("tandem_request_queue_prefill_seconds") + mean_ms("tandem_request_queue_decode_seconds")},
        {"output_tokens", diff("tandem_output_tokens_total")},
        {"prompt_tokens", prompt},
        {"prefix_cache_hit_tokens", hit},
        {"prefix_cache_hit_ratio", hit_ratio},
        {"prompt_tokens_computed", reported("tandem_prompt_tokens_computed_total")},
        {"weight_bytes_per_worker", one_copy},
        {"weight_duplication_factor", one_copy > 0 ? value("tandem_weight_resident_bytes") / one_copy : 0.0},
        // Auto mode: prompts their decode worker computed (no prefill worker, no KV link).
        {"local_prefills", reported("tandem_router_local_prefill_total")},
        {"migrations", diff("tandem_migrations_total")},
        {"restarts", diff("tandem_restarts_total")},
    };
  }
  const auto rapl1 = read_rapl();
  const auto nvml1 = read_nvml_mj();
  json gpu = "not available (no NVML)";
  if (nvml0 && nvml1) {
    const double j = (*nvml1 - *nvml0) / 1e3;
    gpu = {{"source", "NVML (all GPUs)"}, {"joules", j}, {"watts", j / duration}};
  }
  if (rapl0 && rapl1 && rapl0->counters.size() == rapl1->counters.size()) {
    double joules = 0;
    for (size_t k = 0; k < rapl0->counters.size(); ++k) {
      double d = rapl1->counters[k].first - rapl0->counters[k].first;
      if (d < 0) d += rapl0->counters[k].second;  // the counter wrapped
      joules += d / 1e6;
    }
    rep.energy["cpu"] = {
        {"source", "RAPL (CPU packages, the whole machine)"},
        {"joules", joules},
        {"watts", joules / duration},
        {"joules_per_output_token", rep.figures.output_tokens > 0 ? joules / double(rep.figures.output_tokens) : 0.0}};
  } else {
    rep.energy = {{"cpu", "not available (no readable RAPL counters under /sys/class/powercap)"}};
  }
  rep.energy["gpu"] = gpu;
  return rep;
}

json serve_report::to_json() const {
  auto sum = [](const summary& s) {
    return json{{"count", s.count}, {"mean", s.mean}, {"p50", s.p50}, {"p90", s.p90}, {"p99", s.p99}, {"max", s.max}};
  };
  const auto& f = figures;
  return {{"duration_s", f.duration_s},
          {"requests_sent", f.sent},
          {"completed", f.completed},
          {"failed", f.failed},
          {"errors", errors},
          {"arrivals_late", arrivals_late},
          {"request_throughput", f.request_throughput},
          {"prompt_tokens", f.prompt_tokens},
          {"output_tokens", f.output_tokens},
          {"prompt_tokens_per_s", f.prompt_tokens_per_s},
          {"output_tokens_per_s", f.output_tokens_per_s},
          {"ttft_s", sum(f.ttft_s)},
          {"tpot_s", sum(f.tpot_s)},
          {"itl_s", sum(f.itl_s)},
          {"e2e_s", sum(f.e2e_s)},
          {"slo_attainment", f.slo_attainment},
          {"trace_shared_prefix_share", trace_shared_share},
          {"goodput", f.goodput},
          {"server", server},
          {"energy", energy}};
}

void print_report(const serve_report& r, const serve_options& o) {
  const auto& f = r.figures;
  std::printf("\n%-28s %12.2f s\n", "duration", f.duration_s);
  std::printf("%-28s %12lld sent, %lld completed, %lld failed\n", "requests", (long long)f.sent, (long long)f.completed,
              (long long)f.failed);
  for (const auto& [e, c] : r.errors) std::printf("%-28s %12lld  %s\n", "  error", (long long)c, e.c_str());
  if (r.arrivals_late > 0)
    std::printf("%-28s %12lld (--max-concurrency %d was reached)\n", "arrivals sent late", (long long)r.arrivals_late,
                o.max_concurrency);
  std::printf("%-28s %12.3f req/s\n", "request throughput", f.request_throughput);
  std::printf("%-28s %12.1f tok/s (%lld tokens)\n", "prompt throughput", f.prompt_tokens_per_s,
              (long long)f.prompt_tokens);
  std::printf("%-28s %12.1f tok/s (%lld tokens)\n", "output throughput", f.output_tokens_per_s,
              (long long)f.output_tokens);
  if (r.trace_shared_share > 0)  // what the trace offers a prefix cache: the hit ratio's ceiling
    std::printf("%-28s %11.1f%% of prompt tokens (trace)\n", "shared prefix", 100.0 * r.trace_shared_share);
  std::printf("\n%-10s %10s %10s %10s %10s %10s   (ms)\n", "", "mean", "p50", "p90", "p99", "max");
  auto row = [](const char* name, const summary& s) {
    std::printf("%-10s %10.1f %10.1f %10.1f %10.1f %10.1f\n", name, s.mean * 1e3, s.p50 * 1e3, s.p90 * 1e3, s.p99 * 1e3,
                s.max * 1e3);
  };
  row("TTFT", f.ttft_s);
  row("TPOT", f.tpot_s);
  row("ITL", f.itl_s);
  row("E2E", f.e2e_s);
  std::string slos;
  if (o.slos.ttft_s) slos += "TTFT <= " + std::to_string(int(*o.slos.ttft_s * 1e3)) + " ms ";
  if (o.slos.tpot_s) slos += "TPOT <= " + std::to_string(int(*o.slos.tpot_s * 1e3)) + " ms";
  std::printf("\n%-28s %12.3f req/s (%.1f%% of requests meet %s)\n", "goodput", f.goodput, 100.0 * f.slo_attainment,
              slos.empty() ? "no SLO given" : slos.c_str());
  if (r.server.is_object()) {
    const auto& s = r.server;
    std::printf("%-28s %12.1f MB in %.0f transfers, %.2f ms mean transfer, %.2f ms mean handoff\n", "KV moved",
                double(s["kv_bytes_moved"]) / 1e6, double(s["kv_transfers"]), double(s["kv_transfer_ms_mean"]),
                double(s["handoff_ms_mean"]));
    if (s["local_prefills"].is_number() && double(s["local_prefills"]) > 0)
      std::printf("%-28s %12.0f prompts computed by their decode worker (no KV link)\n", "local prefill",
                  double(s["local_prefills"]));
    std::printf("%-28s %12.2f ms mean (prefill + decode queues)\n", "queue wait", double(s["queue_wait_ms_mean"]));
    std::printf("%-28s %12.1f MB per worker, duplication factor %.2f\n", "weights",
                double(s["weight_bytes_per_worker"]) / 1e6, double(s["weight_duplication_factor"]));
    auto count_or_not = [&](const char* label, const json& v) {
      if (v.is_number()) std::printf("%-28s %12.0f tokens\n", label, double(v));
      else std::printf("%-28s %12s\n", label, "not reported");
    };
    count_or_not("prefix-cache hit tokens", s["prefix_cache_hit_tokens"]);
    if (s["prefix_cache_hit_ratio"].is_number())
      std::printf("%-28s %11.1f%% of prompt tokens\n", "hit ratio", 100.0 * double(s["prefix_cache_hit_ratio"]));
    else std::printf("%-28s %12s\n", "hit ratio", "not reported");
    count_or_not("prompt tokens computed", s["prompt_tokens_computed"]);
  } else {
    std::printf("%-28s %s\n", "server metrics", std::string(r.server).c_str());
  }
  for (const char* part : {"cpu", "gpu"}) {
    const auto& e = r.energy[part];
    const std::string label = std::string("energy, ") + part;
    if (e.is_object()) std::printf("%-28s %12.1f J, %.1f W\n", label.c_str(), double(e["joules"]), double(e["watts"]));
    else std::printf("%-28s %s\n", label.c_str(), std::string(e).c_str());
  }
}

}  // namespace tandem::bench
