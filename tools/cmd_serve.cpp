// tandem serve: the pipeline behind HTTP/1.1 + WebSocket (tools/server/).
#include <spdlog/spdlog.h>

#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <thread>

#include <CLI/CLI.hpp>

#include "actors/node.h"
#include "actors/pipeline.h"
#include "runtime/text/chat_template.h"
#include "runtime/model/default_model.h"
#include "runtime/model/model.h"
#include "runtime/oplog.h"
#include "tools/commands.h"
#include "tools/server/http_server.h"

namespace tandem::cli {
namespace {

struct serve_options {
  std::string model, model_name, chat_template_file, mode = "auto", host = "127.0.0.1", api_key, admin_key,
                                                     kv_transport = "local", matmul = "batch-invariant",
                                                     kv_dtype = "f16";
  int port = 8080, prefill_workers = 1, decode_workers = 1, colocated_workers = 1, threads = 1, io_threads = 2,
      max_worker_restarts = 5;
  int32_t kv_blocks = 0, chunk = 256, token_budget = 512, max_batch = 64;
  int32_t max_queue = 256, max_requests_per_connection = 32;
  double ttft_budget_ms = 0, tpot_budget_ms = 0, grace_s = 10, decode_pace_ms = 0, tpot_target_ms = 0,
         recover_after_s = 30, stats_interval_s = 10;
  size_t max_body = 1 << 20, max_frame = 1 << 20;
  bool no_prefix_cache = false, share_cores = false;
  sampling_params defaults;  // where an HTTP request leaves temperature, top_k or top_p out
  double route_overlap_weight = 1.0, route_load_weight = 1.0;
  int64_t kv_store_mib = 512, kv_store_disk_mib = 0;
  std::string kv_store_disk;
  // Several processes
  std::string role = "all", join, cluster_host = "127.0.0.1", node_transport = "auto", kv_listen = "127.0.0.1",
              kv_advertise;
  int cluster_port = 7070, kv_port = 0, workers = 1;
  int64_t heartbeat_timeout_ms = 1500;
  bool no_shm = false;
  uint32_t announce_wire_version = 0;  // tests: a node announcing another version is refused
};

std::atomic<bool> stop_requested{false}, drop_requested{false};
extern "C" void on_stop_signal(int) { stop_requested = true; }
extern "C" void on_drop_signal(int) { drop_requested = true; }

// A flag's text as its enum (the flag's IsMember check already limited it to the names).
template <class E>
E enum_flag(const char* flag, std::optional<E> parsed, const std::string& text) {
  if (!parsed) throw CLI::ValidationError(flag, "'" + text + "' is not one of its values");
  return *parsed;
}

// --role prefill|decode: a worker process joined to a router (actors/node.h).
int run_node(const serve_options& o) {
  node_config nc;
  nc.role = enum_flag("--role", parse_node_role(o.role), o.role);
  const auto colon = o.join.rfind(':');
  if (o.join.empty() || colon == std::string::npos || colon == 0)
    throw CLI::ValidationError("--join", "needs HOST:PORT, the router's --cluster-port");
  nc.join_host = o.join.substr(0, colon);
  try {
    const int port = std::stoi(o.join.substr(colon + 1));
    if (port < 1 || port > 65535) throw std::out_of_range("port");
    nc.join_port = uint16_t(port);
  } catch (const std::exception&) {
    throw CLI::ValidationError("--join", "'" + o.join + "' has no valid port");
  }
  nc.model_path = resolve_model_path(o.model);
  nc.workers = o.workers;
  nc.threads_per_worker = o.threads;
  nc.kv_blocks_per_worker = o.kv_blocks;
  nc.kv_listen_host = o.kv_listen;
  nc.kv_port = uint16_t(o.kv_port);
  nc.kv_advertise_host = o.kv_advertise;
  nc.allow_shm = !o.no_shm;
  nc.announce_wire_version = o.announce_wire_version;
  nc.max_worker_restarts = o.max_worker_restarts;
  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);
  std::signal(SIGUSR1, on_drop_signal);  // fault injection: close the KV receiver's connections
  node n(nc);
  std::string workers;
  for (int32_t i : n.indices()) workers += (workers.empty() ? "" : ",") + std::to_string(i);
  spdlog::info("{} node joined {} with workers {}{}", o.role, o.join, workers,
               n.kv_port() ? " (KV receiver on port " + std::to_string(n.kv_port()) + ")" : "");
  std::fflush(stderr);
  std::thread watcher([&n] {
    while (!stop_requested) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      if (drop_requested.exchange(false)) n.drop_kv_connections();
    }
    n.stop();
  });
  const bool stopped = n.run();
  stop_requested = true;
  watcher.join();
  spdlog::info(stopped ? "stopped" : "leaving: the router is gone");
  return stopped ? 0 : 1;
}

