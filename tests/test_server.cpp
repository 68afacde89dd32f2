// tandem serve end to end, in process: a pipeline on the tiny synthetic model behind the real
// HTTP/WebSocket server on a free loopback port, driven by plain Beast clients.
#include <gtest/gtest.h>

#include <boost/asio.hpp>
#include <boost/beast.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "tests/support/eventually.h"
#include "tests/test_models.h"
#include "tools/server/http_server.h"

using namespace tandem;
using testing_support::eventually;
using namespace std::chrono_literals;
namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using json = nlohmann::json;

namespace {

std::shared_ptr<const model> tiny() {
  static const std::shared_ptr<const model> m = testing_support::tiny_model("server");
  return m;
}

// A model with a context long enough for a tools prompt (1024), with Qwen 3's chat template.
std::shared_ptr<const model> small() {
  static const std::shared_ptr<const model> m = [] {
    const auto p = std::filesystem::temp_directory_path() / "tandem-test-models" / "server-small-f32.gguf";
    std::filesystem::create_directories(p.parent_path());
    if (!std::filesystem::exists(p)) synthesize_model(find_synth_preset("small"), kernels::dtype::f32, p.string(), 7);
    return model::load(p.string());
  }();
  return m;
}
std::shared_ptr<const chat_template> qwen3_template(const tokenizer& tok) {
  std::ifstream in(std::string(TANDEM_TEST_DATA_DIR) + "/templates/qwen3.jinja");
  std::stringstream ss;
  ss << in.rdbuf();
  return std::make_shared<const chat_template>(chat_template::for_vocab(ss.str(), tok));
}

struct reply {
  int status = 0;
  std::string body;
  std::string retry_after;
};

class ServerTest : public ::testing::Test {
 protected:
  std::unique_ptr<pipeline> pipe;
  std::unique_ptr<server::http_server> srv;
  std::thread runner;
  uint16_t port = 0;

  void start(server::server_config sc = {}, serving_config pc = {}, std::shared_ptr<const model> m = nullptr,
             std::shared_ptr<const chat_template> chat = nullptr) {
    if (!m) m = tiny();
    pc.model.loaded = m;
    pc.pools.kv_blocks_per_worker = 256;
    pipe = std::make_unique<pipeline>(pc);
    server::served_model sm{"tiny", m->config().n_ctx, std::move(chat), m->config().n_vocab};
    sc.port = 0;
    srv = std::make_unique<server::http_server>(*pipe, sm, sc);
    port = srv->port();
    runner = std::thread([this] { srv->run(); });
  }
  void TearDown() override {
    if (srv) srv->stop();
    if (runner.joinable()) runner.join();
    srv.reset();
    pipe.reset();
  }

  reply request(http::verb verb, const std::string& target, const std::string& body = "",
                const std::string& auth = "") {
    net::io_context ioc;
    beast::tcp_stream s(ioc);
    s.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port));
    http::request<http::string_body> req(verb, target, 11);
    req.set(http::field::host, "localhost");
    if (!auth.empty()) req.set(http::field::authorization, "Bearer " + auth);
    if (!body.empty()) {
      req.set(http::field::content_type, "application/json");
      req.body() = body;
    }
    req.prepare_payload();
    http::write(s, req);
    beast::flat_buffer buf;
    http::response_parser<http::string_body> p;
    p.body_limit(64 << 20);
    http::read(s, buf, p);
    reply r;
    r.status = p.get().result_int();
    r.body = p.get().body();
    r.retry_after = std::string(p.get()[http::field::retry_after]);
    beast::error_code ec;
    s.socket().shutdown(tcp::socket::shutdown_both, ec);
    return r;
  }

  // What the pipeline alone answers for the same request (the reference).
  std::string direct(const std::string& prompt, int32_t max_tokens, sampling_params sp) {
    return pipe->submit({.prompt = prompt, .max_tokens = max_tokens, .sampling = sp}).wait(30s).text;
  }

  // Kv pools full again and no request actor alive.
  void expect_clean() {
    pipeline_stats st;
    EXPECT_TRUE(eventually([&] {
      st = pipe->stats();
      bool clean = st.live_requests == 0;
      for (const auto& w : st.workers) clean = clean && w.kv_free_blocks == w.kv_total_blocks && w.reserved_blocks == 0;
      return clean;
    })) << "requests or KV blocks still held: " << st.live_requests << " live requests";
  }
};

std::vector<json> sse_events(const std::string& body, bool& done) {
  std::vector<json> out;
  done = false;
  size_t pos = 0;
  while ((pos = body.find("data: ", pos)) != std::string::npos) {
    const size_t end = body.find("\n\n", pos);
    const std::string data = body.substr(pos + 6, end - pos - 6);
    pos = end;
    if (data == "[DONE]") {
      done = true;
      break;
    }
    out.push_back(json::parse(data));
  }
  return out;
}

}  // namespace

TEST_F(ServerTest, HealthModelsAndMetrics) {
  start();
  reply h;
  EXPECT_TRUE(eventually([&] {  // ready once the workers have joined
    h = request(http::verb::get, "/health");
    return h.status == 200;
  })) << "/health never said ready";
  EXPECT_EQ(h.status, 200) << h.body;
  EXPECT_EQ(json::parse(h.body)["status"], "ok");
  auto m = request(http::verb::get, "/v1/models");
  ASSERT_EQ(m.status, 200);
  EXPECT_EQ(json::parse(m.body)["data"][0]["id"], "tiny");
  auto page = request(http::verb::get, "/");
  EXPECT_EQ(page.status, 200);
  EXPECT_NE(page.body.find("WebSocket"), std::string::npos);
  EXPECT_EQ(request(http::verb::get, "/dashboard").status, 200);
  (void)request(http::verb::post, "/v1/completions", R"({"model":"tiny","prompt":"hi","max_tokens":3})");
  auto metrics = request(http::verb::get, "/metrics");
  EXPECT_EQ(metrics.status, 200);
  EXPECT_NE(metrics.body.find("tandem_requests_total"), std::string::npos);
}

