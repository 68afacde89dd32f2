#include "runtime/tokenizer/vocab_hf.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <unordered_map>
#include <utility>
#include <vector>

#include "runtime/errors.h"
#include "runtime/tokenizer/tokenizer_internal.h"

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
      {R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|)"
       R"(\s+(?!\S)|\s+)",
       "llama-bpe"},
      {R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|)"
       R"(\s+)",
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
      throw failure(errc::unsupported,
                    "'" + path + "': tokenizer model '" + model.value("type", "?") +
                        "' is not supported (BPE only: byte-level, or SentencePiece-style with byte_fallback)");
    // A BPE with byte fallback is a SentencePiece BPE in Hugging Face's form (Llama 2, Gemma):
    // llama.cpp's "llama" tokenizer, which merges by token score instead of merge rank.
    const bool spm = model.value("byte_fallback", false);
    vocab_spec s;
    s.model = spm ? "llama" : "gpt2";
    s.pre = spm ? "default" : pre.empty() ? detect_pre(t.value("pre_tokenizer", json())) : pre;
    if (s.pre.empty())
      throw failure(errc::unsupported, "'" + path +
                                           "': its pre-tokenizer is not one tandem recognises (Llama 3's, "
                                           "Qwen 2's, GPT-2's): name it with --pre");
    // id -> text over the model's vocab and the added tokens.
    std::map<int64_t, std::pair<std::string, int32_t>> by_id;  // id -> (text, type)
    for (const auto& [text, id] : model.at("vocab").items())
      by_id[id.get<int64_t>()] = {text, spm && detail::parse_byte_token(text) >= 0 ? 6 : 1};
    const std::string unk =
        model.contains("unk_token") && model["unk_token"].is_string() ? model["unk_token"].get<std::string>() : "";
    for (const auto& a : t.value("added_tokens", json::array())) {
      const std::string text = a.at("content").get<std::string>();
      by_id[a.at("id").get<int64_t>()] = {text, spm && text == unk ? 2 : a.value("special", false) ? 3 : 4};
    }
    if (by_id.empty() || by_id.begin()->first != 0 || by_id.rbegin()->first != int64_t(by_id.size()) - 1)
      throw failure(errc::malformed_file, "'" + path + "': token ids are not 0..n-1 without gaps");
    std::unordered_map<std::string, int64_t> id_by_text;
    for (auto& [id, e] : by_id) {
      s.tokens.push_back(e.first);
      s.token_types.push_back(e.second);
      id_by_text.emplace(e.first, id);
    }
    std::vector<std::pair<std::string, std::string>> merges;
    for (const auto& m : model.at("merges")) {  // "a b" (old format) or ["a", "b"]
      if (m.is_string()) {
        const std::string ab = m.get<std::string>();
        const size_t sp = ab.find(' ');
        if (sp == std::string::npos)
          throw failure(errc::malformed_file, "'" + path + "': merge '" + ab + "' has no space");
        merges.emplace_back(ab.substr(0, sp), ab.substr(sp + 1));
      } else {
        merges.emplace_back(m.at(0).get<std::string>(), m.at(1).get<std::string>());
      }
    }
    if (spm) {
      // SentencePiece keeps a score per piece, which tokenizer.json drops; its BPE ranks pieces by
      // score, and Hugging Face's converter writes the merges in that order. So a piece's score
      // is minus the rank of the first merge that makes it: merging the best-scored pair
      // (llama.cpp) then picks the merge of lowest rank (Hugging Face). Pieces no merge makes
      // (single characters, bytes, added tokens) score below every merge, as unreachable
      // ones should; control, unknown and byte tokens 0, as SentencePiece writes them.
      const float unreachable = -float(merges.size()) - 1.0f;
      s.scores.assign(s.tokens.size(), unreachable);
      for (size_t i = 0; i < s.tokens.size(); ++i)
        if (s.token_types[i] == 2 || s.token_types[i] == 3 || s.token_types[i] == 6) s.scores[i] = 0.0f;
      for (size_t r = merges.size(); r-- > 0;) {
        const auto it = id_by_text.find(merges[r].first + merges[r].second);
        if (it != id_by_text.end() && s.token_types[size_t(it->second)] == 1) s.scores[size_t(it->second)] = -float(r);
      }
    } else {
      for (const auto& [a, b] : merges) s.merges.push_back(a + " " + b);
    }
    auto id_of = [&](const std::string& text) -> token_id {
      if (text.empty()) return -1;
      const auto it = id_by_text.find(text);
      if (it != id_by_text.end()) return token_id(it->second);
      throw failure(errc::malformed_file, "'" + path + "': special token '" + text + "' is not in the vocabulary");
    };
    if (spm && !unk.empty()) s.unk_id = id_of(unk);
    // BOS/EOS as convert_hf_to_gguf (gguf-py's SpecialVocab) takes them: without a word from
    // the files, llama.cpp adds BOS for the Llama 3 pre-tokenizer only; a post-processor that
    // puts a special token first adds BOS (Llama 2's, Llama 3's); tokenizer_config.json's ids
    // and add_bos_token / add_eos_token have the last word (Phi-3's says false over Llama 2's
    // post-processor).
    s.add_bos = s.pre == "llama-bpe" || s.pre == "llama3";
    std::function<void(const json&)> scan = [&](const json& pp) {
      if (!pp.is_object()) return;
      if (pp.value("type", "") == "TemplateProcessing" && pp.contains("single") && !pp["single"].empty() &&
          pp["single"][0].contains("SpecialToken")) {
        s.add_bos = true;
        s.bos_id = id_of(pp["single"][0]["SpecialToken"].at("id").get<std::string>());
      }
      for (const auto& p : pp.value("processors", json::array())) scan(p);
    };
    scan(t.value("post_processor", json()));
    const auto cfg_path = std::filesystem::path(path).parent_path() / "tokenizer_config.json";
    if (std::filesystem::exists(cfg_path)) {
      const json cfg = read_json(cfg_path.string());
      if (cfg.contains("bos_token") && !cfg["bos_token"].is_null()) s.bos_id = id_of(token_text(cfg["bos_token"]));
      if (cfg.contains("eos_token") && !cfg["eos_token"].is_null()) s.eos_id = id_of(token_text(cfg["eos_token"]));
      if (cfg.contains("pad_token") && !cfg["pad_token"].is_null()) s.pad_id = id_of(token_text(cfg["pad_token"]));
      if (cfg.contains("add_bos_token") && cfg["add_bos_token"].is_boolean())
        s.add_bos = cfg["add_bos_token"].get<bool>();
      if (cfg.contains("add_eos_token") && cfg["add_eos_token"].is_boolean())
        s.add_eos = cfg["add_eos_token"].get<bool>();
    }
    // SentencePiece's dummy prefix ("▁" before the text) is the normalizer's Prepend (Llama 2's;
    // Gemma's normalizer only replaces spaces).
    s.add_space_prefix = false;
    std::function<void(const json&)> prepends = [&](const json& n) {
      if (!n.is_object()) return;
      if (n.value("type", "") == "Prepend" && n.value("prepend", "") == "\xE2\x96\x81") s.add_space_prefix = true;
      for (const auto& m : n.value("normalizers", json::array())) prepends(m);
    };
    if (spm) prepends(t.value("normalizer", json()));
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
