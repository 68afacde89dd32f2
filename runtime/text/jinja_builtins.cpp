// Builtins of the Jinja interpreter: the globals (range, namespace, dict, raise_exception,
// strftime_now), Jinja2's filters and tests, and the Python methods templates call on strings and
// dicts (`s.strip()`, `d.items()`). Each follows Jinja2 3.1 / Python 3 behaviour, including
// defaults that surprise (|sort and |unique ignore case, |default only replaces undefined unless
// its second argument is true, |round rounds half to even).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>

#include "runtime/text/jinja_internal.h"

namespace tandem::jinja::detail {

const value* arg(const call_args& a, size_t i, std::string_view name) {
  if (i < a.args.size()) return &a.args[i];
  for (const auto& [k, v] : a.kwargs)
    if (k == name) return &v;
  return nullptr;
}

value arg_or(const call_args& a, size_t i, std::string_view name, value def) {
  const value* v = arg(a, i, name);
  return v ? *v : def;
}

namespace {

int64_t want_int(const value& v, const char* what) {
  if (v.is_int()) return v.as_int();
  if (v.is_bool()) return v.as_bool();
  if (v.is_float() && v.as_float() == std::floor(v.as_float())) return int64_t(v.as_float());
  fail(std::string(what) + " must be an integer, not " + std::string(type_name(v)));
}

const std::string& want_str(const value& v, const char* what) {
  if (!v.is_string()) fail(std::string(what) + " must be a string, not " + std::string(type_name(v)));
  return v.str();
}

}  // namespace

// A list's items, a dict's keys, a string's characters (jinja_internal.h).
std::vector<value> items_of(const value& v, source_pos pos) {
  if (v.is_list()) return v.list().items;
  if (v.is_dict()) {
    std::vector<value> keys;
    for (const auto& [k, x] : v.dict().items) keys.emplace_back(k);
    return keys;
  }
  if (v.is_string()) {
    std::vector<value> chars;
    for (auto c : utf8_chars(v.str())) chars.emplace_back(std::string(c));
    return chars;
  }
  if (v.is_undefined()) return {};
  fail("'" + std::string(type_name(v)) + "' object is not iterable", pos);
}

namespace {

// Simple case mapping for ASCII, Latin-1, Latin Extended-A, Greek and Cyrillic: the scripts chat
// templates and their role names meet. Other characters pass through unchanged (Python would map
// a few more, such as Armenian or Georgian).
uint32_t map_case(uint32_t cp, bool upper) {
  if (cp < 0x80) return uint32_t(upper ? std::toupper(int(cp)) : std::tolower(int(cp)));
  auto shift = [&](uint32_t lo_first, uint32_t lo_last, uint32_t delta) -> std::optional<uint32_t> {
    if (upper && cp >= lo_first + delta && cp <= lo_last + delta) return cp - delta;
    if (!upper && cp >= lo_first && cp <= lo_last) return cp + delta;
    return std::nullopt;
  };
  // Upper-case ranges and the distance to their lower-case letters.
  if (upper && cp == 0xff) return 0x178;
  if (!upper && cp == 0x178) return 0xff;
  if (cp != 0xd7 && cp != 0xf7)
    if (auto r = shift(0xc0, 0xde, 0x20)) return *r;
  if (cp >= 0x100 && cp <= 0x17f && cp != 0x130 && cp != 0x131 && cp != 0x138 && cp != 0x149 && cp != 0x178 &&
      cp != 0x17f) {
    bool odd_upper = (cp >= 0x139 && cp <= 0x148) || (cp >= 0x179 && cp <= 0x17e);
    bool is_upper = odd_upper ? (cp & 1) : !(cp & 1);
    if (upper && !is_upper) return cp - 1;
    if (!upper && is_upper) return cp + 1;
    return cp;
  }
  if (cp != 0x3a2)
    if (auto r = shift(0x391, 0x3ab, 0x20)) return *r;
  if (auto r = shift(0x410, 0x42f, 0x20)) return *r;
  if (auto r = shift(0x400, 0x40f, 0x50)) return *r;
  return cp;
}

std::string map_case_str(const std::string& s, bool upper) {
  std::string out;
  out.reserve(s.size());
  for (std::string_view c : utf8_chars(s)) {
    unsigned char b = static_cast<unsigned char>(c[0]);
    uint32_t cp = c.size() == 1   ? b
                  : c.size() == 2 ? ((b & 0x1fu) << 6) | (static_cast<unsigned char>(c[1]) & 0x3fu)
                                  : 0xffffffff;
    if (c.size() > 2 || (c.size() == 1 && b >= 0x80)) {
      out += c;  // three- and four-byte characters (and stray bytes) have no mapping here
      continue;
    }
    uint32_t m = map_case(cp, upper);
    if (m < 0x80) out += char(m);
    else {
      out += char(0xc0 | (m >> 6));
      out += char(0x80 | (m & 0x3f));
    }
  }
  return out;
}

std::string py_lower(std::string s) { return map_case_str(s, false); }
std::string py_upper(std::string s) { return map_case_str(s, true); }

// `attribute="a.b.0"`: a dotted path of keys and list indexes.
value get_path(evaluator& ev, const value& v, const value& path) {
  if (path.is_none() || path.is_undefined()) return v;  // attribute=none: the item itself
  if (path.is_int()) return ev.get_item(v, path, {});
  std::string p = to_str(path);
  value cur = v;
  size_t start = 0;
  while (start <= p.size()) {
    size_t dot = p.find('.', start);
    std::string part = p.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    bool digits = !part.empty() && std::all_of(part.begin(), part.end(),
                                               [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
    cur = digits ? ev.get_item(cur, value(int64_t(std::stoll(part))), {}) : ev.get_item(cur, value(part), {});
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return cur;
}

// Python's str.strip family; chars empty (None) means whitespace as str.isspace() sees it.
enum strip_side { left = 1, right = 2, both = 3 };
std::string py_strip(const std::string& s, const value& chars, int side) {
  auto cs = utf8_chars(s);
  std::vector<std::string_view> set;
  bool ws = chars.is_none() || chars.is_undefined();
  std::string chars_str = ws ? "" : want_str(chars, "strip() argument");
  if (!ws) set = utf8_chars(chars_str);
  auto strip_it = [&](std::string_view c) {
    if (ws) {
      size_t len;
      return is_py_space(c, 0, &len);
    }
    return std::find(set.begin(), set.end(), c) != set.end();
  };
  size_t b = 0, e = cs.size();
  if (side & left)
    while (b < e && strip_it(cs[b])) ++b;
  if (side & right)
    while (e > b && strip_it(cs[e - 1])) --e;
  std::string out;
  for (size_t i = b; i < e; ++i) out += cs[i];
  return out;
}

// Python's str.split(sep=None, maxsplit=-1).
value py_split(const std::string& s, const value& sep, int64_t maxsplit) {
  std::vector<value> out;
  if (sep.is_none() || sep.is_undefined()) {
    size_t i = 0, n = s.size();
    while (true) {
      size_t len;
      while (i < n && is_py_space(s, i, &len)) i += len;
      if (i >= n) break;
      if (maxsplit >= 0 && int64_t(out.size()) == maxsplit) {
        out.emplace_back(s.substr(i));  // the remainder keeps its trailing whitespace, as in Python
        break;
      }
      size_t j = i;
      while (j < n && !is_py_space(s, j, &len)) j += len;
      out.emplace_back(s.substr(i, j - i));
      i = j;
    }
    return make_list(std::move(out));
  }
  const std::string& d = want_str(sep, "split() separator");
  if (d.empty()) fail("empty separator");
  size_t start = 0;
  while (true) {
    size_t pos = s.find(d, start);
    if (pos == std::string::npos || (maxsplit >= 0 && int64_t(out.size()) == maxsplit)) {
      out.emplace_back(s.substr(start));
      break;
    }
    out.emplace_back(s.substr(start, pos - start));
    start = pos + d.size();
  }
  return make_list(std::move(out));
}

std::string py_replace(const std::string& s, const std::string& from, const std::string& to, int64_t count,
                       size_t max_bytes) {
  std::string out;
  if (from.empty()) {  // Python inserts `to` between every character and at both ends
    auto cs = utf8_chars(s);
    int64_t done = 0;
    for (size_t i = 0; i <= cs.size(); ++i) {
      if (count < 0 || done < count) {
        out += to;
        ++done;
      }
      if (i < cs.size()) out += cs[i];
      if (out.size() > max_bytes) fail("string too long");
    }
    return out;
  }
  size_t start = 0;
  int64_t done = 0;
  while (true) {
    size_t pos = s.find(from, start);
    if (pos == std::string::npos || (count >= 0 && done >= count)) break;
    out.append(s, start, pos - start);
    out += to;
    if (out.size() > max_bytes) fail("string too long");
    start = pos + from.size();
    ++done;
  }
  out.append(s, start);
  return out;
}

// Python's str.title(): a letter after a non-letter is upper case, the rest lower (ASCII letters;
// other characters pass through and count as non-letters unless they are UTF-8 continuation).
std::string py_title(const std::string& s) {
  std::string out = s;
  bool prev_cased = false;
  for (auto& c : out) {
    unsigned char u = static_cast<unsigned char>(c);
    if (std::isalpha(u)) {
      c = char(prev_cased ? std::tolower(u) : std::toupper(u));
      prev_cased = true;
    } else {
      prev_cased = u >= 0x80;  // letters of other scripts keep the word going
    }
  }
  return out;
}

// Jinja2's |title: words start after whitespace or one of - ( { [ <.
std::string jinja_title(const std::string& s) {
  std::string out;
  bool start = true;
  for (char c : s) {
    unsigned char u = static_cast<unsigned char>(c);
    bool boundary = std::isspace(u) || std::strchr("-({[<", c) != nullptr;
    if (boundary) {
      out += c;
      start = true;
    } else {
      out += char(start ? std::toupper(u) : std::tolower(u));
      start = false;
    }
  }
  return out;
}

std::string py_capitalize(const std::string& s) {
  std::string out = py_lower(s);
  if (!out.empty()) out[0] = char(std::toupper(static_cast<unsigned char>(out[0])));
  return out;
}

// Python's str.splitlines() line breaks.
std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  for (size_t i = 0; i < s.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    size_t brk = 0;
    if (c == '\n' || c == '\v' || c == '\f' || c == 0x1c || c == 0x1d || c == 0x1e) brk = 1;
    else if (c == '\r') brk = (i + 1 < s.size() && s[i + 1] == '\n') ? 2 : 1;
    else if (c == 0xc2 && i + 1 < s.size() && static_cast<unsigned char>(s[i + 1]) == 0x85) brk = 2;
    else if (c == 0xe2 && i + 2 < s.size() && static_cast<unsigned char>(s[i + 1]) == 0x80 &&
             (static_cast<unsigned char>(s[i + 2]) == 0xa8 || static_cast<unsigned char>(s[i + 2]) == 0xa9))
      brk = 3;
    if (brk) {
      out.push_back(std::move(cur));
      cur.clear();
      i += brk - 1;
    } else {
      cur += char(c);
    }
  }
  if (!cur.empty()) out.push_back(std::move(cur));
  return out;
}

// printf-style formatting: Jinja2's |format and Python's str % args.
std::string printf_format(const std::string& fmt, const std::vector<value>& args) {
  std::string out;
  size_t ai = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out += fmt[i];
      continue;
    }
    size_t j = i + 1;
    std::string spec = "%";
    while (j < fmt.size() && std::strchr("-+ #0", fmt[j])) spec += fmt[j++];
    while (j < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[j]))) spec += fmt[j++];
    if (j < fmt.size() && fmt[j] == '.') {
      spec += fmt[j++];
      while (j < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[j]))) spec += fmt[j++];
    }
    if (j >= fmt.size()) fail("incomplete format");
    char conv = fmt[j];
    i = j;
    if (conv == '%') {
      out += '%';
      continue;
    }
    if (ai >= args.size()) fail("not enough arguments for format string");
    const value& a = args[ai++];
    char buf[512];
    if (conv == 's' || conv == 'r') {
      std::string s = conv == 's' ? to_str(a) : to_repr(a);
      std::snprintf(buf, sizeof buf, (spec + "s").c_str(), "");
      // Width and precision apply to code points; done by hand around the text.
      size_t dot = spec.find('.');
      if (dot != std::string::npos) {
        size_t prec = size_t(std::atoi(spec.c_str() + dot + 1));
        auto cs = utf8_chars(s);
        if (cs.size() > prec) {
          std::string t;
          for (size_t k = 0; k < prec; ++k) t += cs[k];
          s = t;
        }
      }
      size_t width = 0;
      for (size_t k = 1; k < spec.size() && spec[k] != '.'; ++k)
        if (std::isdigit(static_cast<unsigned char>(spec[k])) && !(spec[k] == '0' && width == 0))
          width = width * 10 + size_t(spec[k] - '0');
      size_t len = utf8_length(s);
      if (len < width) {
        if (spec.find('-') != std::string::npos) s += std::string(width - len, ' ');
        else s = std::string(width - len, ' ') + s;
      }
      out += s;
    } else if (std::strchr("diouxXc", conv)) {
      if (!a.is_number())
        fail("%" + std::string(1, conv) + " format: a number is required, not " + std::string(type_name(a)));
      long long n = a.is_float() ? (long long)a.as_float() : a.is_int() ? a.as_int() : a.as_bool();
      if (conv == 'c') {
        out += char(n);
        continue;
      }
      char c = conv == 'i' || conv == 'u' ? 'd' : conv;
      std::snprintf(buf, sizeof buf, (spec + "ll" + c).c_str(), n);
      out += buf;
    } else if (std::strchr("eEfFgG", conv)) {
      if (!a.is_number())
        fail("%" + std::string(1, conv) + " format: a number is required, not " + std::string(type_name(a)));
      double d = a.is_float() ? a.as_float() : a.is_int() ? double(a.as_int()) : double(a.as_bool());
      std::snprintf(buf, sizeof buf, (spec + conv).c_str(), d);
      out += buf;
    } else {
      fail(std::string("unsupported format character '") + conv + "'");
    }
  }
  if (ai < args.size()) fail("not all arguments converted during string formatting");
  return out;
}

