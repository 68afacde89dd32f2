// `tandem bench transport`: KV transfer throughput and latency per transport — in-process
// (local_transport), shared memory and TCP loopback (kv_sender/kv_receiver, transport/channel.h)
// — for frames of whole KV blocks of a synthetic model's shape, next to memcpy of the same
// bytes in the same run. The receiver runs in a forked child process, so shared memory and TCP
// really cross processes (--same-process keeps it in this one).
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <iostream>
#include <random>

#include <CLI/CLI.hpp>

#include "runtime/model/synth.h"
#include "tools/commands.h"
#include "transport/channel.h"
#include "transport/local/local_transport.h"

namespace tandem::cli {
namespace {

using clock_type = std::chrono::steady_clock;
using transport::kv_frame;

struct opts {
  std::vector<int> blocks = {1, 16, 256};
  std::vector<std::string> transports = {"local", "shm", "tcp"};
  std::string preset = "bench-76m";
  int block_size = 16;
  double seconds = 1.0;
  bool json = false, same_process = false;
};

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

struct result {
  std::string transport;
  int blocks = 0;
  double frame_bytes = 0, mb_s = 0, memcpy_mb_s = 0, p50_us = 0, p99_us = 0;
  size_t frames = 0, latency_samples = 0;
};

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, size_t(p * double(v.size() - 1) + 0.5));
  return v[i];
}

std::shared_ptr<const kv_frame> make_frame(const synth_preset& p, int block_size, int n_blocks) {
  const int32_t head_dim = p.dim / p.n_head;
  const size_t floats = size_t(p.n_layer) * 2 * size_t(p.n_kv_head) * size_t(block_size) * size_t(head_dim);
  auto blocks = std::make_shared<std::vector<kv_block_export>>(size_t(n_blocks));
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  for (int i = 0; i < n_blocks; ++i) {
    auto& b = (*blocks)[size_t(i)];
    b.model_id = 76;
    b.layer_end = p.n_layer;
    b.pos_begin = i * block_size;
    b.pos_end = (i + 1) * block_size;
    b.block_size = block_size;
    b.n_kv_head = p.n_kv_head;
    b.head_dim = head_dim;
    b.request = 1;
    b.payload.resize(floats);
    for (auto& x : b.payload) x = d(rng);
    b.checksum = b.compute_checksum();
  }
  auto f = std::make_shared<kv_frame>();
  f->request = 1;
  f->blocks = std::move(blocks);
  return f;
}

uint64_t frame_bytes(const kv_frame& f) {
  uint64_t n = 0;
  for (const auto& b : *f.blocks) n += b.payload.size() * sizeof(float);
  return n;
}

// memcpy of the frame's payloads into buffers of the same sizes (allocated and touched once).
double memcpy_mb_s(const kv_frame& f, double seconds) {
  std::vector<std::vector<float>> dst;
  for (const auto& b : *f.blocks) dst.emplace_back(b.payload.size(), 1.f);
  const double bytes = double(frame_bytes(f));
  size_t n = 0;
  const auto t0 = clock_type::now();
  do {
    for (size_t i = 0; i < dst.size(); ++i)
      std::memcpy(dst[i].data(), (*f.blocks)[i].payload.data(), dst[i].size() * sizeof(float));
    ++n;
  } while (seconds_since(t0) < seconds);
  return bytes * double(n) / seconds_since(t0) / 1e6;
}

void run_local(const kv_frame& f, double seconds, result& r) {
  transport::local_transport t;
  std::vector<std::vector<float>> dst;
  std::vector<transport::copy_op> ops;
  for (const auto& b : *f.blocks) {
    dst.emplace_back(b.payload.size(), 1.f);
    const size_t n = b.payload.size() * sizeof(float);
    // The transport only reads the source region: registering the frame's own payload is safe.
    const auto src = t.register_memory(const_cast<float*>(b.payload.data()), n);
    const auto d = t.register_memory(dst.back().data(), n);
    ops.push_back({src, 0, d, 0, n});
  }
  std::vector<double> lat;
  const auto t0 = clock_type::now();
  do {
    const auto s0 = clock_type::now();
    const auto id = t.submit(ops);
    const auto st = t.poll(id);
    if (st.state != transport::transfer_state::done) throw failure(st.error.code(), st.error.message());
    lat.push_back(seconds_since(s0) * 1e6);
  } while (seconds_since(t0) < seconds);
  const double el = seconds_since(t0);
  r.frames = lat.size();
  r.mb_s = r.frame_bytes * double(lat.size()) / el / 1e6;
  r.p50_us = percentile(lat, 0.5);
  r.p99_us = percentile(lat, 0.99);
  r.latency_samples = lat.size();
}

