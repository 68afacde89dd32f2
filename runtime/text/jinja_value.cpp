// Values of the Jinja interpreter with Python's semantics: truthiness, str() and repr(), equality
// and ordering, and json.dumps() for |tojson. Templates print these, so the spelling must match
// Python's byte for byte (True, None, ['a', 'b'], 1e+20, 0.30000000000000004).
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "runtime/text/jinja_internal.h"

namespace tandem::jinja::detail {

void fail(std::string message, source_pos pos) { throw template_error{std::move(message), pos, false}; }

const value* dict_obj::find(std::string_view key) const {
  for (const auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

void dict_obj::set(const std::string& key, value v) {
  for (auto& [k, old] : items)
    if (k == key) {
      old = std::move(v);
      return;
    }
  items.emplace_back(key, std::move(v));
}

int depth_of(const value& v) {
  if (v.is_list()) return v.list().depth;
  if (v.is_dict()) return v.dict().depth;
  return 0;
}

static int checked_depth(int child_max) {
  if (child_max + 1 > max_depth) fail("values nest deeper than " + std::to_string(max_depth) + " levels");
  return child_max + 1;
}

value make_list(std::vector<value> items, bool tuple) {
  if (items.size() > max_list_size) fail("list longer than " + std::to_string(max_list_size) + " items");
  int d = 0;
  for (const auto& it : items) d = std::max(d, depth_of(it));
  auto l = std::make_shared<list_obj>();
  l->items = std::move(items);
  l->tuple = tuple;
  l->depth = checked_depth(d);
  return value(std::move(l));
}

value make_dict(std::vector<std::pair<std::string, value>> items, bool is_namespace) {
  int d = 0;
  for (const auto& it : items) d = std::max(d, depth_of(it.second));
  auto o = std::make_shared<dict_obj>();
  // Later keys replace earlier ones, as in a Python dict literal.
  for (auto& [k, v] : items) o->set(k, std::move(v));
  o->is_namespace = is_namespace;
  o->depth = checked_depth(d);
  return value(std::move(o));
}

value make_callable(std::string name, std::function<value(evaluator&, call_args&)> fn) {
  auto c = std::make_shared<callable_obj>();
  c->name = std::move(name);
  c->fn = std::move(fn);
  return value(std::move(c));
}

template <class Json>
static value json_to_value(const Json& j, int depth) {
  if (depth > max_depth) fail("context nests deeper than " + std::to_string(max_depth) + " levels");
  switch (j.type()) {
    case nlohmann::json::value_t::null: return value(none_t{});
    case nlohmann::json::value_t::boolean: return value(j.template get<bool>());
    case nlohmann::json::value_t::number_integer: return value(j.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      auto u = j.template get<uint64_t>();
      if (u > uint64_t(INT64_MAX)) return value(double(u));
      return value(int64_t(u));
    }
    case nlohmann::json::value_t::number_float: return value(j.template get<double>());
    case nlohmann::json::value_t::string: return value(j.template get<std::string>());
    case nlohmann::json::value_t::array: {
      std::vector<value> items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(json_to_value(e, depth + 1));
      return make_list(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      std::vector<std::pair<std::string, value>> items;
      items.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it) items.emplace_back(it.key(), json_to_value(it.value(), depth + 1));
      return make_dict(std::move(items));
    }
    default: return value();  // binary, discarded: not JSON a caller would pass
  }
}

value from_json(const nlohmann::ordered_json& j, int depth) { return json_to_value(j, depth); }
value from_json(const nlohmann::json& j, int depth) { return json_to_value(j, depth); }

std::string_view type_name(const value& v) {
  if (v.is_undefined()) return "Undefined";
  if (v.is_none()) return "NoneType";
  if (v.is_bool()) return "bool";
  if (v.is_int()) return "int";
  if (v.is_float()) return "float";
  if (v.is_string()) return "str";
  if (v.is_list()) return v.list().tuple ? "tuple" : "list";
  if (v.is_dict()) return v.dict().is_namespace ? "Namespace" : "dict";
  return "function";
}

bool truthy(const value& v) {
  if (v.is_undefined() || v.is_none()) return false;
  if (v.is_bool()) return v.as_bool();
  if (v.is_int()) return v.as_int() != 0;
  if (v.is_float()) return v.as_float() != 0.0;
  if (v.is_string()) return !v.str().empty();
  if (v.is_list()) return !v.list().items.empty();
  if (v.is_dict()) return !v.dict().items.empty();
  return true;
}

// Python's repr(float): the shortest digits that round-trip, in fixed notation for exponents in
// [-4, 16) and scientific notation (two-digit exponent at least) outside it; integral values get
// ".0".
std::string format_float(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  size_t e = sci.find('e');
  std::string digits = sci.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  int exp = std::stoi(sci.substr(e + 1));
  int decpt = exp + 1;  // position of the decimal point relative to the digits
  if (decpt <= -4 || decpt > 16) {
    std::string out = sign + digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    return out + eb;
  }
  if (decpt <= 0) return sign + "0." + std::string(size_t(-decpt), '0') + digits;
  if (size_t(decpt) >= digits.size()) return sign + digits + std::string(size_t(decpt) - digits.size(), '0') + ".0";
  return sign + digits.substr(0, size_t(decpt)) + "." + digits.substr(size_t(decpt));
}

static void repr_string(std::string& out, const std::string& s) {
  // Python picks single quotes unless the text has a single quote and no double quote.
  char q = (s.find('\'') != std::string::npos && s.find('"') == std::string::npos) ? '"' : '\'';
  out += q;
  for (unsigned char c : s) {
    if (c == '\\') out += "\\\\";
    else if (c == q) {
      out += '\\';
      out += char(c);
    } else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7f) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      out += b;
    } else out += char(c);
  }
  out += q;
}

static void repr_into(std::string& out, const value& v, int depth);

static void str_into(std::string& out, const value& v, int depth) {
  if (v.is_string()) out += v.str();
  else repr_into(out, v, depth);
}

static void repr_into(std::string& out, const value& v, int depth) {
  if (depth > 2 * max_depth) fail("value nests too deeply to print");
  if (v.is_undefined()) return;
  if (v.is_none()) out += "None";
  else if (v.is_bool()) out += v.as_bool() ? "True" : "False";
  else if (v.is_int()) out += std::to_string(v.as_int());
  else if (v.is_float()) out += format_float(v.as_float());
  else if (v.is_string()) repr_string(out, v.str());
  else if (v.is_list()) {
    const auto& l = v.list();
    out += l.tuple ? '(' : '[';
    for (size_t i = 0; i < l.items.size(); ++i) {
      if (i) out += ", ";
      repr_into(out, l.items[i], depth + 1);
    }
    if (l.tuple && l.items.size() == 1) out += ',';
    out += l.tuple ? ')' : ']';
  } else if (v.is_dict()) {
    const auto& d = v.dict();
    if (d.is_namespace) out += "<Namespace ";
    out += '{';
    bool first = true;
    for (const auto& [k, val] : d.items) {
      if (!first) out += ", ";
      first = false;
      repr_string(out, k);
      out += ": ";
      repr_into(out, val, depth + 1);
    }
    out += '}';
    if (d.is_namespace) out += '>';
  } else {
    out += "<function " + v.callable().name + ">";
  }
}

std::string to_str(const value& v) {
  std::string out;
  str_into(out, v, 0);
  return out;
}

std::string to_repr(const value& v) {
  std::string out;
  repr_into(out, v, 0);
  return out;
}

static bool equals_at(const value& a, const value& b, int depth) {
  if (depth > 2 * max_depth) fail("values nest too deeply to compare");
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) {
      auto num = [](const value& x) {
        return x.is_float() ? x.as_float() : x.is_int() ? double(x.as_int()) : double(x.as_bool());
      };
      return num(a) == num(b);
    }
    auto num = [](const value& x) { return x.is_int() ? x.as_int() : int64_t(x.as_bool()); };
    return num(a) == num(b);
  }
  if (a.v.index() != b.v.index()) return false;
  if (a.is_undefined() || a.is_none()) return true;
  if (a.is_string()) return a.str() == b.str();
  if (a.is_list()) {
    const auto& x = a.list();
    const auto& y = b.list();
    if (x.tuple != y.tuple || x.items.size() != y.items.size()) return false;
    for (size_t i = 0; i < x.items.size(); ++i)
      if (!equals_at(x.items[i], y.items[i], depth + 1)) return false;
    return true;
  }
  if (a.is_dict()) {
    const auto& x = a.dict();
    const auto& y = b.dict();
    if (x.is_namespace || y.is_namespace) return &x == &y;
    if (x.items.size() != y.items.size()) return false;
    for (const auto& [k, v] : x.items) {
      const value* w = y.find(k);
      if (!w || !equals_at(v, *w, depth + 1)) return false;
    }
    return true;
  }
  return std::get<std::shared_ptr<callable_obj>>(a.v) == std::get<std::shared_ptr<callable_obj>>(b.v);
}