// Python's str.format() with {} / {0} / {name} fields and !s / !r conversions (no format specs).
std::string py_format(const std::string& fmt, const call_args& a) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    char c = fmt[i];
    if (c == '}' && i + 1 < fmt.size() && fmt[i + 1] == '}') {
      out += '}';
      ++i;
      continue;
    }
    if (c != '{') {
      out += c;
      continue;
    }
    if (i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out += '{';
      ++i;
      continue;
    }
    size_t close = fmt.find('}', i);
    if (close == std::string::npos) fail("single '{' encountered in format string");
    std::string field = fmt.substr(i + 1, close - i - 1);
    i = close;
    char conv = 's';
    if (size_t bang = field.find('!'); bang != std::string::npos) {
      conv = bang + 1 < field.size() ? field[bang + 1] : 's';
      field.erase(bang);
    }
    if (field.find(':') != std::string::npos) fail("format specs in str.format() are not supported");
    const value* v = nullptr;
    if (field.empty()) {
      if (auto_index >= a.args.size()) fail("Replacement index " + std::to_string(auto_index) + " out of range");
      v = &a.args[auto_index++];
    } else if (std::all_of(field.begin(), field.end(),
                           [](char d) { return std::isdigit(static_cast<unsigned char>(d)); })) {
      size_t k = size_t(std::stoul(field));
      if (k >= a.args.size()) fail("Replacement index " + field + " out of range");
      v = &a.args[k];
    } else {
      for (const auto& [k, x] : a.kwargs)
        if (k == field) v = &x;
      if (!v) fail("KeyError: '" + field + "'");
    }
    out += conv == 'r' ? to_repr(*v) : to_str(*v);
  }
  return out;
}

