// `tandem bench grammar`: what constrained decoding costs on the step's critical path for one
// vocabulary, apart from the model: building the vocabulary trie, computing a state's token
// mask on a cache miss (cold) and on a hit (warm), and feeding a token to the matcher. Random
// walks through the grammar pick a random allowed token at each step, so they visit the states
// a model could; the second pass repeats the walks over the filled mask cache.
#include <algorithm>
#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>

#include "runtime/errors.h"
#include "runtime/structured/grammar.h"
#include "runtime/structured/json_schema.h"
#include "runtime/model/model.h"
#include "runtime/tokenizer/vocab_hf.h"
#include "runtime/model/synth.h"
#include "tools/commands.h"

namespace tandem::cli {
namespace {

// A nested schema (objects in arrays in objects, enums, anyOf, bounded strings).
const char* default_schema = R"({"type": "object", "properties": {
  "title": {"type": "string", "maxLength": 40}, "year": {"type": "integer"},
  "chapters": {"type": "array", "minItems": 2, "maxItems": 5, "items": {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 30}, "pages": {"type": "integer"},
    "people": {"type": "array", "maxItems": 3, "items": {"type": "object", "properties": {
      "name": {"type": "string", "maxLength": 20}, "role": {"enum": ["hero", "villain", "friend"]},
      "age": {"anyOf": [{"type": "integer"}, {"type": "null"}]}}, "required": ["name", "role"]}}},
    "required": ["name", "pages", "people"]}}},
  "required": ["title", "year", "chapters"]})";

struct options {
  std::string model, tokenizer_json, schema, grammar;
  int walks = 10, steps = 300;
  uint32_t seed = 1;
};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw failure(errc::io_error, "cannot read " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

double mean(const std::vector<double>& v) {
  double a = 0;
  for (double x : v) a += x;
  return v.empty() ? 0.0 : a / double(v.size());
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, size_t(p * double(v.size() - 1) + 0.5))];
}

void run(const options& o) {
  using clk = std::chrono::steady_clock;
  auto ms_since = [](clk::time_point t) { return std::chrono::duration<double, std::milli>(clk::now() - t).count(); };
  std::shared_ptr<const model> mdl;
  std::unique_ptr<tokenizer> own;
  const tokenizer* tok;
  if (!o.tokenizer_json.empty()) {
    own = std::make_unique<tokenizer>(vocab_from_tokenizer_json(o.tokenizer_json));
    tok = own.get();
  } else {
    mdl = model::load(o.model.empty() ? bench_model_path() : resolve_model_path(o.model));
    tok = &mdl->tok();
  }
  const std::string gbnf = !o.grammar.empty()
                               ? read_file(o.grammar)
                               : json_schema_to_gbnf(nlohmann::ordered_json::parse(
                                     o.schema.empty() ? std::string(default_schema) : read_file(o.schema)));
  auto t = clk::now();
  const auto trie = tok->vocab_trie();
  const double trie_ms = ms_since(t);
  t = clk::now();
  const auto g = grammar::compile(gbnf);
  const double compile_ms = ms_since(t);
  spdlog::info(
      "vocabulary {} tokens: trie of {} nodes built in {:.1f} ms; grammar of {} rules, {} elements compiled in "
      "{:.2f} ms",
      tok->n_vocab(), trie->nodes.size(), trie_ms, g->rules(), g->elements(), compile_ms);
  for (int pass = 0; pass < 2; ++pass) {
    std::vector<double> mask_ms, accept_us;
    int finished = 0;
    for (int w = 0; w < o.walks; ++w) {
      grammar_matcher m(g, trie);
      std::mt19937 rng(o.seed + uint32_t(w));
      for (int s = 0; s < o.steps; ++s) {
        t = clk::now();
        const auto mask = m.allowed();
        mask_ms.push_back(ms_since(t));
        std::vector<token_id> ok;
        for (token_id id = 0; id < tok->n_vocab(); ++id)
          if (mask_allows(*mask, id)) ok.push_back(id);
        const token_id next = ok[rng() % ok.size()];
        if (tok->is_eog(next)) {
          ++finished;
          break;
        }
        t = clk::now();
        m.accept(next);
        accept_us.push_back(ms_since(t) * 1000.0);
      }
    }
    spdlog::info(
        "{} pass: {} steps over {} walks ({} ended); mask {:.4f} ms mean, p50 {:.4f}, p99 {:.3f}, max {:.3f}; "
        "accept {:.2f} us mean",
        pass == 0 ? "cold" : "warm", mask_ms.size(), o.walks, finished, mean(mask_ms), percentile(mask_ms, 0.5),
        percentile(mask_ms, 0.99), percentile(mask_ms, 1.0), mean(accept_us));
  }
}

}  // namespace

void add_bench_grammar(CLI::App* bench) {
  auto o = std::make_shared<options>();
  auto* c =
      bench->add_subcommand("grammar", "Constrained decoding's cost per step for a vocabulary (masks, cold and warm)");
  c->add_option("-m,--model", o->model,
                "GGUF model whose vocabulary to use, or synth:PRESET[:DTYPE] (default: synth:bench-76m)");
  c->add_option("--tokenizer-json", o->tokenizer_json, "A Hugging Face tokenizer.json instead of a model");
  c->add_option("--schema", o->schema, "JSON Schema file (default: a built-in nested schema)");
  c->add_option("--grammar", o->grammar, "GBNF grammar file instead of a schema");
  c->add_option("--walks", o->walks, "Random walks per pass")->capture_default_str()->check(CLI::Range(1, 100000));
  c->add_option("--steps", o->steps, "Steps per walk at most")->capture_default_str()->check(CLI::Range(1, 100000));
  c->add_option("--seed", o->seed, "Seed of the first walk")->capture_default_str();
  c->callback([o] { run(*o); });  // a failure (bad file, schema) reaches main's handler
}

}  // namespace tandem::cli