TEST_F(ServerTest, CompletionsEqualThePipelineGreedyAndSeeded) {
  start();
  for (const auto& [temp, seed] : std::vector<std::pair<double, int>>{{0.0, 0}, {0.9, 1234}}) {
    // top_k and top_p left out: the one set of defaults (sampling_params'), as tandem generate.
    json body = {{"model", "tiny"}, {"prompt", "Once upon a time"}, {"max_tokens", 12}, {"temperature", temp},
                 {"seed", seed}, {"ignore_eos", true}};
    auto r = request(http::verb::post, "/v1/completions", body.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    const json j = json::parse(r.body);
    sampling_params sp{.temperature = float(temp), .seed = uint64_t(seed)};
    const std::string want = pipe->submit({.prompt = "Once upon a time", .max_tokens = 12, .sampling = sp, .ignore_eos = true})
                                 .wait(30s)
                                 .text;
    EXPECT_EQ(j["choices"][0]["text"].get<std::string>(), want);
    EXPECT_EQ(j["object"], "text_completion");
    EXPECT_EQ(j["usage"]["completion_tokens"], 12);
    EXPECT_EQ(j["choices"][0]["finish_reason"], "length");

    // The same request streamed: the deltas add up to the same text, then usage, then [DONE].
    body["stream"] = true;
    body["stream_options"] = {{"include_usage", true}};
    auto s = request(http::verb::post, "/v1/completions", body.dump());
    ASSERT_EQ(s.status, 200);
    bool done = false;
    const auto events = sse_events(s.body, done);
    EXPECT_TRUE(done);
    std::string text;
    bool usage = false;
    int token_chunks = 0;
    for (const auto& e : events) {
      if (e.contains("usage")) usage = e["usage"]["completion_tokens"] == 12;
      if (!e["choices"].empty()) text += e["choices"][0]["text"].get<std::string>();
      if (!e["choices"].empty() && e["choices"][0]["finish_reason"].is_null()) ++token_chunks;
    }
    EXPECT_TRUE(usage);
    EXPECT_EQ(token_chunks, 12) << "one chunk per token, empty texts included";
    EXPECT_EQ(text, want);
  }
  expect_clean();
}

// n > 1: choices with derived seeds (choice 0 is the n = 1 answer), the prompt computed once
// (the other choices start from its blocks), usage counting the prompt once; streamed, every
// chunk names its choice and each choice gets its finish chunk.
TEST_F(ServerTest, NChoicesShareOnePrefill) {
  start();
  auto computed = [&] {
    const auto m = request(http::verb::get, "/metrics").body;
    const auto at = m.find("\ntandem_prompt_tokens_computed_total ");
    return at == std::string::npos ? -1.0 : std::stod(m.substr(at + 37));
  };
  const std::string prompt = "Once upon a time there was a little girl who loved to play in the park";
  json body = {{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 10}, {"temperature", 2.0}, {"seed", 77},
               {"ignore_eos", true}};
  auto one = request(http::verb::post, "/v1/completions", body.dump());
  ASSERT_EQ(one.status, 200) << one.body;
  const json j1 = json::parse(one.body);
  const double before = computed();
  body["n"] = 3;
  auto three = request(http::verb::post, "/v1/completions", body.dump());
  ASSERT_EQ(three.status, 200) << three.body;
  const double after = computed();
  const json j3 = json::parse(three.body);
  ASSERT_EQ(j3["choices"].size(), 3u);
  std::set<std::string> texts;
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(j3["choices"][i]["index"], i);
    EXPECT_EQ(j3["choices"][i]["finish_reason"], "length");
    texts.insert(j3["choices"][i]["text"].get<std::string>());
  }
  EXPECT_EQ(j3["choices"][0]["text"], j1["choices"][0]["text"]);  // choice 0: the request's own seed
  EXPECT_GE(texts.size(), 2u) << three.body;                       // the others: their own seeds
  const int prompt_tokens = j1["usage"]["prompt_tokens"].get<int>();
  EXPECT_EQ(j3["usage"]["prompt_tokens"], prompt_tokens);
  EXPECT_EQ(j3["usage"]["completion_tokens"], 30);
  EXPECT_EQ(j3["usage"]["total_tokens"], prompt_tokens + 30);
  // The whole prompt the first time (the n = 1 request's blocks may serve it: at most once),
  // then only what is past the last full block, per extra choice.
  EXPECT_LE(after - before, double(prompt_tokens) + 2 * 16) << "the prompt was computed more than once";

  json streamed = body;
  streamed["n"] = 2;
  streamed["stream"] = true;
  streamed["stream_options"] = {{"include_usage", true}};
  auto s = request(http::verb::post, "/v1/completions", streamed.dump());
  ASSERT_EQ(s.status, 200);
  bool done = false;
  std::map<int, std::string> text;
  std::map<int, int> finishes;
  json usage;
  for (const auto& e : sse_events(s.body, done)) {
    if (e.contains("usage") && !e["usage"].is_null()) usage = e["usage"];
    for (const auto& c : e["choices"]) {
      text[c["index"].get<int>()] += c["text"].get<std::string>();
      if (!c["finish_reason"].is_null()) ++finishes[c["index"].get<int>()];
    }
  }
  EXPECT_TRUE(done);
  EXPECT_EQ(finishes, (std::map<int, int>{{0, 1}, {1, 1}}));
  EXPECT_EQ(text[0], j3["choices"][0]["text"]);
  EXPECT_EQ(text[1], j3["choices"][1]["text"]);
  EXPECT_EQ(usage["completion_tokens"], 20);
  expect_clean();
}

// best_of: of that many choices, the n likeliest (mean log-probability per token), renumbered;
// the same seeds as n = best_of, so they are exactly the best of those.
TEST_F(ServerTest, BestOfReturnsTheLikeliestChoices) {
  start();
  json body = {{"model", "tiny"}, {"prompt", "Once upon a time"}, {"max_tokens", 8}, {"temperature", 2.0},
               {"seed", 5}, {"ignore_eos", true}, {"n", 4}, {"logprobs", 0}};
  auto all = request(http::verb::post, "/v1/completions", body.dump());
  ASSERT_EQ(all.status, 200) << all.body;
  std::vector<std::pair<double, std::string>> ranked;
  const json choices = json::parse(all.body)["choices"];
  for (const auto& c : choices) {
    double sum = 0;
    for (const auto& l : c["logprobs"]["token_logprobs"]) sum += l.get<double>();
    ranked.emplace_back(sum / 8, c["text"].get<std::string>());
  }
  std::stable_sort(ranked.begin(), ranked.end(), [](auto& a, auto& b) { return a.first > b.first; });
  body.erase("logprobs");
  body["n"] = 2;
  body["best_of"] = 4;
  auto best = request(http::verb::post, "/v1/completions", body.dump());
  ASSERT_EQ(best.status, 200) << best.body;
  const json j = json::parse(best.body);
  ASSERT_EQ(j["choices"].size(), 2u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(j["choices"][i]["index"], i);
    EXPECT_EQ(j["choices"][i]["text"], ranked[size_t(i)].second);
    EXPECT_TRUE(j["choices"][i]["logprobs"].is_null());  // ranked by them, not asked for
  }
  EXPECT_EQ(j["usage"]["completion_tokens"], 32);  // all four were generated
  body["stream"] = true;
  auto streamed = request(http::verb::post, "/v1/completions", body.dump());
  EXPECT_EQ(streamed.status, 400);
  expect_clean();
}