value bound(const value& self, std::string name, std::function<value(const value&, evaluator&, call_args&)> fn) {
  return make_callable(std::move(name),
                       [self, fn = std::move(fn)](evaluator& ev, call_args& a) { return fn(self, ev, a); });
}

value kv_tuples(const dict_obj& d) {
  std::vector<value> out;
  for (const auto& [k, v] : d.items) out.push_back(make_list({value(k), v}, true));
  return make_list(std::move(out));
}

// Sort key: strings compare case-insensitively unless asked otherwise (Jinja2's default).
value sort_key(const value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return value(py_lower(v.str()));
  return v;
}

// ---- filters ----

using filter_fn = value (*)(evaluator&, const value&, call_args&);

value f_abs(evaluator&, const value& v, call_args&) {
  if (v.is_int()) {
    if (v.as_int() == INT64_MIN) fail("integer overflow");
    return value(std::abs(v.as_int()));
  }
  if (v.is_bool()) return value(int64_t(v.as_bool()));
  if (v.is_float()) return value(std::fabs(v.as_float()));
  fail("bad operand type for abs(): '" + std::string(type_name(v)) + "'");
}

value f_attr(evaluator& ev, const value& v, call_args& a) {
  const value* n = arg(a, 0, "name");
  if (!n) fail("attr() needs a name");
  return ev.get_attr(v, to_str(*n), a.pos);
}

value f_batch(evaluator&, const value& v, call_args& a) {
  int64_t n = want_int(arg_or(a, 0, "linecount", value(int64_t(1))), "batch size");
  if (n <= 0) fail("batch size must be positive");
  const value* fill = arg(a, 1, "fill_with");
  std::vector<value> out, cur;
  for (auto& it : items_of(v)) {
    cur.push_back(std::move(it));
    if (int64_t(cur.size()) == n) {
      out.push_back(make_list(std::move(cur)));
      cur.clear();
    }
  }
  if (!cur.empty()) {
    if (fill && !fill->is_none())
      while (int64_t(cur.size()) < n) cur.push_back(*fill);
    out.push_back(make_list(std::move(cur)));
  }
  return make_list(std::move(out));
}

value f_capitalize(evaluator&, const value& v, call_args&) { return value(py_capitalize(to_str(v))); }

value f_center(evaluator&, const value& v, call_args& a) {
  std::string s = to_str(v);
  int64_t width = want_int(arg_or(a, 0, "width", value(int64_t(80))), "width");
  int64_t len = int64_t(utf8_length(s));
  if (width <= len) return value(s);
  if (width > int64_t(1) << 20) fail("center() width too large");
  int64_t total = width - len;
  int64_t l = total / 2 + (total & width & 1);  // CPython's split of the padding
  return value(std::string(size_t(l), ' ') + s + std::string(size_t(total - l), ' '));
}

value f_default(evaluator&, const value& v, call_args& a) {
  value def = arg_or(a, 0, "default_value", value(""));
  bool boolean = truthy(arg_or(a, 1, "boolean", value(false)));
  if (v.is_undefined() || (boolean && !truthy(v))) return def;
  return v;
}

value f_dictsort(evaluator&, const value& v, call_args& a) {
  if (!v.is_dict()) fail("dictsort() needs a dict, not " + std::string(type_name(v)));
  bool cs = truthy(arg_or(a, 0, "case_sensitive", value(false)));
  std::string by = to_str(arg_or(a, 1, "by", value("key")));
  bool reverse = truthy(arg_or(a, 2, "reverse", value(false)));
  if (by != "key" && by != "value") fail("You can only sort by either 'key' or 'value'");
  std::vector<std::pair<std::string, value>> items = v.dict().items;
  std::stable_sort(items.begin(), items.end(), [&](const auto& x, const auto& y) {
    value kx = by == "key" ? value(x.first) : x.second;
    value ky = by == "key" ? value(y.first) : y.second;
    int c = compare(sort_key(kx, cs), sort_key(ky, cs), {});
    return reverse ? c > 0 : c < 0;
  });
  std::vector<value> out;
  for (auto& [k, x] : items) out.push_back(make_list({value(k), x}, true));
  return make_list(std::move(out));
}

