#include "runtime/vocab_hf.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>

#include "runtime/errors.h"

namespace tandem {
namespace {

using json = nlohmann::json;

json read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw failure(errc::io_error, "cannot open '" + path + "'");
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    throw failure(errc::malformed_file, "'" + path + "' is not valid JSON: " + e.what());
  }
}

// The Split regexes of the pre-tokenizers llama.cpp names, as tokenizer.json spells them.
const std::map<std::string, std::string>& known_splits() {
  static const std::map<std::string, std::string> m = {
      {R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
       "llama-bpe"},
      {R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
       "qwen2"},
  };
  return m;
}

// tokenizer.ggml.pre for this pre_tokenizer, or "" when not one llama.cpp knows.
std::string detect_pre(const json& pt) {
  if (!pt.is_object()) return "";
  const std::string type = pt.value("type", "");
  if (type == "ByteLevel") return pt.value("use_regex", true) ? "gpt-2" : "";
  if (type != "Sequence" || !pt.contains("pretokenizers")) return "";
  std::string found;
  for (const auto& p : pt["pretokenizers"]) {
    if (p.value("type", "") == "Split" && p.contains("pattern") && p["pattern"].contains("Regex")) {
      const auto it = known_splits().find(p["pattern"]["Regex"].get<std::string>());
      if (it == known_splits().end()) return "";
      found = it->second;
    }
  }
  return found;
}

std::string token_text(const json& v) {  // "<s>" or {"content": "<s>", ...}
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content")) return v["content"].get<std::string>();
  return "";
}

}  // namespace

vocab_spec vocab_from_tokenizer_json(const std::string& path, const std::string& pre) {
  const json t = read_json(path);
  try {
    const json& model = t.at("model");
    if (model.value("type", "") != "BPE")
      throw failure(errc::unsupported, "'" + path + "': tokenizer model '" + model.value("type", "?") +
                                           "' is not supported (byte-level BPE only)");
    if (model.value("byte_fallback", false))
      throw failure(errc::unsupported, "'" + path + "': a BPE with byte_fallback (SentencePiece-style, as Gemma's) "
                                       "is not supported here: convert it with llama.cpp");
    vocab_spec s;
    s.model = "gpt2";
    s.pre = pre.empty() ? detect_pre(t.value("pre_tokenizer", json())) : pre;
    if (s.pre.empty())
      throw failure(errc::unsupported, "'" + path + "': its pre-tokenizer is not one tandem recognises (Llama 3's, "
                                       "Qwen 2's, GPT-2's): name it with --pre");
    // id -> text over the model's vocab and the added tokens.
    std::map<int64_t, std::pair<std::string, int32_t>> by_id;  // id -> (text, type)
    for (const auto& [text, id] : model.at("vocab").items()) by_id[id.get<int64_t>()] = {text, 1};
    for (const auto& a : t.value("added_tokens", json::array()))
      by_id[a.at("id").get<int64_t>()] = {a.at("content").get<std::string>(), a.value("special", false) ? 3 : 4};
    if (by_id.empty() || by_id.begin()->first != 0 || by_id.rbegin()->first != int64_t(by_id.size()) - 1)
      throw failure(errc::malformed_file, "'" + path + "': token ids are not 0..n-1 without gaps");
    for (auto& [id, e] : by_id) {
      s.tokens.push_back(e.first);
      s.token_types.push_back(e.second);
    }
    for (const auto& m : model.at("merges")) {  // "a b" (old format) or ["a", "b"]
      if (m.is_string()) s.merges.push_back(m.get<std::string>());
      else s.merges.push_back(m.at(0).get<std::string>() + " " + m.at(1).get<std::string>());
    }
    auto id_of = [&](const std::string& text) -> token_id {
      if (text.empty()) return -1;
      for (const auto& [id, e] : by_id)
        if (e.first == text) return token_id(id);
      throw failure(errc::malformed_file, "'" + path + "': special token '" + text + "' is not in the vocabulary");
    };
    // BOS/EOS as convert_hf_to_gguf takes them: tokenizer_config.json first.
    // Without a word from the files, llama.cpp adds BOS for the Llama 3 pre-tokenizer only.
    s.add_bos = s.pre == "llama-bpe" || s.pre == "llama3";
    const auto cfg_path = std::filesystem::path(path).parent_path() / "tokenizer_config.json";
    if (std::filesystem::exists(cfg_path)) {
      const json cfg = read_json(cfg_path.string());
      if (cfg.contains("bos_token")) s.bos_id = id_of(token_text(cfg["bos_token"]));
      if (cfg.contains("eos_token")) s.eos_id = id_of(token_text(cfg["eos_token"]));
      if (cfg.contains("pad_token")) s.pad_id = id_of(token_text(cfg["pad_token"]));
      if (cfg.contains("add_bos_token") && cfg["add_bos_token"].is_boolean()) s.add_bos = cfg["add_bos_token"].get<bool>();
    }
    // A post-processor that puts a special token first means BOS is added (Llama 3's).
    std::function<void(const json&)> scan = [&](const json& pp) {
      if (!pp.is_object()) return;
      if (pp.value("type", "") == "TemplateProcessing" && pp.contains("single") && !pp["single"].empty() &&
          pp["single"][0].contains("SpecialToken")) {
        s.add_bos = true;
        if (s.bos_id < 0) s.bos_id = id_of(pp["single"][0]["SpecialToken"].at("id").get<std::string>());
      }
      for (const auto& p : pp.value("processors", json::array())) scan(p);
    };
    scan(t.value("post_processor", json()));
    s.add_eos = false;
    s.add_space_prefix = false;
    return s;
  } catch (const json::exception& e) {
    throw failure(errc::malformed_file, "'" + path + "' is not a tokenizer.json: " + e.what());
  }
}

std::string chat_template_beside(const std::string& tokenizer_json_path) {
  const auto cfg = std::filesystem::path(tokenizer_json_path).parent_path() / "tokenizer_config.json";
  if (!std::filesystem::exists(cfg)) return "";
  const json j = read_json(cfg.string());
  const auto it = j.find("chat_template");
  if (it == j.end() || it->is_null()) return "";
  if (it->is_string()) return it->get<std::string>();
  // Newer files hold a list of named templates: the "default" one is the chat template.
  if (it->is_array())
    for (const auto& t : *it)
      if (t.value("name", "") == "default" && t.contains("template")) return t["template"].get<std::string>();
  throw failure(errc::malformed_file, "'" + cfg.string() + "': chat_template is neither a string nor named templates");
}

}  // namespace tandem