void check(const transport::transfer_status& st) {
  if (st.state != transport::transfer_state::done)
    throw failure(st.error.code(), "transfer failed: " + st.error.to_string());
}

void run_channel(const std::string& address, const std::string& mode, std::shared_ptr<const kv_frame> f, double seconds,
                 result& r) {
  const auto cm = parse_channel_mode(mode);
  if (!cm) throw failure(errc::invalid_argument, "unknown channel mode '" + mode + "' (auto, tcp or shm)");
  transport::kv_sender s({.address = address, .mode = *cm, .timeout = std::chrono::milliseconds(30000)});
  for (int i = 0; i < 2; ++i) check(s.wait(s.submit(f)));  // connect, warm the ring and the heaps
  if (s.kind() != mode) throw failure(errc::unsupported, "asked for " + mode + ", got " + s.kind());
  // Throughput: frames pipelined, a window of them in flight (credit-bounded by the channel).
  const size_t window = std::clamp<size_t>(size_t((256u << 20) / std::max(1.0, r.frame_bytes)), 2, 32);
  std::deque<transport::transfer_id> inflight;
  size_t done = 0;
  const auto t0 = clock_type::now();
  while (seconds_since(t0) < seconds || done == 0) {
    while (inflight.size() < window) inflight.push_back(s.submit(f));
    check(s.wait(inflight.front()));
    inflight.pop_front();
    ++done;
  }
  const double el = seconds_since(t0);
  for (auto id : inflight) check(s.wait(id));
  r.frames = done;
  r.mb_s = r.frame_bytes * double(done) / el / 1e6;
  // Latency: one frame at a time, send to acknowledgement.
  std::vector<double> lat;
  const auto t1 = clock_type::now();
  while (seconds_since(t1) < seconds / 2 || lat.size() < 5) {
    const auto s0 = clock_type::now();
    check(s.wait(s.submit(f)));
    lat.push_back(seconds_since(s0) * 1e6);
  }
  r.p50_us = percentile(lat, 0.5);
  r.p99_us = percentile(lat, 0.99);
  r.latency_samples = lat.size();
}

// A receiver that takes frames and drops them (after the channel checked every checksum).
transport::receiver_options receiver_opts() {
  transport::receiver_options o;
  o.bind_host = "127.0.0.1";
  return o;
}

