// Lexer and parser of the Jinja interpreter: template source -> syntax tree (jinja_internal.h).
//
// The lexer applies the whitespace rules that transformers renders chat templates with, and that
// llama.cpp matches: trim_blocks (the newline right after a block or comment tag goes),
// lstrip_blocks (spaces and tabs before a block or comment tag at the start of a line go), the
// `-` and `+` modifiers on tags, newlines normalised to \n and one trailing newline dropped
// (Jinja2's keep_trailing_newline=False). Operator precedence follows Jinja2's parser, including
// its quirks: `~` binds tighter than `+`, `**` is left-associative, filters bind tighter than
// unary minus's operand but apply to the negation (`-3|abs` is 3).
#include <cerrno>
#include <cstring>

#include "runtime/text/jinja_internal.h"

namespace tandem::jinja::detail {
namespace {

enum class tok { text, var_begin, var_end, block_begin, block_end, name, string, integer, floating, op, eof };

struct token {
  tok type;
  std::string text;  // text, name, operator, or the decoded string literal
  value number;  // integer and floating literals
  source_pos pos;
};

class lexer {
 public:
  explicit lexer(std::string_view raw) {
    // Jinja2 normalises every newline to \n and drops one trailing newline before lexing.
    src_.reserve(raw.size());
    for (size_t i = 0; i < raw.size(); ++i) {
      if (raw[i] == '\r') {
        src_ += '\n';
        if (i + 1 < raw.size() && raw[i + 1] == '\n') ++i;
      } else {
        src_ += raw[i];
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i)
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
  }

  std::vector<token> run() {
    size_t p = 0;
    bool line_starting = true;  // the text at p starts a line (Jinja2's lstrip_blocks rule)
    while (p < src_.size()) {
      size_t open = find_tag(p);
      std::string text = src_.substr(p, open - p);
      source_pos text_pos = pos_at(p);
      if (open == src_.size()) {
        add_text(std::move(text), text_pos);
        break;
      }
      char kind = src_[open + 1];  // '{', '%' or '#'
      char mod = open + 2 < src_.size() ? src_[open + 2] : '\0';
      if (mod == '-') {
        rstrip(text);
      } else if (mod != '+' && kind != '{') {
        size_t l = text.rfind('\n');
        size_t from = l == std::string::npos ? 0 : l + 1;
        if ((l != std::string::npos || line_starting) && text.find_first_not_of(" \t", from) == std::string::npos)
          text.erase(from);
      }
      add_text(std::move(text), text_pos);
      size_t inner = open + 2 + ((mod == '-' || mod == '+') ? 1 : 0);
      if (kind == '#') {
        size_t close = src_.find("#}", inner);
        if (close == std::string::npos) fail("unterminated comment", pos_at(open));
        p = after_tag_end(close, close + 2, true, &line_starting);
        continue;
      }
      if (kind == '%' && is_raw_begin(inner)) {
        p = lex_raw(open, &line_starting);
        continue;
      }
      out_.push_back({kind == '{' ? tok::var_begin : tok::block_begin, "", {}, pos_at(open)});
      p = lex_tag(inner, kind == '%', &line_starting);
    }
    out_.push_back({tok::eof, "", {}, pos_at(src_.size())});
    return std::move(out_);
  }

  source_pos pos_at(size_t offset) const {
    size_t lo = 0, hi = line_starts_.size();
    while (hi - lo > 1) {
      size_t mid = (lo + hi) / 2;
      if (line_starts_[mid] <= offset) lo = mid;
      else hi = mid;
    }
    return {int(lo + 1), int(offset - line_starts_[lo] + 1)};
  }

 private:
  std::string src_;
  std::vector<size_t> line_starts_;
  std::vector<token> out_;

  size_t find_tag(size_t p) const {
    for (size_t i = p; i + 1 < src_.size(); ++i)
      if (src_[i] == '{' && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    return src_.size();
  }

  static void rstrip(std::string& s) {
    size_t e = s.find_last_not_of(" \t\n\r\f\v");
    s.erase(e == std::string::npos ? 0 : e + 1);
  }

  void add_text(std::string text, source_pos pos) {
    if (!text.empty()) out_.push_back({tok::text, std::move(text), {}, pos});
  }

  // After a tag ends at `close` (the `%}`, `}}` or `#}`), skips whitespace per the modifiers and
  // trim_blocks; returns where the next text starts.
  size_t after_tag_end(size_t close, size_t end, bool block, bool* line_starting) {
    char before = close > 0 ? src_[close - 1] : '\0';
    size_t p = end;
    if (before == '-') {
      while (p < src_.size() && std::strchr(" \t\n\r\f\v", src_[p])) ++p;
    } else if (block && before != '+' && p < src_.size() && src_[p] == '\n') {
      ++p;  // trim_blocks
    }
    *line_starting = p > end && src_[p - 1] == '\n';
    return p;
  }

  bool is_raw_begin(size_t p) const {
    while (p < src_.size() && std::isspace(static_cast<unsigned char>(src_[p]))) ++p;
    if (src_.compare(p, 3, "raw") != 0) return false;
    p += 3;
    while (p < src_.size() && std::isspace(static_cast<unsigned char>(src_[p]))) ++p;
    if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) ++p;
    return src_.compare(p, 2, "%}") == 0;
  }

  // {% raw %}...{% endraw %}: the text between goes out verbatim.
  size_t lex_raw(size_t open, bool* line_starting) {
    size_t close = src_.find("%}", open);
    size_t p = after_tag_end(close, close + 2, true, line_starting);
    for (size_t q = src_.find("{%", p); q != std::string::npos; q = src_.find("{%", q + 2)) {
      size_t r = q + 2;
      char mod = r < src_.size() ? src_[r] : '\0';
      if (mod == '-' || mod == '+') ++r;
      while (r < src_.size() && std::isspace(static_cast<unsigned char>(src_[r]))) ++r;
      if (src_.compare(r, 6, "endraw") != 0) continue;
      r += 6;
      while (r < src_.size() && std::isspace(static_cast<unsigned char>(src_[r]))) ++r;
      if (r < src_.size() && (src_[r] == '-' || src_[r] == '+')) ++r;
      if (src_.compare(r, 2, "%}") != 0) continue;
      std::string text = src_.substr(p, q - p);
      if (mod == '-') rstrip(text);
      add_text(std::move(text), pos_at(p));
      return after_tag_end(r, r + 2, true, line_starting);
    }
    fail("unterminated 'raw' block: no {% endraw %}", pos_at(open));
  }

  // Tokens of one {{ ... }} or {% ... %}; returns where the text after it starts.
  size_t lex_tag(size_t p, bool block, bool* line_starting) {
    const char* close = block ? "%}" : "}}";
    int brackets = 0;  // a `}}` inside an open { or [ or ( belongs to the expression
    while (true) {
      while (p < src_.size() && std::isspace(static_cast<unsigned char>(src_[p]))) ++p;
      if (p >= src_.size()) fail(std::string("unterminated tag: expected '") + close + "'", pos_at(p));
      if (brackets == 0) {
        size_t q = p;
        if ((src_[q] == '-' || src_[q] == '+') && q + 1 < src_.size()) ++q;
        if (src_.compare(q, 2, close) == 0) {
          out_.push_back({block ? tok::block_end : tok::var_end, "", {}, pos_at(p)});
          return after_tag_end(q, q + 2, block, line_starting);
        }
      }
      source_pos pos = pos_at(p);
      char c = src_[p];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t s = p;
        while (p < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[p])) || src_[p] == '_')) ++p;
        out_.push_back({tok::name, src_.substr(s, p - s), {}, pos});
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        bool after_dot = !out_.empty() && out_.back().type == tok::op && out_.back().text == ".";
        p = lex_number(p, !after_dot, pos);
      } else if (c == '\'' || c == '"') {
        p = lex_string(p, pos);
      } else {
        static const char* ops[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<",
                                    ">",  "=",  ".",  ",",  ":",  "|",  "(", ")", "[", "]", "{", "}"};
        const char* found = nullptr;
        for (const char* op : ops)
          if (src_.compare(p, std::strlen(op), op) == 0) {
            found = op;
            break;
          }
        if (!found) fail(std::string("unexpected character '") + c + "'", pos);
        std::string op = found;
        if (op == "(" || op == "[" || op == "{") ++brackets;
        if ((op == ")" || op == "]" || op == "}") && brackets > 0) --brackets;
        out_.push_back({tok::op, op, {}, pos});
        p += op.size();
      }
    }
  }

  size_t lex_number(size_t p, bool allow_float, source_pos pos) {
    // 0x1f, 0o17, 0b101 (with optional underscores), as Jinja2 accepts.
    if (src_[p] == '0' && p + 1 < src_.size() && std::strchr("xXoObB", src_[p + 1])) {
      int base = std::tolower(src_[p + 1]) == 'x' ? 16 : std::tolower(src_[p + 1]) == 'o' ? 8 : 2;
      size_t q = p + 2;
      std::string digits;
      while (q < src_.size() && (std::isxdigit(static_cast<unsigned char>(src_[q])) || src_[q] == '_')) {
        if (src_[q] != '_') digits += src_[q];
        ++q;
      }
      errno = 0;
      char* end = nullptr;
      long long v = std::strtoll(digits.c_str(), &end, base);
      if (digits.empty() || *end != '\0' || errno == ERANGE) fail("bad integer literal", pos);
      out_.push_back({tok::integer, src_.substr(p, q - p), value(int64_t(v)), pos});
      return q;
    }
    std::string digits;
    auto take_digits = [&] {
      bool any = false;
      while (p < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[p])) || (src_[p] == '_' && any))) {
        if (src_[p] != '_') digits += src_[p];
        any = true;
        ++p;
      }
    };
    take_digits();
    bool is_float = false;
    if (allow_float && p + 1 < src_.size() && src_[p] == '.' && std::isdigit(static_cast<unsigned char>(src_[p + 1]))) {
      digits += '.';
      ++p;
      take_digits();
      is_float = true;
    }
    if (allow_float && p < src_.size() && (src_[p] == 'e' || src_[p] == 'E')) {
      size_t q = p + 1;
      if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
      if (q < src_.size() && std::isdigit(static_cast<unsigned char>(src_[q]))) {
        digits += 'e';
        digits.append(src_, p + 1, q - p - 1);
        p = q;
        take_digits();
        is_float = true;
      }
    }
    if (is_float) {
      out_.push_back({tok::floating, digits, value(std::strtod(digits.c_str(), nullptr)), pos});
    } else {
      errno = 0;
      long long v = std::strtoll(digits.c_str(), nullptr, 10);
      if (errno == ERANGE) fail("integer literal out of range", pos);
      out_.push_back({tok::integer, digits, value(int64_t(v)), pos});
    }
    return p;
  }

  static void append_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) out += char(cp);
    else if (cp < 0x800) {
      out += char(0xc0 | (cp >> 6));
      out += char(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
      out += char(0xe0 | (cp >> 12));
      out += char(0x80 | ((cp >> 6) & 0x3f));
      out += char(0x80 | (cp & 0x3f));
    } else {
      out += char(0xf0 | (cp >> 18));
      out += char(0x80 | ((cp >> 12) & 0x3f));
      out += char(0x80 | ((cp >> 6) & 0x3f));
      out += char(0x80 | (cp & 0x3f));
    }
  }

  // A string literal with Python's escapes (\n \t \xhh \uhhhh ...); an unknown escape keeps its
  // backslash, as Python does.
  size_t lex_string(size_t p, source_pos pos) {
    char q = src_[p++];
    std::string s;
    while (true) {
      if (p >= src_.size()) fail("unterminated string literal", pos);
      char c = src_[p++];
      if (c == q) break;
      if (c != '\\') {
        s += c;
        continue;
      }
      if (p >= src_.size()) fail("unterminated string literal", pos);
      char e = src_[p++];
      auto hex = [&](int n) {
        if (p + size_t(n) > src_.size()) fail("truncated escape in string literal", pos);
        uint32_t v = 0;
        for (int i = 0; i < n; ++i) {
          char h = src_[p++];
          if (!std::isxdigit(static_cast<unsigned char>(h))) fail("bad escape in string literal", pos);
          v = v * 16 + uint32_t(std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (std::tolower(h) - 'a' + 10));
        }
        return v;
      };
      switch (e) {
        case 'n': s += '\n'; break;
        case 't': s += '\t'; break;
        case 'r': s += '\r'; break;
        case '\\': s += '\\'; break;
        case '\'': s += '\''; break;
        case '"': s += '"'; break;
        case 'a': s += '\a'; break;
        case 'b': s += '\b'; break;
        case 'f': s += '\f'; break;
        case 'v': s += '\v'; break;
        case '\n': break;  // line continuation
        case 'x': append_utf8(s, hex(2)); break;
        case 'u': append_utf8(s, hex(4)); break;
        case 'U': {
          uint32_t cp = hex(8);
          if (cp > 0x10ffff) fail("bad \\U escape in string literal", pos);
          append_utf8(s, cp);
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            uint32_t v = uint32_t(e - '0');
            for (int i = 0; i < 2 && p < src_.size() && src_[p] >= '0' && src_[p] <= '7'; ++i)
              v = v * 8 + uint32_t(src_[p++] - '0');
            append_utf8(s, v);
          } else {
            s += '\\';
            s += e;
          }
      }
    }
    out_.push_back({tok::string, std::move(s), {}, pos});
    return p;
  }
};