// What an operator checks first: the model, the KV cache, the workers, the ports.
void log_banner(const serve_options& o, const serving_config& cfg, pipeline& p, uint16_t port) {
  const model& m = p.get_model();
  const auto& c = m.config();
  std::map<std::string, int> types;  // tensor type -> tensors
  for (const auto& t : m.file().tensors()) ++types[std::string(kernels::to_string(t.type))];
  std::string type_list;
  for (const auto& [t, n] : types) type_list += (type_list.empty() ? "" : ",") + t + ":" + std::to_string(n);
  const bool cluster = o.role == "router";
  auto snap = p.snapshot();  // the workers' pools (a moment after start, they may not have joined yet)
  for (int i = 0; i < 100 && !cluster && snap && (snap->workers.empty() || snap->workers.front().kv_total_blocks == 0);
       ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    snap = p.snapshot();
  }
  const int32_t blocks = snap && !snap->workers.empty() ? snap->workers.front().kv_total_blocks : 0;
  oplog::event(oplog::level::info, "start",
               {{"model", cfg.model.path},
                {"name", c.name},
                {"architecture", std::string(to_string(c.arch))},
                {"params_m", double(c.n_params) / 1e6},
                {"tensor_types", type_list},
                {"context", c.n_ctx},
                {"kv_dtype", std::string(kernels::to_string(cfg.kv.dtype))},
                {"kv_blocks_per_worker", blocks},
                {"kv_mib_per_worker", double(cfg.pools.kv_memory_bytes_per_worker) / double(1 << 20)},
                {"mode", cluster ? std::string("router") : o.mode},
                {"prefill_workers", cluster || o.mode == "colocated" ? 0 : o.prefill_workers},
                {"decode_workers", cluster || o.mode == "colocated" ? 0 : o.decode_workers},
                {"colocated_workers", cluster || o.mode != "colocated" ? 0 : o.colocated_workers},
                {"threads_per_worker", o.threads},
                {"shared_cores", o.share_cores || (o.mode == "auto" && !cluster)},
                {"host", o.host},
                {"port", int32_t(port)},
                {"cluster_port", int32_t(cluster ? p.cluster_port() : 0)},
                {"prefix_cache", !o.no_prefix_cache},
                {"admin", !o.admin_key.empty()},
                {"api_key", !o.api_key.empty()}});
}

