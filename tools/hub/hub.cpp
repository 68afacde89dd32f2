#include "tools/hub/hub.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <map>
#include <regex>

#include "runtime/errors.h"
#include "tools/hub/download.h"
#include "tools/hub/https_client.h"

namespace tandem::hub {
namespace {

bool name_chars(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(),
                                   [](unsigned char c) { return std::isalnum(c) || c == '-' || c == '_' || c == '.'; });
}

std::string basename(const std::string& f) { return f.substr(f.rfind('/') + 1); }

// A part of a split GGUF (gguf-split's NAME-00001-of-00003.gguf): its NAME and part count.
bool split_part(const std::string& f, std::string& stem, std::string& parts) {
  static const std::regex re(R"((.*)-(\d{5})-of-(\d{5})\.gguf)", std::regex::icase);
  std::smatch m;
  if (!std::regex_match(f, m, re)) return false;
  stem = m[1];
  parts = m[3];
  return true;
}

// Whether `tag` stands alone in `name` where it occurs (Q4_0 in "-Q4_0.gguf", not "-Q4_0_4_4.gguf").
bool tag_bounded(const std::string& name, const std::string& tag) {
  const auto word = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  for (size_t i = name.find(tag); i != std::string::npos; i = name.find(tag, i + 1)) {
    const bool left = i == 0 || !word(name[i - 1]);
    const bool right = i + tag.size() == name.size() || !word(name[i + tag.size()]);
    if (left && right) return true;
  }
  return false;
}

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

// One failure for every way the hub says no to a token (or its absence).
failure access_failure(int status, const std::string& repo, const settings& s) {
  if (s.token.empty())
    return failure(errc::invalid_argument,
                   fmt::format("repository '{}' on {} is gated or private ({}): set HF_TOKEN to an access token of an "
                               "account that may read it (for a gated model, accept its terms on its page first)",
                               repo, s.endpoint, status));
  return failure(errc::invalid_argument,
                 fmt::format("HF_TOKEN gives no access to repository '{}' on {} ({}): is the token valid, and were "
                             "a gated model's terms accepted with that account?",
                             repo, s.endpoint, status));
}

get_options http_options(const settings& s) {
  get_options o;
  o.token = s.token;
  o.token_host = parse_url(s.endpoint).host;
  return o;
}

nlohmann::json repo_info(const model_ref& ref, const settings& s) {
  const get_result r = get(s.endpoint + "/api/models/" + ref.repo + "?blobs=true", http_options(s));
  const int st = r.head.status;
  if (st == 404)
    throw failure(errc::invalid_argument, fmt::format("repository '{}' not found on {}", ref.repo, s.endpoint));
  // huggingface.co answers 401 for a repository it will not say exists to an anonymous client.
  if (st == 401 && s.token.empty() && r.head.field("x-error-code") == "RepoNotFound")
    throw failure(
        errc::invalid_argument,
        fmt::format("repository '{}' not found on {} (if it is private, set HF_TOKEN)", ref.repo, s.endpoint));
  if (st >= 500) throw transfer_error(fmt::format("{} answered {}", s.endpoint, st));  // the cache may do
  if (st == 401 || st == 403) throw access_failure(st, ref.repo, s);
  if (st != 200)
    throw failure(errc::io_error, fmt::format("{} answered {} for repository '{}': {}", s.endpoint, st, ref.repo,
                                              r.body.substr(0, 200)));
  try {
    return nlohmann::json::parse(r.body);
  } catch (const std::exception& e) {
    throw failure(errc::malformed_file,
                  fmt::format("{}'s listing of '{}' is not JSON: {}", s.endpoint, ref.repo, e.what()));
  }
}

// The cached file `ref` names, if any: used when the hub is out of reach.
std::optional<cached_file> cached_fallback(const model_ref& ref, const settings& s) {
  try {
    const auto c = find_cached(ref, s);
    if (c.size() == 1) return c[0];
    if (c.size() > 1) {  // no tag: the one the rules pick among the cached files
      std::vector<std::string> names;
      for (const auto& f : c) names.push_back(f.file);
      const std::string pick = pick_gguf(names, ref, "the cache");
      for (const auto& f : c)
        if (f.file == pick) return f;
    }
  } catch (const failure&) {}
  return std::nullopt;
}

}  // namespace