// ---- parser -------------------------------------------------------------------------------------

class parser {
 public:
  explicit parser(std::vector<token> toks) : t_(std::move(toks)) {}

  std::shared_ptr<program_ast> run() {
    auto prog = std::make_shared<program_ast>();
    std::string end = parse_body(prog->root, {});
    (void)end;
    return prog;
  }

 private:
  std::vector<token> t_;
  size_t i_ = 0;
  int depth_ = 0;

  struct nest {
    parser& p;
    nest(parser& ps, source_pos pos) : p(ps) {
      if (++p.depth_ > max_depth) fail("template nests deeper than " + std::to_string(max_depth) + " levels", pos);
    }
    ~nest() { --p.depth_; }
  };

  const token& cur() const { return t_[i_]; }
  const token& peek(size_t k = 1) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  bool is_op(const char* op) const { return cur().type == tok::op && cur().text == op; }
  bool is_name(const char* n) const { return cur().type == tok::name && cur().text == n; }
  const token& next() { return t_[i_ < t_.size() - 1 ? i_++ : i_]; }

  static std::string describe(const token& t) {
    switch (t.type) {
      case tok::eof: return "end of template";
      case tok::var_end: return "'}}'";
      case tok::block_end: return "'%}'";
      case tok::string: return "string literal";
      case tok::text: return "text";
      default: return "'" + t.text + "'";
    }
  }
  [[noreturn]] void unexpected(const std::string& wanted) const {
    fail("expected " + wanted + ", got " + describe(cur()), cur().pos);
  }
  void expect_op(const char* op) {
    if (!is_op(op)) unexpected(std::string("'") + op + "'");
    next();
  }
  std::string expect_name() {
    if (cur().type != tok::name) unexpected("a name");
    return next().text;
  }
  void expect_block_end() {
    if (cur().type != tok::block_end) unexpected("'%}'");
    next();
  }

