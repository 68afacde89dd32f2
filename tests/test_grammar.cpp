// The GBNF grammar engine: what compiles and what is refused (with where), which texts a
// grammar accepts, and the token masks over a real vocabulary (stories260K's), checked against
// a brute-force oracle along random constrained walks.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "runtime/structured/grammar.h"
#include "runtime/model/model.h"
#include "runtime/engine/sampler.h"

namespace tandem {
namespace {

const std::string model_path = std::string(TANDEM_TEST_DATA_DIR) + "/stories260K.gguf";

// Whether `g` matches `text` whole.
bool matches(const std::string& g, const std::string& text) {
  grammar_matcher m(grammar::compile(g), nullptr);
  return m.accept_bytes(text) && m.complete();
}

std::string compile_error(const std::string& g) {
  try {
    grammar::compile(g);
  } catch (const failure& e) {
    EXPECT_EQ(e.code(), errc::invalid_argument);
    return e.what();
  }
  return "";
}

TEST(Grammar, RefusesWhatCannotRunAndSaysWhere) {
  struct row {
    const char* grammar;
    const char* says;
  };
  const row rows[] = {
      {"root ::= item", "the rule 'item' is not defined"},
      {"item ::= \"a\"", "no 'root' rule"},
      {"root ::= root \"a\" | \"b\"", "can reach itself without consuming input"},
      {"root ::= a\na ::= b \"x\"\nb ::= \"\" | a", "can reach itself"},
      {"root ::= (\"a\"?)*", "can reach itself"},
      {"root ::= \"abc", "unterminated string literal"},
      {"root ::= [abc", "unterminated character class"},
      {"root ::= \"\\q\"", "unknown escape"},
      {"root ::= (\"a\" | \"b\"", "expected ')'"},
      {"root ::= \"a\")", "unbalanced ')'"},
      {"root ::= *", "nothing to repeat"},
      {"root ::= \"a\"{3,2}", "n is below m"},
      {"root ::= \"a\"{1000000}", "repetition count above"},
      {"root ::= [z-a]", "goes backwards"},
      {"root ::= []", "empty character class"},
      {"root ::= \"a\"\nroot ::= \"b\"", "defined twice"},
      {"root ::= \"a\" @", "unexpected character '@'"},
      {"root = \"a\"", "expected '::='"},
  };
  for (const auto& r : rows) EXPECT_NE(compile_error(r.grammar).find(r.says), std::string::npos) << r.grammar;
  // Line and column of the fault.
  EXPECT_NE(compile_error("root ::= a\n\na ::= \"x\" | b").find("line 3, column 13"), std::string::npos)
      << compile_error("root ::= a\n\na ::= \"x\" | b");
  EXPECT_NE(compile_error(std::string(2 << 20, ' ')).find("over"), std::string::npos);
  // Repetition that multiplies past the element bound is refused, not built.
  EXPECT_NE(compile_error("root ::= \"abcdefghij\"{0,99999}").find("too large"), std::string::npos);
}

TEST(Grammar, AcceptsExactlyItsLanguage) {
  struct row {
    const char* grammar;
    std::vector<std::string> yes, no;
  };
  const row rows[] = {
      {"root ::= \"ab\" | \"cd\"", {"ab", "cd"}, {"", "a", "ac", "abc", "cdab"}},
      {"root ::= [a-c]+ \"!\"", {"a!", "abcabc!"}, {"!", "ad!", "a"}},
      {"root ::= [^a-c]*", {"", "xyz", "é"}, {"a", "xya"}},
      {"root ::= . . .", {"abc", "a\nb", "αβγ"}, {"ab", "abcd"}},
      {"root ::= \"x\"{2,3}", {"xx", "xxx"}, {"x", "xxxx"}},
      {"root ::= \"x\"{2}", {"xx"}, {"x", "xxx"}},
      {"root ::= \"x\"{2,}", {"xx", "xxxxxxx"}, {"x"}},
      {"root ::= \"ab\"? \"c\"", {"c", "abc"}, {"ac", "bc", "ababc"}},
      {"root ::= (\"a\" | \"b\" \"c\")* \"d\"", {"d", "ad", "bcad", "aaabcd"}, {"bd", "abc"}},
      // A rule continues over newlines and comments until the next `name ::=`.
      {"# numbers\nroot ::=\n  num\n  (\",\" num)*  # more\nnum ::= [0-9]+\n", {"1", "12,3,456"}, {"1,", ",1", "a"}},
      // Right recursion and nesting: balanced parentheses.
      {"root ::= (\"(\" root \")\")*", {"", "()", "(())()", "((()))"}, {"(", "())", ")("}},
      {"root ::= \"\\x41\\u00e9\\n\\t\\\"\\\\\"", {"Aé\n\t\"\\"}, {"A"}},
      {"root ::= [\\x00-\\x1f]", {std::string(1, '\0'), "\x1f"}, {" "}},
      // Code points beyond ASCII, in classes and literals.
      {"root ::= [α-ω]+ \"→\" [😀-😏]", {"αβ→😀", "ω→😏"}, {"a→😀", "α→😐", "α→"}},
  };
  for (const auto& r : rows) {
    for (const auto& t : r.yes) EXPECT_TRUE(matches(r.grammar, t)) << r.grammar << " should match '" << t << "'";
    for (const auto& t : r.no) EXPECT_FALSE(matches(r.grammar, t)) << r.grammar << " should not match '" << t << "'";
  }
}

TEST(Grammar, CarriesPartialUtf8AcrossFeeds) {
  grammar_matcher m(grammar::compile("root ::= \"a\" [α-β] \"z\""), nullptr);
  const std::string alpha = "α";  // CE B1
  ASSERT_TRUE(m.accept_bytes("a"));
  ASSERT_TRUE(m.accept_bytes(alpha.substr(0, 1)));
  EXPECT_FALSE(m.complete());
  EXPECT_FALSE(m.accept_bytes("\xBF"));  // CE BF is ο: outside α-β; refused, state kept
  ASSERT_TRUE(m.accept_bytes(alpha.substr(1)));
  ASSERT_TRUE(m.accept_bytes("z"));
  EXPECT_TRUE(m.complete());
  EXPECT_FALSE(m.accept_bytes("z"));  // nothing after a complete root
  // A lead byte no class can start is refused at once.
  grammar_matcher n(grammar::compile("root ::= [a-z]"), nullptr);
  EXPECT_FALSE(n.accept_bytes("\xCE"));
  EXPECT_FALSE(n.accept_bytes("\xFF"));
  // Only well-formed UTF-8: overlong forms, surrogates and code points past U+10FFFF are
  // refused at the byte that makes them so, even where `.` would take any character.
  for (const char* bad : {"\xC0\xAF", "\xC1\xBF", "\xE0\x80", "\xED\xA0", "\xF0\x80", "\xF4\x90", "\xF5"}) {
    grammar_matcher any(grammar::compile("root ::= .*"), nullptr);
    EXPECT_FALSE(any.accept_bytes(bad)) << bad;
  }
  grammar_matcher any(grammar::compile("root ::= .*"), nullptr);
  EXPECT_TRUE(any.accept_bytes("\xED\x9F\xBF\xF4\x8F\xBF\xBF\xE0\xA0\x80"));  // U+D7FF, U+10FFFF, U+0800
}

class GrammarVocab : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { model_ = model::load(model_path); }
  static void TearDownTestSuite() { model_.reset(); }
  static const tokenizer& tok() { return model_->tok(); }
  static std::shared_ptr<const model> model_;

