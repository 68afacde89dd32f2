#include "runtime/structured/grammar.h"

#include <algorithm>
#include <array>
#include <limits>

#include "runtime/errors.h"

namespace tandem {

namespace {

// Bounds that keep a hostile grammar (or schema) from taking unbounded memory or time.
constexpr size_t max_text = 1 << 20;  // bytes of grammar text
constexpr size_t max_elements = 1 << 20;  // elements of the compiled program
constexpr uint32_t max_repeat = 100000;  // the m and n of {m,n}
constexpr size_t max_stacks = 4096;  // parse stacks a matcher keeps (an ambiguous grammar's)
constexpr size_t max_cached_masks = 4096;  // per grammar, then the cache starts over
constexpr size_t max_cached_grammars = 64;

using element = grammar::element;
using kind = grammar::kind;

bool name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

// The parser builds rules as lists of alternatives, each a list of elements (no `end` yet);
// compile() flattens them.
struct parser {
  using seq = std::vector<element>;
  std::string_view src;
  size_t pos = 0;
  std::vector<std::vector<seq>> rules;
  std::vector<std::string> names;
  std::vector<bool> defined;
  std::vector<size_t> first_use;  // where a rule is first named (for "not defined")
  std::unordered_map<std::string, uint32_t> ids;
  std::vector<std::pair<uint32_t, uint32_t>> ranges;
  size_t n_elements = 0;

