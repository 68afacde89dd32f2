// GGUF files with the tokenizer metadata of real published files (Qwen 2.5 and Qwen 3:
// add_bos_token false with a BOS id set; Phi-3 in Microsoft's conversion, add_bos_token true and
// general.name "Phi3", and in a newer one, false; Llama 3.2 and Gemma 3: true), their real
// vocabularies and chat templates, against llama.cpp (tests/data/files/reference.json, written
// by tools/scripts/make_file_fixtures.py). Every expectation is llama.cpp's; the file's metadata
// decides BOS, and no test names it:
//  - the tokenizer, and the request path every front end shares (pipeline's prompt_ids), give
//    llama-server's /tokenize ids for raw prompts (control tokens parsed, and kept as text when
//    asked) and for conversations rendered by the file's template (llama-server's
//    /apply-template text, tokenized as its chat endpoint does);
//  - the greedy continuation of a raw prompt, teacher-forced, gives llama.cpp's top-8
//    log-probabilities;
//  - `tandem generate` prefills those ids, and tandem serve's /v1/completions and
//    /v1/chat/completions prefill them too (return_token_ids; usage.prompt_tokens as
//    llama-server's).
#include <gtest/gtest.h>

#include <boost/asio.hpp>
#include <boost/beast.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "actors/pipeline.h"
#include "runtime/text/chat_template.h"
#include "runtime/engine/engine.h"
#include "runtime/model/model.h"
#include "runtime/model/synth.h"
#include "runtime/tokenizer/vocab_hf.h"
#include "tests/conformance_support.h"
#include "tools/server/http_server.h"

using namespace tandem;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

json read_json(const fs::path& p) {
  std::ifstream in(p);
  if (!in) throw std::runtime_error("cannot read " + p.string());
  return json::parse(in);
}

const json& reference() {
  static const json r = read_json(fs::path(TANDEM_TEST_DATA_DIR) / "files" / "reference.json");
  return r;
}

const json& file_case(const std::string& name) {
  for (const auto& f : reference()["files"])
    if (f["name"] == name) return f;
  throw std::runtime_error("no reference for file " + name);
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The folder convert_hf_to_gguf.py would read for this file (as the fixture script writes it):
// the package's tokenizer.json with the file's added tokens, and a tokenizer_config.json with
// the file's BOS/EOS/padding, add_bos_token/add_eos_token and chat template.
std::string prepare(const json& f, const fs::path& dir) {
  const fs::path src = fs::path(TANDEM_VOCAB_PACKAGES) / f["package"].get<std::string>() / "models";
  if (!fs::exists(src / "tokenizer.json"))
    throw std::runtime_error((src / "tokenizer.json").string() +
                             " is missing: ctest's vocab_packages fixture installs it");
  json tj = read_json(src / "tokenizer.json");
  for (const auto& a : f["added"])
    tj["added_tokens"].push_back({{"id", a[0]},
                                  {"content", a[1]},
                                  {"single_word", false},
                                  {"lstrip", false},
                                  {"rstrip", false},
                                  {"normalized", false},
                                  {"special", true}});
  json cfg = read_json(src / "tokenizer_config.json");
  for (const char* k : {"bos_token", "eos_token", "pad_token", "add_bos_token", "add_eos_token"}) cfg.erase(k);
  cfg.update(f["config"]);
  cfg["chat_template"] = read_text(fs::path(TANDEM_TEST_DATA_DIR) / "templates" / f["template"].get<std::string>());
  fs::create_directories(dir);
  std::ofstream(dir / "tokenizer.json") << tj.dump();
  std::ofstream(dir / "tokenizer_config.json") << cfg.dump();
  return (dir / "tokenizer.json").string();
}

struct real_file {
  std::string path;
  std::shared_ptr<const model> m;
};

// Each file made as the fixture script made it, once for all the test processes (ctest runs
// each case in its own): named by its description, written atomically (synthesize_model renames
// into place), so a process finds it whole or makes it.
const real_file& file_of(const std::string& name) {
  static std::mutex mu;
  static std::map<std::string, real_file> made;
  std::lock_guard<std::mutex> lk(mu);
  if (auto it = made.find(name); it != made.end()) return it->second;
  const json& f = file_case(name);
  const json& syn = reference()["synth"];
  const fs::path shared = fs::temp_directory_path() / "tandem-test-files";
  char key[32];
  std::snprintf(key, sizeof key, "%016zx", std::hash<std::string>{}(f.dump() + syn.dump()));
  const std::string path = (shared / (name + "-" + key + ".gguf")).string();
  if (!fs::exists(path)) {
    const fs::path dir = shared / (name + "-" + key + "-" + std::to_string(::getpid()));
    const std::string tj = prepare(f, dir);
    synth_options opts{*find_architecture(f["arch"].get<std::string>()), syn["output_scale"].get<float>(),
                       vocab_from_tokenizer_json(tj), chat_template_beside(tj), f["general_name"].get<std::string>()};
    synthesize_model(find_synth_preset(syn["preset"]), *kernels::dtype_from_name(syn["dtype"].get<std::string>()), path,
                     syn["seed"].get<uint64_t>(), opts);
    fs::remove_all(dir);
  }
  return made[name] = {path, model::load(path)};
}

std::vector<token_id> ids_of(const json& j) { return j.get<std::vector<token_id>>(); }

std::vector<chat_message> messages_of(const json& c) {
  std::vector<chat_message> msgs;
  for (const auto& m : c["messages"]) msgs.push_back({m["role"], m["content"]});
  return msgs;
}

std::shared_ptr<const chat_template> template_of(const model& m) {
  return std::make_shared<const chat_template>(
      chat_template::for_vocab(m.file().get_string("tokenizer.chat_template", ""), m.tok()));
}

class RealFile : public ::testing::TestWithParam<std::string> {};

std::vector<std::string> file_names() {
  std::vector<std::string> v;
  for (const auto& f : reference()["files"]) v.push_back(f["name"]);
  return v;
}

}  // namespace

