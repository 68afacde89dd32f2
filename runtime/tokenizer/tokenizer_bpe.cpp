// "gpt2" tokenizer: byte-level BPE. Text is split by the GPT-2 pre-tokenizer regex, each piece's
// bytes are spelled with GPT-2's bytes_to_unicode table, and ranked merges are applied (lowest
// rank first, ties: leftmost) through a priority queue over adjacent pairs. Also here:
// make_byte_level_vocab(), which learns such a vocab from a built-in English text.
#include <algorithm>
#include <map>
#include <queue>
#include <string>
#include <tuple>
#include <vector>

#include "runtime/errors.h"
#include "runtime/tokenizer/tokenizer_internal.h"

namespace tandem::detail {

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

const std::array<uint32_t, 256>& byte_to_unicode() {
  // Printable bytes ('!'..'~', '¡'..'¬', '®'..'ÿ') stand for themselves; the others are moved,
  // in byte order, to U+0100 onwards.
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      t[b] = printable ? b : next++;
    }
    return t;
  }();
  return table;
}

const std::string& byte_spelling(uint8_t b) {
  static const std::array<std::string, 256> spellings = [] {
    std::array<std::string, 256> s;
    for (int i = 0; i < 256; ++i) append_utf8(s[i], byte_to_unicode()[i]);
    return s;
  }();
  return spellings[b];
}

std::string unspell_byte_level(std::string_view text) {
  static const std::vector<int> unicode_to_byte = [] {
    std::vector<int> m(324, -1);  // the mapping's code points are all below U+0144
    for (int b = 0; b < 256; ++b) m[byte_to_unicode()[b]] = b;
    return m;
  }();
  std::string out;
  out.reserve(text.size());
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  for (size_t i = 0; i < text.size();) {
    const int len = utf8_check(p + i, text.size() - i);
    if (len <= 0) {  // not UTF-8: keep the byte as it is
      out += text[i++];
      continue;
    }
    uint32_t cp = len == 1 ? p[i] : (p[i] & (0xFF >> (len + 1)));
    for (int k = 1; k < len; ++k) cp = (cp << 6) | (p[i + k] & 0x3F);
    if (cp < unicode_to_byte.size() && unicode_to_byte[cp] >= 0) {
      out += static_cast<char>(unicode_to_byte[cp]);
    } else {
      out.append(text.substr(i, static_cast<size_t>(len)));
    }
    i += static_cast<size_t>(len);
  }
  return out;
}

// ---- GPT-2 pre-tokenizer ----

namespace {
// The regexes of llama.cpp's pre-tokenizer table (llama-vocab.cpp), by tokenizer.ggml.pre.
constexpr char kGpt2Pattern[] = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr char kLlama3Pattern[] =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| )"
    R"(?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr char kQwen2Pattern[] =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| )"
    R"(?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr char kDigitPattern[] = R"(\p{N})";

std::vector<const char*> patterns_for(std::string_view pre) {
  // "default" is llama.cpp's fallback for unnamed BPE vocabs; GPT-2's regex stands in for it.
  for (std::string_view p : {"gpt2", "gpt-2", "default", "phi-2", "olmo", "roberta-bpe"})
    if (pre == p) return {kGpt2Pattern};
  for (std::string_view p : {"llama3", "llama-v3", "llama-bpe", "smaug-bpe", "falcon3", "dbrx", "pixtral"})
    if (pre == p) return {kLlama3Pattern};
  for (std::string_view p : {"qwen2", "deepseek-r1-qwen", "stablelm2", "megrez", "hunyuan"})
    if (pre == p) return {kQwen2Pattern};
  if (pre == "smollm") return {kDigitPattern, kGpt2Pattern};
  throw failure(
      errc::unsupported,
      "tokenizer.ggml.pre '" + std::string(pre) +
          "' is not supported (gpt-2/default, llama-bpe/llama3 and its aliases, qwen2 and its aliases, smollm)");
}
}  // namespace

gpt2_splitter::gpt2_splitter(std::string_view pre) {
  for (const char* pattern : patterns_for(pre)) {
    int err = 0;
    PCRE2_SIZE err_offset = 0;
    // MATCH_INVALID_UTF: text need not be valid UTF-8; invalid sequences simply never match.
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern), PCRE2_ZERO_TERMINATED,
                                     PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &err_offset, nullptr);
    if (code == nullptr) {
      for (auto* c : codes_) pcre2_code_free(c);
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      throw failure(errc::unsupported, std::string("tokenizer: cannot compile a pre-tokenizer regex: ") +
                                           reinterpret_cast<const char*>(msg));
    }
    (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // optional speed-up; interpreter otherwise
    codes_.push_back(code);
  }
}