  [[noreturn]] void fail(size_t at, const std::string& what) const {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < at && i < src.size(); ++i) {
      if (src[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    throw failure(errc::invalid_argument,
                  "grammar: line " + std::to_string(line) + ", column " + std::to_string(col) + ": " + what);
  }

  bool at_end() const { return pos >= src.size(); }
  void skip_space() {
    while (!at_end()) {
      const char c = src[pos];
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        ++pos;
      } else if (c == '#') {
        while (!at_end() && src[pos] != '\n') ++pos;
      } else {
        break;
      }
    }
  }
  std::string name() {
    const size_t b = pos;
    while (!at_end() && name_char(src[pos])) ++pos;
    return std::string(src.substr(b, pos - b));
  }
  // A rule ends where the next one begins: a name followed by `::=`.
  bool rule_start_ahead() const {
    size_t p = pos;
    while (p < src.size() && name_char(src[p])) ++p;
    if (p == pos) return false;
    while (p < src.size() && (src[p] == ' ' || src[p] == '\t' || src[p] == '\n' || src[p] == '\r')) ++p;
    return src.substr(p, 3) == "::=";
  }
  uint32_t rule_id(const std::string& n, size_t at) {
    auto [it, fresh] = ids.emplace(n, uint32_t(names.size()));
    if (fresh) {
      names.push_back(n);
      rules.emplace_back();
      defined.push_back(false);
      first_use.push_back(at);
    }
    return it->second;
  }
  uint32_t aux_rule(uint32_t owner) {
    const std::string n = names[owner] + "-" + std::to_string(names.size());
    const uint32_t id = rule_id(n, pos);
    defined[id] = true;
    return id;
  }
  void count(size_t n) {
    n_elements += n;
    if (n_elements > max_elements)
      fail(pos, "the grammar is too large (over " + std::to_string(max_elements) + " elements)");
  }

  uint32_t hex(size_t digits) {
    uint32_t v = 0;
    for (size_t i = 0; i < digits; ++i, ++pos) {
      if (at_end()) fail(pos, "incomplete escape");
      const char c = src[pos];
      const int d = c >= '0' && c <= '9'   ? c - '0'
                    : c >= 'a' && c <= 'f' ? c - 'a' + 10
                    : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                           : -1;
      if (d < 0) fail(pos, "expected a hex digit in the escape");
      v = v * 16 + uint32_t(d);
    }
    if (v > 0x10FFFF) fail(pos, "escape beyond U+10FFFF");
    return v;
  }
  // One character of a literal or class: an escape or one UTF-8 encoded code point.
  uint32_t character() {
    if (at_end()) fail(pos, "unexpected end of grammar");
    const auto c = static_cast<unsigned char>(src[pos]);
    if (c == '\\') {
      ++pos;
      if (at_end()) fail(pos, "incomplete escape");
      const char e = src[pos++];
      switch (e) {
        case 'n': return '\n';
        case 'r': return '\r';
        case 't': return '\t';
        case '0': return 0;
        case 'x': return hex(2);
        case 'u': return hex(4);
        case 'U': return hex(8);
        case '\\':
        case '"':
        case '[':
        case ']':
        case '-':
        case '^':
        case '/':
        case '\'': return uint32_t(e);
        default: fail(pos - 1, std::string("unknown escape '\\") + e + "'");
      }
    }
    if (c < 0x80) {
      ++pos;
      return c;
    }
    const int len = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    if (len == 0 || pos + size_t(len) > src.size()) fail(pos, "invalid UTF-8 in the grammar");
    uint32_t cp = c & (0x7F >> len);
    for (int i = 1; i < len; ++i) {
      const auto b = static_cast<unsigned char>(src[pos + size_t(i)]);
      if ((b & 0xC0) != 0x80) fail(pos, "invalid UTF-8 in the grammar");
      cp = (cp << 6) | (b & 0x3F);
    }
    pos += size_t(len);
    return cp;
  }
  element chars(std::vector<std::pair<uint32_t, uint32_t>> rs, bool negated) {
    element e;
    e.k = kind::chars;
    e.negated = negated;
    e.first = uint32_t(ranges.size());
    e.count = uint32_t(rs.size());
    ranges.insert(ranges.end(), rs.begin(), rs.end());
    return e;
  }
  element ref(uint32_t rule) {
    element e;
    e.k = kind::rule;
    e.rule = rule;
    return e;
  }

  void parse_all() {
    skip_space();
    while (!at_end()) {
      const size_t at = pos;
      const std::string n = name();
      if (n.empty()) fail(at, "expected a rule name");
      skip_space();
      if (src.substr(pos, 3) != "::=") fail(pos, "expected '::=' after the rule name '" + n + "'");
      pos += 3;
      const uint32_t id = rule_id(n, at);
      if (defined[id]) fail(at, "the rule '" + n + "' is defined twice");
      defined[id] = true;
      auto alts = alternatives(id, false);
      rules[id] = std::move(alts);
      skip_space();
    }
  }
  std::vector<seq> alternatives(uint32_t owner, bool nested) {
    std::vector<seq> alts;
    alts.push_back(sequence(owner, nested));
    while (!at_end() && src[pos] == '|') {
      ++pos;
      alts.push_back(sequence(owner, nested));
    }
    return alts;
  }
  seq sequence(uint32_t owner, bool nested) {
    seq out;
    size_t last = std::string::npos;  // where the last repeatable item starts in `out`
    for (;;) {
      skip_space();
      if (at_end()) break;
      const char c = src[pos];
      if (c == '|') break;
      if (c == ')') {
        if (!nested) fail(pos, "unbalanced ')'");
        break;
      }
      if (rule_start_ahead()) {
        if (nested) fail(pos, "expected ')' before the next rule");
        break;
      }
      const size_t at = pos;
      if (c == '"') {
        ++pos;
        last = out.size();
        while (!at_end() && src[pos] != '"') {
          const uint32_t cp = character();
          out.push_back(chars({{cp, cp}}, false));
        }
        if (at_end()) fail(at, "unterminated string literal");
        ++pos;
        if (out.size() == last) last = std::string::npos;  // "" matches nothing to repeat
      } else if (c == '[') {
        ++pos;
        const bool negated = !at_end() && src[pos] == '^';
        if (negated) ++pos;
        std::vector<std::pair<uint32_t, uint32_t>> rs;
        while (!at_end() && src[pos] != ']') {
          const uint32_t lo = character();
          uint32_t hi = lo;
          if (pos + 1 < src.size() && src[pos] == '-' && src[pos + 1] != ']') {
            ++pos;
            hi = character();
            if (hi < lo) fail(at, "a character range goes backwards");
          }
          rs.emplace_back(lo, hi);
        }
        if (at_end()) fail(at, "unterminated character class");
        ++pos;
        if (rs.empty()) fail(at, "empty character class");
        last = out.size();
        out.push_back(chars(std::move(rs), negated));
      } else if (c == '.') {
        ++pos;
        last = out.size();
        out.push_back(chars({}, true));  // not in no range: any code point
      } else if (c == '(') {
        ++pos;
        const uint32_t aux = aux_rule(owner);
        auto alts = alternatives(aux, true);
        if (at_end() || src[pos] != ')') fail(at, "expected ')' to close this group");
        ++pos;
        rules[aux] = std::move(alts);
        last = out.size();
        out.push_back(ref(aux));
      } else if (name_char(c)) {
        const std::string n = name();
        last = out.size();
        out.push_back(ref(rule_id(n, at)));
      } else if (c == '*' || c == '+' || c == '?' || c == '{') {
        if (last == std::string::npos) fail(at, std::string("'") + c + "' has nothing to repeat");
        uint32_t lo = 0, hi = 0;
        bool bounded = true;
        ++pos;
        if (c == '*') {
          bounded = false;
        } else if (c == '+') {
          lo = 1;
          bounded = false;
        } else if (c == '?') {
          hi = 1;
        } else {
          skip_space();
          lo = number(at);
          skip_space();
          hi = lo;
          if (!at_end() && src[pos] == ',') {
            ++pos;
            skip_space();
            if (!at_end() && src[pos] == '}') {
              bounded = false;
            } else {
              hi = number(at);
              if (hi < lo) fail(at, "in {m,n}, n is below m");
            }
            skip_space();
          }
          if (at_end() || src[pos] != '}') fail(at, "expected '}' to close the repetition");
          ++pos;
        }
        repeat(out, last, lo, bounded ? int64_t(hi) : -1, owner, at);
        last = std::string::npos;
      } else {
        fail(at, std::string("unexpected character '") + c + "'");
      }
    }
    count(out.size() + 1);
    return out;
  }
  uint32_t number(size_t at) {
    uint64_t v = 0;
    const size_t b = pos;
    while (!at_end() && src[pos] >= '0' && src[pos] <= '9') {
      v = v * 10 + uint64_t(src[pos] - '0');
      if (v > max_repeat) fail(at, "a repetition count above " + std::to_string(max_repeat));
      ++pos;
    }
    if (pos == b) fail(pos, "expected a number in the repetition");
    return uint32_t(v);
  }
  // out[from..] repeated lo..hi times (hi -1: unbounded): lo copies, then the optional rest
  // as right-recursive helper rules (x* is r ::= x r | ; x{0,3} nests three such rules).
  void repeat(seq& out, size_t from, uint32_t lo, int64_t hi, uint32_t owner, size_t at) {
    const seq item(out.begin() + std::ptrdiff_t(from), out.end());
    out.resize(from);
    const uint64_t copies = lo + uint64_t(hi < 0 ? 1 : hi - lo);
    if (copies * (item.size() + 2) > max_elements) fail(at, "the repetition makes the grammar too large");
    count(size_t(copies * (item.size() + 2)));
    for (uint32_t i = 0; i < lo; ++i) out.insert(out.end(), item.begin(), item.end());
    if (hi < 0) {
      const uint32_t r = aux_rule(owner);
      seq more = item;
      more.push_back(ref(r));
      rules[r] = {std::move(more), {}};
      out.push_back(ref(r));
    } else if (hi > int64_t(lo)) {
      uint32_t inner = 0;
      for (int64_t i = 0; i < hi - int64_t(lo); ++i) {
        const uint32_t r = aux_rule(owner);
        seq more = item;
        if (i > 0) more.push_back(ref(inner));
        rules[r] = {std::move(more), {}};
        inner = r;
      }
      out.push_back(ref(inner));
    }
  }

  // Undefined rules, a missing root, and rules that reach themselves without consuming input
  // (the matcher would expand them forever).
  uint32_t check() const {
    for (size_t r = 0; r < names.size(); ++r)
      if (!defined[r]) fail(first_use[r], "the rule '" + names[r] + "' is not defined");
    const auto root = ids.find("root");
    if (root == ids.end()) fail(0, "the grammar has no 'root' rule");
    const size_t n = names.size();
    std::vector<bool> nullable(n, false);
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < n; ++r) {
        if (nullable[r]) continue;
        for (const auto& alt : rules[r]) {
          if (std::all_of(alt.begin(), alt.end(),
                          [&](const element& e) { return e.k == kind::rule && nullable[e.rule]; })) {
            nullable[r] = changed = true;
            break;
          }
        }
      }
    }
    // Left corners: the rules a rule can begin with, through nullable prefixes.
    std::vector<std::vector<uint32_t>> corner(n);
    for (size_t r = 0; r < n; ++r)
      for (const auto& alt : rules[r])
        for (const auto& e : alt) {
          if (e.k != kind::rule) break;
          corner[r].push_back(e.rule);
          if (!nullable[e.rule]) break;
        }
    std::vector<uint8_t> color(n, 0);  // 0 new, 1 on the path, 2 done
    for (size_t start = 0; start < n; ++start) {
      if (color[start]) continue;
      std::vector<std::pair<uint32_t, size_t>> path{{uint32_t(start), 0}};
      color[start] = 1;
      while (!path.empty()) {
        auto& [r, i] = path.back();
        if (i == corner[r].size()) {
          color[r] = 2;
          path.pop_back();
          continue;
        }
        const uint32_t next = corner[r][i++];
        if (color[next] == 1)
          fail(first_use[next], "the rule '" + names[next] +
                                    "' can reach itself without consuming input (left recursion, or a "
                                    "repetition of something that can match nothing)");
        if (color[next] == 0) {
          color[next] = 1;
          path.emplace_back(next, 0);
        }
      }
    }
    return root->second;
  }
};

bool in_ranges(const std::vector<std::pair<uint32_t, uint32_t>>& ranges, const element& e, uint32_t cp) {
  bool in = false;
  for (uint32_t i = e.first; i < e.first + e.count && !in; ++i) in = ranges[i].first <= cp && cp <= ranges[i].second;
  return in != e.negated;
}

// Whether some code point in [lo, hi] (those a partial UTF-8 sequence can still become) matches.
bool may_match(const std::vector<std::pair<uint32_t, uint32_t>>& ranges, const element& e, uint32_t lo, uint32_t hi) {
  for (uint32_t i = e.first; i < e.first + e.count; ++i) {
    const auto [a, b] = ranges[i];
    if (!e.negated && a <= hi && lo <= b) return true;
    if (e.negated && a <= lo && hi <= b) return false;
  }
  return e.negated;
}

void normalize(std::vector<std::vector<uint32_t>>& v) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
}

}  // namespace