// tools: the template gets them; tool_choice "required" and a named function force one valid
// call (the random model would never write one), read back into tool_calls, streamed as a
// tool_calls delta; auto leaves the model free; earlier calls and tool results render; what
// cannot work is a 400 naming the field.
TEST_F(ServerTest, ToolCallsAreForcedReadAndStreamed) {
  start({}, {}, small(), qwen3_template(small()->tok()));
  const json tools = json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
      "properties": {"city": {"type": "string", "maxLength": 16}, "unit": {"enum": ["c", "f"]}}, "required": ["city", "unit"]}}},
    {"type": "function", "function": {"name": "add", "parameters": {"type": "object",
      "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}])");
  const json msgs = {{{"role", "user"}, {"content", "Weather in Paris?"}}};
  auto chat = [&](json body) {
    body["model"] = "tiny";
    if (!body.contains("messages")) body["messages"] = msgs;
    body["tools"] = tools;
    return request(http::verb::post, "/v1/chat/completions", body.dump());
  };
  for (int seed = 0; seed < 4; ++seed) {
    auto r = chat({{"tool_choice", "required"}, {"seed", seed}, {"temperature", 1.0}, {"max_tokens", 120}});
    ASSERT_EQ(r.status, 200) << r.body;
    const json j = json::parse(r.body);
    const auto& c = j["choices"][0];
    EXPECT_EQ(c["finish_reason"], "tool_calls") << r.body;
    ASSERT_EQ(c["message"]["tool_calls"].size(), 1u) << r.body;
    const auto& call = c["message"]["tool_calls"][0];
    EXPECT_EQ(call["type"], "function");
    EXPECT_FALSE(call["id"].get<std::string>().empty());
    const std::string name = call["function"]["name"];
    const json args = json::parse(call["function"]["arguments"].get<std::string>());
    if (name == "get_weather") {
      EXPECT_TRUE(args["city"].is_string() && (args["unit"] == "c" || args["unit"] == "f")) << args.dump();
    } else {
      EXPECT_EQ(name, "add");
      EXPECT_TRUE(args["a"].is_number_integer() && args["b"].is_number_integer()) << args.dump();
    }
  }
  auto named = chat({{"tool_choice", {{"type", "function"}, {"function", {{"name", "add"}}}}}, {"seed", 1}, {"max_tokens", 120}});
  ASSERT_EQ(named.status, 200) << named.body;
  EXPECT_EQ(json::parse(named.body)["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "add");
  auto free = chat({{"tool_choice", "auto"}, {"seed", 1}, {"max_tokens", 8}, {"ignore_eos", true}});
  ASSERT_EQ(free.status, 200) << free.body;
  {  // auto, streamed: an answer that is no call streams as content token by token, the same text
    auto fs = chat({{"tool_choice", "auto"}, {"seed", 1}, {"max_tokens", 8}, {"ignore_eos", true}, {"stream", true}});
    bool fdone = false;
    std::string text;
    int pieces = 0;
    for (const auto& e : sse_events(fs.body, fdone))
      if (!e["choices"].empty() && e["choices"][0]["delta"].contains("content") &&
          !e["choices"][0]["delta"]["content"].get<std::string>().empty()) {
        text += e["choices"][0]["delta"]["content"].get<std::string>();
        ++pieces;
      }
    const json whole = json::parse(free.body)["choices"][0]["message"];
    if (!whole.contains("tool_calls")) {
      EXPECT_EQ(text, whole["content"].get<std::string>());
      EXPECT_GT(pieces, 1) << fs.body;
    }
  }
  // Streamed: the role, then the call as a tool_calls delta, then finish "tool_calls".
  auto s = chat({{"tool_choice", "required"}, {"seed", 2}, {"max_tokens", 120}, {"stream", true}});
  ASSERT_EQ(s.status, 200);
  bool done = false;
  const auto events = sse_events(s.body, done);
  EXPECT_TRUE(done);
  // As OpenAI streams a call: a first delta with index, id, type and name (arguments ""), then
  // the arguments in pieces, which together are the JSON object.
  std::string finish, role, name, args;
  int call_deltas = 0;
  for (const auto& e : events) {
    const auto& c = e["choices"][0];
    if (c["delta"].contains("role")) role = c["delta"]["role"];
    if (c["delta"].contains("tool_calls")) {
      const auto& t = c["delta"]["tool_calls"][0];
      EXPECT_EQ(t["index"], 0);
      if (call_deltas++ == 0) {
        EXPECT_FALSE(t["id"].get<std::string>().empty());
        EXPECT_EQ(t["type"], "function");
        name = t["function"]["name"];
      } else {
        EXPECT_FALSE(t.contains("id"));
      }
      args += t["function"]["arguments"].get<std::string>();
    }
    if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
  }
  EXPECT_EQ(role, "assistant");
  EXPECT_EQ(finish, "tool_calls");
  EXPECT_TRUE(name == "get_weather" || name == "add") << name;
  EXPECT_GT(call_deltas, 2) << "the arguments come in pieces: " << s.body;
  EXPECT_TRUE(json::parse(args).is_object()) << args;
  // A second turn: the call and its result in the history.
  json turn = msgs;
  turn.push_back({{"role", "assistant"}, {"content", nullptr},
                  {"tool_calls", {{{"id", "c1"}, {"type", "function"},
                                   {"function", {{"name", "get_weather"}, {"arguments", R"({"city":"Paris","unit":"c"})"}}}}}}});
  turn.push_back({{"role", "tool"}, {"tool_call_id", "c1"}, {"content", "sunny, 21 C"}});
  auto second = chat({{"messages", turn}, {"max_tokens", 4}});
  EXPECT_EQ(second.status, 200) << second.body;
  // Refused, naming the field.
  auto refused = [&](json body, const std::string& target, const std::string& param) {
    auto r = request(http::verb::post, target, body.dump());
    EXPECT_EQ(r.status, 400) << body.dump() << " -> " << r.body;
    EXPECT_EQ(json::parse(r.body)["error"]["param"], param) << r.body;
  };
  const json base = {{"model", "tiny"}, {"messages", msgs}, {"tools", tools}};
  auto with = [&](json extra) {
    json b = base;
    b.update(extra);
    return b;
  };
  refused(with({{"tool_choice", {{"type", "function"}, {"function", {{"name", "rm"}}}}}}), "/v1/chat/completions",
          "tool_choice");
  refused(with({{"tool_choice", "sometimes"}}), "/v1/chat/completions", "tool_choice");
  refused(with({{"tools", {{{"type", "function"}, {"function", {{"name", "bad name!"}}}}}}}), "/v1/chat/completions",
          "tools");
  refused({{"model", "tiny"}, {"messages", msgs}, {"tool_choice", "required"}}, "/v1/chat/completions", "tool_choice");
  refused({{"model", "tiny"}, {"prompt", "x"}, {"tools", tools}}, "/v1/completions", "tools");
  refused(with({{"tool_choice", "required"}, {"response_format", {{"type", "json_object"}}}}),
          "/v1/chat/completions", "tool_choice");
  expect_clean();
}

// A model whose template has no tool-call format (here: none at all) refuses tools.
TEST_F(ServerTest, ToolsNeedATemplateThatTakesThem) {
  start();
  const json body = {{"model", "tiny"},
                     {"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                     {"tools", {{{"type", "function"}, {"function", {{"name", "f"}}}}}}};
  auto r = request(http::verb::post, "/v1/chat/completions", body.dump());
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_EQ(json::parse(r.body)["error"]["param"], "tools");
}

TEST_F(ServerTest, ChatCompletionsStreamAndStopStrings) {
  start();
  json body = {{"model", "tiny"}, {"messages", {{{"role", "user"}, {"content", "Hello"}}}}, {"max_tokens", 10},
               {"temperature", 0}, {"stream", true}};
  auto s = request(http::verb::post, "/v1/chat/completions", body.dump());
  ASSERT_EQ(s.status, 200) << s.body;
  bool done = false;
  const auto events = sse_events(s.body, done);
  ASSERT_TRUE(done);
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events.front()["object"], "chat.completion.chunk");
  EXPECT_EQ(events.front()["choices"][0]["delta"]["role"], "assistant");
  std::string text;
  for (const auto& e : events) text += e["choices"][0]["delta"].value("content", "");
  EXPECT_EQ(events.back()["choices"][0]["finish_reason"], "length");

  // A stop string taken from the middle of that answer ends it just before.
  if (text.size() >= 4) {
    const std::string stop = text.substr(text.size() / 2, 2);
    body["stream"] = false;
    body["stop"] = stop;
    auto r = request(http::verb::post, "/v1/chat/completions", body.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    const json j = json::parse(r.body);
    EXPECT_EQ(j["choices"][0]["message"]["content"].get<std::string>(), text.substr(0, text.find(stop)));
    EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  }
  expect_clean();
}

TEST_F(ServerTest, BadRequestsGetOpenAIErrors) {
  server::server_config sc;
  sc.max_body_bytes = 4096;
  start(sc);
  auto code = [&](const std::string& target, const std::string& body) {
    auto r = request(http::verb::post, target, body);
    const json j = json::parse(r.body, nullptr, false);
    EXPECT_TRUE(j.contains("error") && j["error"].contains("message")) << r.body;
    return r.status;
  };
  EXPECT_EQ(code("/v1/completions", "{not json"), 400);
  EXPECT_EQ(code("/v1/completions", R"({"model":"other","prompt":"x"})"), 400);
  EXPECT_EQ(code("/v1/completions", R"({"model":"tiny"})"), 400);
  EXPECT_EQ(code("/v1/completions", R"({"model":"tiny","prompt":"x","max_tokens":0})"), 400);
  EXPECT_EQ(code("/v1/completions", R"({"model":"tiny","prompt":"x","temperature":"hot"})"), 400);
  EXPECT_EQ(code("/v1/completions", R"({"model":"tiny","prompt":"\xff\xfe"})"), 400);
  EXPECT_EQ(code("/v1/chat/completions", R"({"model":"tiny","messages":[{"role":"robot","content":"x"}]})"), 400);
  const std::string long_prompt = json({{"model", "tiny"}, {"prompt", std::string(3000, 'a')}}).dump();
  EXPECT_EQ(code("/v1/completions", long_prompt), 400);  // longer than the tiny model's context
  EXPECT_EQ(code("/v1/completions", std::string(5000, ' ')), 413);
  EXPECT_EQ(request(http::verb::get, "/nope").status, 404);
  EXPECT_EQ(request(http::verb::get, "/v1/completions").status, 405);
  EXPECT_EQ(request(http::verb::get, "/admin/state").status, 404);  // off without --admin-key
  // Still serving everyone else.
  EXPECT_EQ(request(http::verb::post, "/v1/completions", R"({"model":"tiny","prompt":"ok","max_tokens":2})").status, 200);
  expect_clean();
}

// Issue 20: a parameter tandem does not implement is a 400 naming it, never a silent 200;
// at the value that asks for nothing it is accepted. `model` may be left out, and chat
// generates until the model stops or the context is full.
TEST_F(ServerTest, UnimplementedParametersAre400sNamingThem) {
  start();
  auto refused = [&](const std::string& target, json body, const std::string& param) {
    auto r = request(http::verb::post, target, body.dump());
    EXPECT_EQ(r.status, 400) << body.dump() << " -> " << r.body;
    const json j = json::parse(r.body, nullptr, false);
    EXPECT_EQ(j["error"]["param"], param) << r.body;
  };
  const json comp = {{"model", "tiny"}, {"prompt", "Once"}, {"max_tokens", 3}};
  const json chat = {{"model", "tiny"}, {"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"max_tokens", 3}};
  const std::vector<std::pair<std::string, json>> asks = {
      {"logprobs", 21}, {"logprobs", true}, {"echo", 1}, {"suffix", "end"}, {"best_of", 0}, {"best_of", 17},
      {"frequency_penalty", 2.5}, {"presence_penalty", -3}, {"repetition_penalty", 0}, {"repetition_penalty", 2.5},
      {"n", 0}, {"n", 17}, {"n", 1.5}, {"n", "2"},
      {"no_such_field", 1},
      // implemented, but checked: ids outside the vocabulary, biases outside [-100, 100]
      {"logit_bias", {{"999999", 1}}}, {"logit_bias", {{"x", 1}}}, {"logit_bias", {{"5", 101}}},
      {"stop_token_ids", {-1}}, {"min_tokens", -1}, {"min_tokens", 1.5},
      // the prompt's tokenization: booleans
      {"parse_special", "no"}, {"add_special_tokens", 0}, {"return_token_ids", "yes"}};
  for (const auto& [k, v] : asks) {
    json b = comp;
    b[k] = v;
    refused("/v1/completions", b, k);
  }
  for (const auto& [k, v] : std::vector<std::pair<std::string, json>>{
           {"logprobs", 2},
           {"top_logprobs", 3},  // without logprobs: true
           // structured outputs: implemented, but what cannot be honoured is refused
           {"response_format", {{"type", "json_schema"},
                                {"json_schema", {{"name", "x"}, {"schema", {{"type", "string"}, {"pattern", "a+"}}}}}}},
           {"response_format", {{"type", "xml"}}},
           {"response_format", {{"type", "json_object"}, {"strict", true}}},
           {"grammar", "root ::= undefined-rule"},
           {"grammar", 7},
           {"guided_choice", json::array()},
           {"guided_json", "{not json"},
           {"guided_regex", "a+"},
           {"tools", json::array({{{"type", "function"}, {"function", {{"name", "f"}}}}})},
           {"tool_choice", "required"},
           {"add_special_tokens", true},  // vLLM's chat field: the template places BOS here
           {"parse_special", false},      // a chat message's content is always text
           {"max_tokens_typo", 4}}) {
    json b = chat;
    b[k] = v;
    refused("/v1/chat/completions", b, k);
  }
  json so = comp;
  so["stream"] = true;
  so["stream_options"] = {{"include_usage", true}, {"continuous_usage_stats", true}};
  refused("/v1/completions", so, "stream_options");
  json ids_streamed = comp;
  ids_streamed.update({{"stream", true}, {"return_token_ids", true}});
  refused("/v1/completions", ids_streamed, "return_token_ids");

  // The values that ask for nothing pass, as OpenAI's clients send them.
  json quiet = chat;
  quiet.update({{"logprobs", false}, {"presence_penalty", 0}, {"frequency_penalty", 0}, {"logit_bias", json::object()},
                {"response_format", {{"type", "text"}}}, {"tool_choice", "none"}, {"tools", json::array()},
                {"n", 1}, {"user", "u-1"}, {"top_logprobs", nullptr}, {"add_special_tokens", false}});
  auto ok = request(http::verb::post, "/v1/chat/completions", quiet.dump());
  EXPECT_EQ(ok.status, 200) << ok.body;

  // No model named: the served one. Chat without max_tokens runs to the end (EOS or context),
  // not to 16 tokens.
  json nomodel = {{"messages", {{{"role", "user"}, {"content", "Once upon a time"}}}}, {"ignore_eos", true},
                  {"temperature", 0}};
  auto r = request(http::verb::post, "/v1/chat/completions", nomodel.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = json::parse(r.body);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_GT(j["usage"]["completion_tokens"].get<int>(), 16);
  EXPECT_EQ(j["usage"]["prompt_tokens"].get<int>() + j["usage"]["completion_tokens"].get<int>(),
            tiny()->config().n_ctx + 1)
      << "generated until the context was full";
  // Legacy completions keep OpenAI's default of 16.
  auto c = request(http::verb::post, "/v1/completions", json({{"prompt", "Once"}, {"ignore_eos", true}}).dump());
  ASSERT_EQ(c.status, 200) << c.body;
  EXPECT_EQ(json::parse(c.body)["usage"]["completion_tokens"], 16);
  expect_clean();
}

// logit_bias, stop_token_ids and min_tokens change the output as they say, on both APIs, and
// leave the stream exactly resumable (each is a function of the token index and the logits).
TEST_F(ServerTest, LogitBiasStopTokenIdsAndMinTokens) {
  start();
  const tokenizer& tok = tiny()->tok();
  const auto greedy = pipe->submit({.prompt = "Once upon a time", .max_tokens = 8, .ignore_eos = true}).wait(30s);
  ASSERT_EQ(greedy.tokens.size(), 8u);
  auto complete = [&](json extra) {
    json b = {{"model", "tiny"}, {"prompt", "Once upon a time"}, {"max_tokens", 8}, {"temperature", 0}, {"ignore_eos", true}};
    b.update(extra);
    auto r = request(http::verb::post, "/v1/completions", b.dump());
    EXPECT_EQ(r.status, 200) << r.body;
    return json::parse(r.body, nullptr, false);
  };
  // -100 bans the greedy first token; +100 on one token makes every output that token.
  const std::string first = std::to_string(greedy.tokens[0]);
  auto banned = complete({{"logit_bias", {{first, -100}}}});
  EXPECT_NE(banned["choices"][0]["text"].get<std::string>(), greedy.text);
  const token_id forced = greedy.tokens[0] == 100 ? 101 : 100;
  auto all = complete({{"logit_bias", {{std::to_string(forced), 100}}}});
  EXPECT_EQ(all["choices"][0]["text"].get<std::string>(), tok.decode(std::vector<token_id>(8, forced)));
  // Sampled at temperature 1 too: the bias comes before sampling.
  auto hot = complete({{"logit_bias", {{std::to_string(forced), 100}}}, {"temperature", 1.0}, {"seed", 3}});
  EXPECT_EQ(hot["choices"][0]["text"].get<std::string>(), tok.decode(std::vector<token_id>(8, forced)));

  // A stop token id ends the answer before it, with finish "stop", ignore_eos or not.
  // (the first token that is new after the first; the random tiny model repeats itself)
  size_t cut = 1;
  while (cut < 8 && std::find(greedy.tokens.begin(), greedy.tokens.begin() + long(cut), greedy.tokens[cut]) !=
                        greedy.tokens.begin() + long(cut))
    ++cut;
  if (cut == 8) cut = 0;
  auto stopped = complete({{"stop_token_ids", {greedy.tokens[cut]}}});
  EXPECT_EQ(stopped["usage"]["completion_tokens"], int(cut));
  EXPECT_EQ(stopped["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(stopped["choices"][0]["text"].get<std::string>(),
            tok.decode(std::vector<token_id>(greedy.tokens.begin(), greedy.tokens.begin() + long(cut))));

  // EOS pushed up by +100 ends at once; min_tokens holds it back for that many tokens.
  const std::string eos = std::to_string(tok.eos());
  auto at_once = complete({{"logit_bias", {{eos, 100}}}, {"ignore_eos", false}});
  EXPECT_EQ(at_once["usage"]["completion_tokens"], 0);
  EXPECT_EQ(at_once["choices"][0]["finish_reason"], "stop");
  auto held = complete({{"logit_bias", {{eos, 100}}}, {"ignore_eos", false}, {"min_tokens", 5}});
  EXPECT_EQ(held["usage"]["completion_tokens"], 5);
  EXPECT_EQ(held["choices"][0]["finish_reason"], "stop");

  // Penalties lower repeats: the tiny model's greedy answer repeats itself; with a frequency
  // penalty the most repeated token comes back fewer times (and the answer matches a lone
  // engine's with the same penalty, as recovery needs).
  auto most_repeats = [](const std::vector<token_id>& t) {
    std::map<token_id, int> c;
    int best = 0;
    for (token_id x : t) best = std::max(best, ++c[x]);
    return best;
  };
  const auto plain = pipe->submit({.prompt = "Once upon a time", .max_tokens = 24, .ignore_eos = true}).wait(30s);
  sampling_params pen{.temperature = 0.0f};
  pen.frequency_penalty = 2.0f;
  pen.presence_penalty = 0.5f;
  const auto penalized =
      pipe->submit({.prompt = "Once upon a time", .max_tokens = 24, .sampling = pen, .ignore_eos = true}).wait(30s);
  ASSERT_EQ(penalized.tokens.size(), 24u);
  EXPECT_LT(most_repeats(penalized.tokens), most_repeats(plain.tokens));
  EXPECT_EQ(penalized.tokens,
            testing_support::alone(*tiny(), tiny()->tok().encode("Once upon a time", true), 24, pen, true));
  auto via_http = complete({{"frequency_penalty", 2.0}, {"presence_penalty", 0.5}, {"max_tokens", 24}});
  EXPECT_EQ(via_http["choices"][0]["text"].get<std::string>(), penalized.text);
  // vLLM's repetition_penalty (prompt and output tokens): another answer, a lone engine's.
  sampling_params rep{.temperature = 0.0f};
  rep.repetition_penalty = 1.8f;
  const auto repeated =
      pipe->submit({.prompt = "Once upon a time", .max_tokens = 24, .sampling = rep, .ignore_eos = true}).wait(30s);
  EXPECT_NE(repeated.tokens, plain.tokens);
  EXPECT_EQ(repeated.tokens,
            testing_support::alone(*tiny(), tiny()->tok().encode("Once upon a time", true), 24, rep, true));
  EXPECT_EQ(complete({{"repetition_penalty", 1.8}, {"max_tokens", 24}})["choices"][0]["text"].get<std::string>(),
            repeated.text);

  // The WebSocket protocol takes the same fields (checked by the same parser): one frame.
  server::api_request ar;
  server::served_model sm{"tiny", tiny()->config().n_ctx, nullptr, tiny()->config().n_vocab};
  EXPECT_FALSE(server::parse_ws_generate(json{{"type", "generate"}, {"id", "w"}, {"prompt", "x"},
                                              {"logit_bias", {{"7", -100}}}, {"stop_token_ids", {3}}, {"min_tokens", 2}},
                                         sm, ar));
  EXPECT_EQ(ar.gen.sampling.bias_tokens, std::vector<token_id>{7});
  EXPECT_EQ(ar.gen.sampling.stop_tokens, std::vector<token_id>{3});
  EXPECT_EQ(ar.gen.sampling.min_tokens, 2);
  expect_clean();
}

// logprobs: the log-probabilities of the model's raw distribution (log_softmax of the logits)
// for each output token and its most likely alternatives, in each API's form.
TEST_F(ServerTest, LogprobsOnCompletionsChatAndWebSocket) {
  start();
  const std::string prompt = "Once upon a time";
  // The reference: the first token's distribution straight from an engine.
  auto shared = tiny();
  engine eng(shared, engine_options{.n_kv_blocks = 64});
  const seq_id sq = eng.create_sequence();
  std::vector<float> logits;
  ASSERT_TRUE(eng.prefill(sq, tiny()->tok().encode(prompt, true), logits).ok());
  double mx = *std::max_element(logits.begin(), logits.end()), sum = 0;
  for (float l : logits) sum += std::exp(double(l) - mx);
  const token_id first = token_id(std::max_element(logits.begin(), logits.end()) - logits.begin());
  const double first_lp = double(logits[size_t(first)]) - mx - std::log(sum);

  json body = {{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 6}, {"temperature", 0}, {"ignore_eos", true},
               {"logprobs", 3}};
  auto r = request(http::verb::post, "/v1/completions", body.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  const json lp = json::parse(r.body)["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 6u) << lp.dump();
  ASSERT_EQ(lp["token_logprobs"].size(), 6u);
  ASSERT_EQ(lp["text_offset"].size(), 6u);
  EXPECT_NEAR(lp["token_logprobs"][0].get<double>(), first_lp, 1e-4);
  EXPECT_EQ(lp["tokens"][0], tiny()->tok().token_bytes(first));
  EXPECT_EQ(lp["text_offset"][0], 0);
  for (size_t i = 0; i < 6; ++i) {
    const double v = lp["token_logprobs"][i].get<double>();
    EXPECT_LE(v, 0.0);
    ASSERT_LE(lp["top_logprobs"][i].size(), 3u);
    double best = -1e30;
    for (const auto& [k, x] : lp["top_logprobs"][i].items()) best = std::max(best, x.get<double>());
    EXPECT_NEAR(v, best, 1e-6) << "greedy: the chosen token is the likeliest";
  }
  // Streamed: the chunks' entries add up to the same lists.
  body["stream"] = true;
  auto s = request(http::verb::post, "/v1/completions", body.dump());
  bool done = false;
  json streamed = json::array();
  for (const auto& e : sse_events(s.body, done))
    if (!e["choices"].empty() && e["choices"][0]["logprobs"].is_object())
      for (const auto& v : e["choices"][0]["logprobs"]["token_logprobs"]) streamed.push_back(v);
  EXPECT_TRUE(done);
  EXPECT_EQ(streamed, lp["token_logprobs"]);
  // echo puts the prompt first (streamed: in the first chunk); with logprobs it is refused (the
  // prompt's log-probabilities are not computed).
  json echo = {{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 6}, {"temperature", 0}, {"ignore_eos", true},
               {"echo", true}};
  auto er = request(http::verb::post, "/v1/completions", echo.dump());
  ASSERT_EQ(er.status, 200) << er.body;
  const std::string plain_text = json::parse(r.body)["choices"][0]["text"];
  EXPECT_EQ(json::parse(er.body)["choices"][0]["text"], prompt + plain_text);
  echo["stream"] = true;
  std::string echoed;
  bool edone = false;
  for (const auto& e : sse_events(request(http::verb::post, "/v1/completions", echo.dump()).body, edone))
    if (!e["choices"].empty()) echoed += e["choices"][0]["text"].get<std::string>();
  EXPECT_EQ(echoed, prompt + plain_text);
  echo["stream"] = false;
  echo["logprobs"] = 1;
  EXPECT_EQ(request(http::verb::post, "/v1/completions", echo.dump()).status, 400);

  // Without logprobs: null, as OpenAI's.
  body.erase("logprobs");
  body["stream"] = false;
  EXPECT_TRUE(json::parse(request(http::verb::post, "/v1/completions", body.dump()).body)["choices"][0]["logprobs"].is_null());

  // Chat: logprobs true, top_logprobs 2: content entries with bytes.
  json chat = {{"model", "tiny"}, {"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"max_tokens", 4},
               {"temperature", 0}, {"ignore_eos", true}, {"logprobs", true}, {"top_logprobs", 2}};
  auto c = request(http::verb::post, "/v1/chat/completions", chat.dump());
  ASSERT_EQ(c.status, 200) << c.body;
  const json content = json::parse(c.body)["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 4u);
  for (const auto& e : content) {
    EXPECT_TRUE(e["bytes"].is_array());
    EXPECT_EQ(e["top_logprobs"].size(), 2u);
    EXPECT_GE(e["top_logprobs"][0]["logprob"].get<double>(), e["top_logprobs"][1]["logprob"].get<double>());
  }

  // WebSocket: each token frame carries them (parsed the same way as HTTP's).
  server::api_request ar;
  server::served_model sm{"tiny", tiny()->config().n_ctx, nullptr, tiny()->config().n_vocab};
  EXPECT_FALSE(server::parse_ws_generate(json{{"type", "generate"}, {"id", "w"}, {"prompt", "x"}, {"logprobs", 5}}, sm, ar));
  EXPECT_EQ(ar.gen.sampling.logprobs, 5);
  json frame;
  server::add_ws_logprobs(frame, tiny()->tok(), logprobs_of(logits, first, 2));
  EXPECT_NEAR(frame["logprob"].get<double>(), first_lp, 1e-4);
  EXPECT_EQ(frame["top_logprobs"][0]["token"], first);
  expect_clean();
}

// Issue 22 item 7: /admin/kill answers within a bound whatever the pipeline is doing. Here
// the pipeline's only actor thread is blocked (a stalled KV link holds it for 5 s): the kill
// cannot be decided, and the answer is a 503 after the bound (2 s), not a wait for the router.
TEST_F(ServerTest, AdminKillAnswersWithinItsBoundWhenTheRouterCannot) {
  server::server_config sc;
  sc.admin_key = "boss";
  serving_config pc;
  pc.pools.scheduler_threads = 1;
  start(sc, pc);
  pipe->inject(fault_kind::stall_link, 1, 5000ms);
  auto h = pipe->submit({.prompt = "Once upon a time", .max_tokens = 4, .ignore_eos = true});
  auto& injected = pipe->metrics().get_counter("tandem_faults_injected_total", "", {{"kind", "stall_link"}});
  ASSERT_TRUE(eventually([&] { return injected.value() >= 1; })) << "the armed stall never met a KV link";
  ASSERT_EQ(injected.value(), 1.0);
  const auto t0 = std::chrono::steady_clock::now();
  auto r = request(http::verb::post, "/admin/kill", R"({"kind": "decode"})", "boss");
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.status, 503) << r.body;
  EXPECT_NE(r.body.find("did not answer within 2000 ms"), std::string::npos) << r.body;
  EXPECT_LT(waited, 4.0) << "the admin call waited for the blocked router";
  // Once the link lets go, the request finishes and the next kill is decided as usual.
  EXPECT_EQ(h.wait(30s).error, errc::ok);
  EXPECT_EQ(request(http::verb::post, "/admin/kill", R"({"kind": "decode", "index": 0})", "boss").status, 200);
}

TEST_F(ServerTest, KeysGuardTheApiAndAdmin) {
  server::server_config sc;
  sc.api_key = "secret";
  sc.admin_key = "boss";
  start(sc);
  const std::string body = R"({"model":"tiny","prompt":"x","max_tokens":2})";
  EXPECT_EQ(request(http::verb::post, "/v1/completions", body).status, 401);
  EXPECT_EQ(request(http::verb::post, "/v1/completions", body, "wrong").status, 401);
  EXPECT_EQ(request(http::verb::post, "/v1/completions", body, "secret").status, 200);
  EXPECT_EQ(request(http::verb::get, "/admin/state", "", "secret").status, 401);
  auto st = request(http::verb::get, "/admin/state", "", "boss");
  EXPECT_EQ(st.status, 200);
  const json state = json::parse(st.body);
  EXPECT_TRUE(state["workers"].is_array());
  EXPECT_TRUE(state["router"]["requests"].contains("decoding"));
  EXPECT_EQ(state["router"]["prefill_queue"], 0);
  EXPECT_EQ(state["router"]["tracked"], 0);
  EXPECT_TRUE(state["router"]["listed"].is_array());
  EXPECT_EQ(state["router"]["kv_links"], 1);
  EXPECT_TRUE(state["live_connections"].is_number_integer());

  // Issue 22 item 8: out-of-range admin fields are refused, not clamped or taken as "any";
  // every admin 404 is an error object.
  auto admin = [&](const std::string& path, const json& b) {
    auto r = request(http::verb::post, path, b.dump(), "boss");
    const json j = json::parse(r.body, nullptr, false);
    EXPECT_TRUE(j.contains("error") && j["error"].contains("message")) << path << " " << b.dump() << " -> " << r.body;
    return std::pair{r.status, j.contains("error") ? j["error"].value("param", json()).dump() : std::string()};
  };
  EXPECT_EQ(admin("/admin/kill", {{"kind", "decode"}, {"index", -1}}), (std::pair{400, std::string("\"index\"")}));
  EXPECT_EQ(admin("/admin/kill", {{"kind", "decode"}, {"index", 7}}).first, 404);  // no decode worker 7
  EXPECT_EQ(admin("/admin/fault", {{"fault", "stall"}, {"count", 0}}), (std::pair{400, std::string("\"count\"")}));
  EXPECT_EQ(admin("/admin/fault", {{"fault", "stall"}, {"count", -1}}).first, 400);
  EXPECT_EQ(admin("/admin/fault", {{"fault", "stall"}, {"stall_ms", int64_t(1e15)}}),
            (std::pair{400, std::string("\"stall_ms\"")}));
  EXPECT_EQ(admin("/admin/nope", json::object()).first, 404);
  // Nothing was armed or killed by those: the next request is served as usual.
  EXPECT_EQ(request(http::verb::post, "/v1/completions", body, "secret").status, 200);
}

TEST_F(ServerTest, WebSocketInterleavesCancelsAndFreesOnDisconnect) {
  start();
  net::io_context ioc;
  websocket::stream<beast::tcp_stream> ws(ioc);
  beast::get_lowest_layer(ws).connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port));
  ws.handshake("localhost", "/ws");
  auto send = [&](const json& j) { ws.write(net::buffer(j.dump())); };
  auto recv = [&] {
    beast::flat_buffer b;
    ws.read(b);
    return json::parse(beast::buffers_to_string(b.data()));
  };

  // Two requests at once on one connection: each stream complete and equal to the pipeline's.
  send({{"type", "generate"}, {"id", "a"}, {"prompt", "Once upon a time"}, {"max_tokens", 8}, {"ignore_eos", true}});
  send({{"type", "generate"}, {"id", 7}, {"prompt", "The dog"}, {"max_tokens", 5}, {"ignore_eos", true}});
  std::map<std::string, std::string> text;
  std::map<std::string, int> tokens;
  int done = 0;
  while (done < 2) {
    const json f = recv();
    ASSERT_NE(f["type"], "error") << f.dump();
    const std::string id = f["id"].get<std::string>();
    if (f["type"] == "token") {
      EXPECT_EQ(f["index"], tokens[id]++);
      text[id] += f["text"].get<std::string>();
    }
    if (f["type"] == "done") {
      ++done;
      EXPECT_EQ(f["finish_reason"], "length");
      EXPECT_TRUE(f["timings"].contains("ttft_ms"));
    }
  }
  EXPECT_EQ(tokens["a"], 8);
  EXPECT_EQ(tokens["7"], 5);
  const sampling_params greedy{.temperature = 0.0f};
  EXPECT_EQ(text["a"], pipe->submit({.prompt = "Once upon a time", .max_tokens = 8, .sampling = greedy, .ignore_eos = true})
                           .wait(30s)
                           .text);

  // Bad frames get error frames; the connection stays usable.
  send({{"type", "dance"}, {"id", "x"}});
  EXPECT_EQ(recv()["type"], "error");
  ws.write(net::buffer(std::string("{oops")));
  EXPECT_EQ(recv()["code"], "invalid_argument");
  send({{"type", "generate"}, {"id", "y"}});
  EXPECT_EQ(recv()["type"], "error");

  // Cancel: the request ends with done/cancelled. (As long as the tiny model's context allows:
  // 100 tokens could all be generated before the cancel arrived when the suite ran in parallel.)
  send({{"type", "generate"}, {"id", "long"}, {"prompt", "Once"}, {"max_tokens", 240}, {"ignore_eos", true}});
  for (json f = recv(); f["type"] != "token"; f = recv()) {
  }
  send({{"type", "cancel"}, {"id", "long"}});
  std::string reason;
  while (reason.empty()) {
    const json f = recv();
    ASSERT_NE(f["type"], "error") << f.dump();
    if (f["type"] == "done") reason = f["finish_reason"].get<std::string>();
  }
  EXPECT_EQ(reason, "cancelled");

  // A client that vanishes mid-generation: its request is cancelled and its KV freed.
  send({{"type", "generate"}, {"id", "gone"}, {"prompt", "Once"}, {"max_tokens", 100}, {"ignore_eos", true}});
  for (json f = recv(); f["type"] != "token"; f = recv()) {
  }
  beast::get_lowest_layer(ws).socket().close();
  expect_clean();
}

TEST_F(ServerTest, ShutdownDrainsInFlightRequests) {
  server::server_config sc;
  sc.grace = 20s;
  start(sc);
  std::thread client([&] {
    auto r = request(http::verb::post, "/v1/completions", R"({"model":"tiny","prompt":"x","max_tokens":60,"ignore_eos":true})");
    EXPECT_EQ(r.status, 200);
    EXPECT_EQ(json::parse(r.body)["usage"]["completion_tokens"], 60);
  });
  // (EXPECT: the client thread must be joined whatever happens.)
  EXPECT_TRUE(eventually([&] { return pipe->stats().live_requests > 0; })) << "the request never reached the pipeline";
  srv->stop();           // no new requests; the one in flight finishes
  runner.join();         // run() returns once it has
  client.join();
}

// Issue 22 item 6: when the grace period ends with streams still running, each gets the
// documented shutting_down error (an SSE error event then [DONE]; a WebSocket error frame,
// then close 1001 "shutting_down") instead of a cut connection.
TEST_F(ServerTest, GraceEndTellsStreamsWhyTheyEnd) {
  server::server_config sc;
  sc.grace = 300ms;
  start(sc);
  pipe->inject(fault_kind::stall, 4, 3000ms);  // steps hang: the requests outlive the grace period
  std::string sse_body;
  std::thread http_client([&] {
    sse_body = request(http::verb::post, "/v1/completions",
                       R"({"model":"tiny","prompt":"x","max_tokens":60,"ignore_eos":true,"stream":true})")
                   .body;
  });
  net::io_context ioc;
  websocket::stream<tcp::socket> ws(ioc);
  ws.next_layer().connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port));
  ws.handshake("localhost", "/ws");
  ws.write(net::buffer(json({{"type", "generate"}, {"id", "g"}, {"prompt", "Once"}, {"max_tokens", 60}}).dump()));
  EXPECT_TRUE(eventually([&] { return pipe->stats().live_requests >= 2; }))  // (the client thread is joined below)
      << "the two streams never both reached the pipeline";
  srv->stop();
  std::vector<json> frames;
  beast::error_code ec;
  for (;;) {
    beast::flat_buffer b;
    ws.read(b, ec);
    if (ec) break;
    frames.push_back(json::parse(beast::buffers_to_string(b.data())));
  }
  EXPECT_EQ(ec, websocket::error::closed) << ec.message();
  EXPECT_EQ(ws.reason().code, websocket::close_code::going_away);
  EXPECT_EQ(std::string(ws.reason().reason.c_str()), "shutting_down");
  bool told = false;
  for (const auto& f : frames) told = told || (f["type"] == "error" && f["id"] == "g" && f["code"] == "shutting_down");
  EXPECT_TRUE(told) << json(frames).dump();
  runner.join();
  http_client.join();
  bool done = false;
  const auto events = sse_events(sse_body, done);
  EXPECT_TRUE(done) << sse_body;
  ASSERT_FALSE(events.empty()) << sse_body;
  EXPECT_EQ(events.back()["error"]["code"], "shutting_down") << sse_body;
}

// Issue 22 item 5: a SIGTERM drain (stop()) while streams run and clients keep connecting,
// in a loop: every stream ends with its last token or the documented shutting_down error,
// never a cut; the server neither crashes nor hangs (an accept re-armed on one io thread
// while stop() closed the acceptor on another crashed it in about one run in 3 of this
// binary; the suite runs this under ASan too).
TEST_F(ServerTest, DrainsUnderLoadEndEveryStreamCleanlyEveryTime) {
  for (int round = 0; round < 8; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    server::server_config sc;
    sc.grace = 300ms;
    start(sc);
    // Odd rounds: steps hang past the grace period, so the streams are told shutting_down;
    // even rounds: they finish within it.
    if (round % 2) pipe->inject(fault_kind::stall, 2, 1000ms);
    std::atomic<bool> stopping{false};
    std::vector<std::string> sse(6);
    std::vector<std::thread> clients;
    for (size_t i = 0; i < sse.size(); ++i)
      clients.emplace_back([&, i] {
        net::io_context ioc;
        beast::tcp_stream s(ioc);
        beast::error_code ec;
        s.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port), ec);
        http::request<http::string_body> req(http::verb::post, "/v1/completions", 11);
        req.set(http::field::host, "localhost");
        req.set(http::field::content_type, "application/json");
        req.body() = json({{"model", "tiny"}, {"prompt", "Once upon"}, {"max_tokens", 40 + 40 * int(i)},
                           {"ignore_eos", true}, {"stream", true}})
                         .dump();
        req.prepare_payload();
        if (!ec) http::write(s, req, ec);
        beast::flat_buffer buf;
        http::response_parser<http::string_body> p;
        if (!ec) http::read(s, buf, p, ec);
        // Not accepted before the acceptor closed (refused, or reset from the listen queue
        // before any byte came back), or a 503 (it came after the stop): no request was made.
        // An error once the response had begun is a cut stream, and fails below.
        if ((ec && !p.is_header_done()) || (!ec && p.get().result_int() == 503)) return;
        sse[i] = p.get().body();
        if (ec) sse[i] += "\n(cut: " + ec.message() + ")";
      });
    std::vector<std::string> ws_end(4);
    for (size_t i = 0; i < ws_end.size(); ++i)
      clients.emplace_back([&, i] {
        net::io_context ioc;
        websocket::stream<tcp::socket> ws(ioc);
        beast::error_code ec;
        ws.next_layer().connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port), ec);
        if (!ec) ws.handshake("localhost", "/ws", ec);
        if (ec) return void(ws_end[i] = "refused");  // the server was stopping already
        ws.write(net::buffer(json({{"type", "generate"}, {"id", "g"}, {"prompt", "Once"}, {"max_tokens", 60 + 40 * int(i)},
                                   {"ignore_eos", true}})
                                 .dump()),
                 ec);
        for (;;) {
          beast::flat_buffer b;
          ws.read(b, ec);
          if (ec) break;
          const json f = json::parse(beast::buffers_to_string(b.data()));
          if (f["type"] == "done") ws_end[i] = "done";
          if (f["type"] == "error") ws_end[i] = f.value("code", "?");
        }
        if (ws_end[i].empty()) ws_end[i] = "cut: " + ec.message();
      });
    // Clients that keep connecting while the server stops.
    std::thread knocker([&] {
      while (!stopping) {
        net::io_context ioc;
        tcp::socket s(ioc);
        beast::error_code ec;
        s.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port), ec);
        if (!ec) net::write(s, net::buffer(std::string("GET /health HTTP/1.1\r\nHost: x\r\n\r\n")), ec);
      }
    });
    // An idle keep-alive connection: one answer, then nothing asked.
    net::io_context idle_ioc;
    beast::tcp_stream idle(idle_ioc);
    idle.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port));
    http::request<http::string_body> hreq(http::verb::get, "/health", 11);
    hreq.set(http::field::host, "localhost");
    http::write(idle, hreq);
    beast::flat_buffer idle_buf;
    http::response<http::string_body> hres;
    http::read(idle, idle_buf, hres);
    ASSERT_TRUE(hres.keep_alive());
    // Most streams running when the server stops; not a condition of the test (short ones may
    // have ended, late ones be refused): after 2 s it stops whatever the count.
    (void)eventually([&] { return pipe->stats().live_requests >= 6; }, 2s);
    srv->stop();
    runner.join();  // run() returns: the drain ended
    {  // the idle connection was closed by the server, not left open
      beast::error_code ec;
      http::response<http::string_body> more;
      idle.expires_after(5s);
      http::read(idle, idle_buf, more, ec);
      EXPECT_EQ(ec, http::error::end_of_stream) << ec.message();
    }
    stopping = true;
    knocker.join();
    for (auto& t : clients) t.join();
    for (size_t i = 0; i < sse.size(); ++i) {
      bool done = false;
      const auto events = sse_events(sse[i], done);
      if (sse[i].empty()) continue;  // refused: it came after the stop
      EXPECT_TRUE(done) << "stream " << i << " was cut: " << sse[i];
      if (done && !events.empty()) {
        const json& last = events.back();
        const bool finished = last.contains("choices") && !last["choices"].empty() && last["choices"][0]["finish_reason"].is_string();
        const bool told = last.contains("error") && last["error"]["code"] == "shutting_down";
        EXPECT_TRUE(finished || told) << "stream " << i << " ends with " << last.dump();
      }
    }
    for (size_t i = 0; i < ws_end.size(); ++i)
      EXPECT_TRUE(ws_end[i] == "done" || ws_end[i] == "shutting_down" || ws_end[i] == "refused")
          << "websocket " << i << ": " << ws_end[i];
    srv.reset();
    pipe.reset();
  }
}

