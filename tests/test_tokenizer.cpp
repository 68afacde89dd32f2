// Tokenizer tests: the real stories260K vocab (llama/SPM with byte fallback), the synthetic
// byte-level BPE vocab, hand-built vocabs for the merge rules, streaming decode, errors.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/text/chat_template.h"
#include "runtime/errors.h"
#include "runtime/gguf/gguf.h"
#include "runtime/tokenizer/tokenizer.h"
#include "runtime/tokenizer/vocab_gguf.h"
#include "runtime/model/synth.h"
#include "runtime/tokenizer/tokenizer_internal.h"

#include <map>
#include <memory>
#include <nlohmann/json.hpp>

namespace tandem {
namespace {

const std::string kModelDir = std::string(TANDEM_TEST_DATA_DIR);
const std::string kStoriesPath = kModelDir + "/stories260K.gguf";
const std::string kReferencePath = kModelDir + "/stories260K-reference.txt";

std::string read_file_or_throw(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw std::runtime_error("required test data '" + path +
                             "' is missing (TANDEM_TEST_DATA_DIR = " TANDEM_TEST_DATA_DIR ")");
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The stories260K tokenizer, loaded once. Throws (failing the test loudly) if the file is missing.
const tokenizer& stories() {
  static const tokenizer tok = [] {
    if (!std::filesystem::exists(kStoriesPath)) {
      throw std::runtime_error("required test model '" + kStoriesPath + "' is missing");
    }
    return tokenizer(vocab_from_gguf(gguf::file::open(kStoriesPath)));
  }();
  return tok;
}

const tokenizer& byte_level() {
  static const tokenizer tok(make_byte_level_vocab(512));
  return tok;
}

struct reference {
  std::string prompt;
  std::vector<token_id> prompt_ids;
  std::vector<token_id> greedy_ids;
  std::string continuation;
};

std::vector<token_id> parse_ids(const std::string& list) {
  std::vector<token_id> ids;
  std::string s = list;
  for (char& c : s) {
    if (c == '[' || c == ']' || c == ',') c = ' ';
  }
  std::istringstream in(s);
  long v = 0;
  while (in >> v) ids.push_back(static_cast<token_id>(v));
  return ids;
}

reference load_reference() {
  const std::string text = read_file_or_throw(kReferencePath);
  reference r;
  std::istringstream in(text);
  std::string line;
  auto value_of = [&](const std::string& key) -> std::string {
    return line.rfind(key, 0) == 0 ? line.substr(key.size()) : std::string();
  };
  while (std::getline(in, line)) {
    if (line.rfind("PROMPT: ", 0) == 0) r.prompt = value_of("PROMPT: ");
    if (line.rfind("PROMPT_TOKEN_IDS: ", 0) == 0) r.prompt_ids = parse_ids(value_of("PROMPT_TOKEN_IDS: "));
    if (line.rfind("GREEDY_64_TOKEN_IDS: ", 0) == 0) {
      r.greedy_ids = parse_ids(value_of("GREEDY_64_TOKEN_IDS: "));
    }
  }
  const size_t begin = text.find("BEGIN>>>"), end = text.find("<<<END");
  if (r.prompt.empty() || r.prompt_ids.empty() || r.greedy_ids.empty() || begin == std::string::npos ||
      end == std::string::npos || end < begin) {
    throw std::runtime_error("cannot parse the reference file '" + kReferencePath + "'");
  }
  r.continuation = text.substr(begin + 8, end - begin - 8);
  return r;
}

// An independent strict UTF-8 validator (RFC 3629: no overlongs, surrogates or > U+10FFFF).
bool valid_utf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    int n = 0;
    uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    }
    if ((c & 0xE0) == 0xC0) {
      n = 1;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      n = 2;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      n = 3;
      cp = c & 0x07;
    } else return false;
    if (i + static_cast<size_t>(n) >= s.size()) return false;  // truncated
    for (int k = 1; k <= n; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      if ((b & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (b & 0x3F);
    }
    if ((n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000)) return false;
    if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n + 1;
  }
  return true;
}

const std::vector<std::string> kRoundTripTexts = {
    "",
    "Hello, world!",
    "Once upon a time, there was a little girl named Lily.",
    "café, naïve, über, Ünïcödé é",
    "中文测试：你好，世界",
    "Привет, мир!",
    "emoji 🙂 and family 👩‍👩‍👧 with ZWJ, flag 🇫🇷",
    "tabs\tand\t\ttabs, spaces  two   three    four",
    "   leading and trailing spaces   ",
    " ",
    "\t",
    "line one\nline two\n\nline four\r\nwindows\n",
    "\n\n\n",
    "digits 1234567890 and 3.14159, 1e-9",
    "mixed: a🙂b中c\td\ne  f",
    "<s> and </s> and <|endoftext|> are plain text here",
    "quotes 'single' \"double\" it's we're they've I'm you'll he'd",
};

// ---- the real model ----

TEST(StoriesTokenizer, PromptMatchesReference) {
  const reference ref = load_reference();
  const tokenizer& tok = stories();
  EXPECT_EQ(tok.spec().model, "llama");
  EXPECT_EQ(tok.n_vocab(), 512);
  EXPECT_EQ(tok.bos(), 1);
  EXPECT_EQ(tok.eos(), 2);
  EXPECT_EQ(tok.encode(ref.prompt, true), ref.prompt_ids);
  EXPECT_EQ(tok.encode("Once upon a time", true), (std::vector<token_id>{1, 403, 407, 261, 378}));
  EXPECT_EQ(tok.decode(ref.prompt_ids, true), ref.prompt);
}

TEST(StoriesTokenizer, ContinuationDecodesToReference) {
  const reference ref = load_reference();
  const tokenizer& tok = stories();
  ASSERT_EQ(ref.greedy_ids.size(), 64u);
  EXPECT_EQ(tok.decode(ref.greedy_ids), ref.continuation);

  // Streaming gives the same text.
  stream_decoder dec(tok);
  std::string streamed;
  for (token_id id : ref.greedy_ids) streamed += dec.push(id);
  streamed += dec.flush();
  EXPECT_EQ(streamed, ref.continuation);
}

TEST(StoriesTokenizer, TokenBytes) {
  const tokenizer& tok = stories();
  EXPECT_EQ(tok.token_text(403), "\xE2\x96\x81Once");
  EXPECT_EQ(tok.token_bytes(403), " Once");
  EXPECT_EQ(tok.token_text(13), "<0x0A>");
  EXPECT_EQ(tok.token_bytes(13), "\n");
  EXPECT_EQ(tok.token_bytes(1), "");  // control
  EXPECT_EQ(tok.token_bytes(2), "");
  EXPECT_TRUE(tok.is_eog(2));
  EXPECT_FALSE(tok.is_eog(1));
  EXPECT_FALSE(tok.is_eog(403));
  EXPECT_FALSE(tok.is_eog(-1));
  EXPECT_FALSE(tok.is_eog(100000));
  EXPECT_THROW((void)tok.token_bytes(512), failure);
}

TEST(StoriesTokenizer, BosAndEmpty) {
  const tokenizer& tok = stories();
  EXPECT_EQ(tok.encode("", true), std::vector<token_id>{1});
  EXPECT_TRUE(tok.encode("", false).empty());
  EXPECT_EQ(tok.decode(std::vector<token_id>{}), "");
  const auto ids = tok.encode("Once", false);
  ASSERT_FALSE(ids.empty());
  EXPECT_NE(ids[0], 1);
}

TEST(StoriesTokenizer, LeadingSpace) {
  const tokenizer& tok = stories();
  const auto ids = tok.encode(" hi", false);
  EXPECT_EQ(tok.decode(ids), "  hi");  // the space prefix plus the text's own
  EXPECT_EQ(tok.decode(ids, true), " hi");  // exactly one removed
  EXPECT_EQ(tok.decode(tok.encode("hi", true), true), "hi");
}

TEST(StoriesTokenizer, RoundTrips) {
  const tokenizer& tok = stories();
  for (const std::string& text : kRoundTripTexts) {
    const auto ids = tok.encode(text, true);
    EXPECT_EQ(tok.decode(ids, true), text) << "text: " << text;
    for (token_id id : ids) EXPECT_TRUE(id >= 0 && id < tok.n_vocab());
  }
}

TEST(StoriesTokenizer, ByteFallbackForUnknownCharacters) {
  const tokenizer& tok = stories();
  // "中" (E4 B8 AD) is not in a 512-token English vocab: three byte tokens after "▁".
  const auto ids = tok.encode("中", false);
  ASSERT_GE(ids.size(), 3u);
  const std::vector<token_id> tail(ids.end() - 3, ids.end());
  EXPECT_EQ(tail, (std::vector<token_id>{3 + 0xE4, 3 + 0xB8, 3 + 0xAD}));
  EXPECT_EQ(tok.token_text(3 + 0xE4), "<0xE4>");
}

TEST(StoriesTokenizer, SpecialTokenTextIsPlainText) {
  const tokenizer& tok = stories();
  for (token_id id : tok.encode("<s></s><unk>", false)) {
    EXPECT_NE(id, 0);
    EXPECT_NE(id, 1);
    EXPECT_NE(id, 2);
  }
}

TEST(StoriesTokenizer, InvalidUtf8InputRoundTripsThroughBytes) {
  const tokenizer& tok = stories();
  const std::string text = std::string("a\xFF") + "b\xC3(c\xE4\xB8";
  EXPECT_EQ(tok.decode(tok.encode(text, true), true), text);
}

// ---- the synthetic byte-level vocab ----

TEST(ByteLevelVocab, ShapeAndSpecialTokens) {
  const vocab_spec s = make_byte_level_vocab(512);
  ASSERT_EQ(s.tokens.size(), 512u);
  ASSERT_EQ(s.token_types.size(), 512u);
  EXPECT_EQ(s.model, "gpt2");
  EXPECT_EQ(s.tokens[0], "<unk>");
  EXPECT_EQ(s.tokens[1], "<s>");
  EXPECT_EQ(s.tokens[2], "</s>");
  EXPECT_EQ(s.token_types[0], 2);
  EXPECT_EQ(s.token_types[1], 3);
  EXPECT_EQ(s.token_types[2], 3);
  EXPECT_EQ(s.bos_id, 1);
  EXPECT_EQ(s.eos_id, 2);
  EXPECT_EQ(s.unk_id, 0);
  EXPECT_TRUE(s.add_bos);
  EXPECT_TRUE(s.scores.empty() || s.scores.size() == s.tokens.size());
  EXPECT_EQ(s.tokens[3 + 'A'], "A");
  EXPECT_EQ(s.tokens[3 + ' '], "\xC4\xA0");  // "Ġ"
  EXPECT_EQ(s.tokens[3 + '\n'], "\xC4\x8A");  // "Ċ"
  for (int i = 3; i < 259; ++i) EXPECT_EQ(s.token_types[i], 1);
  std::set<std::string> unique(s.tokens.begin(), s.tokens.end());
  EXPECT_EQ(unique.size(), s.tokens.size());
  EXPECT_FALSE(s.merges.empty());
  for (const std::string& m : s.merges) {
    const size_t sp = m.find(' ');
    ASSERT_NE(sp, std::string::npos) << m;
    const std::string joined = m.substr(0, sp) + m.substr(sp + 1);
    EXPECT_TRUE(unique.count(joined)) << m;
  }
  const tokenizer tok(s);
  EXPECT_EQ(tok.token_bytes(3 + ' '), " ");
  EXPECT_EQ(tok.token_bytes(3 + 0xE4), "\xE4");
  EXPECT_TRUE(tok.is_eog(2));
}

TEST(ByteLevelVocab, DeterministicAndExactSize) {
  for (int32_t n : {259, 260, 300, 512, 1000, 4096}) {
    const vocab_spec a = make_byte_level_vocab(n);
    const vocab_spec b = make_byte_level_vocab(n);
    EXPECT_EQ(a.tokens.size(), static_cast<size_t>(n));
    EXPECT_EQ(a.tokens, b.tokens);
    EXPECT_EQ(a.token_types, b.token_types);
    EXPECT_EQ(a.merges, b.merges);
    EXPECT_EQ(a.scores, b.scores);
    std::set<std::string> unique(a.tokens.begin(), a.tokens.end());
    EXPECT_EQ(unique.size(), a.tokens.size()) << "n_vocab " << n;
    EXPECT_NO_THROW(tokenizer{a});
  }
  // A small vocab is a prefix of a larger one (same training, stopped earlier).
  const vocab_spec small = make_byte_level_vocab(300), large = make_byte_level_vocab(512);
  EXPECT_TRUE(std::equal(small.tokens.begin(), small.tokens.end(), large.tokens.begin()));
  // A vocab bigger than the text supports is filled with unused tokens.
  const vocab_spec huge = make_byte_level_vocab(4096);
  EXPECT_EQ(huge.token_types.back(), 5);
  EXPECT_THROW(make_byte_level_vocab(258), failure);
}

TEST(ByteLevelVocab, Fast) {
  const auto t0 = std::chrono::steady_clock::now();
  const vocab_spec s = make_byte_level_vocab(512);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(s.tokens.size(), 512u);
  EXPECT_LT(ms, 500.0);  // typically a few ms; generous for loaded debug builds
  std::printf("make_byte_level_vocab(512): %.1f ms\n", ms);
}

TEST(ByteLevelVocab, MergesCompressEnglish) {
  const tokenizer& tok = byte_level();
  const std::string text = "The keeper climbed the stairs of the lighthouse.";
  const auto ids = tok.encode(text, false);
  EXPECT_LT(ids.size(), text.size() / 2);
  EXPECT_EQ(tok.decode(ids), text);
}

TEST(ByteLevelVocab, RoundTrips) {
  const tokenizer& tok = byte_level();
  for (const std::string& text : kRoundTripTexts) {
    const auto ids = tok.encode(text, true);
    ASSERT_FALSE(ids.empty());
    EXPECT_EQ(ids[0], 1);
    EXPECT_EQ(tok.decode(ids), text) << "text: " << text;
    EXPECT_EQ(tok.decode(ids, true), text) << "gpt2 vocab never strips";
    const auto no_bos = tok.encode(text, false);
    EXPECT_EQ(std::vector<token_id>(ids.begin() + 1, ids.end()), no_bos);
  }
  const std::string invalid = std::string("x\xFF\xFE") + "y\xC3" + " z\xE4\xB8";
  EXPECT_EQ(tok.decode(tok.encode(invalid, false)), invalid);
}

TEST(ByteLevelVocab, SpecialTokenTextIsPlainText) {
  const tokenizer& tok = byte_level();
  for (token_id id : tok.encode("<s></s><unk>", false)) {
    EXPECT_NE(id, 0);
    EXPECT_NE(id, 1);
    EXPECT_NE(id, 2);
  }
}

TEST(ByteLevelVocab, LongInputs) {
  const tokenizer& tok = byte_level();
  std::string text;
  for (int i = 0; i < 2000; ++i) text += "The light does not ask who needs it. 123\n";
  text += std::string(100000, ' ') + "end" + std::string(50000, 'a');
  EXPECT_EQ(tok.decode(tok.encode(text, false)), text);
  EXPECT_EQ(stories().decode(stories().encode(text, false), true), text);
}

// ---- streaming ----

void check_streaming(const tokenizer& tok, const std::string& text) {
  const auto ids = tok.encode(text, true);
  stream_decoder dec(tok);
  std::string all;
  for (token_id id : ids) {
    const std::string piece = dec.push(id);
    EXPECT_TRUE(valid_utf8(piece)) << "invalid UTF-8 chunk while streaming: " << text;
    all += piece;
  }
  const std::string rest = dec.flush();
  EXPECT_TRUE(valid_utf8(rest));
  all += rest;
  EXPECT_EQ(all, tok.decode(ids)) << "text: " << text;
  EXPECT_EQ(dec.flush(), "");
}

TEST(StreamDecoder, ValidUtf8AndMatchesDecode) {
  for (const std::string& text : kRoundTripTexts) {
    check_streaming(stories(), text);
    check_streaming(byte_level(), text);
  }
}

// The stories vocab spells byte b as token 3 + b ("<0xXX>").
std::string push_bytes(stream_decoder& dec, std::initializer_list<int> bytes) {
  std::string out;
  for (int b : bytes) out += dec.push(3 + b);
  return out;
}

TEST(StreamDecoder, HoldsIncompleteCharacters) {
  stream_decoder dec(stories());
  EXPECT_EQ(dec.push(3 + 0xE4), "");
  EXPECT_EQ(dec.push(3 + 0xB8), "");
  EXPECT_EQ(dec.push(3 + 0xAD), "中");
  EXPECT_EQ(dec.push(3 + 0xF0), "");
  EXPECT_EQ(dec.push(3 + 0x9F), "");
  EXPECT_EQ(dec.push(3 + 0x99), "");
  EXPECT_EQ(dec.push(3 + 0x82), "🙂");
  EXPECT_EQ(dec.flush(), "");
}

TEST(StreamDecoder, InvalidBytesBecomeReplacementCharacters) {
  const std::string fffd = "\xEF\xBF\xBD";
  {
    stream_decoder dec(stories());
    EXPECT_EQ(push_bytes(dec, {0x80}), fffd);  // stray continuation: emitted at once
    EXPECT_EQ(push_bytes(dec, {0xFF}), fffd);  // never valid
    EXPECT_EQ(push_bytes(dec, {0xC0, 0xAF}), fffd + fffd);  // overlong lead
    EXPECT_EQ(push_bytes(dec, {0xED, 0xA0}), fffd + fffd);  // surrogate
    EXPECT_EQ(dec.flush(), "");
  }
  {
    stream_decoder dec(stories());
    EXPECT_EQ(push_bytes(dec, {0xE4}), "");
    EXPECT_EQ(push_bytes(dec, {'A'}), fffd + "A");  // lead followed by a non-continuation
  }
  {
    stream_decoder dec(stories());
    EXPECT_EQ(push_bytes(dec, {0xE4, 0xB8}), "");
    EXPECT_EQ(push_bytes(dec, {0xC3}), fffd + fffd);  // E4 B8 cannot complete; C3 is held
    EXPECT_EQ(push_bytes(dec, {0xA9}), "é");
  }
  {
    stream_decoder dec(stories());
    EXPECT_EQ(push_bytes(dec, {0xF0, 0x9F}), "");
    EXPECT_EQ(dec.flush(), fffd + fffd);  // an incomplete character at the end
    EXPECT_EQ(dec.flush(), "");
  }
  {
    // Every chunk stays valid UTF-8 whatever bytes come.
    stream_decoder dec(stories());
    std::string all;
    for (int b = 0; b < 256; ++b) {
      const std::string s = dec.push(3 + ((b * 97) % 256));
      EXPECT_TRUE(valid_utf8(s));
      all += s;
    }
    all += dec.flush();
    EXPECT_TRUE(valid_utf8(all));
  }
}

// ---- merge rules on hand-built vocabs ----

vocab_spec spm_spec(const std::vector<std::pair<std::string, float>>& entries) {
  vocab_spec s;
  s.model = "llama";
  s.tokens = {"<unk>", "<s>", "</s>"};
  s.scores = {0, 0, 0};
  s.token_types = {2, 3, 3};
  for (const auto& [text, score] : entries) {
    s.tokens.push_back(text);
    s.scores.push_back(score);
    s.token_types.push_back(1);
  }
  s.unk_id = 0;
  s.bos_id = 1;
  s.eos_id = 2;
  s.add_space_prefix = false;
  return s;
}

std::vector<std::string> texts(const tokenizer& tok, const std::vector<token_id>& ids) {
  std::vector<std::string> out;
  for (token_id id : ids) out.push_back(tok.token_text(id));
  return out;
}
using strings = std::vector<std::string>;

TEST(SpmMerges, HighestScoreFirstTiesLeftmost) {
  {
    // "bc" outscores "ab": a + bc.
    const tokenizer tok(spm_spec({{"a", -1}, {"b", -1}, {"c", -1}, {"ab", -5}, {"bc", -2}}));
    EXPECT_EQ(texts(tok, tok.encode("abc", false)), (strings{"a", "bc"}));
  }
  {
    const tokenizer tok(spm_spec({{"a", -1}, {"b", -1}, {"c", -1}, {"ab", -2}, {"bc", -5}}));
    EXPECT_EQ(texts(tok, tok.encode("abc", false)), (strings{"ab", "c"}));
  }
  {
    // Merging continues while a concatenation is a token: a + bc -> abc.
    const tokenizer tok(spm_spec({{"a", -1}, {"b", -1}, {"c", -1}, {"ab", -5}, {"bc", -2}, {"abc", -9}}));
    EXPECT_EQ(texts(tok, tok.encode("abc", false)), (strings{"abc"}));
    EXPECT_EQ(texts(tok, tok.encode("abcab", false)), (strings{"abc", "ab"}));
  }
  {
    // Equal scores: the leftmost pair merges first.
    const tokenizer tok(spm_spec({{"a", -1}, {"aa", -2}}));
    EXPECT_EQ(texts(tok, tok.encode("aaa", false)), (strings{"aa", "a"}));
    EXPECT_EQ(texts(tok, tok.encode("aaaaa", false)), (strings{"aa", "aa", "a"}));
  }
}

TEST(SpmMerges, SpacePrefixAndUnknownWithoutByteTokens) {
  vocab_spec s = spm_spec({{"\xE2\x96\x81", -1}, {"h", -1}, {"i", -1}, {"\xE2\x96\x81h", -2}, {"\xE2\x96\x81hi", -3}});
  s.add_space_prefix = true;
  const tokenizer tok(s);
  EXPECT_EQ(texts(tok, tok.encode("hi hi", true)), (strings{"<s>", "\xE2\x96\x81hi", "\xE2\x96\x81hi"}));
  // No byte tokens: an unknown character is one <unk>.
  EXPECT_EQ(tok.encode("hé", false), (std::vector<token_id>{tok.encode("h", false)[0], 0}));
  EXPECT_EQ(tok.decode(tok.encode("hi hi", true), true), "hi hi");
}

TEST(SpmMerges, TypesMayBeAbsent) {
  vocab_spec s = spm_spec({{"a", -1}, {"<0x41>", 0}, {"<0x42>", 0}});
  s.token_types.clear();
  const tokenizer tok(s);
  EXPECT_EQ(tok.token_bytes(4), "A");  // "<0x41>" inferred as a byte token
  EXPECT_EQ(tok.token_bytes(1), "");  // bos inferred as control
  EXPECT_EQ(texts(tok, tok.encode("aAB", false)), (strings{"a", "<0x41>", "<0x42>"}));
}

vocab_spec bpe_spec(const std::vector<std::string>& tokens, const std::vector<std::string>& merges) {
  vocab_spec s;
  s.model = "gpt2";
  s.tokens = tokens;
  s.merges = merges;
  s.add_bos = false;
  return s;
}

TEST(BpeMerges, LowestRankFirst) {
  {
    const tokenizer tok(bpe_spec({"a", "b", "c", "ab", "bc", "abc"}, {"b c", "a b", "a bc"}));
    EXPECT_EQ(texts(tok, tok.encode("abc", false)), (strings{"abc"}));  // a + bc -> abc
  }
  {
    const tokenizer tok(bpe_spec({"a", "b", "c", "ab", "bc", "abc"}, {"a b", "b c", "a bc"}));
    EXPECT_EQ(texts(tok, tok.encode("abc", false)), (strings{"ab", "c"}));  // no "ab c" rule
  }
  {
    const tokenizer tok(bpe_spec({"a", "aa"}, {"a a"}));
    EXPECT_EQ(texts(tok, tok.encode("aaa", false)), (strings{"aa", "a"}));
  }
  {
    // Pieces never merge across the pre-tokenizer's boundaries: "a" and "Ġb" are separate.
    const tokenizer tok(bpe_spec({"a", "b", "\xC4\xA0", "a\xC4\xA0",
                                  "\xC4\xA0"
                                  "b"},
                                 {"a \xC4\xA0", "\xC4\xA0 b"}));
    EXPECT_EQ(texts(tok, tok.encode("a b", false)), (strings{"a",
                                                             "\xC4\xA0"
                                                             "b"}));
  }
}

TEST(BpeMerges, EogTokens) {
  vocab_spec s = bpe_spec(
      {"a", "<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|im_start|>", "<|eot_id|>x"},
      {});
  s.token_types = {1, 3, 3, 3, 1, 3, 3, 3};
  s.eos_id = 0;
  const tokenizer tok(s);
  EXPECT_TRUE(tok.is_eog(0));  // eos, whatever its text
  EXPECT_TRUE(tok.is_eog(1));
  EXPECT_TRUE(tok.is_eog(2));
  EXPECT_TRUE(tok.is_eog(3));
  EXPECT_FALSE(tok.is_eog(4));  // "<|end|>" but a normal token
  EXPECT_TRUE(tok.is_eog(5));
  EXPECT_FALSE(tok.is_eog(6));
  EXPECT_FALSE(tok.is_eog(7));
}

// ---- construction errors ----

errc construction_error(const vocab_spec& s) {
  try {
    tokenizer tok(s);
  } catch (const failure& e) {
    return e.code();
  }
  return errc::ok;
}

TEST(TokenizerErrors, UnsupportedModel) {
  vocab_spec s = make_byte_level_vocab(300);
  s.model = "xyz";
  try {
    tokenizer tok(s);
    FAIL() << "expected failure";
  } catch (const failure& e) {
    EXPECT_EQ(e.code(), errc::unsupported);
    EXPECT_STREQ(e.what(), "tokenizer model 'xyz' is not supported (llama, gpt2)");
  }
}

TEST(TokenizerErrors, MalformedSpecs) {
  const vocab_spec good = make_byte_level_vocab(300);
  ASSERT_EQ(construction_error(good), errc::ok);
  {
    vocab_spec s = good;
    s.scores = {1.0f, 2.0f};
    EXPECT_EQ(construction_error(s), errc::malformed_file);
  }
  {
    vocab_spec s = good;
    s.token_types.pop_back();
    EXPECT_EQ(construction_error(s), errc::malformed_file);
  }
  {
    vocab_spec s = good;
    s.token_types[5] = 9;
    EXPECT_EQ(construction_error(s), errc::malformed_file);
  }
  {
    vocab_spec s = good;
    s.bos_id = 300;
    EXPECT_EQ(construction_error(s), errc::malformed_file);
  }
  {
    vocab_spec s = good;
    s.eos_id = -7;
    EXPECT_EQ(construction_error(s), errc::malformed_file);
  }
  for (const std::string bad : {"abc", "a b c", " ab", "ab ", ""}) {
    vocab_spec s = good;
    s.merges.push_back(bad);
    EXPECT_EQ(construction_error(s), errc::malformed_file) << "merge '" << bad << "'";
  }
  {
    vocab_spec s = good;
    s.tokens.clear();
    s.token_types.clear();
    EXPECT_EQ(construction_error(s), errc::malformed_file);
  }
  {
    // llama needs one score per token.
    vocab_spec s = spm_spec({{"a", -1}});
    s.scores.clear();
    EXPECT_EQ(construction_error(s), errc::malformed_file);
  }
}

// ---- GGUF glue ----

TEST(VocabFromGguf, RoundTripsThroughAFile) {
  const vocab_spec src = make_byte_level_vocab(400);
  gguf::writer w;
  w.set_string("general.architecture", "llama");
  w.set_string("tokenizer.ggml.model", src.model);
  w.set_string("tokenizer.ggml.pre", src.pre);
  w.set_strings("tokenizer.ggml.tokens", src.tokens);
  w.set_i32s("tokenizer.ggml.token_type", src.token_types);
  w.set_strings("tokenizer.ggml.merges", src.merges);
  w.set_u32("tokenizer.ggml.bos_token_id", 1);
  w.set_u32("tokenizer.ggml.eos_token_id", 2);
  w.set_u32("tokenizer.ggml.unknown_token_id", 0);
  w.set_u32("tokenizer.ggml.padding_token_id", 0xFFFFFFFFu);
  w.set_bool("tokenizer.ggml.add_bos_token", true);
  const std::string path =
      (std::filesystem::temp_directory_path() / ("tandem_test_tokenizer_" + std::to_string(::getpid()) + ".gguf"))
          .string();
  w.write(path);
  const vocab_spec got = vocab_from_gguf(gguf::file::open(path));
  std::filesystem::remove(path);
  EXPECT_EQ(got.model, src.model);
  EXPECT_EQ(got.pre, src.pre);
  EXPECT_EQ(got.tokens, src.tokens);
  EXPECT_EQ(got.token_types, src.token_types);
  EXPECT_EQ(got.merges, src.merges);
  EXPECT_TRUE(got.scores.empty());
  EXPECT_EQ(got.bos_id, 1);
  EXPECT_EQ(got.eos_id, 2);
  EXPECT_EQ(got.unk_id, 0);
  EXPECT_EQ(got.pad_id, -1);
  EXPECT_TRUE(got.add_bos);
  EXPECT_FALSE(got.add_space_prefix);
  const tokenizer a(src), b(got);
  for (const std::string& text : kRoundTripTexts) EXPECT_EQ(a.encode(text, true), b.encode(text, true));
}

TEST(VocabFromGguf, StoriesSpec) {
  if (!std::filesystem::exists(kStoriesPath)) FAIL() << "required test model '" << kStoriesPath << "' is missing";
  const vocab_spec s = vocab_from_gguf(gguf::file::open(kStoriesPath));
  EXPECT_EQ(s.model, "llama");
  EXPECT_EQ(s.tokens.size(), 512u);
  EXPECT_EQ(s.scores.size(), 512u);
  EXPECT_EQ(s.token_types.size(), 512u);
  EXPECT_EQ(s.unk_id, 0);
  EXPECT_EQ(s.pad_id, -1);  // stored as 0xFFFFFFFF
  EXPECT_TRUE(s.add_bos);
  EXPECT_TRUE(s.add_space_prefix);
}

}  // namespace
}  // namespace tandem