std::string gbnf_literal(std::string_view bytes) {
  std::string out = "\"";
  for (unsigned char c : bytes) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += char(c);
    } else if (c < 0x20 || c == 0x7F) {
      static const char hex[] = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += char(c);
    }
  }
  return out + "\"";
}

// ---- compiling ----

std::shared_ptr<const grammar> grammar::compile(std::string_view text) {
  if (text.size() > max_text)
    throw failure(errc::invalid_argument, "grammar: the text is over " + std::to_string(max_text) + " bytes");
  parser p;
  p.src = text;
  p.parse_all();
  const uint32_t root = p.check();
  std::shared_ptr<grammar> g(new grammar());
  g->ranges_ = std::move(p.ranges);
  g->alts_.resize(p.rules.size());
  for (size_t r = 0; r < p.rules.size(); ++r)
    for (const auto& alt : p.rules[r]) {
      g->alts_[r].push_back(uint32_t(g->elems_.size()));
      g->elems_.insert(g->elems_.end(), alt.begin(), alt.end());
      g->elems_.push_back(element{});  // end
    }
  g->root_ = root;
  // Byte classes: the ASCII range cut at every range boundary of every element.
  std::vector<uint32_t> cuts{0, 0x80};
  for (const auto& [lo, hi] : g->ranges_) {
    if (lo < 0x80) cuts.push_back(lo);
    if (hi + 1 < 0x80) cuts.push_back(hi + 1);
  }
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  for (uint32_t b = 0; b < 0x80; ++b)
    g->byte_class_[b] = uint8_t(std::upper_bound(cuts.begin(), cuts.end(), b) - cuts.begin() - 1);
  for (uint32_t b = 0x80; b < 256; ++b) g->byte_class_[b] = uint8_t(cuts.size() - 1 + (b - 0x80));
  return g;
}