gpt2_splitter::~gpt2_splitter() {
  for (auto* c : codes_) pcre2_code_free(c);
}

std::vector<std::string_view> gpt2_splitter::split(std::string_view text) const {
  std::vector<std::string_view> pieces;
  if (text.empty()) return pieces;
  split_with(codes_.front(), text, pieces);
  for (size_t r = 1; r < codes_.size(); ++r) {
    std::vector<std::string_view> finer;
    for (std::string_view p : pieces) split_with(codes_[r], p, finer);
    pieces.swap(finer);
  }
  return pieces;
}

void gpt2_splitter::split_with(const pcre2_code* code, std::string_view text,
                               std::vector<std::string_view>& pieces) const {
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> md(
      pcre2_match_data_create_from_pattern(code, nullptr), &pcre2_match_data_free);
  if (!md) throw std::bad_alloc();
  const auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t last = 0;  // end of what has been emitted
  size_t pos = 0;  // where the next search starts
  while (pos < text.size()) {
    int rc = pcre2_match(code, subject, text.size(), pos, 0, md.get(), nullptr);
    if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) {  // e.g. JIT stack limit: retry interpreted
      rc = pcre2_match(code, subject, text.size(), pos, PCRE2_NO_JIT, md.get(), nullptr);
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      throw failure(errc::invalid_argument,
                    std::string("tokenizer: pre-tokenizer regex failed: ") + reinterpret_cast<const char*>(msg));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
    const size_t start = ov[0], end = ov[1];
    if (end == start) {  // none of the patterns matches empty; never loop on an empty match
      pos = start + 1;
      continue;
    }
    if (start > last) pieces.push_back(text.substr(last, start - last));  // unmatched bytes
    pieces.push_back(text.substr(start, end - start));
    last = pos = end;
  }
  if (last < text.size()) pieces.push_back(text.substr(last));
}

// ---- encoding ----

void bpe_build(tokenizer_tables& t) {
  for (int b = 0; b < 256; ++b) {
    auto it = t.text_to_id.find(byte_spelling(static_cast<uint8_t>(b)));
    if (it != t.text_to_id.end()) t.byte_token[b] = it->second;
  }
  // A merge is usable when both sides and their concatenation are tokens; the first (lowest
  // ranked) rule for a pair wins.
  t.merges.reserve(t.spec.merges.size());
  std::string joined;
  for (size_t rank = 0; rank < t.spec.merges.size(); ++rank) {
    const std::string_view m = t.spec.merges[rank];
    const size_t sp = m.find(' ');  // validated: exactly one, not at either end
    const std::string_view left = m.substr(0, sp), right = m.substr(sp + 1);
    auto l = t.text_to_id.find(left), r = t.text_to_id.find(right);
    if (l == t.text_to_id.end() || r == t.text_to_id.end()) continue;
    joined.assign(left).append(right);
    auto res = t.text_to_id.find(joined);
    if (res == t.text_to_id.end()) continue;
    t.merges.emplace(pair_key(l->second, r->second), merge_rule{static_cast<int32_t>(rank), res->second});
  }
  t.splitter = std::make_unique<gpt2_splitter>(t.spec.pre);
  for (std::string_view p : {"llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral"})
    if (t.spec.pre == p) t.ignore_merges = true;
}

namespace {

struct bpe_symbol {
  token_id id;  // -1: a byte without a token (becomes unk)
  int prev;
  int next;
  bool alive;
};

struct bpe_bigram {
  int32_t rank;
  int left;
  int right;
  token_id left_id;
  token_id right_id;
  token_id result;
};

// Orders the heap so that the lowest rank is on top; among equal ranks, the leftmost pair.
struct bpe_bigram_greater {
  bool operator()(const bpe_bigram& a, const bpe_bigram& b) const {
    return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
  }
};

}  // namespace

