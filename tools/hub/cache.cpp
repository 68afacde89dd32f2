#include "tools/hub/cache.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "runtime/atomic_file.h"
#include "runtime/errors.h"

namespace tandem::hub {
namespace fs = std::filesystem;

std::string repo_dir(const std::string& root, const std::string& repo) {
  std::string d = repo;
  const size_t slash = d.find('/');
  if (slash != std::string::npos) d.replace(slash, 1, "--");  // huggingface_hub's models--owner--name style
  return (fs::path(root) / d).string();
}

std::string cache_path(const std::string& root, const std::string& repo, const std::string& file) {
  return (fs::path(repo_dir(root, repo)) / file).string();
}

std::optional<cached_file> read_record(const std::string& file_path) {
  std::ifstream in(file_path + ".json");
  if (!in) return std::nullopt;
  try {
    const auto j = nlohmann::json::parse(in);
    cached_file f{j.at("repo"), j.at("file"), j.at("sha256"), j.at("size"), j.value("commit", ""), file_path};
    std::error_code ec;
    // A file that lost its bytes since (truncated, replaced) is no longer the verified one.
    if (fs::file_size(file_path, ec) != f.size || ec) return std::nullopt;
    return f;
  } catch (const std::exception&) {
    return std::nullopt;  // not ours, or cut short: as if absent
  }
}

void write_record(const cached_file& f) {
  const nlohmann::json j = {
      {"repo", f.repo}, {"file", f.file}, {"sha256", f.sha256}, {"size", f.size}, {"commit", f.commit}};
  const std::string dest = f.path + ".json";
  write_file_atomically(dest, [&](std::ostream& out) { out << j.dump(2) << "\n"; });
}

std::vector<cached_file> list_cached(const std::string& root, const std::string& repo) {
  std::vector<cached_file> out;
  std::error_code ec;
  const fs::path base = repo.empty() ? fs::path(root) : fs::path(repo_dir(root, repo));
  if (!fs::is_directory(base, ec)) return out;
  for (auto it = fs::recursive_directory_iterator(base, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    const std::string p = it->path().string();
    if (!it->is_regular_file() || p.size() < 6 || p.compare(p.size() - 5, 5, ".json") != 0) continue;
    auto f = read_record(p.substr(0, p.size() - 5));
    if (f && (repo.empty() || f->repo == repo)) out.push_back(*f);
  }
  std::sort(out.begin(), out.end(), [](const cached_file& a, const cached_file& b) {
    return std::tie(a.repo, a.file) < std::tie(b.repo, b.file);
  });
  return out;
}

void remove_cached(const cached_file& f) {
  for (const char* suffix : {".json", "", ".part", ".bad"}) {
    std::error_code ec;
    fs::remove(f.path + suffix, ec);
    if (ec) throw failure(errc::io_error, "cannot remove '" + f.path + suffix + "': " + ec.message());
  }
}

}  // namespace tandem::hub