std::shared_ptr<const grammar> grammar::cached(const std::string& text) {
  static std::mutex mu;
  static std::unordered_map<std::string, std::shared_ptr<const grammar>> recent;
  {
    std::lock_guard lock(mu);
    if (auto it = recent.find(text); it != recent.end()) return it->second;
  }
  auto g = compile(text);  // outside the lock: a large grammar does not stall the others
  std::lock_guard lock(mu);
  if (recent.size() >= max_cached_grammars) recent.clear();
  recent.emplace(text, g);
  return g;
}

// ---- matching ----

grammar_matcher::grammar_matcher(std::shared_ptr<const grammar> g, std::shared_ptr<const token_trie> trie)
    : g_(std::move(g)), trie_(std::move(trie)) {
  reset();
}

void grammar_matcher::reset() {
  st_ = {};
  finished_ = false;
  consumed_ = 0;
  for (uint32_t a : g_->alts_[g_->root_]) {
    stack s{a};
    expand(s, st_.stacks);
  }
  normalize(st_.stacks);
}

// Moves `s` (its top an element position) down to positions where a character is expected,
// entering rules and returning from finished alternatives; each result goes to `out`. A rule
// reference that ends its alternative pushes no return position (tail calls), so right
// recursion (x* as r ::= x r |) keeps stacks flat. `s` is restored before returning.
void grammar_matcher::expand(stack& s, std::vector<stack>& out) const {
  if (out.size() > max_stacks) return;
  if (s.empty()) {
    out.push_back(s);
    return;
  }
  const uint32_t pos = s.back();
  const element& e = g_->elems_[pos];
  switch (e.k) {
    case kind::chars: out.push_back(s); return;
    case kind::end:
      s.pop_back();
      expand(s, out);
      s.push_back(pos);
      return;
    case kind::rule: {
      s.pop_back();
      const bool returns = g_->elems_[pos + 1].k != kind::end;
      if (returns) s.push_back(pos + 1);
      for (uint32_t a : g_->alts_[e.rule]) {
        s.push_back(a);
        expand(s, out);
        s.pop_back();
      }
      if (returns) s.pop_back();
      s.push_back(pos);
      return;
    }
  }
}

