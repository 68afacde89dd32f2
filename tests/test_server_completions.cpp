// tandem serve end to end, /v1/completions: outputs equal the pipeline's, greedy and seeded,
// streamed or not; n choices share one prefill; best_of keeps the likeliest; logit_bias,
// stop_token_ids and min_tokens act as they say; logprobs on every API.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "tests/support/server_fixture.h"

using namespace tandem;
using namespace tandem::testing_support;
using namespace std::chrono_literals;

TEST_F(ServerTest, CompletionsEqualThePipelineGreedyAndSeeded) {
  start();
  for (const auto& [temp, seed] : std::vector<std::pair<double, int>>{{0.0, 0}, {0.9, 1234}}) {
    // top_k and top_p left out: the one set of defaults (sampling_params'), as tandem generate.
    json body = {{"model", "tiny"},  {"prompt", "Once upon a time"},
                 {"max_tokens", 12}, {"temperature", temp},
                 {"seed", seed},     {"ignore_eos", true}};
    auto r = request(http::verb::post, "/v1/completions", body.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    const json j = json::parse(r.body);
    sampling_params sp{.temperature = float(temp), .seed = uint64_t(seed)};
    const std::string want =
        pipe->submit({.prompt = "Once upon a time", .max_tokens = 12, .sampling = sp, .ignore_eos = true})
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
  json body = {{"model", "tiny"},    {"prompt", prompt}, {"max_tokens", 10},
               {"temperature", 2.0}, {"seed", 77},       {"ignore_eos", true}};
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
  EXPECT_GE(texts.size(), 2u) << three.body;  // the others: their own seeds
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
               {"seed", 5},       {"ignore_eos", true},           {"n", 4},          {"logprobs", 0}};
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

// logit_bias, stop_token_ids and min_tokens change the output as they say, on both APIs, and
// leave the stream exactly resumable (each is a function of the token index and the logits).
TEST_F(ServerTest, LogitBiasStopTokenIdsAndMinTokens) {
  start();
  const tokenizer& tok = tiny()->tok();
  const auto greedy = pipe->submit({.prompt = "Once upon a time", .max_tokens = 8, .ignore_eos = true}).wait(30s);
  ASSERT_EQ(greedy.tokens.size(), 8u);
  auto complete = [&](json extra) {
    json b = {
        {"model", "tiny"}, {"prompt", "Once upon a time"}, {"max_tokens", 8}, {"temperature", 0}, {"ignore_eos", true}};
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
  EXPECT_FALSE(server::parse_ws_generate(json{{"type", "generate"},
                                              {"id", "w"},
                                              {"prompt", "x"},
                                              {"logit_bias", {{"7", -100}}},
                                              {"stop_token_ids", {3}},
                                              {"min_tokens", 2}},
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

  json body = {{"model", "tiny"},  {"prompt", prompt},   {"max_tokens", 6},
               {"temperature", 0}, {"ignore_eos", true}, {"logprobs", 3}};
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
  json echo = {{"model", "tiny"},  {"prompt", prompt},   {"max_tokens", 6},
               {"temperature", 0}, {"ignore_eos", true}, {"echo", true}};
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
  EXPECT_TRUE(
      json::parse(request(http::verb::post, "/v1/completions", body.dump()).body)["choices"][0]["logprobs"].is_null());

  // Chat: logprobs true, top_logprobs 2: content entries with bytes.
  json chat = {{"model", "tiny"},    {"messages", {{{"role", "user"}, {"content", "Hi"}}}},
               {"max_tokens", 4},    {"temperature", 0},
               {"ignore_eos", true}, {"logprobs", true},
               {"top_logprobs", 2}};
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
  EXPECT_FALSE(
      server::parse_ws_generate(json{{"type", "generate"}, {"id", "w"}, {"prompt", "x"}, {"logprobs", 5}}, sm, ar));
  EXPECT_EQ(ar.gen.sampling.logprobs, 5);
  json frame;
  server::add_ws_logprobs(frame, tiny()->tok(), logprobs_of(logits, first, 2));
  EXPECT_NEAR(frame["logprob"].get<double>(), first_lp, 1e-4);
  EXPECT_EQ(frame["top_logprobs"][0]["token"], first);
  expect_clean();
}