// Every --stats-interval-s while anything happens: running and waiting requests per queue,
// tokens/s in and out, KV use per worker, the prefix cache's hit ratio (vLLM logs the like).
class stats_logger {
 public:
  stats_logger(pipeline& p, double interval_s) : p_(p) {
    if (interval_s <= 0) return;
    thread_ = std::thread([this, every = std::chrono::milliseconds(int64_t(interval_s * 1000))] {
      std::unique_lock lk(mu_);
      auto last = std::chrono::steady_clock::now();
      double prompt0 = counter("tandem_prompt_tokens_total"), out0 = counter("tandem_output_tokens_total"),
             cached0 = counter("tandem_prompt_tokens_cached_total");
      while (!cv_.wait_for(lk, every, [this] { return stop_; })) {
        const auto now = std::chrono::steady_clock::now();
        const double secs = std::chrono::duration<double>(now - last).count();
        const double prompt = counter("tandem_prompt_tokens_total"), out = counter("tandem_output_tokens_total"),
                     cached = counter("tandem_prompt_tokens_cached_total");
        const auto s = p_.snapshot();
        // No snapshot in time (the workers still clearing their KV pools at start-up, or a
        // router restarting): skip this line, keep the previous figures as the baseline.
        if (!s) continue;
        int64_t running = 0;
        for (const auto& [state, n] : s->requests_by_state)
          if (state != "queued") running += n;
        const bool idle =
            prompt == prompt0 && out == out0 && running == 0 && s->prefill_queue == 0 && s->decode_queue == 0;
        if (!idle) {
          std::string kv;
          for (const auto& w : s->workers)
            kv += (kv.empty() ? "" : ",") + w.name + ":" + std::to_string(w.kv_total_blocks - w.kv_free_blocks) + "/" +
                  std::to_string(w.kv_total_blocks);
          oplog::event(oplog::level::info, "stats",
                       {{"running", running},
                        {"prefill_queue", s->prefill_queue},
                        {"decode_queue", s->decode_queue},
                        {"prompt_tokens_per_s", (prompt - prompt0) / secs},
                        {"output_tokens_per_s", (out - out0) / secs},
                        {"prefix_hit_ratio", prompt > prompt0 ? (cached - cached0) / (prompt - prompt0) : 0.0},
                        {"kv_blocks_used", kv},
                        {"live_requests", s->live_requests}});
        }
        last = now;
        prompt0 = prompt, out0 = out, cached0 = cached;
      }
    });
  }
  ~stats_logger() {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  double counter(const char* name) { return p_.metrics().get_counter(name, "").value(); }
  pipeline& p_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

// The model's chat template (or the --chat-template file). A file the user names must parse; a
// model's own template that does not falls back to a hand-written format, with a warning.
std::shared_ptr<const chat_template> load_chat_template(const model& m, const std::string& file, bool builtin_model) {
  std::string source = m.file().get_string("tokenizer.chat_template", "");
  if (builtin_model && source.empty()) source = default_model_chat_template;
  if (!file.empty()) {
    std::ifstream in(file, std::ios::binary);
    if (!in) throw failure(errc::io_error, "cannot read --chat-template '" + file + "'");
    source.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  auto t = std::make_shared<const chat_template>(chat_template::for_vocab(source, m.tok()));
  if (!file.empty() && !t->uses_jinja())
    throw failure(errc::invalid_argument, "--chat-template '" + file + "': " + t->fallback_reason());
  if (!source.empty() && !t->uses_jinja())
    spdlog::warn("chat template: {}; using {}", t->fallback_reason(), t->describe());
  return t;
}

int run_serve(const serve_options& o) {
  if (o.role == "prefill" || o.role == "decode") return run_node(o);
  if (!o.join.empty()) throw CLI::ValidationError("--join", "is for --role prefill or decode");
  serving_config cfg;
  if (o.role == "router") {
    // A cluster's nodes own their cores and compute no prompt on the decode side yet: auto (the
    // default) is disaggregated there.
    if (o.mode == "colocated") throw CLI::ValidationError("--role router", "serves disaggregated mode only");
    cfg.cluster = {o.cluster_port, o.cluster_host,
                   enum_flag("--node-transport", parse_channel_mode(o.node_transport), o.node_transport),
                   std::chrono::milliseconds(o.heartbeat_timeout_ms)};
  }
  if (!o.kv_store_disk.empty() && o.kv_store_disk_mib <= 0)
    throw CLI::ValidationError("--kv-store-disk", "needs --kv-store-disk-mib > 0 (the size of the disk tier)");
  cfg.model.path = resolve_model_path(o.model);
  cfg.pools.mode =
      o.role == "router" ? serving_mode::disaggregated : enum_flag("--mode", parse_serving_mode(o.mode), o.mode);
  cfg.pools.prefill_workers = o.prefill_workers;
  cfg.pools.decode_workers = o.decode_workers;
  cfg.pools.colocated_workers = o.colocated_workers;
  cfg.pools.threads_per_worker = o.threads;
  cfg.pools.share_cores = o.share_cores;
  if (o.share_cores && cfg.pools.mode != serving_mode::disaggregated)
    throw CLI::ValidationError("--share-cores", "is for --mode disaggregated (auto shares the cores always)");
  cfg.pools.kv_blocks_per_worker = o.kv_blocks;
  cfg.pools.max_worker_restarts = o.max_worker_restarts;
  cfg.pools.recover_after = std::chrono::milliseconds(int64_t(o.recover_after_s * 1000));
  cfg.kv.dtype = parse_kv_dtype(o.kv_dtype);
  cfg.kv.prefix_cache = !o.no_prefix_cache;
  cfg.kv.store_memory_bytes = o.kv_store_mib << 20;
  cfg.kv.store_disk_path = o.kv_store_disk;
  cfg.kv.store_disk_bytes = o.kv_store_disk_mib << 20;
  cfg.kv.transport = enum_flag("--kv-transport", parse_kv_transport_kind(o.kv_transport), o.kv_transport);
  cfg.steps = {parse_matmul_mode(o.matmul),
               o.chunk,
               o.token_budget,
               o.token_budget,
               o.max_batch,
               o.tpot_target_ms,
               o.decode_pace_ms};
  if (o.decode_pace_ms > 0 && !o.share_cores) throw CLI::ValidationError("--decode-pace-ms", "needs --share-cores");
  cfg.scheduling.route_overlap_weight = o.route_overlap_weight;
  cfg.scheduling.route_load_weight = o.route_load_weight;
  cfg.scheduling.admission.max_prefill_queue = o.max_queue;
  cfg.scheduling.admission.max_decode_queue = o.max_queue;
  cfg.scheduling.admission.ttft_budget_ms = o.ttft_budget_ms;
  cfg.scheduling.admission.tpot_budget_ms = o.tpot_budget_ms;
  pipeline p(cfg);

  server::served_model sm;
  sm.id = o.model_name.empty() ? std::filesystem::path(cfg.model.path).stem().string() : o.model_name;
  sm.context_length = p.get_model().config().n_ctx;
  sm.n_vocab = p.get_model().config().n_vocab;
  sm.defaults = o.defaults;
  sm.chat = load_chat_template(p.get_model(), o.chat_template_file, o.model.empty());

  server::server_config sc;
  sc.host = o.host;
  sc.port = uint16_t(o.port);
  sc.api_key = o.api_key;
  sc.admin_key = o.admin_key;
  sc.max_body_bytes = o.max_body;
  sc.max_frame_bytes = o.max_frame;
  sc.max_requests_per_connection = size_t(o.max_requests_per_connection);
  sc.grace = std::chrono::milliseconds(int64_t(o.grace_s * 1000));
  sc.io_threads = o.io_threads;
  sc.stop_on_signals = true;  // SIGINT/SIGTERM: stop accepting, drain, exit 0
  server::http_server srv(p, sm, sc);
  log_banner(o, cfg, p, srv.port());
  stats_logger stats(p, o.stats_interval_s);
  spdlog::info("serving model '{}' ({} mode, chat template {}) on http://{}:{} (WebSocket: /ws)", sm.id, o.mode,
               sm.chat->describe(), o.host, srv.port());
  if (o.role == "router")
    spdlog::info("router: prefill and decode nodes join at {}:{} (tandem serve --role prefill|decode --join ...)",
                 o.cluster_host, p.cluster_port());
  std::fflush(stderr);
  srv.run();
  spdlog::info("stopped");
  return 0;
}

}  // namespace

// `tandem serve --print-config`: every flag with its value under [serve], as --config reads it
// back. A text flag left empty (not set: its default is computed, as the model's own chat
// template) is written commented out, and this flag and the hidden test flags not at all.
std::string effective_config(const CLI::App& serve) {
  std::istringstream in(serve.config_to_str(true, true));
  std::string out = "[serve]\n", comment, line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') {
      comment += line + "\n";
      continue;
    }
    const std::string key = line.substr(0, line.find('='));
    if (key != "print-config" && key != "announce-wire-version")
      out +=
          comment + (line.size() > key.size() + 1 && line.substr(key.size() + 1) == "\"\"" ? "# " : "") + line + "\n";
    comment.clear();
  }
  return out;
}

