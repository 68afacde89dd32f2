// The real trained model in tests/data: tokenization and the greedy continuation must equal the
// reference produced by an independent Llama implementation, id for id and byte for byte.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "runtime/engine/engine.h"
#include "runtime/engine/sampler.h"

using namespace tandem;

namespace {

const std::string data_dir = TANDEM_TEST_DATA_DIR;
const std::string model_path = data_dir + "/stories260K.gguf";
const std::string reference_path = data_dir + "/stories260K-reference.txt";

struct reference {
  std::string prompt;
  std::vector<token_id> prompt_ids, greedy_ids;
  std::string text;
};

std::vector<token_id> parse_ids(const std::string& s) {
  std::vector<token_id> out;
  std::string num;
  for (char ch : s) {
    if (std::isdigit(static_cast<unsigned char>(ch))) num += ch;
    else if (!num.empty()) {
      out.push_back(std::stoi(num));
      num.clear();
    }
  }
  if (!num.empty()) out.push_back(std::stoi(num));
  return out;
}

reference load_reference() {
  std::ifstream in(reference_path);
  if (!in) throw std::runtime_error("missing test data: " + reference_path + " (tests/data; set TANDEM_TEST_DATA_DIR)");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string all = ss.str();
  reference r;
  std::istringstream lines(all);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("PROMPT: ", 0) == 0) r.prompt = line.substr(8);
    else if (line.rfind("PROMPT_TOKEN_IDS:", 0) == 0) r.prompt_ids = parse_ids(line.substr(17));
    else if (line.rfind("GREEDY_64_TOKEN_IDS:", 0) == 0) r.greedy_ids = parse_ids(line.substr(20));
  }
  const auto b = all.find("BEGIN>>>"), e = all.find("<<<END");
  if (b == std::string::npos || e == std::string::npos || r.prompt.empty() || r.greedy_ids.size() != 64)
    throw std::runtime_error("reference file " + reference_path + " is not in the expected format");
  r.text = all.substr(b + 8, e - b - 8);
  return r;
}

class Stories : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(std::filesystem::exists(model_path))
        << "missing test data: " << model_path << " (tests/data; set TANDEM_TEST_DATA_DIR)";
    ref = load_reference();
    m = model::load(model_path);
  }
  reference ref;
  std::shared_ptr<const model> m;
};

}  // namespace

TEST_F(Stories, PromptTokenizesToReferenceIds) { EXPECT_EQ(m->tok().encode(ref.prompt, true), ref.prompt_ids); }

TEST_F(Stories, Greedy64TokensEqualReference) {
  for (int threads : {1, 2}) {
    engine eng(m, engine_options{.n_threads = threads, .n_kv_blocks = 16});
    const seq_id s = eng.create_sequence();
    std::vector<float> logits;
    ASSERT_TRUE(eng.prefill(s, ref.prompt_ids, logits).ok());
    std::vector<token_id> out;
    stream_decoder dec(m->tok());
    std::string text;
    for (int i = 0; i < 64; ++i) {
      const token_id t = sample(logits, sampling_params{.temperature = 0.0f}, uint64_t(i));
      out.push_back(t);
      text += dec.push(t);
      ASSERT_TRUE(eng.decode(std::span(&s, 1), std::span(&t, 1), logits).ok());
    }
    text += dec.flush();
    EXPECT_EQ(out, ref.greedy_ids) << "threads " << threads;
    EXPECT_EQ(text, ref.text) << "threads " << threads;
    EXPECT_EQ(m->tok().decode(out), ref.text);
  }
}

// Reuse on the real model: a second request that starts with the prompt and the first 40
// reference tokens (the next turn of a conversation) is served from the cached blocks and
// goes on exactly as the reference.
TEST_F(Stories, PrefixReuseContinuesTheReferenceExactly) {
  engine eng(m, engine_options{.n_threads = 2, .n_kv_blocks = 32, .prefix_cache = true});
  auto run = [&](const std::vector<token_id>& prompt, int n, int32_t& reused) {
    const seq_id s = eng.create_sequence();
    reused = eng.attach_prefix(s, prompt);
    std::vector<float> logits;
    EXPECT_TRUE(eng.prefill(s, std::span(prompt).subspan(size_t(reused)), logits).ok());
    std::vector<token_id> out;
    for (int i = 0; i < n; ++i) {
      const token_id t = sample(logits, sampling_params{.temperature = 0.0f}, uint64_t(i));
      out.push_back(t);
      EXPECT_TRUE(eng.decode(std::span(&s, 1), std::span(&t, 1), logits).ok());
    }
    EXPECT_TRUE(eng.free_sequence(s).ok());
    return out;
  };
  int32_t reused = 0;
  EXPECT_EQ(run(ref.prompt_ids, 64, reused), ref.greedy_ids);
  EXPECT_EQ(reused, 0);
  auto next = ref.prompt_ids;
  next.insert(next.end(), ref.greedy_ids.begin(), ref.greedy_ids.begin() + 40);
  const auto out = run(next, 24, reused);
  EXPECT_EQ(reused, int32_t((next.size() - 1) / 16 * 16));
  EXPECT_GT(reused, 0);
  EXPECT_EQ(out, std::vector<token_id>(ref.greedy_ids.begin() + 40, ref.greedy_ids.end()));
}