value f_escape(evaluator&, const value& v, call_args&) {
  std::string out;
  for (char c : to_str(v)) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return value(std::move(out));
}

value f_first(evaluator&, const value& v, call_args&) {
  auto items = items_of(v);
  return items.empty() ? value() : items.front();
}

value f_last(evaluator&, const value& v, call_args&) {
  auto items = items_of(v);
  return items.empty() ? value() : items.back();
}

bool parse_float_str(std::string s, double* out) {
  s = py_strip(s, value(none_t{}), both);
  std::string t;
  for (char c : s)
    if (c != '_') t += c;
  if (t.empty()) return false;
  char* end = nullptr;
  double d = std::strtod(t.c_str(), &end);
  if (end != t.c_str() + t.size()) return false;
  *out = d;
  return true;
}

value f_float(evaluator&, const value& v, call_args& a) {
  value def = arg_or(a, 0, "default", value(0.0));
  if (v.is_float()) return v;
  if (v.is_int() || v.is_bool()) return value(double(v.is_int() ? v.as_int() : v.as_bool()));
  double d;
  if (v.is_string() && parse_float_str(v.str(), &d)) return value(d);
  return def;
}

value f_int(evaluator&, const value& v, call_args& a) {
  value def = arg_or(a, 0, "default", value(int64_t(0)));
  int64_t base = want_int(arg_or(a, 1, "base", value(int64_t(10))), "base");
  if (v.is_int()) return v;
  if (v.is_bool()) return value(int64_t(v.as_bool()));
  if (v.is_float()) {
    double d = v.as_float();
    if (!std::isfinite(d) || std::fabs(d) >= 9.2e18) return def;
    return value(int64_t(d));
  }
  if (v.is_string()) {
    std::string s = py_strip(v.str(), value(none_t{}), both);
    std::string t;
    for (char c : s)
      if (c != '_') t += c;
    if (!t.empty()) {
      errno = 0;
      char* end = nullptr;
      long long n = std::strtoll(t.c_str(), &end, int(base));
      if (errno == 0 && end == t.c_str() + t.size()) return value(int64_t(n));
      double d;  // Jinja2 falls back to int(float(s)): "4.5" is 4
      if (parse_float_str(t, &d) && std::isfinite(d) && std::fabs(d) < 9.2e18) return value(int64_t(d));
    }
  }
  return def;
}

value f_indent(evaluator&, const value& v, call_args& a) {
  std::string s = to_str(v);
  value w = arg_or(a, 0, "width", value(int64_t(4)));
  std::string ind =
      w.is_string() ? w.str() : std::string(size_t(std::clamp<int64_t>(want_int(w, "width"), 0, 1 << 16)), ' ');
  bool first = truthy(arg_or(a, 1, "first", value(false)));
  bool blank = truthy(arg_or(a, 2, "blank", value(false)));
  // Jinja2 appends a newline before splitting so a trailing newline survives.
  auto lines = split_lines(s + "\n");
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) out += "\n";
    if (i > 0 && (blank || !lines[i].empty())) out += ind;
    out += lines[i];
  }
  if (first) out = ind + out;
  return value(std::move(out));
}

value f_items(evaluator&, const value& v, call_args&) {
  if (v.is_undefined()) return make_list({});
  if (!v.is_dict()) fail("items() needs a mapping, not " + std::string(type_name(v)));
  return kv_tuples(v.dict());
}

value f_join(evaluator& ev, const value& v, call_args& a) {
  std::string sep = to_str(arg_or(a, 0, "d", value("")));
  const value* attr = arg(a, 1, "attribute");
  std::string out;
  bool first = true;
  for (const auto& it : items_of(v)) {
    if (!first) out += sep;
    first = false;
    out += to_str(attr ? get_path(ev, it, *attr) : it);
    if (out.size() > ev.options().max_output_bytes) fail("string too long");
  }
  return value(std::move(out));
}

value f_length(evaluator&, const value& v, call_args&) {
  if (v.is_string()) return value(int64_t(utf8_length(v.str())));
  if (v.is_list()) return value(int64_t(v.list().items.size()));
  if (v.is_dict()) return value(int64_t(v.dict().items.size()));
  if (v.is_undefined()) return value(int64_t(0));
  fail("object of type '" + std::string(type_name(v)) + "' has no len()");
}

value f_list(evaluator&, const value& v, call_args&) { return make_list(items_of(v)); }

value f_lower(evaluator&, const value& v, call_args&) { return value(py_lower(to_str(v))); }
value f_upper(evaluator&, const value& v, call_args&) { return value(py_upper(to_str(v))); }

value f_map(evaluator& ev, const value& v, call_args& a) {
  std::vector<value> out;
  const value* attr = nullptr;
  for (const auto& [k, x] : a.kwargs)
    if (k == "attribute") attr = &x;
  if (attr) {
    const value* def = nullptr;
    for (const auto& [k, x] : a.kwargs)
      if (k == "default") def = &x;
    for (const auto& it : items_of(v)) {
      value r = get_path(ev, it, *attr);
      out.push_back(r.is_undefined() && def ? *def : r);
    }
    return make_list(std::move(out));
  }
  if (a.args.empty()) fail("map() needs a filter name or attribute=");
  std::string name = to_str(a.args[0]);
  call_args rest;
  rest.pos = a.pos;
  rest.args.assign(a.args.begin() + 1, a.args.end());
  rest.kwargs = a.kwargs;
  for (const auto& it : items_of(v)) {
    call_args c = rest;
    out.push_back(call_filter(ev, name, it, c));
  }
  return make_list(std::move(out));
}

value min_max(evaluator& ev, const value& v, call_args& a, bool want_max) {
  bool cs = truthy(arg_or(a, 0, "case_sensitive", value(false)));
  const value* attr = arg(a, 1, "attribute");
  auto items = items_of(v);
  if (items.empty()) return value();
  size_t best = 0;
  auto key = [&](const value& x) { return sort_key(attr ? get_path(ev, x, *attr) : x, cs); };
  for (size_t i = 1; i < items.size(); ++i) {
    int c = compare(key(items[i]), key(items[best]), {});
    if (want_max ? c > 0 : c < 0) best = i;
  }
  return items[best];
}
value f_max(evaluator& ev, const value& v, call_args& a) { return min_max(ev, v, a, true); }
value f_min(evaluator& ev, const value& v, call_args& a) { return min_max(ev, v, a, false); }