TEST_P(RealFile, TokenizesRawPromptsAsLlamaCpp) {
  const json& f = file_case(GetParam());
  const tokenizer& tok = file_of(GetParam()).m->tok();
  ASSERT_GE(f["raw"].size(), 5u);
  for (const auto& c : f["raw"]) {
    const std::string text = c["text"];
    EXPECT_EQ(ids_of(c["ids"]).size(), c["completions_prompt_tokens"].get<size_t>())
        << "llama-server's /tokenize and /v1/completions agree: " << text;
    EXPECT_EQ(tok.encode(text, true, true), ids_of(c["ids"])) << GetParam() << " '" << text << "'";
    EXPECT_EQ(tok.encode(text, true, false), ids_of(c["ids_literal"])) << GetParam() << " literal '" << text << "'";
    // The request path of the pipeline, the HTTP and WebSocket APIs and `generate`: a raw prompt
    // by default, and with control-token text asked to stay text.
    EXPECT_EQ(prompt_ids(tok, generation_request{.prompt = text}), ids_of(c["ids"])) << text;
    EXPECT_EQ(prompt_ids(tok, generation_request{.prompt = text, .parse_special = false}), ids_of(c["ids_literal"]))
        << text;
    // pipeline::submit's override of the file's BOS: llama.cpp's ids with BOS put in front
    // where they had none, or taken off where the file added it.
    auto with_bos = ids_of(c["ids"]), without_bos = with_bos;
    if (tok.file_specials().bos) without_bos.erase(without_bos.begin());
    else if (tok.bos() >= 0) with_bos.insert(with_bos.begin(), tok.bos());
    if (tok.bos() >= 0) {
      EXPECT_EQ(prompt_ids(tok, generation_request{.prompt = text, .add_bos = true}), with_bos) << text;
    }
    EXPECT_EQ(prompt_ids(tok, generation_request{.prompt = text, .add_bos = false}), without_bos) << text;
    // add_special false (no EOS is added by any of these files either): none.
    EXPECT_EQ(prompt_ids(tok, generation_request{.prompt = text, .add_special = false}), without_bos) << text;
  }
}

