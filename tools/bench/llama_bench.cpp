#include "tools/bench/llama_bench.h"

#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>

#include "runtime/errors.h"

namespace tandem::bench {
namespace fs = std::filesystem;

namespace {

// Single-quoted for /bin/sh.
std::string quoted(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// Runs a shell command; returns its standard output, throws with its exit status otherwise.
std::string capture(const std::string& cmd) {
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) throw failure(errc::io_error, "cannot run: " + cmd);
  std::string out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  const int st = ::pclose(p);
  if (st != 0) throw failure(errc::io_error, "'" + cmd + "' failed (status " + std::to_string(WEXITSTATUS(st)) + ")");
  return out;
}

// A file of a few bytes naming a sibling file: a symlink flattened by a copy.
std::optional<std::string> flattened_link(const fs::path& p) {
  if (!fs::is_regular_file(p) || fs::file_size(p) > 255) return std::nullopt;
  std::ifstream in(p);
  std::string name((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (name.empty() || name.find('/') != std::string::npos || !fs::exists(p.parent_path() / name)) return std::nullopt;
  return name;
}

}  // namespace

llama_bench::llama_bench(const std::string& dir) {
  const fs::path src(dir);
  if (!fs::is_regular_file(src / "llama-bench")) throw failure(errc::io_error, "no llama-bench in '" + dir + "'");
  stage_ = (fs::temp_directory_path() / ("tandem-llama-bench-" + std::to_string(::getpid()))).string();
  fs::remove_all(stage_);
  fs::create_directories(stage_);
  for (const auto& e : fs::directory_iterator(src)) {
    const fs::path to = fs::path(stage_) / e.path().filename();
    if (e.is_symlink()) fs::create_symlink(fs::read_symlink(e.path()), to);
    else if (auto target = flattened_link(e.path())) fs::create_symlink(*target, to);
    else if (e.is_regular_file()) fs::copy_file(e.path(), to);
  }
  capture(quoted(stage_ + "/llama-bench") + " --help >/dev/null 2>&1");
}

llama_bench::~llama_bench() {
  std::error_code ec;
  fs::remove_all(stage_, ec);
}

double llama_bench::run(const std::string& model, int threads, int prompt, int gen, int depth) const {
  const std::string cmd = quoted(stage_ + "/llama-bench") + " -m " + quoted(model) + " -t " + std::to_string(threads) +
                          " -p " + std::to_string(prompt) + " -n " + std::to_string(gen) + " -d " +
                          std::to_string(depth) + " -r 1 -o json 2>/dev/null";
  const auto out = nlohmann::json::parse(capture(cmd), nullptr, false);
  if (!out.is_array() || out.empty() || !out.back().contains("avg_ts"))
    throw failure(errc::io_error, "llama-bench printed no result for " + model);
  return out.back()["avg_ts"].get<double>();
}

double llama_bench::prefill_tps(const std::string& model, int threads, int tokens, int depth) const {
  return run(model, threads, tokens, 0, depth);
}

double llama_bench::decode_tps(const std::string& model, int threads, int tokens, int depth) const {
  return run(model, threads, 0, tokens, depth);
}

}  // namespace tandem::bench