int run_bench(const opts& o) {
  const auto& preset = find_synth_preset(o.preset);
  const bool need_channel =
      std::any_of(o.transports.begin(), o.transports.end(), [](const std::string& t) { return t != "local"; });
  // The child is forked before this process starts any thread.
  pid_t child = -1;
  int to_child = -1;
  std::string address;
  std::unique_ptr<transport::kv_receiver> local_rx;
  if (need_channel && !o.same_process) {
    int a[2], b[2];
    if (::pipe(a) != 0 || ::pipe(b) != 0) throw failure(errc::io_error, "pipe failed");
    child = ::fork();
    if (child < 0) throw failure(errc::io_error, "fork failed");
    if (child == 0) {
      ::close(a[1]);
      ::close(b[0]);
      int rc = 0;
      try {
        transport::kv_receiver rx(receiver_opts(), [](kv_frame&&) {});
        const std::string addr = rx.address();
        const uint32_t n = uint32_t(addr.size());
        (void)!::write(b[1], &n, sizeof n);
        (void)!::write(b[1], addr.data(), n);
        char c;
        while (::read(a[0], &c, 1) > 0) {}
      } catch (const std::exception& e) {
        std::fprintf(stderr, "bench transport receiver: %s\n", e.what());
        rc = 1;
      }
      ::_exit(rc);
    }
    ::close(a[0]);
    ::close(b[1]);
    to_child = a[1];
    uint32_t n = 0;
    if (::read(b[0], &n, sizeof n) != sizeof n || n > 4096) throw failure(errc::io_error, "receiver child failed");
    address.resize(n);
    if (::read(b[0], address.data(), n) != ssize_t(n)) throw failure(errc::io_error, "receiver child failed");
    ::close(b[0]);
  } else if (need_channel) {
    local_rx = std::make_unique<transport::kv_receiver>(receiver_opts(), [](kv_frame&&) {});
    address = local_rx->address();
  }
  const std::string where = o.same_process ? "same process" : "child process";

  std::vector<result> results;
  for (int nb : o.blocks) {
    const auto f = make_frame(preset, o.block_size, nb);
    const double mc = memcpy_mb_s(*f, std::max(0.2, o.seconds / 2));
    for (const auto& t : o.transports) {
      result r;
      r.transport = t;
      r.blocks = nb;
      r.frame_bytes = double(frame_bytes(*f));
      r.memcpy_mb_s = mc;
      if (t == "local") run_local(*f, o.seconds, r);
      else run_channel(address, t, f, o.seconds, r);
      results.push_back(r);
      if (!o.json) spdlog::debug("{} x{}: {:.0f} MB/s", t, nb, r.mb_s);
    }
  }
  if (child > 0) {
    ::close(to_child);
    ::waitpid(child, nullptr, 0);
  }

  const int32_t head_dim = preset.dim / preset.n_head;
  if (o.json) {
    nlohmann::json out;
    out["preset"] = o.preset;
    out["block_bytes"] = uint64_t(preset.n_layer) * 2 * preset.n_kv_head * o.block_size * head_dim * 4;
    out["receiver"] = where;
    out["results"] = nlohmann::json::array();
    for (const auto& r : results)
      out["results"].push_back({{"transport", r.transport},
                                {"blocks", r.blocks},
                                {"frame_bytes", r.frame_bytes},
                                {"mb_per_s", r.mb_s},
                                {"memcpy_mb_per_s", r.memcpy_mb_s},
                                {"pct_of_memcpy", 100.0 * r.mb_s / r.memcpy_mb_s},
                                {"latency_p50_us", r.p50_us},
                                {"latency_p99_us", r.p99_us},
                                {"frames", r.frames},
                                {"latency_samples", r.latency_samples}});
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  std::printf("KV transfer, %s shape: %d layers x 2 x %d KV heads x %d positions x %d dims, f32 = %.0f KiB per block\n",
              o.preset.c_str(), preset.n_layer, preset.n_kv_head, o.block_size, head_dim,
              double(preset.n_layer) * 2 * preset.n_kv_head * o.block_size * head_dim * 4 / 1024);
  std::printf("receiver: %s (local: in-process copy between registered regions)\n", where.c_str());
  std::printf("MB/s: frames pipelined; latency: one frame at a time, send to acknowledgement\n\n");
  std::printf("%-6s %6s %10s %10s %10s %9s %10s %10s\n", "kind", "blocks", "MiB/frame", "MB/s", "memcpy", "%memcpy",
              "p50 us", "p99 us");
  for (const auto& r : results)
    std::printf("%-6s %6d %10.2f %10.0f %10.0f %8.0f%% %10.0f %10.0f\n", r.transport.c_str(), r.blocks,
                r.frame_bytes / (1 << 20), r.mb_s, r.memcpy_mb_s, 100.0 * r.mb_s / r.memcpy_mb_s, r.p50_us, r.p99_us);
  return 0;
}

}  // namespace

void add_bench_transport(CLI::App* bench) {
  auto o = std::make_shared<opts>();
  auto* t = bench->add_subcommand(
      "transport",
      "KV transfer throughput and latency: in-process, shared memory and TCP loopback (receiver in a "
      "child process), next to memcpy of the same bytes");
  t->add_option("--blocks", o->blocks, "Blocks per frame")->delimiter(',')->check(CLI::Range(1, 4096));
  t->add_option("--transports", o->transports, "Transports to run")
      ->delimiter(',')
      ->check(CLI::IsMember({"local", "shm", "tcp"}));
  t->add_option("--preset", o->preset, "Synthetic model preset whose KV shape the blocks have")
      ->check(CLI::IsMember([] {
        std::vector<std::string> n;
        for (const auto& p : synth_presets()) n.push_back(p.name);
        return n;
      }()));
  t->add_option("--block-size", o->block_size, "Positions per KV block")->check(CLI::Range(1, 4096));
  t->add_option("--seconds", o->seconds, "Seconds per case (throughput; latency takes half as long again)")
      ->check(CLI::Range(0.01, 600.0));
  t->add_flag("--same-process", o->same_process, "Run the receiver in this process instead of a child");
  t->add_flag("--json", o->json, "Print results as JSON");
  t->callback([o] { run_bench(*o); });
}

}  // namespace tandem::cli
