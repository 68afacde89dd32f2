// tandem serve: the pipeline behind HTTP/1.1 + WebSocket (tools/server/).
#include <spdlog/spdlog.h>

#include <filesystem>

#include "actors/pipeline.h"
#include "runtime/model.h"
#include "tools/commands.h"
#include "tools/server/http_server.h"

namespace tandem::cli {
namespace {

struct serve_options {
  std::string model, model_name, mode = "disaggregated", host = "127.0.0.1", api_key, admin_key, kv_transport = "local",
              matmul = "batch-invariant";
  int port = 8080, prefill_workers = 1, decode_workers = 1, colocated_workers = 1, threads = 1, io_threads = 2;
  int32_t kv_blocks = 0, chunk = 256, token_budget = 512, max_batch = 64;
  int32_t max_queue = 256, max_requests_per_connection = 32;
  double ttft_budget_ms = 0, tpot_budget_ms = 0, grace_s = 10;
  size_t max_body = 1 << 20, max_frame = 1 << 20;
  bool no_prefix_cache = false;
  double route_overlap_weight = 1.0, route_load_weight = 1.0;
  int64_t kv_store_mib = 512, kv_store_disk_mib = 0;
  std::string kv_store_disk;
};

int run_serve(const serve_options& o) {
  pipeline_config cfg;
  cfg.model_path = resolve_model_path(o.model);
  cfg.mode = o.mode == "colocated" ? serving_mode::colocated : serving_mode::disaggregated;
  cfg.prefill_workers = o.prefill_workers;
  cfg.decode_workers = o.decode_workers;
  cfg.colocated_workers = o.colocated_workers;
  cfg.threads_per_worker = o.threads;
  cfg.matmul = parse_matmul_mode(o.matmul);
  cfg.prefix_cache = !o.no_prefix_cache;
  cfg.route_overlap_weight = o.route_overlap_weight;
  cfg.route_load_weight = o.route_load_weight;
  cfg.kv_store_memory_bytes = o.kv_store_mib << 20;
  cfg.kv_store_disk_path = o.kv_store_disk;
  cfg.kv_store_disk_bytes = o.kv_store_disk_mib << 20;
  if (!o.kv_store_disk.empty() && o.kv_store_disk_mib <= 0)
    throw CLI::ValidationError("--kv-store-disk", "needs --kv-store-disk-mib > 0 (the size of the disk tier)");
  cfg.kv_blocks_per_worker = o.kv_blocks;
  cfg.chunk_size = o.chunk;
  cfg.prefill_token_budget = o.token_budget;
  cfg.colocated_token_budget = o.token_budget;
  cfg.max_batch = o.max_batch;
  cfg.kv_transport = o.kv_transport;
  cfg.admission.max_prefill_queue = o.max_queue;
  cfg.admission.max_decode_queue = o.max_queue;
  cfg.admission.ttft_budget_ms = o.ttft_budget_ms;
  cfg.admission.tpot_budget_ms = o.tpot_budget_ms;
  pipeline p(cfg);

  server::served_model sm;
  sm.id = o.model_name.empty() ? std::filesystem::path(cfg.model_path).stem().string() : o.model_name;
  sm.context_length = p.get_model().config().n_ctx;
  sm.chat = detect_chat_format(p.get_model().file().get_string("tokenizer.chat_template", ""));

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
  spdlog::info("serving model '{}' ({} mode, chat format {}) on http://{}:{} (WebSocket: /ws)", sm.id, o.mode,
               to_string(sm.chat), o.host, srv.port());
  std::fflush(stderr);
  srv.run();
  spdlog::info("stopped");
  return 0;
}

}  // namespace

void add_serve(CLI::App& app) {
  auto o = std::make_shared<serve_options>();
  auto* cmd = app.add_subcommand("serve", "Serve the model over HTTP (OpenAI-compatible, SSE) and WebSocket");
  cmd->fallthrough();  // --config belongs to the top-level app (CLI11 reads config files there)
  cmd->add_option("-m,--model", o->model, "GGUF model file (default: the built-in synthetic model)");
  cmd->add_option("--model-name", o->model_name, "Model id clients send in 'model' (default: the file's name)");
  cmd->add_option("--mode", o->mode, "disaggregated or colocated")->check(CLI::IsMember({"disaggregated", "colocated"}));
  cmd->add_option("--prefill-workers", o->prefill_workers, "Prefill workers (disaggregated)")->check(CLI::Range(1, 256));
  cmd->add_option("--decode-workers", o->decode_workers, "Decode workers (disaggregated)")->check(CLI::Range(1, 256));
  cmd->add_option("--colocated-workers", o->colocated_workers, "Workers (colocated)")->check(CLI::Range(1, 256));
  cmd->add_option("-t,--threads", o->threads, "Compute threads per worker")->check(CLI::Range(1, 1024));
  add_matmul_option(cmd, o->matmul);
  cmd->add_flag("--no-prefix-cache", o->no_prefix_cache,
                "Compute every prompt in full (default: reuse the KV blocks of prompts that start alike)");
  cmd->add_option("--route-overlap-weight", o->route_overlap_weight,
                  "Prefill placement: weight of the prompt tokens a worker lacks cached (docs/architecture.md)")
      ->check(CLI::Range(0.0, 1e6));
  cmd->add_option("--kv-store-mib", o->kv_store_mib,
                  "Host KV store memory for published prefix blocks, MiB (0: no store)")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 24));
  cmd->add_option("--kv-store-disk", o->kv_store_disk, "Disk tier file for the KV store (made at start, removed at exit)");
  cmd->add_option("--kv-store-disk-mib", o->kv_store_disk_mib, "Size of the KV store's disk tier, MiB")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 30));
  cmd->add_option("--route-load-weight", o->route_load_weight, "Prefill placement: weight of a worker's queued tokens")
      ->check(CLI::Range(0.0, 1e6));
  cmd->add_option("--kv-blocks", o->kv_blocks, "KV blocks per worker (default: 256 MiB worth)")->check(CLI::Range(0, 1 << 24));
  cmd->add_option("--chunk", o->chunk, "Prefill chunk size in tokens")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--token-budget", o->token_budget, "Tokens per worker step")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--max-batch", o->max_batch, "Sequences decoding at once per worker")->check(CLI::Range(1, 4096));
  cmd->add_option("--kv-transport", o->kv_transport, "KV link path: handoff, local or shm")
      ->check(CLI::IsMember({"handoff", "local", "shm"}));
  cmd->add_option("--max-queue", o->max_queue, "Requests waiting per queue before 429 (0: unbounded)")->check(CLI::Range(0, 1 << 24));
  cmd->add_option("--ttft-budget-ms", o->ttft_budget_ms, "Reject (429) when the predicted TTFT exceeds this (0: off)")
      ->check(CLI::Range(0.0, 1e9));
  cmd->add_option("--tpot-budget-ms", o->tpot_budget_ms, "Reject (429) when the measured TPOT exceeds this (0: off)")
      ->check(CLI::Range(0.0, 1e9));
  cmd->add_option("--host", o->host, "Address to bind (default loopback)");
  cmd->add_option("--port", o->port, "Port (0: any free port)")->check(CLI::Range(0, 65535));
  cmd->add_option("--api-key", o->api_key, "Require 'Authorization: Bearer KEY' on /v1/* and /ws");
  cmd->add_option("--admin-key", o->admin_key, "Enable /admin/* behind this key (off without it)");
  cmd->add_option("--max-body-bytes", o->max_body, "Largest HTTP body (413 above)")->check(CLI::Range(size_t(1), size_t(1) << 30));
  cmd->add_option("--max-frame-bytes", o->max_frame, "Largest WebSocket message (closes with 1009 above)")
      ->check(CLI::Range(size_t(1), size_t(1) << 30));
  cmd->add_option("--max-requests-per-connection", o->max_requests_per_connection, "Requests in flight on one WebSocket")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--io-threads", o->io_threads, "Network threads")->check(CLI::Range(1, 256));
  cmd->add_option("--grace-seconds", o->grace_s, "On SIGINT/SIGTERM, how long in-flight requests may finish")
      ->check(CLI::Range(0.0, 3600.0));
  cmd->callback([o] {
    const int rc = run_serve(*o);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace tandem::cli