TEST_P(RealFile, ChatPromptsAsLlamaServer) {
  const json& f = file_case(GetParam());
  const model& m = *file_of(GetParam()).m;
  const auto tmpl = template_of(m);
  ASSERT_TRUE(tmpl->uses_jinja()) << tmpl->describe();
  ASSERT_GE(f["chat"].size(), 2u);
  for (const auto& c : f["chat"]) {
    generation_request req;
    ASSERT_TRUE(tmpl->render(messages_of(c), req.prompt, &req.literal_ranges).ok());
    EXPECT_EQ(req.prompt, c["prompt"].get<std::string>());
    EXPECT_EQ(prompt_ids(m.tok(), req), ids_of(c["ids"])) << req.prompt;
    EXPECT_EQ(ids_of(c["ids"]).size(), c["chat_prompt_tokens"].get<size_t>()) << "llama-server's chat endpoint agrees";
    const auto ids = ids_of(c["ids"]);
    EXPECT_LE(std::count(ids.begin(), ids.end(), m.tok().bos()), 1) << "at most one BOS";
  }
}

TEST_P(RealFile, GreedyContinuationEqualsLlamaCpp) {
  const json& f = file_case(GetParam());
  const auto& m = file_of(GetParam()).m;
  const json& g = f["greedy"];
  const auto ids = prompt_ids(m->tok(), generation_request{.prompt = g["text"].get<std::string>()});
  ASSERT_EQ(ids, ids_of(g["ids"]));
  std::set<token_id> banned;
  for (const auto& b : f["banned"]) banned.insert(b.get<token_id>());
  engine eng(m, engine_options{.n_threads = 2, .n_kv_blocks = 16, .kv_dtype = kernels::dtype::f32});
  const seq_id s = eng.create_sequence();
  std::vector<float> logits;
  ASSERT_TRUE(eng.prefill(s, ids, logits).ok());
  // Q8_0 with x quantized as ggml does; Gemma 3's GELU llama.cpp reads from a table of f16 values
  // (tests/test_real_vocab has the same tolerances).
  const float tol = f["arch"] == "gemma3" ? 0.3f : 0.05f;
  const auto r = testing_support::teacher_force(eng, s, logits, g["steps"], banned, tol, 2 * tol, GetParam());
  EXPECT_GE(r.steps, 8);
  EXPECT_GE(r.clear, r.steps / 3) << "enough choices are clear to compare";
}

// `tandem generate` (the binary) prefills llama.cpp's ids and starts as llama.cpp does.
TEST_P(RealFile, GenerateCommandPrefillsLlamaCppIds) {
  const json& f = file_case(GetParam());
  const real_file& rf = file_of(GetParam());
  const json& g = f["greedy"];
  const fs::path out = fs::path(rf.path).parent_path() / ("generate-" + std::to_string(::getpid()) + ".json");
  const std::string cmd = std::string(TANDEM_BINARY) + " generate --model '" + rf.path +
                          "' --prompt \"$TANDEM_PROMPT\" -n 4" + " --temperature 0 --threads 2 --json > '" +
                          out.string() + "' 2>/dev/null";
  ASSERT_EQ(::setenv("TANDEM_PROMPT", g["text"].get<std::string>().c_str(), 1), 0);
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const json j = read_json(out);
  fs::remove(out);
  EXPECT_EQ(ids_of(j["prompt_token_ids"]), ids_of(g["ids"]));
  std::set<token_id> banned;
  for (const auto& b : f["banned"]) banned.insert(b.get<token_id>());
  const token_id first = j["token_ids"].at(0);
  // llama.cpp chose among the tokens it could print; where tandem's choice is one, they agree.
  if (!banned.count(first)) {
    EXPECT_EQ(first, g["steps"][0]["id"].get<token_id>());
  }
}