model_ref parse_ref(const std::string& text) {
  std::string s = text;
  // A model page's address names the same thing (ollama's hf.co/owner/name:QUANT).
  for (const char* prefix : {"https://huggingface.co/", "huggingface.co/", "hf.co/"})
    if (s.rfind(prefix, 0) == 0) s.erase(0, std::string(prefix).size());
  model_ref r;
  const size_t colon = s.find(':');
  r.repo = s.substr(0, colon);
  if (colon != std::string::npos) r.quant = s.substr(colon + 1);
  const size_t slash = r.repo.find('/');
  const bool ok = slash != std::string::npos && name_chars(r.repo.substr(0, slash)) &&
                  name_chars(r.repo.substr(slash + 1)) && (colon == std::string::npos || name_chars(r.quant));
  if (!ok)
    throw failure(errc::invalid_argument, "'" + text +
                                              "' does not name a Hugging Face repository: OWNER/NAME[:QUANT], e.g. "
                                              "bartowski/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M");
  return r;
}

settings settings::from_env(const std::string& cache_dir) {
  settings s;
  if (const std::string e = env("HF_ENDPOINT"); !e.empty()) s.endpoint = e;
  while (!s.endpoint.empty() && s.endpoint.back() == '/') s.endpoint.pop_back();
  try {
    (void)parse_url(s.endpoint);  // a bad HF_ENDPOINT is reported now, naming it
  } catch (const failure& e) {
    throw failure(errc::invalid_argument, std::string("HF_ENDPOINT: ") + e.what());
  }
  s.token = env("HF_TOKEN");
  if (s.token.empty()) s.token = env("HUGGING_FACE_HUB_TOKEN");  // its older name
  const std::string off = lower(env("HF_HUB_OFFLINE"));
  s.offline = off == "1" || off == "true" || off == "yes" || off == "on";
  s.cache_root = (std::filesystem::path(cache_dir) / "hub").string();
  return s;
}

std::string pick_gguf(const std::vector<std::string>& files, const model_ref& ref, const std::string& where) {
  // Each model once: a split GGUF's parts count as one choice, named by its first part.
  std::vector<std::string> choices;
  std::map<std::string, std::string> parts_of;  // first part -> part count
  for (const auto& f : files) {
    const std::string base = lower(basename(f));
    if (base.size() < 5 || base.compare(base.size() - 5, 5, ".gguf") != 0 || base.rfind("mmproj", 0) == 0) continue;
    std::string stem, parts;
    if (split_part(f, stem, parts)) {
      const std::string first = stem + "-00001-of-" + parts + ".gguf";
      if (parts_of.emplace(first, parts).second) choices.push_back(first);
    } else {
      choices.push_back(f);
    }
  }
  if (choices.empty())
    throw failure(errc::invalid_argument,
                  fmt::format("{} has no GGUF file{}", where, files.empty() ? "" : " (files: " + join(files) + ")"));
  const std::string tag = lower(ref.quant.empty() ? "Q4_K_M" : ref.quant);
  std::vector<std::string> matches;
  for (const auto& c : choices)
    if (lower(basename(c)).find(tag) != std::string::npos) matches.push_back(c);
  if (ref.quant.empty() && matches.empty()) matches = choices;  // no Q4_K_M: the only GGUF, if one
  if (matches.size() > 1) {
    std::vector<std::string> bounded;
    for (const auto& m : matches)
      if (tag_bounded(lower(basename(m)), tag)) bounded.push_back(m);
    if (bounded.size() == 1) matches = bounded;
  }
  const auto listing = [&] {
    std::vector<std::string> l;
    for (const auto& c : choices) l.push_back(parts_of.count(c) ? c + " (split)" : c);
    return join(l);
  };
  if (matches.empty())
    throw failure(errc::invalid_argument,
                  fmt::format("no GGUF file in {} matches '{}' (choices: {})", where, ref.quant, listing()));
  if (matches.size() > 1)
    throw failure(errc::invalid_argument,
                  ref.quant.empty() ? fmt::format("{} has several GGUF files: name one, {}:QUANT (choices: {})", where,
                                                  ref.repo, join(matches))
                                    : fmt::format("'{}' matches several GGUF files in {}: {} (name one more precisely)",
                                                  ref.quant, where, join(matches)));
  const std::string& m = matches[0];
  if (const auto it = parts_of.find(m); it != parts_of.end())
    throw failure(errc::unsupported,
                  fmt::format("{} in {} is split into {} files ({}); tandem loads single GGUF files: merge them with "
                              "llama-gguf-split --merge, or choose another quant (choices: {})",
                              m, where, std::stoi(it->second), m, listing()));
  return m;
}