void bpe_encode(const tokenizer_tables& t, std::string_view text, std::vector<token_id>& out) {
  std::vector<bpe_symbol> syms;
  std::priority_queue<bpe_bigram, std::vector<bpe_bigram>, bpe_bigram_greater> queue;
  auto try_add = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    const token_id l = syms[left].id, r = syms[right].id;
    if (l < 0 || r < 0) return;
    auto it = t.merges.find(pair_key(l, r));
    if (it == t.merges.end()) return;
    queue.push({it->second.rank, left, right, l, r, it->second.result});
  };

  std::string spelled;
  for (std::string_view piece : t.splitter->split(text)) {
    if (t.ignore_merges) {
      spelled.clear();
      for (char c : piece) spelled += byte_spelling(static_cast<uint8_t>(c));
      if (auto it = t.text_to_id.find(spelled); it != t.text_to_id.end()) {
        out.push_back(it->second);
        continue;
      }
    }
    syms.clear();
    const int n = static_cast<int>(piece.size());
    for (int i = 0; i < n; ++i) {
      syms.push_back({t.byte_token[static_cast<unsigned char>(piece[i])], i - 1, i + 1 < n ? i + 1 : -1, true});
    }
    for (int i = 1; i < n; ++i) try_add(i - 1, i);
    while (!queue.empty()) {
      const bpe_bigram b = queue.top();
      queue.pop();
      bpe_symbol& l = syms[b.left];
      bpe_symbol& r = syms[b.right];
      if (!l.alive || !r.alive || l.next != b.right || l.id != b.left_id || r.id != b.right_id) {
        continue;  // stale
      }
      l.id = b.result;
      l.next = r.next;
      r.alive = false;
      if (r.next >= 0) syms[r.next].prev = b.left;
      try_add(l.prev, b.left);
      try_add(b.left, l.next);
    }
    for (int i = 0; i >= 0; i = syms[i].next) {
      if (syms[i].id >= 0) {
        out.push_back(syms[i].id);
      } else if (t.spec.unk_id >= 0) {
        out.push_back(t.spec.unk_id);
      } else {
        throw failure(errc::invalid_argument, "tokenizer: byte " +
                                                  std::to_string(static_cast<unsigned char>(piece[i])) +
                                                  " has no token and the vocab has no unknown token");
      }
    }
  }
}

}  // namespace tandem::detail

// ---- make_byte_level_vocab ----