value select_impl(evaluator& ev, const value& v, call_args& a, bool by_attr, bool keep) {
  size_t at = 0;
  value attr;
  if (by_attr) {
    if (a.args.empty()) fail("selectattr()/rejectattr() need an attribute name");
    attr = a.args[at++];
  }
  std::string test;
  if (at < a.args.size()) test = to_str(a.args[at++]);
  call_args targs;
  targs.pos = a.pos;
  targs.args.assign(a.args.begin() + std::ptrdiff_t(std::min(at, a.args.size())), a.args.end());
  std::vector<value> out;
  for (const auto& it : items_of(v)) {
    value x = by_attr ? get_path(ev, it, attr) : it;
    bool r;
    if (test.empty()) r = truthy(x);
    else {
      call_args c = targs;
      r = call_test(ev, test, x, c);
    }
    if (r == keep) out.push_back(it);
  }
  return make_list(std::move(out));
}
value f_select(evaluator& ev, const value& v, call_args& a) { return select_impl(ev, v, a, false, true); }
value f_reject(evaluator& ev, const value& v, call_args& a) { return select_impl(ev, v, a, false, false); }
value f_selectattr(evaluator& ev, const value& v, call_args& a) { return select_impl(ev, v, a, true, true); }
value f_rejectattr(evaluator& ev, const value& v, call_args& a) { return select_impl(ev, v, a, true, false); }

value f_replace(evaluator& ev, const value& v, call_args& a) {
  const value* from = arg(a, 0, "old");
  const value* to = arg(a, 1, "new");
  if (!from || !to) fail("replace() needs two arguments");
  value count = arg_or(a, 2, "count", value(none_t{}));
  return value(py_replace(to_str(v), to_str(*from), to_str(*to), count.is_none() ? -1 : want_int(count, "count"),
                          ev.options().max_output_bytes));
}

value f_reverse(evaluator&, const value& v, call_args&) {
  if (v.is_string()) {
    auto cs = utf8_chars(v.str());
    std::string out;
    for (size_t i = cs.size(); i-- > 0;) out += cs[i];
    return value(std::move(out));
  }
  auto items = items_of(v);
  std::reverse(items.begin(), items.end());
  return make_list(std::move(items));
}

value f_round(evaluator&, const value& v, call_args& a) {
  int64_t prec = want_int(arg_or(a, 0, "precision", value(int64_t(0))), "precision");
  std::string method = to_str(arg_or(a, 1, "method", value("common")));
  if (!v.is_number()) fail("round() needs a number, not " + std::string(type_name(v)));
  double d = v.is_float() ? v.as_float() : v.is_int() ? double(v.as_int()) : double(v.as_bool());
  bool int_input = !v.is_float();
  prec = std::clamp<int64_t>(prec, -300, 300);
  if (method == "floor" || method == "ceil") {
    double m = std::pow(10.0, double(prec));
    return value((method == "floor" ? std::floor(d * m) : std::ceil(d * m)) / m);
  }
  if (method != "common") fail("method must be 'common', 'ceil' or 'floor'");
  if (!std::isfinite(d)) return value(d);
  if (int_input && prec >= 0) return v;  // round(7) is 7, an int
  if (prec == 0) return value(std::nearbyint(d));  // half to even, as Python's round()
  // Python rounds the exact binary value to `prec` decimals; printf does the same.
  if (prec > 0) {
    char buf[512];
    std::snprintf(buf, sizeof buf, "%.*f", int(prec), d);
    return value(std::strtod(buf, nullptr));
  }
  double m = std::pow(10.0, double(-prec));
  return value(std::nearbyint(d / m) * m);
}

value f_safe(evaluator&, const value& v, call_args&) { return v; }
value f_string(evaluator&, const value& v, call_args&) { return value(to_str(v)); }
value f_pprint(evaluator&, const value& v, call_args&) { return value(to_repr(v)); }

value f_sort(evaluator& ev, const value& v, call_args& a) {
  bool reverse = truthy(arg_or(a, 0, "reverse", value(false)));
  bool cs = truthy(arg_or(a, 1, "case_sensitive", value(false)));
  const value* attr = arg(a, 2, "attribute");
  auto items = items_of(v);
  std::vector<std::pair<value, value>> keyed;
  for (auto& it : items) keyed.emplace_back(sort_key(attr ? get_path(ev, it, *attr) : it, cs), it);
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
    int c = compare(x.first, y.first, {});
    return reverse ? c > 0 : c < 0;
  });
  std::vector<value> out;
  for (auto& [k, it] : keyed) out.push_back(std::move(it));
  return make_list(std::move(out));
}

value f_sum(evaluator& ev, const value& v, call_args& a) {
  const value* attr = arg(a, 0, "attribute");
  value acc = arg_or(a, 1, "start", value(int64_t(0)));
  for (const auto& it : items_of(v)) {
    value x = attr ? get_path(ev, it, *attr) : it;
    if (!x.is_number() || !acc.is_number())
      fail("unsupported operand type(s) for +: '" + std::string(type_name(acc)) + "' and '" +
           std::string(type_name(x)) + "'");
    if (acc.is_float() || x.is_float()) {
      auto f = [](const value& y) {
        return y.is_float() ? y.as_float() : y.is_int() ? double(y.as_int()) : double(y.as_bool());
      };
      acc = value(f(acc) + f(x));
    } else {
      int64_t r;
      auto i = [](const value& y) { return y.is_int() ? y.as_int() : int64_t(y.as_bool()); };
      if (__builtin_add_overflow(i(acc), i(x), &r)) fail("integer overflow");
      acc = value(r);
    }
  }
  return acc;
}

value f_title(evaluator&, const value& v, call_args&) { return value(jinja_title(to_str(v))); }

// transformers' tojson: json.dumps(x, ensure_ascii=False, indent=indent, separators=separators,
// sort_keys=sort_keys). With indent, json.dumps separates items with "," (no space).
value f_tojson(evaluator&, const value& v, call_args& a) {
  json_format f;
  value indent = arg_or(a, 0, "indent", value(none_t{}));
  if (!indent.is_none()) {
    f.indent = int(std::clamp<int64_t>(want_int(indent, "indent"), 0, 64));
    f.item_sep = ",";
  }
  f.ensure_ascii = truthy(arg_or(a, 1, "ensure_ascii", value(false)));
  value seps = arg_or(a, 2, "separators", value(none_t{}));
  if (seps.is_list() && seps.list().items.size() == 2) {
    f.item_sep = to_str(seps.list().items[0]);
    f.key_sep = to_str(seps.list().items[1]);
  }
  f.sort_keys = truthy(arg_or(a, 3, "sort_keys", value(false)));
  return value(to_json(v, f, a.pos));
}