std::vector<cached_file> find_cached(const model_ref& ref, const settings& s) {
  std::vector<cached_file> all = list_cached(s.cache_root, ref.repo);
  if (ref.quant.empty() || all.empty()) return all;
  std::vector<std::string> names;
  for (const auto& f : all) names.push_back(f.file);
  const std::string pick = pick_gguf(names, ref, "the cache of '" + ref.repo + "'");
  std::vector<cached_file> out;
  for (const auto& f : all)
    if (f.file == pick) out.push_back(f);
  return out;
}

cached_file pull(const model_ref& ref, const settings& s) {
  if (s.offline) {
    if (auto c = cached_fallback(ref, s)) return *c;
    throw failure(errc::io_error, fmt::format("HF_HUB_OFFLINE is set and '{}' is not in the cache ({}): unset it "
                                              "to download the file",
                                              ref.str(), s.cache_root));
  }
  nlohmann::json info;
  try {
    info = repo_info(ref, s);
  } catch (const transfer_error& e) {
    if (auto c = cached_fallback(ref, s)) {
      spdlog::warn("cannot reach the hub ({}); using the cached {}", e.what(), c->path);
      return *c;
    }
    throw failure(errc::io_error, fmt::format("cannot reach the hub at {} (HF_ENDPOINT): {}; '{}' is not in the cache",
                                              s.endpoint, e.what(), ref.str()));
  }
  std::vector<std::string> names;
  std::map<std::string, std::pair<uint64_t, std::string>> meta;  // file -> size, sha256
  for (const auto& sib : info.value("siblings", nlohmann::json::array())) {
    const std::string f = sib.value("rfilename", "");
    // A name that would leave the repository's folder in the cache is not a file we take.
    if (f.empty() || f[0] == '/' || f == ".." || f.rfind("../", 0) == 0 || f.find("/../") != std::string::npos ||
        (f.size() >= 3 && f.compare(f.size() - 3, 3, "/..") == 0))
      continue;
    names.push_back(f);
    const auto lfs = sib.value("lfs", nlohmann::json::object());
    meta[f] = {lfs.value("size", sib.value("size", uint64_t(0))), lower(lfs.value("sha256", std::string()))};
  }
  const std::string file = pick_gguf(names, ref, "repository '" + ref.repo + "'");
  const std::string commit = info.value("sha", "");
  cached_file want{ref.repo,         file,   meta[file].second,
                   meta[file].first, commit, cache_path(s.cache_root, ref.repo, file)};
  if (want.size == 0) throw failure(errc::malformed_file, fmt::format("{} lists no size for {}", s.endpoint, file));
  if (auto c = read_record(want.path); c && c->size == want.size && (want.sha256.empty() || c->sha256 == want.sha256)) {
    spdlog::info("{} is up to date in the cache", file);
    return *c;
  }
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(want.path).parent_path(), ec);
  if (ec) throw failure(errc::io_error, "cannot create '" + want.path + "'s folder: " + ec.message());
  std::filesystem::remove(want.path + ".json", ec);  // an older revision's record no longer holds
  download_request d;
  d.url = fmt::format("{}/{}/resolve/{}/{}", s.endpoint, ref.repo, commit.empty() ? "main" : commit, encode_path(file));
  d.dest = want.path;
  d.size = want.size;
  d.sha256 = want.sha256;
  d.label = file;
  d.http = http_options(s);
  spdlog::info("downloading {} ({:.1f} MiB) from {} into {}", file, double(want.size) / (1024.0 * 1024.0), ref.repo,
               want.path);
  try {
    want.sha256 = download(d);
  } catch (const status_error& e) {
    if (e.status == 401 || e.status == 403) throw access_failure(e.status, ref.repo, s);
    throw failure(errc::io_error, fmt::format("cannot download {} of '{}': {}", file, ref.repo, e.what()));
  }
  write_record(want);
  spdlog::info("verified {} (sha256 {})", want.path, want.sha256);
  return want;
}

std::string resolve(const model_ref& ref, const settings& s) {
  if (auto c = cached_fallback(ref, s)) return c->path;
  if (s.offline)
    throw failure(errc::io_error, fmt::format("HF_HUB_OFFLINE is set and hf:{} is not in the cache ({}): run `tandem "
                                              "model pull {}` online first",
                                              ref.str(), s.cache_root, ref.str()));
  return pull(ref, s).path;
}

}  // namespace tandem::hub