bool grammar_matcher::advance(const state& in, uint32_t cp, state& out) const {
  out.stacks.clear();
  out.partial = 0;
  out.left = 0;
  out.width = 0;
  for (const auto& s : in.stacks) {
    if (s.empty()) continue;  // the root is done: nothing may follow
    const element& e = g_->elems_[s.back()];
    if (!in_ranges(g_->ranges_, e, cp)) continue;
    stack t = s;
    t.back() += 1;
    expand(t, out.stacks);
  }
  normalize(out.stacks);
  // An ambiguity that explodes is cut off: the matcher is dead rather than unbounded.
  if (out.stacks.size() > max_stacks) out.stacks.clear();
  return !out.stacks.empty();
}

// Only well-formed UTF-8 goes through (RFC 3629): no overlong forms, surrogates, or code
// points past U+10FFFF, refused at the byte that makes them so. Byte-fallback tokens can spell
// any bytes; a JSON parser downstream refuses these.
bool grammar_matcher::step_byte(const state& in, uint8_t b, state& out) const {
  uint32_t partial;
  uint8_t left, width;
  if (in.left == 0) {
    if (b < 0x80) return advance(in, b, out);
    if (b >= 0xC2 && b <= 0xDF) {
      partial = b & 0x1F;
      left = 1;
    } else if ((b & 0xF0) == 0xE0) {
      partial = b & 0x0F;
      left = 2;
    } else if (b >= 0xF0 && b <= 0xF4) {
      partial = b & 0x07;
      left = 3;
    } else {
      return false;
    }
    width = uint8_t(left + 1);
  } else {
    if ((b & 0xC0) != 0x80) return false;
    partial = (in.partial << 6) | (b & 0x3F);
    left = uint8_t(in.left - 1);
    width = in.width;
    if (left == 0) return advance(in, partial, out);  // in range: checked while partial
  }
  // Mid-character: the code points the bytes so far can still become, less overlong forms,
  // surrogates and what lies past U+10FFFF; keep the stacks whose next character may be one.
  const uint32_t least = width == 2 ? 0x80 : width == 3 ? 0x800 : 0x10000;
  const uint32_t lo = std::max(partial << (6 * left), least);
  const uint32_t hi = std::min((partial << (6 * left)) | ((1u << (6 * left)) - 1), 0x10FFFFu);
  if (lo > hi || (lo >= 0xD800 && hi <= 0xDFFF)) return false;
  out.stacks.clear();
  for (const auto& s : in.stacks)
    if (!s.empty() && may_match(g_->ranges_, g_->elems_[s.back()], lo, hi)) out.stacks.push_back(s);
  out.partial = partial;
  out.left = left;
  out.width = width;
  return !out.stacks.empty();
}