  // Parses statements until a block tag named in `ends` (which is consumed, tag name returned)
  // or the end of the template (only allowed when `ends` is empty).
  std::string parse_body(body& out, const std::vector<std::string_view>& ends, source_pos opened = {},
                         std::string_view opener = "") {
    nest guard(*this, cur().pos);
    while (true) {
      const token& t = cur();
      if (t.type == tok::eof) {
        if (ends.empty()) return "";
        std::string wanted;
        for (size_t k = 0; k < ends.size(); ++k)
          wanted += (k == 0 ? "'" : k + 1 == ends.size() ? " or '" : ", '") + std::string(ends[k]) + "'";
        fail("unexpected end of template: '" + std::string(opener) + "' opened at line " + std::to_string(opened.line) +
                 " col " + std::to_string(opened.col) + " is not closed (expected " + wanted + ")",
             t.pos);
      }
      if (t.type == tok::text) {
        auto s = std::make_unique<text_stmt>();
        s->pos = t.pos;
        s->text = t.text;
        out.push_back(std::move(s));
        next();
      } else if (t.type == tok::var_begin) {
        auto s = std::make_unique<output_stmt>();
        s->pos = t.pos;
        next();
        s->value_ = parse_tuple_or_expr();
        if (cur().type != tok::var_end) unexpected("'}}'");
        next();
        out.push_back(std::move(s));
      } else if (t.type == tok::block_begin) {
        const token& kw = peek();
        if (kw.type != tok::name) {
          next();
          unexpected("a tag name");
        }
        for (auto e : ends)
          if (kw.text == e) {
            next();
            next();
            return kw.text;
          }
        next();
        out.push_back(parse_statement());
      } else {
        unexpected("text or a tag");
      }
    }
  }

