// `tandem model pull|list|rm`: GGUF models from Hugging Face repositories (tools/hub), and
// `--model hf:REPO[:QUANT]` wherever a model is named.
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>
#include <iostream>

#include <CLI/CLI.hpp>

#include "runtime/errors.h"
#include "runtime/model/synth.h"
#include "tools/commands.h"
#include "tools/hub/hub.h"

namespace tandem::cli {

std::string resolve_hf_model(const std::string& ref) {
  return hub::resolve(hub::parse_ref(ref), hub::settings::from_env(cache_dir()));
}

void add_model_hub(CLI::App* model_cmd) {
  const std::string env_help =
      "\nHF_ENDPOINT (default https://huggingface.co), HF_TOKEN for gated and private repositories, "
      "HF_HUB_OFFLINE=1 to use the cache alone, HTTPS_PROXY / NO_PROXY; files are cached in "
      "$TANDEM_CACHE_DIR/hub/OWNER--NAME/.";
  auto* pull = model_cmd->add_subcommand(
      "pull",
      "Download a GGUF from a Hugging Face repository into the cache (resumable, sha256-checked) and print "
      "its path; QUANT picks the file whose name contains it (default Q4_K_M, else the only GGUF). "
      "Serve it with --model hf:REPO[:QUANT]." +
          env_help);
  auto ref = std::make_shared<std::string>();
  pull->add_option("model", *ref, "OWNER/NAME[:QUANT], e.g. bartowski/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M")->required();
  pull->callback([ref] {
    const auto f = hub::pull(hub::parse_ref(*ref), hub::settings::from_env(cache_dir()));
    std::cout << f.path << "\n";
  });

  auto* list = model_cmd->add_subcommand("list", "The models pulled into the cache (repository, file, size, path)");
  auto json = std::make_shared<bool>(false);
  list->add_flag("--json", *json, "Print one JSON array");
  list->callback([json] {
    const auto s = hub::settings::from_env(cache_dir());
    const auto files = hub::list_cached(s.cache_root);
    if (*json) {
      nlohmann::json a = nlohmann::json::array();
      for (const auto& f : files)
        a.push_back({{"repo", f.repo},
                     {"file", f.file},
                     {"size", f.size},
                     {"sha256", f.sha256},
                     {"commit", f.commit},
                     {"path", f.path}});
      std::cout << a.dump() << "\n";
      return;
    }
    if (files.empty()) {
      spdlog::info("no models in {} (tandem model pull OWNER/NAME[:QUANT])", s.cache_root);
      return;
    }
    size_t wr = 4, wf = 4;
    for (const auto& f : files) wr = std::max(wr, f.repo.size()), wf = std::max(wf, f.file.size());
    std::cout << fmt::format("{:<{}}  {:<{}}  {:>10}  {}\n", "REPO", wr, "FILE", wf, "SIZE", "PATH");
    for (const auto& f : files)
      std::cout << fmt::format("{:<{}}  {:<{}}  {:>6.1f} MiB  {}\n", f.repo, wr, f.file, wf,
                               double(f.size) / (1024.0 * 1024.0), f.path);
  });

  auto* rm = model_cmd->add_subcommand("rm",
                                       "Remove a pulled model from the cache: REPO:QUANT one file, REPO all of "
                                       "the repository's (partial downloads included)");
  auto rm_ref = std::make_shared<std::string>();
  rm->add_option("model", *rm_ref, "OWNER/NAME[:QUANT]")->required();
  rm->callback([rm_ref] {
    const auto s = hub::settings::from_env(cache_dir());
    const auto r = hub::parse_ref(*rm_ref);
    const auto files = hub::find_cached(r, s);
    const std::string dir = hub::repo_dir(s.cache_root, r.repo);
    if (r.quant.empty() && std::filesystem::exists(dir)) {
      for (const auto& f : files) spdlog::info("removing {}", f.path);
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
      if (ec) throw failure(errc::io_error, "cannot remove '" + dir + "': " + ec.message());
      return;
    }
    if (files.empty())
      throw failure(errc::invalid_argument, "'" + r.str() + "' is not in the cache (" + s.cache_root + ")");
    for (const auto& f : files) {
      spdlog::info("removing {}", f.path);
      hub::remove_cached(f);
    }
  });
}

}  // namespace tandem::cli