bool grammar_matcher::complete() const {
  return st_.left == 0 && !st_.stacks.empty() && st_.stacks.front().empty();  // sorted: empty first
}

bool grammar_matcher::accept_bytes(std::string_view bytes) {
  if (finished_ || dead()) return false;
  state cur = st_, next;
  for (unsigned char b : bytes) {
    if (!step_byte(cur, b, next)) return false;
    std::swap(cur, next);
  }
  st_ = std::move(cur);
  return true;
}

bool grammar_matcher::accept(token_id t) {
  ++consumed_;
  if (finished_ || dead() || !trie_ || t < 0 || t >= trie_->n_vocab) {
    st_.stacks.clear();
    return false;
  }
  if (std::find(trie_->eog.begin(), trie_->eog.end(), t) != trie_->eog.end()) {
    if (complete()) {
      finished_ = true;
      return true;
    }
    st_.stacks.clear();
    return false;
  }
  const std::string& b = trie_->bytes[size_t(t)];
  if (b.empty() || !accept_bytes(b)) {
    st_.stacks.clear();
    return false;
  }
  return true;
}

std::string grammar_matcher::state_key(const state& st) {
  std::string k;
  k.reserve(8 + st.stacks.size() * 16);
  auto put = [&](uint32_t v) { k.append(reinterpret_cast<const char*>(&v), sizeof v); };
  put(st.partial);
  put(uint32_t(st.left) | uint32_t(st.width) << 8);
  for (const auto& s : st.stacks) {
    put(uint32_t(s.size()));
    for (uint32_t v : s) put(v);
  }
  return k;
}

std::string grammar_matcher::key() const {
  const uint64_t uid = trie_->uid;
  return std::string(reinterpret_cast<const char*>(&uid), sizeof uid) + state_key(st_);
}