value f_trim(evaluator&, const value& v, call_args& a) {
  return value(py_strip(to_str(v), arg_or(a, 0, "chars", value(none_t{})), both));
}

value f_unique(evaluator& ev, const value& v, call_args& a) {
  bool cs = truthy(arg_or(a, 0, "case_sensitive", value(false)));
  const value* attr = arg(a, 1, "attribute");
  std::vector<value> out, seen;
  for (const auto& it : items_of(v)) {
    value k = sort_key(attr ? get_path(ev, it, *attr) : it, cs);
    bool dup = false;
    for (const auto& s : seen) dup = dup || equals(s, k);
    if (!dup) {
      seen.push_back(k);
      out.push_back(it);
    }
  }
  return make_list(std::move(out));
}

value f_wordcount(evaluator&, const value& v, call_args&) {
  std::string s = to_str(v);
  int64_t n = 0;
  bool in_word = false;
  for (unsigned char c : s) {
    bool w = std::isalnum(c) || c == '_' || c >= 0x80;
    if (w && !in_word) ++n;
    in_word = w;
  }
  return value(n);
}

value f_format(evaluator&, const value& v, call_args& a) {
  if (!a.kwargs.empty()) fail("format() with keyword arguments is not supported");
  return value(printf_format(to_str(v), a.args));
}

const std::map<std::string, filter_fn, std::less<>>& filters() {
  static const std::map<std::string, filter_fn, std::less<>> table = {
      {"abs", f_abs},
      {"attr", f_attr},
      {"batch", f_batch},
      {"capitalize", f_capitalize},
      {"center", f_center},
      {"count", f_length},
      {"d", f_default},
      {"default", f_default},
      {"dictsort", f_dictsort},
      {"e", f_escape},
      {"escape", f_escape},
      {"first", f_first},
      {"float", f_float},
      {"forceescape", f_escape},
      {"format", f_format},
      {"indent", f_indent},
      {"int", f_int},
      {"items", f_items},
      {"join", f_join},
      {"last", f_last},
      {"length", f_length},
      {"list", f_list},
      {"lower", f_lower},
      {"map", f_map},
      {"max", f_max},
      {"min", f_min},
      {"pprint", f_pprint},
      {"reject", f_reject},
      {"rejectattr", f_rejectattr},
      {"replace", f_replace},
      {"reverse", f_reverse},
      {"round", f_round},
      {"safe", f_safe},
      {"select", f_select},
      {"selectattr", f_selectattr},
      {"sort", f_sort},
      {"string", f_string},
      {"sum", f_sum},
      {"title", f_title},
      {"tojson", f_tojson},
      {"trim", f_trim},
      {"unique", f_unique},
      {"upper", f_upper},
      {"wordcount", f_wordcount},
  };
  return table;
}

// ---- tests ----

using test_fn = bool (*)(evaluator&, const value&, call_args&);

const value& test_arg(const call_args& a) {
  if (a.args.empty()) fail("test needs an argument");
  return a.args[0];
}

bool t_defined(evaluator&, const value& v, call_args&) { return !v.is_undefined(); }
bool t_undefined(evaluator&, const value& v, call_args&) { return v.is_undefined(); }
bool t_none(evaluator&, const value& v, call_args&) { return v.is_none(); }
bool t_boolean(evaluator&, const value& v, call_args&) { return v.is_bool(); }
bool t_true(evaluator&, const value& v, call_args&) { return v.is_bool() && v.as_bool(); }
bool t_false(evaluator&, const value& v, call_args&) { return v.is_bool() && !v.as_bool(); }
bool t_integer(evaluator&, const value& v, call_args&) { return v.is_int(); }
bool t_float(evaluator&, const value& v, call_args&) { return v.is_float(); }
bool t_number(evaluator&, const value& v, call_args&) { return v.is_number(); }
bool t_string(evaluator&, const value& v, call_args&) { return v.is_string(); }
bool t_mapping(evaluator&, const value& v, call_args&) { return v.is_dict() && !v.dict().is_namespace; }
// Jinja2's Undefined has __iter__ and __len__, so it passes `iterable` and `sequence`.
bool t_iterable(evaluator&, const value& v, call_args&) {
  return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
}
bool t_sequence(evaluator& ev, const value& v, call_args& a) { return t_iterable(ev, v, a); }
bool t_callable(evaluator&, const value& v, call_args&) { return v.is_callable(); }
bool t_odd(evaluator&, const value& v, call_args&) { return (want_int(v, "odd test operand") & 1) != 0; }
bool t_even(evaluator&, const value& v, call_args&) { return (want_int(v, "even test operand") & 1) == 0; }
bool t_divisibleby(evaluator&, const value& v, call_args& a) {
  int64_t d = want_int(test_arg(a), "divisibleby argument");
  if (d == 0) fail("integer division or modulo by zero");
  return want_int(v, "divisibleby operand") % d == 0;
}
bool t_eq(evaluator&, const value& v, call_args& a) { return equals(v, test_arg(a)); }
bool t_ne(evaluator&, const value& v, call_args& a) { return !equals(v, test_arg(a)); }
bool t_lt(evaluator&, const value& v, call_args& a) { return compare(v, test_arg(a), a.pos) < 0; }
bool t_le(evaluator&, const value& v, call_args& a) { return compare(v, test_arg(a), a.pos) <= 0; }
bool t_gt(evaluator&, const value& v, call_args& a) { return compare(v, test_arg(a), a.pos) > 0; }
bool t_ge(evaluator&, const value& v, call_args& a) { return compare(v, test_arg(a), a.pos) >= 0; }
bool t_in(evaluator&, const value& v, call_args& a) {
  const value& c = test_arg(a);
  if (c.is_string()) return v.is_string() && c.str().find(v.str()) != std::string::npos;
  if (c.is_dict()) return v.is_string() && c.dict().find(v.str()) != nullptr;
  for (const auto& x : items_of(c))
    if (equals(x, v)) return true;
  return false;
}
bool t_sameas(evaluator&, const value& v, call_args& a) {
  const value& o = test_arg(a);
  if (v.v.index() != o.v.index()) return false;
  if (v.is_list()) return v.list_ptr() == o.list_ptr();
  if (v.is_dict()) return v.dict_ptr() == o.dict_ptr();
  return equals(v, o);  // None, True, False and small ints are singletons in Python
}
bool t_lower(evaluator&, const value& v, call_args&) {
  std::string s = to_str(v);
  return py_lower(s) == s && py_upper(s) != s;
}
bool t_upper(evaluator&, const value& v, call_args&) {
  std::string s = to_str(v);
  return py_upper(s) == s && py_lower(s) != s;
}
bool t_escaped(evaluator&, const value&, call_args&) { return false; }