// Issue 22 item 1: HTTP/1.1 pipelining. Two generating POSTs written in one go, well past
// 512 bytes together, get both answers, in order.
TEST_F(ServerTest, PipelinedPostsAreBothAnswered) {
  start();
  for (size_t pad : {100u, 600u, 3000u}) {
    SCOPED_TRACE("padding " + std::to_string(pad));
    auto post = [&](const std::string& prompt, int n) {
      const std::string body = json({{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", n}, {"ignore_eos", true},
                                     {"user", std::string(pad, 'u')}})
                                   .dump();
      return "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
             std::to_string(body.size()) + "\r\n\r\n" + body;
    };
    net::io_context ioc;
    tcp::socket s(ioc);
    s.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port));
    net::write(s, net::buffer(post("Once upon a time", 20) + post("The dog", 5)));
    beast::flat_buffer buf;
    for (int want : {20, 5}) {
      SCOPED_TRACE("answer of " + std::to_string(want) + " tokens");
      http::response<http::string_body> res;
      beast::error_code ec;
      http::read(s, buf, res, ec);
      ASSERT_FALSE(ec) << ec.message();
      ASSERT_EQ(res.result_int(), 200) << res.body();
      EXPECT_EQ(json::parse(res.body())["usage"]["completion_tokens"], want);
    }
  }
  expect_clean();
}