bool equals(const value& a, const value& b) { return equals_at(a, b, 0); }

static int compare_at(const value& a, const value& b, source_pos pos, int depth) {
  if (depth > 2 * max_depth) fail("values nest too deeply to compare", pos);
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) {
      auto num = [](const value& x) {
        return x.is_float() ? x.as_float() : x.is_int() ? double(x.as_int()) : double(x.as_bool());
      };
      double x = num(a), y = num(b);
      return x < y ? -1 : x > y ? 1 : 0;
    }
    auto num = [](const value& x) { return x.is_int() ? x.as_int() : int64_t(x.as_bool()); };
    int64_t x = num(a), y = num(b);
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    int c = a.str().compare(b.str());  // byte order of UTF-8 is code point order
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.is_list() && b.is_list() && a.list().tuple == b.list().tuple) {
    const auto& x = a.list().items;
    const auto& y = b.list().items;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (equals_at(x[i], y[i], depth + 1)) continue;
      return compare_at(x[i], y[i], pos, depth + 1);
    }
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  fail("'<' not supported between instances of '" + std::string(type_name(a)) + "' and '" + std::string(type_name(b)) +
           "'",
       pos);
}

int compare(const value& a, const value& b, source_pos pos) { return compare_at(a, b, pos, 0); }

// Decodes one UTF-8 sequence at s[i]; invalid bytes count as one character of their own.
static uint32_t decode_utf8(std::string_view s, size_t i, size_t* len) {
  unsigned char c = static_cast<unsigned char>(s[i]);
  int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
  if (n == 0 || i + size_t(n) > s.size()) {
    *len = 1;
    return c;
  }
  uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1f) : n == 3 ? (c & 0x0f) : (c & 0x07);
  for (int k = 1; k < n; ++k) {
    unsigned char cc = static_cast<unsigned char>(s[i + size_t(k)]);
    if ((cc >> 6) != 2) {
      *len = 1;
      return c;
    }
    cp = (cp << 6) | (cc & 0x3f);
  }
  *len = size_t(n);
  return cp;
}