const std::map<std::string, test_fn, std::less<>>& tests() {
  static const std::map<std::string, test_fn, std::less<>> table = {
      {"defined", t_defined},
      {"undefined", t_undefined},
      {"none", t_none},
      {"boolean", t_boolean},
      {"true", t_true},
      {"false", t_false},
      {"integer", t_integer},
      {"float", t_float},
      {"number", t_number},
      {"string", t_string},
      {"mapping", t_mapping},
      {"iterable", t_iterable},
      {"sequence", t_sequence},
      {"callable", t_callable},
      {"odd", t_odd},
      {"even", t_even},
      {"divisibleby", t_divisibleby},
      {"eq", t_eq},
      {"equalto", t_eq},
      {"==", t_eq},
      {"ne", t_ne},
      {"!=", t_ne},
      {"lt", t_lt},
      {"lessthan", t_lt},
      {"<", t_lt},
      {"le", t_le},
      {"<=", t_le},
      {"gt", t_gt},
      {"greaterthan", t_gt},
      {">", t_gt},
      {"ge", t_ge},
      {">=", t_ge},
      {"in", t_in},
      {"sameas", t_sameas},
      {"lower", t_lower},
      {"upper", t_upper},
      {"escaped", t_escaped},
  };
  return table;
}

// ---- globals ----

value g_range(evaluator&, call_args& a) {
  if (a.args.empty() || a.args.size() > 3) fail("range expected 1 to 3 arguments");
  int64_t start = 0, stop, step = 1;
  if (a.args.size() == 1) stop = want_int(a.args[0], "range() argument");
  else {
    start = want_int(a.args[0], "range() argument");
    stop = want_int(a.args[1], "range() argument");
    if (a.args.size() == 3) step = want_int(a.args[2], "range() argument");
  }
  if (step == 0) fail("range() arg 3 must not be zero");
  long double count = step > 0 ? (stop > start ? ((long double)stop - start + step - 1) / step : 0)
                               : (stop < start ? ((long double)start - stop - step - 1) / -step : 0);
  if (count > max_list_size) fail("range() longer than " + std::to_string(max_list_size) + " items");
  std::vector<value> out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.emplace_back(i);
  return make_list(std::move(out));
}

value dict_from_args(call_args& a, bool is_namespace) {
  std::vector<std::pair<std::string, value>> items;
  if (!a.args.empty()) {
    const value& init = a.args[0];
    if (init.is_dict()) items = init.dict().items;
    else if (init.is_list()) {
      for (const auto& p : init.list().items) {
        if (!p.is_list() || p.list().items.size() != 2) fail("dictionary update sequence element has wrong length");
        items.emplace_back(to_str(p.list().items[0]), p.list().items[1]);
      }
    } else if (!init.is_undefined()) fail("cannot convert " + std::string(type_name(init)) + " to a dict");
  }
  for (auto& kv : a.kwargs) items.push_back(kv);
  if (is_namespace)
    for (const auto& kv : items)
      if (kv.second.is_dict() && kv.second.dict().is_namespace) fail("a namespace attribute cannot hold a namespace");
  return make_dict(std::move(items), is_namespace);
}

value g_namespace(evaluator&, call_args& a) { return dict_from_args(a, true); }
value g_dict(evaluator&, call_args& a) { return dict_from_args(a, false); }

value g_raise_exception(evaluator&, call_args& a) {
  std::string msg = a.args.empty() ? std::string() : to_str(a.args[0]);
  throw template_error{std::move(msg), a.pos, true};
}

value g_strftime_now(evaluator& ev, call_args& a) {
  std::string fmt = a.args.empty() ? std::string() : to_str(a.args[0]);
  std::time_t t = ev.options().now ? *ev.options().now : std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  if (fmt.size() > 256) fail("strftime_now() format too long");
  char buf[4096];
  size_t n = std::strftime(buf, sizeof buf, fmt.c_str(), &tm);
  return value(std::string(buf, n));
}

const std::vector<std::pair<std::string, value>>& global_table() {
  static const std::vector<std::pair<std::string, value>> table = {
      {"range", make_callable("range", g_range)},
      {"namespace", make_callable("namespace", g_namespace)},
      {"dict", make_callable("dict", g_dict)},
      {"raise_exception", make_callable("raise_exception", g_raise_exception)},
      {"strftime_now", make_callable("strftime_now", g_strftime_now)},
  };
  return table;
}

}  // namespace

const value* find_global(const std::string& name) {
  for (const auto& [k, v] : global_table())
    if (k == name) return &v;
  return nullptr;
}

value call_filter(evaluator& ev, const std::string& name, const value& input, call_args& args) {
  auto it = filters().find(name);
  if (it == filters().end()) fail("unknown filter '" + name + "'", args.pos);
  return it->second(ev, input, args);
}

bool call_test(evaluator& ev, const std::string& name, const value& input, call_args& args) {
  auto it = tests().find(name);
  if (it == tests().end()) fail("unknown test '" + name + "'", args.pos);
  return it->second(ev, input, args);
}

// ---- methods ----