namespace {
// Refuses every other request, as a full queue would (deterministic, unlike a real burst).
struct every_other_refused : admission_policy {
  mutable std::atomic<int> n{0};
  admission_decision decide(const admission_config&, const load_snapshot&, int32_t) const override {
    admission_decision d;
    if (n++ % 2 == 1) {
      d.admitted = false;
      d.reason = reject_reason::prefill_queue_full;
      d.retry_after_ms = 1500;
      d.message = "the prefill queue is full";
    }
    return d;
  }
};
}  // namespace

TEST_F(ServerTest, AdmissionRejectionsAre429WithRetryAfter) {
  serving_config pc;
  pc.scheduling.admission_policy_impl = std::make_shared<every_other_refused>();
  start({}, pc);
  const std::string body = R"({"model":"tiny","prompt":"x","max_tokens":2})";
  auto ok = request(http::verb::post, "/v1/completions", body);
  EXPECT_EQ(ok.status, 200) << ok.body;
  auto refused = request(http::verb::post, "/v1/completions", body);
  EXPECT_EQ(refused.status, 429) << refused.body;
  EXPECT_EQ(refused.retry_after, "2");  // seconds, rounded up
  const json e = json::parse(refused.body);
  EXPECT_EQ(e["error"]["type"], "rate_limit_error");
  EXPECT_EQ(e["error"]["code"], "overloaded");
  // Streamed: the refusal comes before any event, so it is still a plain 429.
  auto streamed = request(http::verb::post, "/v1/completions",
                          R"({"model":"tiny","prompt":"x","max_tokens":2,"stream":true})");  // admitted (3rd)
  EXPECT_EQ(streamed.status, 200);
  auto streamed_refused = request(http::verb::post, "/v1/completions",
                                  R"({"model":"tiny","prompt":"x","max_tokens":2,"stream":true})");
  EXPECT_EQ(streamed_refused.status, 429);
  expect_clean();
}