std::vector<std::string_view> utf8_chars(std::string_view s) {
  std::vector<std::string_view> out;
  for (size_t i = 0; i < s.size();) {
    size_t len;
    decode_utf8(s, i, &len);
    out.push_back(s.substr(i, len));
    i += len;
  }
  return out;
}

size_t utf8_length(std::string_view s) {
  size_t n = 0;
  for (size_t i = 0; i < s.size(); ++n) {
    size_t len;
    decode_utf8(s, i, &len);
    i += len;
  }
  return n;
}

bool is_py_space(std::string_view s, size_t i, size_t* len) {
  uint32_t cp = decode_utf8(s, i, len);
  if ((cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20)) return true;
  return cp == 0x85 || cp == 0xa0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

// json.dumps' string escaping: ensure_ascii=False leaves non-ASCII as is (what transformers
// passes); ensure_ascii=True writes \uXXXX, with surrogate pairs above the BMP.
static void json_string(std::string& out, std::string_view s, bool ensure_ascii) {
  out += '"';
  for (size_t i = 0; i < s.size();) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    char b[16];
    if (c == '"') out += "\\\"";
    else if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c == '\b') out += "\\b";
    else if (c == '\f') out += "\\f";
    else if (c < 0x20 || (ensure_ascii && c == 0x7f)) {
      std::snprintf(b, sizeof b, "\\u%04x", c);
      out += b;
    } else if (c >= 0x80 && ensure_ascii) {
      size_t len;
      uint32_t cp = decode_utf8(s, i, &len);
      if (cp >= 0x10000) {
        cp -= 0x10000;
        std::snprintf(b, sizeof b, "\\u%04x\\u%04x", 0xd800 + (cp >> 10), 0xdc00 + (cp & 0x3ff));
      } else {
        std::snprintf(b, sizeof b, "\\u%04x", cp);
      }
      out += b;
      i += len;
      continue;
    } else out += char(c);
    ++i;
  }
  out += '"';
}

static void json_into(std::string& out, const value& v, const json_format& f, int level, source_pos pos) {
  if (level > 2 * max_depth) fail("value nests too deeply for tojson", pos);
  auto newline = [&](int lvl) {
    out += '\n';
    out.append(size_t(f.indent) * size_t(lvl), ' ');
  };
  if (v.is_none()) out += "null";
  else if (v.is_bool()) out += v.as_bool() ? "true" : "false";
  else if (v.is_int()) out += std::to_string(v.as_int());
  else if (v.is_float()) {
    double d = v.as_float();
    out += std::isnan(d) ? "NaN" : std::isinf(d) ? (d < 0 ? "-Infinity" : "Infinity") : format_float(d);
  } else if (v.is_string()) json_string(out, v.str(), f.ensure_ascii);
  else if (v.is_list()) {
    const auto& items = v.list().items;
    if (items.empty()) {
      out += "[]";
      return;
    }
    out += '[';
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) out += f.item_sep;
      if (f.indent >= 0) newline(level + 1);
      json_into(out, items[i], f, level + 1, pos);
    }
    if (f.indent >= 0) newline(level);
    out += ']';
  } else if (v.is_dict() && !v.dict().is_namespace) {
    std::vector<const std::pair<std::string, value>*> items;
    for (const auto& it : v.dict().items) items.push_back(&it);
    if (items.empty()) {
      out += "{}";
      return;
    }
    if (f.sort_keys) std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
    out += '{';
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) out += f.item_sep;
      if (f.indent >= 0) newline(level + 1);
      json_string(out, items[i]->first, f.ensure_ascii);
      out += f.key_sep;
      json_into(out, items[i]->second, f, level + 1, pos);
    }
    if (f.indent >= 0) newline(level);
    out += '}';
  } else {
    fail("Object of type " + std::string(type_name(v)) + " is not JSON serializable", pos);
  }
}

std::string to_json(const value& v, const json_format& fmt, source_pos pos) {
  std::string out;
  json_into(out, v, fmt, 0, pos);
  return out;
}

}  // namespace tandem::jinja::detail