namespace tandem {

namespace {
// The kquant synthetic vocabulary (seed 1: 253 merges of English prose) with its
// tokenizer.ggml.pre set to `pre`: the vocab both llama.cpp fixtures below were made on.
tokenizer kquant_vocab_with_pre(const std::string& pre) {
  const auto dir = std::filesystem::temp_directory_path() / "tandem-test-models";
  std::filesystem::create_directories(dir);
  const auto base = (dir / "pretok-kquant-seed1.gguf").string();
  synthesize_model(find_synth_preset("kquant"), kernels::dtype::f32, base, 1);  // fresh: the fixture is this synth's
  const auto src = gguf::file::open(base);
  gguf::writer w;
  for (const auto& [k, v] : src.metadata()) w.set(k, v);
  w.set_string("tokenizer.ggml.pre", pre);
  const auto path = (dir / ("pretok-" + pre + ".gguf")).string();
  w.write(path);
  return tokenizer(vocab_from_gguf(gguf::file::open(path)));
}
}  // namespace

// tokenizer.ggml.pre chooses the pre-tokenizer as llama.cpp does: on the kquant synthetic vocab
// (seed 1: 253 merges of English prose) with its pre key set to each name, every string of a tricky corpus (whitespace
// runs, digits, contractions in any case, code, CJK, emoji, newlines) encodes to exactly the
// ids llama-tokenize gives (tests/data/pretok, made by tools/scripts/make_pretok_fixtures.py).
TEST(PreTokenizer, EveryPreEncodesTheCorpusAsLlamaCpp) {
  std::ifstream in(std::string(TANDEM_TEST_DATA_DIR) + "/pretok/reference.json");
  ASSERT_TRUE(in) << "missing test data: tests/data/pretok/reference.json";
  const auto cases = nlohmann::json::parse(in);
  std::map<std::string, std::unique_ptr<tokenizer>> toks;
  std::set<std::string> pres_seen;
  for (const auto& c : cases) {
    const std::string pre = c.at("pre");
    if (!toks.count(pre)) toks[pre] = std::make_unique<tokenizer>(kquant_vocab_with_pre(pre));
    pres_seen.insert(pre);
    const std::string text = c.at("text");
    EXPECT_EQ(toks[pre]->encode(text, false), c.at("ids").get<std::vector<token_id>>())
        << "pre " << pre << ", text \"" << text << "\"";
  }
  EXPECT_EQ(pres_seen, (std::set<std::string>{"gpt-2", "llama-bpe", "qwen2", "smollm"}));
  // The fixture tells the pre-tokenizers apart: with this vocab's merges, some strings encode
  // differently under each pair of them (so a wrong choice of regex fails above).
  for (const auto& [a, b] : std::vector<std::pair<std::string, std::string>>{
           {"gpt-2", "llama-bpe"}, {"llama-bpe", "qwen2"}, {"gpt-2", "smollm"}}) {
    int differ = 0;
    for (const auto& c : cases)
      if (c.at("pre") == a) {
        const std::string text = c.at("text");
        differ += toks[a]->encode(text, false) != toks[b]->encode(text, false);
      }
    EXPECT_GE(differ, 1) << a << " and " << b << " encode the whole corpus alike";
  }
  // And the splits themselves: llama-bpe groups digits by three, qwen2 and smollm take them one
  // by one, gpt-2 keeps the run.
  auto pieces = [](const char* pre, std::string_view text) { return detail::gpt2_splitter(pre).split(text).size(); };
  EXPECT_EQ(pieces("llama-bpe", "1234567890"), 4u);
  EXPECT_EQ(pieces("qwen2", "1234567890"), 10u);
  EXPECT_EQ(pieces("smollm", "1234567890"), 10u);
  EXPECT_EQ(pieces("gpt-2", "1234567890"), 1u);
}

// Control tokens written in text, as llama-tokenize has them (tests/data/pretok/special.json):
// with parse_special they are their tokens (and an SPM vocab puts its space prefix after
// each), without it plain characters.
TEST(SpecialTokens, ParsedInTextOnlyWhenAskedAsLlamaCpp) {
  std::ifstream in(std::string(TANDEM_TEST_DATA_DIR) + "/pretok/special.json");
  ASSERT_TRUE(in) << "missing test data: tests/data/pretok/special.json";
  const auto cases = nlohmann::json::parse(in);
  const tokenizer spm(vocab_from_gguf(gguf::file::open(std::string(TANDEM_TEST_DATA_DIR) + "/stories260K.gguf")));
  const tokenizer bpe = kquant_vocab_with_pre("llama-bpe");
  int parsed = 0;
  for (const auto& c : cases) {
    const std::string text = c.at("text");
    const bool parse = c.at("parse_special");
    const tokenizer& t = c.at("model") == "stories260K" ? spm : bpe;
    const auto want = c.at("ids").get<std::vector<token_id>>();
    EXPECT_EQ(t.encode(text, false, parse), want)
        << c.at("model") << " parse_special=" << parse << " \"" << text << "\"";
    parsed += parse && std::find(want.begin(), want.end(), t.bos()) != want.end();
  }
  EXPECT_GE(parsed, 6) << "the fixture has <s> parsed as BOS";
  EXPECT_EQ(cases.size(), 24u);
}

TEST(PreTokenizer, AnUnknownPreIsRefusedByName) {
  auto spec = make_byte_level_vocab(300);
  spec.pre = "starcoder-9000";
  try {
    tokenizer t(spec);
    FAIL() << "accepted";
  } catch (const failure& e) {
    EXPECT_EQ(e.code(), errc::unsupported);
    EXPECT_NE(std::string(e.what()).find("starcoder-9000"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("llama-bpe"), std::string::npos) << e.what();
  }
}

}  // namespace tandem

// A SentencePiece vocabulary set up as Gemma's (no space prefix, byte fallback, BOS, control turn
// markers, a user-defined token) against llama-tokenize (tests/data/spm, written by
// tools/scripts/make_spm_fixtures.py; the real Gemma vocabulary needs a tokenizer.model no
// package here ships, so the pieces are stories260K's).
TEST(GemmaStyleSpm, TokenizesAsLlamaCpp) {
  using namespace tandem;
  const std::string dir = std::string(TANDEM_TEST_DATA_DIR) + "/spm";
  std::ifstream in(dir + "/reference.json");
  ASSERT_TRUE(in) << "missing test data: tests/data/spm/reference.json";
  const auto ref = nlohmann::json::parse(in);
  const auto f = gguf::file::open(dir + "/" + ref["vocab"].get<std::string>());
  const tokenizer tok(vocab_from_gguf(f));
  ASSERT_FALSE(tok.spec().add_space_prefix);
  int n = 0;
  for (const auto& c : ref["cases"]) {
    const std::string text = c["text"];
    const bool ps = c["parse_special"];
    EXPECT_EQ(tok.encode(text, true, ps), c["ids"].get<std::vector<token_id>>())
        << (ps ? "(parse_special) '" : "'") << text << "'";
    ++n;
  }
  EXPECT_GE(n, 40);
}

// tokenizer.ggml.eot_token_id / eom_token_id end a turn whatever their text (Llama 3.1's
// <|eom_id|> for tool calls; files naming their own end-of-turn token); bad ids are refused.
TEST(EndOfTurn, EotAndEomIdsEndGeneration) {
  using namespace tandem;
  vocab_spec v = make_byte_level_vocab(300);
  ASSERT_FALSE(tokenizer(v).is_eog(290));
  v.eot_id = 290;
  v.eom_id = 291;
  const tokenizer t(v);
  EXPECT_TRUE(t.is_eog(290));
  EXPECT_TRUE(t.is_eog(291));
  EXPECT_TRUE(t.is_eog(v.eos_id));
  EXPECT_FALSE(t.is_eog(292));
  v.eot_id = 300;
  EXPECT_THROW(tokenizer{v}, failure);
}

// synth's printable vocabulary (--model synth:NAME models): every token's bytes are printable
// UTF-8 on their own (no half characters, no control bytes but tab, newline, return), so a
// random model writes text; ASCII still tokenizes as before.
namespace tandem {
TEST(Tokenizer, PrintableSyntheticVocabularyPrintsEveryToken) {
  const vocab_spec raw = make_byte_level_vocab(512);
  vocab_spec v = raw;
  respell_unprintable_bytes(v);
  const tokenizer plain(raw), tok(v);
  // Valid UTF-8 (whole characters) with no control character but tab, newline and return.
  auto printable = [](const std::string& s) {
    for (size_t i = 0; i < s.size();) {
      const unsigned char c = static_cast<unsigned char>(s[i]);
      const size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
      if (n == 0 || i + n > s.size()) return false;
      for (size_t k = 1; k < n; ++k)
        if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
      if (n == 1 && (c == 0x7F || (c < 0x20 && c != '\t' && c != '\n' && c != '\r'))) return false;
      i += n;
    }
    return true;
  };
  int unprintable_before = 0;
  for (token_id i = 0; i < tok.n_vocab(); ++i) {
    EXPECT_TRUE(printable(tok.token_bytes(i))) << i << " '" << tok.token_text(i) << "'";
    unprintable_before += !printable(plain.token_bytes(i));
  }
  EXPECT_EQ(unprintable_before, 128 + 32 - 3 + 1) << "the raw vocabulary has every byte";
  for (const std::string text : {"Once upon a time, there was 1 cat.\n", "  x\ty\r\n{\"k\": [1, 2]}"}) {
    EXPECT_EQ(tok.encode(text, false), plain.encode(text, false)) << text;
    EXPECT_EQ(tok.decode(tok.encode(text, false)), text);
  }
}

// A vocabulary that adds EOS as well as BOS (tokenizer.ggml.add_eos_token): encode puts both
// around a text when asked for the file's specials, none otherwise; a chat rendering loses the
// bos_token it starts with and the eos_token it ends with, so that the prompt gets one of each
// (llama.cpp's common_chat_template_direct_apply does the same).
TEST(Tokenizer, FileSpecialsAddEosAndTemplatesDropTheirCopies) {
  vocab_spec v = make_byte_level_vocab(300);
  v.add_bos = true;
  v.add_eos = true;
  const tokenizer tok(v);
  EXPECT_EQ(tok.file_specials(), (tokenizer::specials{.bos = true, .eos = true}));
  const auto plain = tok.encode("hi", false);
  auto both = plain;
  both.insert(both.begin(), tok.bos());
  both.push_back(tok.eos());
  EXPECT_EQ(tok.encode("hi", true), both);
  const auto tmpl = chat_template::for_vocab(
      "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}{{ eos_token }}", tok);
  std::string prompt;
  ASSERT_TRUE(tmpl.render({{"user", "hi"}}, prompt).ok());
  EXPECT_EQ(prompt, "hi");
  EXPECT_EQ(tok.encode(prompt, tok.file_specials(), true), both);
  // A vocabulary that adds neither keeps the template's texts, which are then the tokens.
  v.add_bos = v.add_eos = false;
  const tokenizer bare(v);
  ASSERT_TRUE(chat_template::for_vocab(
                  "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}{{ eos_token }}", bare)
                  .render({{"user", "hi"}}, prompt)
                  .ok());
  EXPECT_EQ(bare.encode(prompt, true, true), both);
}
}  // namespace tandem