  // Brute force: token t is allowed iff its bytes continue the match (end of generation iff
  // the match is complete). Compared with the trie walk and the mask cache.
  static void expect_exact_mask(const grammar_matcher& m, const token_mask& mask) {
    const auto trie = tok().vocab_trie();
    for (token_id t = 0; t < tok().n_vocab(); ++t) {
      bool want;
      if (tok().is_eog(t)) {
        want = m.complete();
      } else {
        grammar_matcher copy = m;
        want = !trie->bytes[size_t(t)].empty() && copy.accept_bytes(trie->bytes[size_t(t)]);
      }
      ASSERT_EQ(mask_allows(mask, t), want) << "token " << t << " '" << tok().token_bytes(t) << "'";
    }
  }
};
std::shared_ptr<const model> GrammarVocab::model_;

// A small JSON grammar (objects, arrays, strings with escapes, numbers, literals).
const char* json_gbnf = R"(
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null")
object ::= "{" ws ( string ws ":" ws value ws ( "," ws string ws ":" ws value ws )* )? "}"
array  ::= "[" ws ( value ws ( "," ws value ws )* )? "]"
string ::= "\"" ( [^"\\\x00-\x1f] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} ) )* "\""
number ::= "-"? ( "0" | [1-9] [0-9]{0,15} ) ( "." [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,3} )?
ws     ::= | " " | "\n" [ ]{0,8}
)";

TEST_F(GrammarVocab, MasksAreExactAlongRandomWalks) {
  const auto g = grammar::compile(json_gbnf);
  const auto trie = tok().vocab_trie();
  ASSERT_EQ(trie, tok().vocab_trie());  // built once
  for (uint32_t seed = 0; seed < 20; ++seed) {
    grammar_matcher m(g, trie);
    std::mt19937 rng(seed);
    std::string text;
    bool ended = false;
    for (int step = 0; step < 60 && !ended; ++step) {
      const auto mask = m.allowed();
      expect_exact_mask(m, *mask);
      if (::testing::Test::HasFatalFailure()) return;
      std::vector<token_id> ok;
      for (token_id t = 0; t < tok().n_vocab(); ++t)
        if (mask_allows(*mask, t)) ok.push_back(t);
      ASSERT_FALSE(ok.empty()) << "seed " << seed << " after '" << text << "'";
      // Prefer ending once possible after a while, so that some walks finish.
      const bool can_end = m.complete();
      const token_id t = can_end && step > 30 ? tok().eos() : ok[rng() % ok.size()];
      ASSERT_TRUE(m.accept(t)) << "an allowed token was refused";
      if (tok().is_eog(t)) {
        ended = true;
      } else {
        text += tok().token_bytes(t);
      }
      EXPECT_EQ(m.consumed(), size_t(step + 1));
    }
    if (ended) {
      const auto j = nlohmann::json::parse(text, nullptr, false);
      EXPECT_FALSE(j.is_discarded()) << text;
      EXPECT_TRUE(j.is_object()) << text;
    }
  }
}

TEST_F(GrammarVocab, DeadStatesAllowOnlyTheEnd) {
  grammar_matcher m(grammar::compile("root ::= \"Once\""), tok().vocab_trie());
  const auto words = tok().encode("upon", false);
  ASSERT_FALSE(words.empty());
  EXPECT_FALSE(m.allowed() == nullptr);
  EXPECT_FALSE(mask_allows(*m.allowed(), tok().eos()));  // not complete yet
  EXPECT_FALSE(m.accept(words[0]));  // not a continuation
  EXPECT_TRUE(m.dead());
  const auto mask = m.allowed();
  for (token_id t = 0; t < tok().n_vocab(); ++t) EXPECT_EQ(mask_allows(*mask, t), tok().is_eog(t)) << t;
}

TEST_F(GrammarVocab, ConstraintFollowsTheOutputGivenAndReplaysOnDivergence) {
  const std::string g = "root ::= (\"a\" | \"b\" | \" \")+";
  sampling_params sp;
  ASSERT_TRUE(sp.set_grammar(g).ok());
  const auto trie = tok().vocab_trie();
  const auto a = tok().encode("a", false), b = tok().encode("b", false);
  ASSERT_EQ(a.size(), 1u);
  ASSERT_EQ(b.size(), 1u);
  // The shared constraint at any output equals a fresh matcher fed that output.
  auto fresh = [&](const std::vector<token_id>& out) {
    grammar_matcher m(grammar::compile(g), trie);
    for (token_id t : out) m.accept(t);
    return *m.allowed();
  };
  const std::vector<std::vector<token_id>> outputs = {{}, {a[0]}, {a[0], b[0]}, {b[0]}, {b[0], b[0], a[0]}, {a[0]}, {}};
  for (const auto& out : outputs) EXPECT_EQ(*sp.constraint->mask_after(out, trie), fresh(out));
  // A token outside the grammar in the output: dead, end only.
  const std::vector<token_id> off = {a[0], tok().encode("c", false)[0]};
  auto dead = *sp.constraint->mask_after(off, trie);
  for (token_id t = 0; t < tok().n_vocab(); ++t) EXPECT_EQ(mask_allows(dead, t), tok().is_eog(t));
}

TEST_F(GrammarVocab, ConstrainedLogitsBanWhatTheGrammarForbids) {
  sampling_params sp;
  ASSERT_FALSE(sp.set_grammar("root ::= \"x").ok());
  EXPECT_TRUE(sp.grammar.empty());
  ASSERT_TRUE(sp.set_grammar("root ::= \" Once\"").ok());  // SentencePiece: "▁Once" is " Once"
  const size_t V = size_t(tok().n_vocab());
  std::vector<float> logits(V, 1.0f), buf;
  auto l = constrained_logits(logits, sp, {}, tok(), buf);
  const auto mask = sp.constraint->mask_after({}, tok().vocab_trie());
  size_t finite = 0;
  for (size_t t = 0; t < V; ++t) {
    EXPECT_EQ(std::isfinite(l[t]), mask_allows(*mask, token_id(t)));
    finite += std::isfinite(l[t]) ? 1 : 0;
  }
  EXPECT_GT(finite, 0u);
  EXPECT_LT(finite, V / 4);
  // Greedy picks the best allowed token even when a forbidden one scores higher.
  const auto once = tok().encode("Once", false);
  ASSERT_EQ(tok().token_bytes(once[0]), " Once");
  std::vector<float> skewed(V, 0.0f);
  skewed[size_t(tok().encode("upon", false)[0])] = 50.0f;
  skewed[size_t(once[0])] = 1.0f;
  sp.temperature = 0.0f;
  EXPECT_EQ(sample(constrained_logits(skewed, sp, {}, tok(), buf), sp, 0), once[0]);
  // Everything the grammar allows banned already (min_tokens before a finished grammar):
  // the grammar wins, its tokens get equal logits.
  std::vector<float> banned(V, -std::numeric_limits<float>::infinity());
  l = constrained_logits(banned, sp, {}, tok(), buf);
  for (size_t t = 0; t < V; ++t) EXPECT_EQ(l[t] == 0.0f, mask_allows(*mask, token_id(t)));
  // No grammar: the logits themselves.
  sampling_params none;
  EXPECT_EQ(constrained_logits(logits, none, {}, tok(), buf).data(), logits.data());
}

}  // namespace
}  // namespace tandem