TEST_F(ServerTest, SlowHeadersOversizedFramesAndBadUtf8AreClosed) {
  server::server_config sc;
  sc.header_timeout = 300ms;
  sc.max_frame_bytes = 1024;
  sc.max_requests_per_connection = 2;
  start(sc);
  net::io_context ioc;
  {  // Headers that never finish: closed after the timeout.
    beast::tcp_stream s(ioc);
    s.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port));
    net::write(s.socket(), net::buffer(std::string("GET /health HTTP/1.1\r\nHost: x\r\n")));
    char c;
    beast::error_code ec;
    s.socket().read_some(net::buffer(&c, 1), ec);  // blocks until the server gives up on us
    EXPECT_TRUE(ec == net::error::eof || ec == net::error::connection_reset) << ec.message();
  }
  auto connect_ws = [&](websocket::stream<beast::tcp_stream>& ws) {
    beast::get_lowest_layer(ws).connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port));
    ws.handshake("localhost", "/ws");
  };
  {  // Too many requests on one connection: the extra one gets an error, the others go on.
    websocket::stream<beast::tcp_stream> ws(ioc);
    connect_ws(ws);
    for (const char* id : {"1", "2", "3"})
      ws.write(net::buffer(json({{"type", "generate"}, {"id", id}, {"prompt", "Once"}, {"max_tokens", 60}, {"ignore_eos", true}}).dump()));
    int done = 0;
    bool refused = false;
    while (done < 2) {
      beast::flat_buffer b;
      ws.read(b);
      const json f = json::parse(beast::buffers_to_string(b.data()));
      if (f["type"] == "error") {
        EXPECT_EQ(f["id"], "3");
        EXPECT_EQ(f["code"], "overloaded");
        refused = true;
      }
      done += f["type"] == "done";
    }
    EXPECT_TRUE(refused);
  }
  {  // A message over the frame limit: closed with 1009.
    websocket::stream<beast::tcp_stream> ws(ioc);
    connect_ws(ws);
    ws.write(net::buffer(std::string(2000, ' ')));
    beast::flat_buffer b;
    beast::error_code ec;
    ws.read(b, ec);
    EXPECT_TRUE(ec) << "the connection must end";  // (closed, or the teardown's socket error)
    EXPECT_EQ(ws.reason().code, websocket::close_code::too_big);
  }
  {  // A text frame that is not UTF-8: closed with 1007.
    websocket::stream<beast::tcp_stream> ws(ioc);
    connect_ws(ws);
    ws.write(net::buffer(std::string("{\"x\":\"\xff\xfe\"}")));
    beast::flat_buffer b;
    beast::error_code ec;
    ws.read(b, ec);
    EXPECT_TRUE(ec) << "the connection must end";
    EXPECT_EQ(ws.reason().code, websocket::close_code::bad_payload);
  }
  // Everyone else is still served.
  EXPECT_EQ(request(http::verb::post, "/v1/completions", R"({"model":"tiny","prompt":"ok","max_tokens":2})").status, 200);
  expect_clean();
}