static value string_method(const value& self, const std::string& name) {
  using A = call_args;
  auto strip = [](int side) {
    return [side](const value& s, evaluator&, A& a) {
      return value(py_strip(s.str(), arg_or(a, 0, "chars", value(none_t{})), side));
    };
  };
  if (name == "strip") return bound(self, name, strip(both));
  if (name == "lstrip") return bound(self, name, strip(left));
  if (name == "rstrip") return bound(self, name, strip(right));
  if (name == "split")
    return bound(self, name, [](const value& s, evaluator&, A& a) {
      value mx = arg_or(a, 1, "maxsplit", value(int64_t(-1)));
      return py_split(s.str(), arg_or(a, 0, "sep", value(none_t{})), want_int(mx, "maxsplit"));
    });
  if (name == "splitlines")
    return bound(self, name, [](const value& s, evaluator&, A&) {
      std::vector<value> out;
      for (auto& l : split_lines(s.str())) out.emplace_back(std::move(l));
      return make_list(std::move(out));
    });
  auto affix = [](bool start) {
    return [start](const value& s, evaluator&, A& a) {
      const value* p = arg(a, 0, start ? "prefix" : "suffix");
      if (!p) fail(std::string(start ? "startswith" : "endswith") + "() needs an argument");
      std::vector<value> options = p->is_list() ? p->list().items : std::vector<value>{*p};
      for (const auto& o : options) {
        const std::string& x = want_str(o, "startswith()/endswith() argument");
        const std::string& str = s.str();
        if (x.size() <= str.size() &&
            (start ? str.compare(0, x.size(), x) == 0 : str.compare(str.size() - x.size(), x.size(), x) == 0))
          return value(true);
      }
      return value(false);
    };
  };
  if (name == "startswith") return bound(self, name, affix(true));
  if (name == "endswith") return bound(self, name, affix(false));
  if (name == "upper")
    return bound(self, name, [](const value& s, evaluator&, A&) { return value(py_upper(s.str())); });
  if (name == "lower")
    return bound(self, name, [](const value& s, evaluator&, A&) { return value(py_lower(s.str())); });
  if (name == "title")
    return bound(self, name, [](const value& s, evaluator&, A&) { return value(py_title(s.str())); });
  if (name == "capitalize")
    return bound(self, name, [](const value& s, evaluator&, A&) { return value(py_capitalize(s.str())); });
  if (name == "replace")
    return bound(self, name, [](const value& s, evaluator& ev, A& a) {
      if (a.args.size() < 2) fail("replace() needs two arguments");
      value count = arg_or(a, 2, "count", value(int64_t(-1)));
      return value(py_replace(s.str(), want_str(a.args[0], "replace() argument"),
                              want_str(a.args[1], "replace() argument"), want_int(count, "count"),
                              ev.options().max_output_bytes));
    });
  auto find = [](bool reverse, bool raise) {
    return [reverse, raise](const value& s, evaluator&, A& a) {
      const value* sub = arg(a, 0, "sub");
      if (!sub) fail("find() needs an argument");
      const std::string& str = s.str();
      size_t p = reverse ? str.rfind(want_str(*sub, "find() argument")) : str.find(want_str(*sub, "find() argument"));
      if (p == std::string::npos) {
        if (raise) fail("substring not found");
        return value(int64_t(-1));
      }
      return value(int64_t(utf8_length(std::string_view(str).substr(0, p))));  // code point index
    };
  };
  if (name == "find") return bound(self, name, find(false, false));
  if (name == "rfind") return bound(self, name, find(true, false));
  if (name == "index") return bound(self, name, find(false, true));
  if (name == "count")
    return bound(self, name, [](const value& s, evaluator&, A& a) {
      const std::string sub = want_str(arg_or(a, 0, "sub", value("")), "count() argument");
      const std::string& str = s.str();
      if (sub.empty()) return value(int64_t(utf8_length(str) + 1));
      int64_t n = 0;
      for (size_t p = str.find(sub); p != std::string::npos; p = str.find(sub, p + sub.size())) ++n;
      return value(n);
    });
  if (name == "format")
    return bound(self, name, [](const value& s, evaluator&, A& a) { return value(py_format(s.str(), a)); });
  if (name == "join")
    return bound(self, name, [](const value& s, evaluator& ev, A& a) {
      std::string out;
      bool first = true;
      for (const auto& it : items_of(arg_or(a, 0, "iterable", value()))) {
        if (!first) out += s.str();
        first = false;
        out += want_str(it, "join() item");
        if (out.size() > ev.options().max_output_bytes) fail("string too long");
      }
      return value(std::move(out));
    });
  auto classify = [](int (*pred)(int)) {
    return [pred](const value& s, evaluator&, A&) {
      const std::string& str = s.str();
      return value(!str.empty() && std::all_of(str.begin(), str.end(),
                                               [pred](char c) { return pred(static_cast<unsigned char>(c)) != 0; }));
    };
  };
  if (name == "isdigit") return bound(self, name, classify(isdigit));
  if (name == "isalpha") return bound(self, name, classify(isalpha));
  if (name == "isalnum") return bound(self, name, classify(isalnum));
  if (name == "isspace") return bound(self, name, classify(isspace));
  if (name == "isupper")
    return bound(self, name, [](const value& s, evaluator& ev, A& a) { return value(t_upper(ev, s, a)); });
  if (name == "islower")
    return bound(self, name, [](const value& s, evaluator& ev, A& a) { return value(t_lower(ev, s, a)); });
  return value();
}

static value dict_method(const value& self, const std::string& name) {
  using A = call_args;
  if (name == "items") return bound(self, name, [](const value& d, evaluator&, A&) { return kv_tuples(d.dict()); });
  if (name == "keys")
    return bound(self, name, [](const value& d, evaluator&, A&) {
      std::vector<value> out;
      for (const auto& [k, v] : d.dict().items) out.emplace_back(k);
      return make_list(std::move(out));
    });
  if (name == "values")
    return bound(self, name, [](const value& d, evaluator&, A&) {
      std::vector<value> out;
      for (const auto& [k, v] : d.dict().items) out.push_back(v);
      return make_list(std::move(out));
    });
  if (name == "get")
    return bound(self, name, [](const value& d, evaluator&, A& a) {
      const value* key = arg(a, 0, "key");
      if (!key) fail("get() needs a key");
      const value* v = key->is_string() ? d.dict().find(key->str()) : nullptr;
      return v ? *v : arg_or(a, 1, "default", value(none_t{}));
    });
  return value();
}

static value list_method(const value& self, const std::string& name) {
  using A = call_args;
  if (name == "index")
    return bound(self, name, [](const value& l, evaluator&, A& a) {
      const value* x = arg(a, 0, "value");
      if (!x) fail("index() needs an argument");
      const auto& items = l.list().items;
      for (size_t i = 0; i < items.size(); ++i)
        if (equals(items[i], *x)) return value(int64_t(i));
      fail(to_repr(*x) + " is not in list");
    });
  if (name == "count")
    return bound(self, name, [](const value& l, evaluator&, A& a) {
      const value* x = arg(a, 0, "value");
      if (!x) fail("count() needs an argument");
      int64_t n = 0;
      for (const auto& it : l.list().items) n += equals(it, *x);
      return value(n);
    });
  return value();
}

value find_method(const value& obj, const std::string& name) {
  if (obj.is_string()) return string_method(obj, name);
  if (obj.is_dict() && !obj.dict().is_namespace) return dict_method(obj, name);
  if (obj.is_list()) return list_method(obj, name);
  return value();
}

}  // namespace tandem::jinja::detail