// One mask computation walks the vocabulary trie, stepping the matcher's state by each edge's
// byte. Most of the ~2 bytes per trie node lead back to a handful of states (inside a JSON
// string every ordinary character returns to the same stacks), so the states met are interned
// and their transitions memoized as they are found: a small DFA built on the fly, after which
// a trie node costs one table lookup instead of a copy of the stacks.
struct grammar_matcher::walker {
  static constexpr int32_t unknown = -2, dead = -1;
  const grammar_matcher& m;
  std::vector<state> states;
  std::vector<std::array<int32_t, 256>> next;
  std::unordered_map<std::string, int32_t> ids;

  int32_t intern(state&& s) {
    auto [it, fresh] = ids.emplace(state_key(s), int32_t(states.size()));
    if (fresh) {
      states.push_back(std::move(s));
      next.emplace_back();
      next.back().fill(unknown);
    }
    return it->second;
  }
  int32_t step(int32_t from, uint8_t b) {
    const uint8_t c = m.g_->byte_class_[b];
    if (next[size_t(from)][c] != unknown) return next[size_t(from)][c];
    state out;
    const int32_t to = m.step_byte(states[size_t(from)], b, out) ? intern(std::move(out)) : dead;
    next[size_t(from)][c] = to;  // (intern may have moved the table)
    return to;
  }
  void walk(uint32_t node, int32_t at, token_mask& mask) {
    const token_trie& t = *m.trie_;
    const auto& n = t.nodes[node];
    for (uint32_t e = n.first_edge; e < n.first_edge + n.n_edges; ++e) {
      const int32_t to = step(at, t.edge_byte[e]);
      if (to == dead) continue;
      const uint32_t child = t.edge_child[e];
      const auto& c = t.nodes[child];
      for (uint32_t k = c.first_token; k < c.first_token + c.n_tokens; ++k) {
        const token_id id = t.tokens[k];
        mask[size_t(id) / 64] |= uint64_t(1) << (id % 64);
      }
      if (c.n_edges) walk(child, to, mask);
    }
  }
};

std::shared_ptr<const token_mask> grammar_matcher::allowed() const {
  if (!trie_) throw failure(errc::invalid_argument, "grammar_matcher::allowed needs a vocabulary");
  const size_t words = (size_t(trie_->n_vocab) + 63) / 64;
  auto with_eog = [&](token_mask& m) {
    for (token_id id : trie_->eog) m[size_t(id) / 64] |= uint64_t(1) << (id % 64);
  };
  if (finished_ || dead()) return trie_->end_only;
  const std::string k = key();
  {
    std::lock_guard lock(g_->mask_mu_);
    if (auto it = g_->masks_.find(k); it != g_->masks_.end()) return it->second;
  }
  auto m = std::make_shared<token_mask>(words, 0);
  walker w{*this, {}, {}, {}};
  const int32_t start = w.intern(state(st_));
  w.walk(0, start, *m);
  if (complete()) with_eog(*m);
  std::lock_guard lock(g_->mask_mu_);
  if (g_->masks_.size() >= max_cached_masks) g_->masks_.clear();
  g_->masks_.emplace(k, m);
  return m;
}

std::shared_ptr<const token_mask> grammar_constraint::mask_after(std::span<const token_id> output,
                                                                 const std::shared_ptr<const token_trie>& trie) {
  std::lock_guard lock(mu_);
  if (!m_ || trie_ != trie) {
    m_ = std::make_unique<grammar_matcher>(g_, trie);
    trie_ = trie;
    seen_.clear();
  }
  if (seen_.size() > output.size() || !std::equal(seen_.begin(), seen_.end(), output.begin())) {
    m_->reset();
    seen_.clear();
  }
  for (size_t i = seen_.size(); i < output.size(); ++i) {
    m_->accept(output[i]);
    seen_.push_back(output[i]);
  }
  return m_->allowed();
}

}  // namespace tandem