namespace tandem {

namespace {

// The training text for make_byte_level_vocab: plain English prose with punctuation, digits
// and newlines. Changing it changes every synthetic vocab, so leave it alone.
constexpr std::string_view kTrainingText =
    "The old lighthouse stood at the end of the harbor road, and every evening at half past "
    "six the keeper climbed its 112 steps to light the lamp. She had done it for 23 years. "
    "The town below knew the sound of her boots on the iron stairs, and the children said "
    "that the light was the eye of the sea, watching over the boats as they came home.\n"
    "In the spring of 1987 a storm came in from the west. The wind pulled at the roofs, the "
    "rain fell in long grey sheets, and the waves were higher than anyone could remember. "
    "Three fishing boats were still out on the water. The keeper watched them from the top "
    "of the tower: one, two, three small lights, rising and falling in the dark.\n"
    "\"They will make it,\" she told herself. \"They always do.\" But the wind was getting "
    "stronger, and at 9:45 the power went out across the whole town. The streets went black. "
    "The lamp in the tower flickered once, twice, and then it was dark as well.\n"
    "She did not wait. She found the old oil lantern in the store room, filled it with her "
    "hands shaking, and carried it up the stairs, one step at a time. At the top she set it "
    "in front of the great glass lens and struck a match. The flame caught. The lens took "
    "the small light and turned it into a bright beam that reached far out over the waves.\n"
    "On the water, the first captain saw the beam and turned his boat toward the harbor. The "
    "second followed him, and then the third. It took them almost an hour to come in, but "
    "at 10:52 all three boats were tied up safely at the pier, and 14 tired men walked up "
    "the hill to their homes.\n"
    "The next morning the mayor came to the lighthouse with a basket of bread, cheese and "
    "apples. \"You saved them,\" he said. \"How can the town thank you?\" The keeper only "
    "smiled. \"Fix the power lines,\" she said, \"and buy me a new can of oil. I used the "
    "last of it last night.\"\n"
    "Years later, when the lighthouse was replaced by an automatic light, people still "
    "talked about that night. The children who had heard the story told it to their own "
    "children, and they told it to theirs. Some of the details changed with each telling: "
    "the waves grew taller, the storm lasted longer, and the number of boats went from three "
    "to five, then to seven. But the heart of the story stayed the same.\n"
    "It is a simple story, really. A person had a job to do, and when things went wrong, she "
    "did the job anyway, with what she had. She did not ask whether it was her place, or "
    "whether someone else would do it. She simply climbed the stairs.\n"
    "Today the lighthouse is a small museum. For 5 dollars you can climb the same 112 steps "
    "and look out over the harbor. On the wall at the top there is a little brass plate, "
    "and on it are the words she is said to have spoken that night: \"The light does not "
    "ask who needs it. It just shines.\"\n"
    "Questions for the reader: What would you have done? Is it better to wait for help, or "
    "to act at once? Write down your answer in 100 words or less, and share it with a friend "
    "before the end of the week.\n";

}  // namespace

vocab_spec make_byte_level_vocab(int32_t n_vocab) {
  if (n_vocab < 259) {
    throw failure(errc::invalid_argument,
                  "make_byte_level_vocab: n_vocab must be at least 259, got " + std::to_string(n_vocab));
  }
  vocab_spec spec;
  spec.model = "gpt2";
  spec.pre = "gpt2";
  spec.bos_id = 1;
  spec.eos_id = 2;
  spec.unk_id = 0;
  spec.add_bos = true;
  spec.add_eos = false;
  spec.add_space_prefix = false;
  spec.tokens.reserve(n_vocab);
  spec.token_types.reserve(n_vocab);
  auto add_token = [&spec](std::string text, int32_t type) {
    spec.tokens.push_back(std::move(text));
    spec.token_types.push_back(type);
  };
  add_token("<unk>", detail::type_unknown);
  add_token("<s>", detail::type_control);
  add_token("</s>", detail::type_control);
  for (int b = 0; b < 256; ++b) {
    add_token(detail::byte_spelling(static_cast<uint8_t>(b)), detail::type_normal);
  }
  std::map<std::string, token_id, std::less<>> index;
  for (size_t i = 0; i < spec.tokens.size(); ++i) {
    index.emplace(spec.tokens[i], static_cast<token_id>(i));
  }

  // The training corpus: each distinct pre-token piece as a sequence of ids, with its count.
  std::map<std::string_view, int64_t> piece_counts;
  const detail::gpt2_splitter splitter;
  for (std::string_view piece : splitter.split(kTrainingText)) ++piece_counts[piece];
  std::vector<std::vector<token_id>> words;
  std::vector<int64_t> counts;
  for (const auto& [piece, count] : piece_counts) {
    if (piece.size() < 2) continue;  // no pairs, ever
    std::vector<token_id> w;
    for (char c : piece) w.push_back(3 + static_cast<unsigned char>(c));
    words.push_back(std::move(w));
    counts.push_back(count);
  }

  // Pair counts over the corpus, kept up to date as words change.
  std::unordered_map<uint64_t, int64_t> pair_counts;
  auto count_pairs = [&pair_counts](const std::vector<token_id>& w, int64_t count) {
    for (size_t i = 1; i < w.size(); ++i) {
      const uint64_t key = detail::pair_key(w[i - 1], w[i]);
      if ((pair_counts[key] += count) == 0) pair_counts.erase(key);
    }
  };
  for (size_t w = 0; w < words.size(); ++w) count_pairs(words[w], counts[w]);

  std::vector<token_id> merged_word;
  while (static_cast<int32_t>(spec.tokens.size()) < n_vocab && !pair_counts.empty()) {
    // The most frequent pair; ties go to the lexicographically smallest (left, right) text.
    token_id best_l = -1, best_r = -1;
    int64_t best_count = 0;
    for (const auto& [key, count] : pair_counts) {
      const auto l = static_cast<token_id>(key >> 32), r = static_cast<token_id>(key & 0xFFFFFFFFu);
      if (best_l < 0 || count > best_count ||
          (count == best_count &&
           std::tie(spec.tokens[l], spec.tokens[r]) < std::tie(spec.tokens[best_l], spec.tokens[best_r]))) {
        best_l = l;
        best_r = r;
        best_count = count;
      }
    }
    std::string merged = spec.tokens[best_l] + spec.tokens[best_r];
    spec.merges.push_back(spec.tokens[best_l] + " " + spec.tokens[best_r]);
    token_id merged_id;
    if (auto it = index.find(merged); it != index.end()) {
      merged_id = it->second;  // the same text was already made from another pair
    } else {
      merged_id = static_cast<token_id>(spec.tokens.size());
      index.emplace(merged, merged_id);
      add_token(std::move(merged), detail::type_normal);
    }
    // Rewrite the words holding the pair (left to right, non-overlapping), updating counts.
    for (size_t w = 0; w < words.size(); ++w) {
      std::vector<token_id>& word = words[w];
      bool found = false;
      for (size_t i = 1; i < word.size() && !found; ++i) {
        found = word[i - 1] == best_l && word[i] == best_r;
      }
      if (!found) continue;
      merged_word.clear();
      for (size_t i = 0; i < word.size(); ++i) {
        if (i + 1 < word.size() && word[i] == best_l && word[i + 1] == best_r) {
          merged_word.push_back(merged_id);
          ++i;
        } else {
          merged_word.push_back(word[i]);
        }
      }
      count_pairs(word, -counts[w]);
      count_pairs(merged_word, counts[w]);
      word.swap(merged_word);
    }
  }

  // The text ran out of pairs: fill up with unused tokens.
  for (int64_t k = 0; static_cast<int32_t>(spec.tokens.size()) < n_vocab; ++k) {
    std::string name = "<unused_" + std::to_string(k) + ">";
    if (index.count(name) != 0) continue;
    index.emplace(name, static_cast<token_id>(spec.tokens.size()));
    add_token(std::move(name), detail::type_unused);
  }
  return spec;
}

}  // namespace tandem