// tandem serve prefills what llama-server prefills: raw prompts on /v1/completions, with
// control tokens parsed and (parse_special false) kept as text; conversations on
// /v1/chat/completions through the file's template.
TEST_P(RealFile, ServerPrefillsWhatLlamaServerDoes) {
  namespace beast = boost::beast;
  namespace http = beast::http;
  namespace net = boost::asio;
  const json& f = file_case(GetParam());
  const auto& m = file_of(GetParam()).m;
  serving_config pc;
  pc.model.loaded = m;
  pc.pools.kv_blocks_per_worker = 64;
  pipeline pipe(pc);
  server::served_model sm{"real", m->config().n_ctx, template_of(*m), m->config().n_vocab};
  server::server_config sc;
  sc.port = 0;
  server::http_server srv(pipe, sm, sc);
  std::thread runner([&] { srv.run(); });
  auto post = [&](const std::string& target, const json& body) {
    net::io_context io;
    net::ip::tcp::socket sock(io);
    sock.connect({net::ip::make_address("127.0.0.1"), srv.port()});
    http::request<http::string_body> req{http::verb::post, target, 11};
    req.set(http::field::host, "127.0.0.1");
    req.set(http::field::content_type, "application/json");
    req.body() = body.dump();
    req.prepare_payload();
    http::write(sock, req);
    beast::flat_buffer buf;
    http::response<http::string_body> res;
    http::read(sock, buf, res);
    EXPECT_EQ(res.result_int(), 200) << res.body();
    return json::parse(res.body(), nullptr, false);
  };
  for (const auto& c : f["raw"]) {
    const json body = {{"prompt", c["text"]}, {"max_tokens", 1}, {"temperature", 0}, {"return_token_ids", true}};
    const json r = post("/v1/completions", body);
    EXPECT_EQ(ids_of(r["choices"][0]["prompt_token_ids"]), ids_of(c["ids"])) << c["text"];
    EXPECT_EQ(r["usage"]["prompt_tokens"], c["completions_prompt_tokens"]) << c["text"];
    // A one-text array is the same prompt; token ids are taken as they are (no BOS added).
    json array = body;
    array["prompt"] = json::array({c["text"]});
    EXPECT_EQ(ids_of(post("/v1/completions", array)["choices"][0]["prompt_token_ids"]), ids_of(c["ids"])) << c["text"];
    json ids = body;
    ids["prompt"] = c["ids_literal"];
    EXPECT_EQ(ids_of(post("/v1/completions", ids)["choices"][0]["prompt_token_ids"]), ids_of(c["ids_literal"]));
    json literal = body;
    literal["parse_special"] = false;
    EXPECT_EQ(ids_of(post("/v1/completions", literal)["choices"][0]["prompt_token_ids"]), ids_of(c["ids_literal"]))
        << c["text"];
  }
  for (const auto& c : f["chat"]) {
    const json r =
        post("/v1/chat/completions",
             {{"messages", c["messages"]}, {"max_tokens", 1}, {"temperature", 0}, {"return_token_ids", true}});
    EXPECT_EQ(ids_of(r["prompt_token_ids"]), ids_of(c["ids"])) << c["prompt"];
    EXPECT_EQ(r["usage"]["prompt_tokens"], c["chat_prompt_tokens"]);
  }
  // The WebSocket API: a raw prompt (parsed, and literal) and a conversation; its done frame's
  // usage counts the prompt's tokens.
  {
    namespace websocket = beast::websocket;
    net::io_context io;
    websocket::stream<net::ip::tcp::socket> ws(io);
    ws.next_layer().connect({net::ip::make_address("127.0.0.1"), srv.port()});
    ws.handshake("127.0.0.1", "/ws");
    auto prompt_tokens = [&](json frame) {
      frame["type"] = "generate";
      frame["id"] = "w";
      frame["max_tokens"] = 1;
      ws.write(net::buffer(frame.dump()));
      for (;;) {
        beast::flat_buffer b;
        ws.read(b);
        const json ev = json::parse(beast::buffers_to_string(b.data()));
        if (ev["type"] == "done") return ev["usage"]["prompt_tokens"].get<size_t>();
        if (ev["type"] == "error") {
          ADD_FAILURE() << ev.dump();
          return size_t(0);
        }
      }
    };
    for (const auto& c : f["raw"]) {
      EXPECT_EQ(prompt_tokens({{"prompt", c["text"]}}), c["ids"].size()) << c["text"];
      EXPECT_EQ(prompt_tokens({{"prompt", c["text"]}, {"parse_special", false}}), c["ids_literal"].size()) << c["text"];
    }
    EXPECT_EQ(prompt_tokens({{"messages", f["chat"][0]["messages"]}}), f["chat"][0]["ids"].size());
    ws.close(websocket::close_code::normal);
  }
  srv.stop();
  runner.join();
}

INSTANTIATE_TEST_SUITE_P(Files, RealFile, ::testing::ValuesIn(file_names()), [](const auto& info) {
  std::string n = info.param;
  for (char& ch : n)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return n;
});