  stmt_ptr parse_statement() {
    const token kw = next();
    const std::string& n = kw.text;
    if (n == "if") return parse_if(kw.pos);
    if (n == "for") return parse_for(kw.pos);
    if (n == "set") return parse_set(kw.pos);
    if (n == "macro") return parse_macro(kw.pos);
    if (n == "call") return parse_call_block(kw.pos);
    if (n == "filter") {
      auto s = std::make_unique<filter_block_stmt>();
      s->pos = kw.pos;
      parse_filter_chain(s->filters, false);
      expect_block_end();
      parse_body(s->body_, {"endfilter"}, kw.pos, "filter");
      expect_block_end();
      return s;
    }
    if (n == "generation") {
      auto s = std::make_unique<block_stmt>();
      s->pos = kw.pos;
      expect_block_end();
      parse_body(s->body_, {"endgeneration"}, kw.pos, "generation");
      expect_block_end();
      return s;
    }
    if (n == "break" || n == "continue") {
      auto s = std::make_unique<loop_control_stmt>();
      s->pos = kw.pos;
      s->kind = n == "break" ? loop_control::break_ : loop_control::continue_;
      expect_block_end();
      return s;
    }
    if (n == "elif" || n == "else" || n.rfind("end", 0) == 0)
      fail("unexpected '" + n + "' tag: no open block it could close", kw.pos);
    fail("unknown or unsupported tag '" + n + "'", kw.pos);
  }

