// "llama" tokenizer: SentencePiece-style BPE driven by token scores, with byte fallback.
// The algorithm follows llama.cpp's llm_tokenizer_spm: start from the UTF-8 characters of the
// text (spaces written as U+2581), then repeatedly merge the adjacent pair whose concatenation
// is a vocab token with the highest score (ties: the leftmost pair). A priority queue holds the
// candidate bigrams; entries made stale by an earlier merge are skipped when popped.
#include <queue>
#include <string>
#include <vector>

#include "runtime/errors.h"
#include "runtime/tokenizer/tokenizer_internal.h"

namespace tandem::detail {

namespace {

// A run of the escaped text: [start, start + len). len == 0 once merged into its left neighbour.
struct symbol {
  int prev;
  int next;
  size_t start;
  size_t len;
};

struct bigram {
  float score;
  int left;
  int right;
  size_t len;  // len of left + right when queued: detects stale entries
};

// Orders the max-heap: highest score on top; among equal scores, the leftmost pair.
struct bigram_less {
  bool operator()(const bigram& a, const bigram& b) const {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  }
};

}  // namespace

void spm_build(tokenizer_tables& t) {
  // Byte fallback: the "<0xXX>" byte tokens; failing those, a single-character ASCII token.
  for (size_t i = 0; i < t.spec.tokens.size(); ++i) {
    if (t.types[i] != type_byte) continue;
    const int b = parse_byte_token(t.spec.tokens[i]);
    if (b >= 0 && t.byte_token[b] < 0) t.byte_token[b] = static_cast<token_id>(i);
  }
  for (int b = 0; b < 0x80; ++b) {
    if (t.byte_token[b] >= 0) continue;
    const char c = static_cast<char>(b);
    auto it = t.text_to_id.find(std::string_view(&c, 1));
    if (it != t.text_to_id.end()) t.byte_token[b] = it->second;
  }
}

void spm_encode(const tokenizer_tables& t, std::string_view text, std::vector<token_id>& out, bool space_prefix) {
  if (text.empty()) return;

  // Escape: optional leading space, then every ' ' becomes U+2581.
  std::string s;
  s.reserve(text.size() + 8);
  if (space_prefix) s += "\xE2\x96\x81";
  for (char c : text) {
    if (c == ' ') {
      s += "\xE2\x96\x81";
    } else {
      s += c;
    }
  }

  // One symbol per UTF-8 character (an invalid byte is a symbol of its own).
  std::vector<symbol> syms;
  syms.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const size_t len = utf8_char_len(s, i);
    const int idx = static_cast<int>(syms.size());
    syms.push_back({idx - 1, idx + 1, i, len});
    i += len;
  }
  syms.back().next = -1;

  std::priority_queue<bigram, std::vector<bigram>, bigram_less> queue;
  const bool have_scores = !t.spec.scores.empty();
  auto try_add = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    const size_t len = syms[left].len + syms[right].len;
    auto it = t.text_to_id.find(std::string_view(s).substr(syms[left].start, len));
    if (it == t.text_to_id.end()) return;
    const float score = have_scores ? t.spec.scores[it->second] : 0.0f;
    queue.push({score, left, right, len});
  };
  for (int i = 1; i < static_cast<int>(syms.size()); ++i) try_add(i - 1, i);

  while (!queue.empty()) {
    const bigram b = queue.top();
    queue.pop();
    symbol& l = syms[b.left];
    symbol& r = syms[b.right];
    if (l.len == 0 || r.len == 0 || l.next != b.right || l.len + r.len != b.len) continue;
    l.len += r.len;
    r.len = 0;
    l.next = r.next;
    if (r.next >= 0) syms[r.next].prev = b.left;
    try_add(l.prev, b.left);
    try_add(b.left, l.next);
  }

  for (int i = 0; i >= 0; i = syms[i].next) {
    const std::string_view piece = std::string_view(s).substr(syms[i].start, syms[i].len);
    auto it = t.text_to_id.find(piece);
    if (it != t.text_to_id.end()) {
      out.push_back(it->second);
      continue;
    }
    // Byte fallback; a character without byte tokens becomes one unk.
    bool all_bytes = true;
    for (char c : piece) all_bytes = all_bytes && t.byte_token[static_cast<unsigned char>(c)] >= 0;
    if (all_bytes) {
      for (char c : piece) out.push_back(t.byte_token[static_cast<unsigned char>(c)]);
    } else if (t.spec.unk_id >= 0) {
      out.push_back(t.spec.unk_id);
    } else {
      throw failure(errc::invalid_argument, "tokenizer: cannot encode '" + std::string(piece) +
                                                "': the vocab has neither byte tokens for it nor an unknown token");
    }
  }
}

}  // namespace tandem::detail