void add_serve(CLI::App& app) {
  auto o = std::make_shared<serve_options>();
  auto* cmd = app.add_subcommand("serve", "Serve the model over HTTP (OpenAI-compatible, SSE) and WebSocket");
  cmd->fallthrough();  // --config belongs to the top-level app (CLI11 reads config files there)
  cmd->add_option("-m,--model", o->model,
                  "GGUF model file, hf:OWNER/NAME[:QUANT] for a GGUF from Hugging Face (pulled into the cache on first "
                  "use: tandem model pull), or synth:PRESET[:DTYPE] for a synthetic one (synth:bench-76m, the "
                  "benchmarks' model) (default: the built-in stories260K)");
  cmd->add_option("--model-name", o->model_name, "Model id clients send in 'model' (default: the file's name)");
  cmd->add_option("--temperature", o->defaults.temperature,
                  "Sampling temperature of HTTP requests that leave it out (tandem generate's default too)")
      ->check(CLI::Range(0.0f, 2.0f))
      ->capture_default_str();
  cmd->add_option("--top-k", o->defaults.top_k, "top_k of HTTP requests that leave it out; 0 disables")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--top-p", o->defaults.top_p, "top_p of HTTP requests that leave it out; 1 disables")
      ->check(CLI::Range(0.000001f, 1.0f))
      ->capture_default_str();
  cmd->add_option("--chat-template", o->chat_template_file,
                  "A Jinja chat template file to render chat messages with, instead of the model's own "
                  "tokenizer.chat_template")
      ->check(CLI::ExistingFile);
  cmd->add_option("--mode", o->mode,
                  "auto (the default: a prefill and a decode pool sharing the cores; a short uncached prompt is "
                  "computed by its decode worker within its TPOT slack of 0.8 x --tpot-target-ms, 50 when 0, "
                  "a long one by the prefill pool; with --role router: disaggregated), "
                  "disaggregated (the two pools, each owning its --threads), or colocated (workers that do both)")
      ->check(CLI::IsMember({"disaggregated", "colocated", "auto"}))
      ->capture_default_str();
  cmd->add_option("--prefill-workers", o->prefill_workers, "Prefill workers (auto, disaggregated)")
      ->check(CLI::Range(1, 256));
  cmd->add_option("--decode-workers", o->decode_workers, "Decode workers (auto, disaggregated)")
      ->check(CLI::Range(1, 256));
  cmd->add_option("--colocated-workers", o->colocated_workers, "Workers (colocated)")->check(CLI::Range(1, 256));
  cmd->add_option("-t,--threads", o->threads, "Compute threads per worker")->check(CLI::Range(1, 1024));
  cmd->add_flag("--share-cores,!--no-share-cores", o->share_cores,
                "Disaggregated: prefill and decode workers share all their cores (each keeps --threads while "
                "busy; the rest go to whoever has work) instead of owning --threads each");
  cmd->add_option("--tpot-target-ms", o->tpot_target_ms,
                  "Time per output token to hold: colocated steps take as much prefill as their fitted step cost "
                  "says fits in 0.8 x this; with --share-cores decode steps are paced at 0.6 x this (0: off)")
      ->check(CLI::Range(0.0, 10000.0))
      ->capture_default_str();
  cmd->add_option("--decode-pace-ms", o->decode_pace_ms,
                  "With --share-cores: while a prompt computes, a decode step starts at most this often and the "
                  "cores go to prefill in between (0: 0.6 x --tpot-target-ms, or back to back without one)")
      ->check(CLI::Range(0.0, 1000.0))
      ->capture_default_str();
  add_matmul_option(cmd, o->matmul);
  add_kv_dtype_option(cmd, o->kv_dtype);
  cmd->add_flag("--no-prefix-cache", o->no_prefix_cache,
                "Compute every prompt in full (default: reuse the KV blocks of prompts that start alike)");
  cmd->add_option("--route-overlap-weight", o->route_overlap_weight,
                  "Prefill placement: weight of the prompt tokens a worker lacks cached (docs/architecture.md)")
      ->check(CLI::Range(0.0, 1e6));
  cmd->add_option("--kv-store-mib", o->kv_store_mib,
                  "Host KV store memory for published prefix blocks, MiB (0: no store)")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 24));
  cmd->add_option("--kv-store-disk", o->kv_store_disk,
                  "Disk tier file for the KV store (made at start, removed at exit)");
  cmd->add_option("--kv-store-disk-mib", o->kv_store_disk_mib, "Size of the KV store's disk tier, MiB")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 30));
  cmd->add_option("--route-load-weight", o->route_load_weight, "Prefill placement: weight of a worker's queued tokens")
      ->check(CLI::Range(0.0, 1e6));
  cmd->add_option("--kv-blocks", o->kv_blocks, "KV blocks per worker (default: 256 MiB worth)")
      ->check(CLI::Range(0, 1 << 24));
  cmd->add_option("--chunk", o->chunk, "Prefill chunk size in tokens")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--token-budget", o->token_budget, "Tokens per worker step")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--max-batch", o->max_batch, "Sequences decoding at once per worker")->check(CLI::Range(1, 4096));
  cmd->add_option("--kv-transport", o->kv_transport, "KV link path: handoff, local or shm")
      ->check(CLI::IsMember({"handoff", "local", "shm"}));
  cmd->add_option("--max-worker-restarts", o->max_worker_restarts,
                  "Restarts a pool allows per 10 s before it is degraded (docs/fault-tolerance.md)")
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option(
         "--stats-interval-s", o->stats_interval_s,
         "Log a stats line (queues, tokens/s, KV use, prefix hits) this often while anything happens; 0: never")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();
  cmd->add_option("--recover-after-s", o->recover_after_s,
                  "A degraded pool (or router) starts again after this, doubling while it keeps failing, up to 5 min")
      ->check(CLI::Range(0.01, 3600.0));
  cmd->add_option("--max-queue", o->max_queue, "Requests waiting per queue before 429 (0: unbounded)")
      ->check(CLI::Range(0, 1 << 24));
  cmd->add_option("--ttft-budget-ms", o->ttft_budget_ms, "Reject (429) when the predicted TTFT exceeds this (0: off)")
      ->check(CLI::Range(0.0, 1e9));
  cmd->add_option("--tpot-budget-ms", o->tpot_budget_ms, "Reject (429) when the measured TPOT exceeds this (0: off)")
      ->check(CLI::Range(0.0, 1e9));
  cmd->add_option("--host", o->host, "Address to bind (default loopback)");
  cmd->add_option("--port", o->port, "Port (0: any free port)")->check(CLI::Range(0, 65535));
  cmd->add_option("--api-key", o->api_key, "Require 'Authorization: Bearer KEY' on /v1/* and /ws");
  cmd->add_option("--admin-key", o->admin_key, "Enable /admin/* behind this key (off without it)");
  cmd->add_option("--max-body-bytes", o->max_body, "Largest HTTP body (413 above)")
      ->check(CLI::Range(size_t(1), size_t(1) << 30));
  cmd->add_option("--max-frame-bytes", o->max_frame, "Largest WebSocket message (closes with 1009 above)")
      ->check(CLI::Range(size_t(1), size_t(1) << 30));
  cmd->add_option("--max-requests-per-connection", o->max_requests_per_connection,
                  "Requests in flight on one WebSocket")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--io-threads", o->io_threads, "Network threads")->check(CLI::Range(1, 256));
  cmd->add_option("--grace-seconds", o->grace_s, "On SIGINT/SIGTERM, how long in-flight requests may finish")
      ->check(CLI::Range(0.0, 3600.0));
  cmd->add_option("--role", o->role,
                  "all: one process (default); router: HTTP/WebSocket, admission and routing for workers that join "
                  "it; prefill or decode: a worker process that joins a router (--join)")
      ->check(CLI::IsMember({"all", "router", "prefill", "decode"}));
  cmd->add_option("--join", o->join, "prefill/decode: the router's HOST:PORT (its --cluster-port)");
  cmd->add_option("--cluster-port", o->cluster_port, "router: port nodes join at (0: any free port)")
      ->check(CLI::Range(0, 65535));
  cmd->add_option("--cluster-host", o->cluster_host, "router: address nodes join at (default loopback)");
  cmd->add_option("--node-transport", o->node_transport,
                  "router: KV path between nodes: auto (shared memory on one host, else TCP), tcp or shm")
      ->check(CLI::IsMember({"auto", "tcp", "shm"}));
  cmd->add_option("--heartbeat-timeout-ms", o->heartbeat_timeout_ms,
                  "router: a node silent this long is lost and its requests recovered")
      ->check(CLI::Range(int64_t(50), int64_t(600000)));
  cmd->add_option("--workers", o->workers, "prefill/decode: workers in this process")->check(CLI::Range(1, 256));
  cmd->add_option("--kv-listen", o->kv_listen, "decode: address the KV receiver binds (default loopback)");
  cmd->add_option("--kv-port", o->kv_port, "decode: KV receiver port (0: any free port)")->check(CLI::Range(0, 65535));
  cmd->add_option("--kv-advertise", o->kv_advertise,
                  "decode: address senders reach the KV receiver at (default --kv-listen)");
  cmd->add_flag("--no-shm", o->no_shm, "decode: never offer shared memory to senders (TCP only)");
  cmd->add_option("--announce-wire-version", o->announce_wire_version, "tests: join announcing this wire version")
      ->group("");
  auto print_config = std::make_shared<bool>(false);
  cmd->add_flag("--print-config", *print_config,
                "Print the effective configuration (every flag with its value, defaults included) as a --config file "
                "and exit");
  cmd->callback([o, cmd, print_config] {
    if (*print_config) {
      std::printf("%s", effective_config(*cmd).c_str());
      return;
    }
    const int rc = run_serve(*o);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace tandem::cli