  stmt_ptr parse_if(source_pos pos) {
    auto s = std::make_unique<if_stmt>();
    s->pos = pos;
    expr_ptr cond = parse_expr();
    expect_block_end();
    while (true) {
      body b;
      std::string end = parse_body(b, {"elif", "else", "endif"}, pos, "if");
      s->branches.emplace_back(std::move(cond), std::move(b));
      if (end == "elif") {
        cond = parse_expr();
        expect_block_end();
        continue;
      }
      if (end == "else") {
        expect_block_end();
        parse_body(s->otherwise, {"endif"}, pos, "if");
      }
      expect_block_end();
      return s;
    }
  }

  target parse_target(bool allow_tuple) {
    target t;
    if (is_op("(")) {
      next();
      t = parse_target(true);
      expect_op(")");
    } else {
      t.name = expect_name();
    }
    if (allow_tuple && is_op(",")) {
      target tup;
      tup.elements.push_back(std::move(t));
      while (is_op(",")) {
        next();
        if (cur().type != tok::name && !is_op("(")) break;
        target e;
        if (is_op("(")) {
          next();
          e = parse_target(true);
          expect_op(")");
        } else {
          e.name = expect_name();
        }
        tup.elements.push_back(std::move(e));
      }
      return tup;
    }
    return t;
  }

  stmt_ptr parse_for(source_pos pos) {
    auto s = std::make_unique<for_stmt>();
    s->pos = pos;
    s->var = parse_target(true);
    if (!is_name("in")) unexpected("'in'");
    next();
    s->iterable = parse_tuple_or_expr(/*no_cond=*/true);
    if (is_name("if")) {
      next();
      s->filter = parse_expr();
    }
    if (is_name("recursive")) fail("recursive for loops are not supported", cur().pos);
    expect_block_end();
    std::string end = parse_body(s->body_, {"else", "endfor"}, pos, "for");
    if (end == "else") {
      expect_block_end();
      parse_body(s->otherwise, {"endfor"}, pos, "for");
    }
    expect_block_end();
    return s;
  }

  stmt_ptr parse_set(source_pos pos) {
    if (cur().type == tok::name && peek().type == tok::op && peek().text == ".") {
      auto s = std::make_unique<set_stmt>();
      s->pos = pos;
      s->var.name = next().text;
      next();
      s->ns_attr = expect_name();
      expect_op("=");
      s->value_ = parse_tuple_or_expr();
      expect_block_end();
      return s;
    }
    target t = parse_target(true);
    if (is_op("=")) {
      next();
      auto s = std::make_unique<set_stmt>();
      s->pos = pos;
      s->var = std::move(t);
      s->value_ = parse_tuple_or_expr();
      expect_block_end();
      return s;
    }
    if (t.name.empty()) unexpected("'='");
    auto s = std::make_unique<set_block_stmt>();
    s->pos = pos;
    s->name = t.name;
    if (is_op("|")) parse_filter_chain(s->filters, true);
    expect_block_end();
    parse_body(s->body_, {"endset"}, pos, "set");
    expect_block_end();
    return s;
  }

  std::vector<macro_param> parse_params() {
    std::vector<macro_param> params;
    expect_op("(");
    while (!is_op(")")) {
      macro_param p;
      p.name = expect_name();
      if (is_op("=")) {
        next();
        p.default_ = parse_expr();
      }
      params.push_back(std::move(p));
      if (!is_op(",")) break;
      next();
    }
    expect_op(")");
    return params;
  }

