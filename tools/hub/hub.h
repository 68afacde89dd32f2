#pragma once
// GGUF models from a Hugging Face repository, as `llama-server -hf` and `ollama pull` find them:
// REPO[:QUANT] names a repository and a quantization; the file is resolved from the hub's
// listing, downloaded into the cache, checked, and found there again offline.
#include <string>
#include <vector>

#include "tools/hub/cache.h"

namespace tandem::hub {

// owner/name[:QUANT]
struct model_ref {
  std::string repo, quant;
  std::string str() const { return quant.empty() ? repo : repo + ":" + quant; }
};
// Throws failure(invalid_argument) when `s` is not owner/name[:QUANT].
model_ref parse_ref(const std::string& s);

// What the environment says, as huggingface_hub reads it.
struct settings {
  std::string endpoint = "https://huggingface.co";  // HF_ENDPOINT, without a trailing '/'
  std::string token;  // HF_TOKEN (or HUGGING_FACE_HUB_TOKEN)
  bool offline = false;  // HF_HUB_OFFLINE=1: never contact the hub
  std::string cache_root;  // {cache directory}/hub
  static settings from_env(const std::string& cache_dir);
};

// Which GGUF of `files` (a repository's, or the cache's) `ref` names: among the *.gguf files but
// mmproj* (vision projectors), those whose name contains the quant tag, case-insensitively;
// without a tag Q4_K_M when there is one (llama.cpp's default), else the only GGUF. Throws
// failure(invalid_argument) listing the choices when none or several match, failure(unsupported)
// for a split GGUF (tandem loads single files). `where` names the listing in those messages.
std::string pick_gguf(const std::vector<std::string>& files, const model_ref& ref, const std::string& where);

// `tandem model pull`: asks the hub for the repository's files, downloads the chosen one unless
// the cache has it verified already. When the hub cannot be reached, a cached file that `ref`
// names is used with a warning. HF_HUB_OFFLINE: the cache alone.
cached_file pull(const model_ref& ref, const settings& s);

// `--model hf:REPO[:QUANT]`: a verified cached file without contacting the hub; else pull().
std::string resolve(const model_ref& ref, const settings& s);

// Cached files `ref` names (all of the repository's when it has no tag).
std::vector<cached_file> find_cached(const model_ref& ref, const settings& s);

}  // namespace tandem::hub