  stmt_ptr parse_macro(source_pos pos) {
    auto s = std::make_unique<macro_stmt>();
    s->pos = pos;
    s->name = expect_name();
    s->params = parse_params();
    expect_block_end();
    parse_body(s->body_, {"endmacro"}, pos, "macro");
    if (cur().type == tok::name) next();  // {% endmacro name %}
    expect_block_end();
    return s;
  }

  stmt_ptr parse_call_block(source_pos pos) {
    auto s = std::make_unique<call_block_stmt>();
    s->pos = pos;
    if (is_op("(")) s->caller_params = parse_params();
    expr_ptr e = parse_postfix(parse_primary());
    auto* c = dynamic_cast<call_expr*>(e.get());
    if (!c) fail("'call' needs a macro call", pos);
    e.release();
    s->call.reset(c);
    expect_block_end();
    parse_body(s->body_, {"endcall"}, pos, "call");
    expect_block_end();
    return s;
  }

  // `| f(args) | g` after {% set x %} or {% filter %} (the first `|` only for set).
  void parse_filter_chain(std::vector<filter_call>& out, bool leading_pipe) {
    bool first = true;
    while (first ? (!leading_pipe || is_op("|")) : is_op("|")) {
      if (!first || leading_pipe) next();
      first = false;
      filter_call f;
      f.pos = cur().pos;
      f.name = expect_name();
      if (is_op("(")) parse_call_args(f.args, f.kwargs);
      out.push_back(std::move(f));
    }
  }

  // ---- expressions ----

  // `a, b` without brackets is a tuple where Jinja2 parses one: {{ }}, set values, for iterables.
  expr_ptr parse_tuple_or_expr(bool no_cond = false) {
    source_pos pos = cur().pos;
    expr_ptr first = no_cond ? parse_or() : parse_expr();
    if (!is_op(",")) return first;
    auto t = std::make_unique<list_expr>();
    t->pos = pos;
    t->tuple = true;
    t->items.push_back(std::move(first));
    while (is_op(",")) {
      next();
      if (cur().type == tok::var_end || cur().type == tok::block_end || is_name("if")) break;
      t->items.push_back(no_cond ? parse_or() : parse_expr());
    }
    return t;
  }

  expr_ptr parse_expr() {
    nest guard(*this, cur().pos);
    source_pos pos = cur().pos;
    expr_ptr e = parse_or();
    while (is_name("if")) {
      next();
      auto c = std::make_unique<cond_expr>();
      c->pos = pos;
      c->then = std::move(e);
      c->cond = parse_or();
      if (is_name("else")) {
        next();
        c->otherwise = parse_expr();
      }
      e = std::move(c);
    }
    return e;
  }

  expr_ptr make_binary(binary_op op, expr_ptr l, expr_ptr r, source_pos pos) {
    auto b = std::make_unique<binary_expr>();
    b->pos = pos;
    b->op = op;
    b->left = std::move(l);
    b->right = std::move(r);
    return b;
  }

  expr_ptr parse_or() {
    expr_ptr e = parse_and();
    while (is_name("or")) {
      source_pos pos = next().pos;
      e = make_binary(binary_op::or_, std::move(e), parse_and(), pos);
    }
    return e;
  }

  expr_ptr parse_and() {
    expr_ptr e = parse_not();
    while (is_name("and")) {
      source_pos pos = next().pos;
      e = make_binary(binary_op::and_, std::move(e), parse_not(), pos);
    }
    return e;
  }

  expr_ptr parse_not() {
    if (is_name("not")) {
      nest guard(*this, cur().pos);
      auto u = std::make_unique<unary_expr>();
      u->pos = next().pos;
      u->op = unary_op::not_;
      u->operand = parse_not();
      return u;
    }
    return parse_compare();
  }

  expr_ptr parse_compare() {
    source_pos pos = cur().pos;
    expr_ptr first = parse_math1();
    std::vector<std::pair<compare_op, expr_ptr>> rest;
    while (true) {
      compare_op op;
      if (cur().type == tok::op && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                    cur().text == "<=" || cur().text == ">" || cur().text == ">=")) {
        const std::string& o = cur().text;
        op = o == "=="   ? compare_op::eq
             : o == "!=" ? compare_op::ne
             : o == "<"  ? compare_op::lt
             : o == "<=" ? compare_op::le
             : o == ">"  ? compare_op::gt
                         : compare_op::ge;
        next();
      } else if (is_name("in")) {
        op = compare_op::in;
        next();
      } else if (is_name("not") && peek().type == tok::name && peek().text == "in") {
        op = compare_op::not_in;
        next();
        next();
      } else {
        break;
      }
      rest.emplace_back(op, parse_math1());
    }
    if (rest.empty()) return first;
    auto c = std::make_unique<compare_expr>();
    c->pos = pos;
    c->first = std::move(first);
    c->rest = std::move(rest);
    return c;
  }

  expr_ptr parse_math1() {  // + -
    expr_ptr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      binary_op op = cur().text == "+" ? binary_op::add : binary_op::sub;
      source_pos pos = next().pos;
      e = make_binary(op, std::move(e), parse_concat(), pos);
    }
    return e;
  }

  expr_ptr parse_concat() {  // ~
    expr_ptr e = parse_math2();
    while (is_op("~")) {
      source_pos pos = next().pos;
      e = make_binary(binary_op::concat, std::move(e), parse_math2(), pos);
    }
    return e;
  }

  expr_ptr parse_math2() {  // * / // %
    expr_ptr e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const std::string& o = cur().text;
      binary_op op = o == "*"    ? binary_op::mul
                     : o == "/"  ? binary_op::div
                     : o == "//" ? binary_op::floordiv
                                 : binary_op::mod;
      source_pos pos = next().pos;
      e = make_binary(op, std::move(e), parse_pow(), pos);
    }
    return e;
  }

  expr_ptr parse_pow() {
    expr_ptr e = parse_unary(true);
    while (is_op("**")) {
      source_pos pos = next().pos;
      e = make_binary(binary_op::pow, std::move(e), parse_unary(true), pos);
    }
    return e;
  }

  expr_ptr parse_unary(bool with_filter) {
    nest guard(*this, cur().pos);
    expr_ptr e;
    if (is_op("-") || is_op("+")) {
      auto u = std::make_unique<unary_expr>();
      u->op = cur().text == "-" ? unary_op::neg : unary_op::pos;
      u->pos = next().pos;
      u->operand = parse_unary(false);
      e = std::move(u);
    } else {
      e = parse_postfix(parse_primary());
    }
    if (with_filter) return parse_filters(std::move(e));
    return e;
  }

  expr_ptr parse_primary() {
    nest guard(*this, cur().pos);
    const token& t = cur();
    source_pos pos = t.pos;
    if (t.type == tok::name) {
      const std::string& n = t.text;
      auto lit = [&](value v) {
        next();
        auto l = std::make_unique<literal_expr>();
        l->pos = pos;
        l->val = std::move(v);
        return l;
      };
      if (n == "true" || n == "True") return lit(value(true));
      if (n == "false" || n == "False") return lit(value(false));
      if (n == "none" || n == "None") return lit(value(none_t{}));
      auto e = std::make_unique<name_expr>();
      e->pos = pos;
      e->name = n;
      next();
      return e;
    }
    if (t.type == tok::string) {
      std::string s;
      while (cur().type == tok::string) s += next().text;  // 'a' 'b' is 'ab', as in Python
      auto l = std::make_unique<literal_expr>();
      l->pos = pos;
      l->val = value(std::move(s));
      return l;
    }
    if (t.type == tok::integer || t.type == tok::floating) {
      auto l = std::make_unique<literal_expr>();
      l->pos = pos;
      l->val = next().number;
      return l;
    }
    if (is_op("(")) {
      next();
      if (is_op(")")) {
        next();
        auto l = std::make_unique<list_expr>();
        l->pos = pos;
        l->tuple = true;
        return l;
      }
      expr_ptr first = parse_expr();
      if (is_op(")")) {
        next();
        return first;
      }
      auto l = std::make_unique<list_expr>();
      l->pos = pos;
      l->tuple = true;
      l->items.push_back(std::move(first));
      while (is_op(",")) {
        next();
        if (is_op(")")) break;
        l->items.push_back(parse_expr());
      }
      expect_op(")");
      return l;
    }
    if (is_op("[")) {
      next();
      auto l = std::make_unique<list_expr>();
      l->pos = pos;
      while (!is_op("]")) {
        l->items.push_back(parse_expr());
        if (!is_op(",")) break;
        next();
      }
      expect_op("]");
      return l;
    }
    if (is_op("{")) {
      next();
      auto d = std::make_unique<dict_expr>();
      d->pos = pos;
      while (!is_op("}")) {
        expr_ptr k = parse_expr();
        expect_op(":");
        expr_ptr v = parse_expr();
        d->items.emplace_back(std::move(k), std::move(v));
        if (!is_op(",")) break;
        next();
      }
      expect_op("}");
      return d;
    }
    unexpected("an expression");
  }

  void parse_call_args(std::vector<expr_ptr>& args, std::vector<std::pair<std::string, expr_ptr>>& kwargs) {
    expect_op("(");
    while (!is_op(")")) {
      if (is_op("*") || is_op("**")) fail("*args and **kwargs in calls are not supported", cur().pos);
      if (cur().type == tok::name && peek().type == tok::op && peek().text == "=") {
        std::string k = next().text;
        next();
        kwargs.emplace_back(std::move(k), parse_expr());
      } else {
        if (!kwargs.empty()) fail("positional argument after keyword argument", cur().pos);
        args.push_back(parse_expr());
      }
      if (!is_op(",")) break;
      next();
    }
    expect_op(")");
  }

  expr_ptr parse_postfix(expr_ptr e) {
    while (true) {
      source_pos pos = cur().pos;
      if (is_op(".")) {
        next();
        if (cur().type == tok::integer) {  // x.0 is x[0]
          auto ix = std::make_unique<index_expr>();
          ix->pos = pos;
          ix->obj = std::move(e);
          auto l = std::make_unique<literal_expr>();
          l->pos = cur().pos;
          l->val = next().number;
          ix->key = std::move(l);
          e = std::move(ix);
          continue;
        }
        auto a = std::make_unique<attr_expr>();
        a->pos = pos;
        a->obj = std::move(e);
        a->name = expect_name();
        e = std::move(a);
      } else if (is_op("[")) {
        next();
        e = parse_subscript(std::move(e), pos);
        expect_op("]");
      } else if (is_op("(")) {
        auto c = std::make_unique<call_expr>();
        c->pos = pos;
        c->callee = std::move(e);
        parse_call_args(c->args, c->kwargs);
        e = std::move(c);
      } else {
        return e;
      }
    }
  }

  expr_ptr parse_subscript(expr_ptr obj, source_pos pos) {
    expr_ptr start, stop, step;
    if (!is_op(":")) {
      start = parse_expr();
      if (is_op("]")) {
        auto ix = std::make_unique<index_expr>();
        ix->pos = pos;
        ix->obj = std::move(obj);
        ix->key = std::move(start);
        return ix;
      }
      if (is_op(",")) fail("tuple subscripts are not supported", cur().pos);
    }
    expect_op(":");
    if (!is_op("]") && !is_op(":")) stop = parse_expr();
    if (is_op(":")) {
      next();
      if (!is_op("]")) step = parse_expr();
    }
    auto s = std::make_unique<slice_expr>();
    s->pos = pos;
    s->obj = std::move(obj);
    s->start = std::move(start);
    s->stop = std::move(stop);
    s->step = std::move(step);
    return s;
  }

  // A test's single argument may come without parentheses: `x is divisibleby 3`.
  bool starts_bare_test_arg() const {
    const token& t = cur();
    if (t.type == tok::string || t.type == tok::integer || t.type == tok::floating) return true;
    if (t.type == tok::op) return t.text == "[" || t.text == "{";
    if (t.type == tok::name)
      return t.text != "else" && t.text != "or" && t.text != "and" && t.text != "if" && t.text != "not" &&
             t.text != "in" && t.text != "is";
    return false;
  }

  expr_ptr parse_filters(expr_ptr e) {
    while (true) {
      source_pos pos = cur().pos;
      if (is_op("|")) {
        next();
        auto f = std::make_unique<filter_expr>();
        f->pos = cur().pos;
        f->operand = std::move(e);
        f->name = expect_name();
        if (is_op("(")) parse_call_args(f->args, f->kwargs);
        e = std::move(f);
      } else if (is_name("is")) {
        next();
        auto t = std::make_unique<test_expr>();
        t->pos = pos;
        if (is_name("not")) {
          next();
          t->negated = true;
        }
        t->operand = std::move(e);
        // `none`, `true` and `false` are test names here, not literals.
        t->name = expect_name();
        if (is_op("(")) {
          std::vector<std::pair<std::string, expr_ptr>> kw;
          parse_call_args(t->args, kw);
          for (auto& [k, v] : kw) t->args.push_back(std::move(v));
        } else if (starts_bare_test_arg()) {
          t->args.push_back(parse_postfix(parse_primary()));
        }
        e = std::move(t);
      } else {
        return e;
      }
    }
  }
};

}  // namespace

std::shared_ptr<program_ast> parse_template(std::string_view source) {
  lexer lx(source);
  parser ps(lx.run());
  return ps.run();
}

}  // namespace tandem::jinja::detail
