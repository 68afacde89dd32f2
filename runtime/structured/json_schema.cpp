#include "runtime/structured/json_schema.h"

#include "runtime/structured/grammar.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <set>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/errors.h"

namespace tandem {
namespace {

using ojson = nlohmann::ordered_json;

constexpr int max_depth = 64;
constexpr size_t max_grammar_bytes = size_t(1) << 20;
constexpr int64_t max_items = 1000;  // minItems, maxItems, maxProperties
constexpr int64_t max_length = 10000;  // minLength, maxLength
constexpr int64_t unbounded = -1;

[[noreturn]] void refuse(const std::string& message) { throw failure(errc::invalid_argument, message); }
[[noreturn]] void refuse_keyword(std::string_view keyword, std::string_view why = "is not supported") {
  refuse("JSON Schema keyword '" + std::string(keyword) + "' " + std::string(why));
}

// The shared rules, defined once when used. Whitespace is bounded so that the model cannot
// pad forever and the matcher keeps few stacks; numbers are bounded so that every number the
// grammar allows parses (nlohmann refuses 1e999 as an overflow). A \u escape of a surrogate
// must be a high one followed by a low one: nlohmann refuses a lone surrogate (and a raw one,
// which is not UTF-8, is left out of the class).
struct primitive {
  const char* name;
  const char* body;
  std::vector<const char*> uses;
};
const primitive primitives[] = {
    {"value",
     "object | array | string | number | boolean | null",
     {"object", "array", "string", "number", "boolean", "null"}},
    {"object",
     R"("{" ws ( string ws ":" ws value ( ws "," ws string ws ":" ws value )* ws )? "}")",
     {"ws", "string", "value"}},
    {"array", R"("[" ws ( value ( ws "," ws value )* ws )? "]")", {"ws", "value"}},
    {"string", R"("\"" char* "\"")", {"char"}},
    {"char",
     R"([^"\\\x00-\x1f\uD800-\uDFFF] | "\\" ( ["\\/bfnrt] | "u" ( [0-9a-cA-Ce-fE-F] [0-9a-fA-F]{3} | [dD] [0-7] )"
     R"([0-9a-fA-F]{2})"
     R"( | [dD] [89abAB] [0-9a-fA-F]{2} "\\u" [dD] [c-fC-F] [0-9a-fA-F]{2} ) ))",
     {}},
    {"number", R"(integer ( "." [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,2} )?)", {"integer"}},
    {"integer", R"("-"? ( "0" | [1-9] [0-9]{0,15} ))", {}},
    {"boolean", R"("true" | "false")", {}},
    {"null", R"("null")", {}},
    {"date", R"([0-9]{4} "-" ( "0" [1-9] | "1" [0-2] ) "-" ( "0" [1-9] | [12] [0-9] | "3" [01] ))", {}},
    {"time",
     R"(( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ":" ( [0-5] [0-9] | "60" ) ( "." [0-9]{1,9} )?)"
     R"( ( [zZ] | [+-] ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ))",
     {}},
    {"date-time", R"(date [tT] time)", {"date", "time"}},
    {"uuid", R"([0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{12})", {}},
    {"ipv4", R"(ipv4-octet "." ipv4-octet "." ipv4-octet "." ipv4-octet)", {"ipv4-octet"}},
    {"ipv4-octet", R"("25" [0-5] | "2" [0-4] [0-9] | "1" [0-9] [0-9] | [1-9] [0-9] | [0-9])", {}},
    {"ws", R"(| " " | "\n" [ \t]{0,20})", {}},
};
const std::set<std::string_view> formats = {"date", "time", "date-time", "uuid", "ipv4"};

const std::set<std::string_view> annotations = {"title",    "description", "default",  "examples",
                                                "$schema",  "$id",         "$comment", "deprecated",
                                                "readOnly", "writeOnly",   "$defs",    "definitions"};
// Keywords that apply to one type of instance (and are ignored for the others).
const std::map<std::string_view, std::string_view> typed_keywords = {
    {"properties", "object"},       {"required", "object"},         {"additionalProperties", "object"},
    {"minProperties", "object"},    {"maxProperties", "object"},    {"items", "array"},
    {"prefixItems", "array"},       {"minItems", "array"},          {"maxItems", "array"},
    {"uniqueItems", "array"},       {"minLength", "string"},        {"maxLength", "string"},
    {"format", "string"},           {"minimum", "number"},          {"maximum", "number"},
    {"exclusiveMinimum", "number"}, {"exclusiveMaximum", "number"}, {"multipleOf", "number"}};
// Keywords that stand for the whole schema; other constraints beside them are refused.
const std::set<std::string_view> combinators = {"enum", "const", "anyOf", "oneOf", "allOf", "$ref"};
const std::vector<std::string_view> type_names = {"object", "array", "string", "number", "integer", "boolean", "null"};

// A GBNF literal of these bytes (UTF-8 passes through; the engine matches code points).
std::string literal(std::string_view bytes) { return gbnf_literal(bytes); }

const std::string quote = literal("\"");

// `{m,n}` and friends; hi == unbounded for none.
std::string repeat(int64_t lo, int64_t hi) {
  if (hi == unbounded) return lo == 0 ? "*" : lo == 1 ? "+" : "{" + std::to_string(lo) + ",}";
  if (lo == hi) return "{" + std::to_string(lo) + "}";
  if (lo == 0 && hi == 1) return "?";
  return "{" + std::to_string(lo) + "," + std::to_string(hi) + "}";
}

// A count keyword (minItems, maxLength...): a non-negative integer at most `cap`.
int64_t count(const ojson& s, const char* key, int64_t dflt, int64_t cap) {
  auto it = s.find(key);
  if (it == s.end()) return dflt;
  const ojson& v = *it;
  if (!v.is_number() || v.get<double>() < 0 || std::floor(v.get<double>()) != v.get<double>())
    refuse_keyword(key, "must be a non-negative integer");
  if (v.get<double>() > double(cap)) refuse_keyword(key, "above " + std::to_string(cap) + " is not supported");
  return v.get<int64_t>();
}

bool has_type(const ojson& v, std::string_view t) {
  if (t == "null") return v.is_null();
  if (t == "boolean") return v.is_boolean();
  if (t == "string") return v.is_string();
  if (t == "object") return v.is_object();
  if (t == "array") return v.is_array();
  if (t == "number") return v.is_number();
  // integer: JSON Schema counts 1.0 as an integer.
  return v.is_number_integer() || v.is_number_unsigned() ||
         (v.is_number_float() && std::isfinite(v.get<double>()) && std::floor(v.get<double>()) == v.get<double>());
}

// A GBNF expression; atomic ones (a rule name, a literal) may be placed in a sequence or
// under a postfix operator as they are, others become a rule first.
struct expr {
  std::string text;
  bool atomic = false;
};

class converter {
 public:
  explicit converter(const ojson& root) : root_(root) {
    for (const auto& p : primitives) taken_.insert(p.name);
  }

  std::string run() {
    reserve("root");
    refs_["#"] = "root";
    define("root", gen(root_, "root", 0).text);
    std::string out;
    for (const auto& [name, body] : rules_) out += name + " ::= " + body + "\n";
    for (const auto& p : primitives)
      if (used_.count(p.name)) out += std::string(p.name) + " ::= " + p.body + "\n";
    if (out.size() > max_grammar_bytes) refuse("the grammar for this JSON Schema would exceed 1 MiB");
    return out;
  }

 private:
  // A primitive rule, emitted (with those it uses) at the end.
  std::string use(const std::string& name) {
    if (!used_.insert(name).second) return name;
    for (const auto& p : primitives)
      if (p.name == name)
        for (const char* dep : p.uses) use(dep);
    return name;
  }

  // ---- rules ----
  std::string reserve(const std::string& hint) {
    std::string base;
    for (char c : hint.substr(0, 48)) {
      bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
      if (ok || (!base.empty() && base.back() != '-')) base += ok ? c : '-';
    }
    while (!base.empty() && base.back() == '-') base.pop_back();
    if (base.empty()) base = "p";
    std::string name = base;
    for (int i = 2; !taken_.insert(name).second; ++i) name = base + "-" + std::to_string(i);
    index_[name] = rules_.size();
    rules_.emplace_back(name, "");
    return name;
  }
  void define(const std::string& name, std::string body) {
    bytes_ += name.size() + body.size() + 6;
    if (bytes_ > max_grammar_bytes) refuse("the grammar for this JSON Schema would exceed 1 MiB");
    by_body_.emplace(body, name);
    rules_[index_.at(name)].second = std::move(body);
  }
  // A rule with this body (an existing one with the same body is shared).
  std::string add_rule(const std::string& hint, std::string body) {
    if (auto it = by_body_.find(body); it != by_body_.end()) return it->second;
    std::string name = reserve(hint);
    define(name, std::move(body));
    return name;
  }
  std::string term(const ojson& s, const std::string& name, int depth) {
    expr e = gen(s, name, depth);
    return e.atomic ? e.text : add_rule(name, std::move(e.text));
  }
  // Rule names follow the path: a property's value is named after it (without "root-").
  static std::string child(const std::string& name, const std::string& key) {
    return name == "root" ? key : name + "-" + key;
  }

  // ---- schemas ----
  expr gen(const ojson& s, const std::string& name, int depth) {
    if (depth > max_depth) refuse("JSON Schema nested deeper than " + std::to_string(max_depth) + " is not supported");
    if (s.is_boolean()) {
      if (s.get<bool>()) return {use("value"), true};
      refuse("the JSON Schema 'false' matches nothing");
    }
    if (!s.is_object()) refuse("a JSON Schema must be an object or a boolean, not " + s.dump());
    std::string combinator;
    for (const auto& [key, v] : s.items()) {
      if (annotations.count(key) || typed_keywords.count(key) || key == "type" || key == "nullable") continue;
      if (!combinators.count(key)) refuse_keyword(key);
      if (!combinator.empty() && !(combinator == "enum" && key == "const") && !(combinator == "const" && key == "enum"))
        refuse_keyword(key, "together with '" + combinator + "' is not supported");
      combinator = key;
    }
    auto nullable = s.find("nullable");
    if (nullable != s.end() && !nullable->is_boolean()) refuse_keyword("nullable", "must be a boolean");
    expr e;
    if (combinator.empty()) {
      e = gen_typed(s, name, depth);
    } else {
      // The combinator stands alone: a constraint beside it would intersect with it.
      for (const auto& [key, v] : s.items())
        if (typed_keywords.count(key) || (key == "type" && combinator != "enum" && combinator != "const"))
          refuse_keyword(key, "together with '" + combinator + "' is not supported");
      if (combinator == "enum" || combinator == "const") e = gen_enum(s);
      else if (combinator == "$ref") e = gen_ref(s, depth);
      else if (combinator == "allOf") {
        const ojson& all = s.at("allOf");
        if (!all.is_array() || all.size() != 1) refuse_keyword("allOf", "with other than one element is not supported");
        e = gen(all[0], name, depth + 1);
      } else {
        const ojson& any = s.at(combinator);
        if (!any.is_array() || any.empty()) refuse_keyword(combinator, "must be a non-empty array");
        std::vector<std::string> alts;
        for (size_t i = 0; i < any.size(); ++i)
          alts.push_back(gen(any[i], name + "-" + std::to_string(i), depth + 1).text);
        e = alternatives(alts);
      }
    }
    if (nullable != s.end() && nullable->get<bool>()) e = alternatives({e.text, use("null")});
    return e;
  }

  static expr alternatives(std::vector<std::string> alts) {
    std::vector<std::string> unique;  // the same branch twice would double the matcher's stacks
    for (auto& a : alts)
      if (std::find(unique.begin(), unique.end(), a) == unique.end()) unique.push_back(std::move(a));
    if (unique.size() == 1) return {unique[0], false};
    std::string text;
    for (const auto& a : unique) text += (text.empty() ? "" : " | ") + a;
    return {text, false};
  }

  std::vector<std::string> types_of(const ojson& s) {
    std::vector<std::string> types;
    auto t = s.find("type");
    if (t != s.end()) {
      std::vector<ojson> list = t->is_array() ? std::vector<ojson>(t->begin(), t->end()) : std::vector<ojson>{*t};
      for (const auto& v : list) {
        if (!v.is_string() || std::find(type_names.begin(), type_names.end(), v.get<std::string>()) == type_names.end())
          refuse_keyword("type", "must name JSON types, not " + v.dump());
        if (std::find(types.begin(), types.end(), v.get<std::string>()) == types.end())
          types.push_back(v.get<std::string>());
      }
      if (types.empty()) refuse_keyword("type", "must not be an empty list");
    } else {
      // No type: the types whose keywords are present (their other types are left out).
      for (const auto& [key, v] : s.items())
        if (auto k = typed_keywords.find(key); k != typed_keywords.end())
          if (std::find(types.begin(), types.end(), k->second) == types.end()) types.emplace_back(k->second);
    }
    // number includes integer
    if (std::find(types.begin(), types.end(), "number") != types.end()) std::erase(types, std::string("integer"));
    return types;
  }

  expr gen_typed(const ojson& s, const std::string& name, int depth) {
    std::vector<std::string> types = types_of(s);
    if (types.empty()) return {use("value"), true};
    std::vector<std::string> alts;
    for (const auto& t : types) {
      std::string part = types.size() == 1 ? name : name + "-" + t;
      expr e = t == "null"      ? expr{use("null"), true}
               : t == "boolean" ? expr{use("boolean"), true}
               : t == "string"  ? gen_string(s)
               : t == "array"   ? gen_array(s, part, depth)
               : t == "object"  ? gen_object(s, part, depth)
                                : gen_number(s, t == "integer");
      if (types.size() == 1) return e;
      alts.push_back(e.text);
    }
    return alternatives(alts);
  }

  expr gen_enum(const ojson& s) {
    std::vector<ojson> values;
    if (auto c = s.find("const"); c != s.end()) values.push_back(*c);
    if (auto e = s.find("enum"); e != s.end()) {
      if (!e->is_array()) refuse_keyword("enum", "must be an array");
      if (values.empty()) values.assign(e->begin(), e->end());
      else if (std::find(e->begin(), e->end(), values[0]) == e->end()) values.clear();
    }
    std::vector<std::string> types;
    if (s.contains("type")) types = types_of(s);
    std::vector<std::string> alts;
    for (const auto& v : values) {
      bool typed = types.empty();
      for (const auto& t : types) typed = typed || has_type(v, t);
      if (typed) alts.push_back(literal(v.dump()));
    }
    if (alts.empty()) refuse_keyword(s.contains("enum") ? "enum" : "const", "allows no value of the schema's type");
    expr e = alternatives(alts);
    e.atomic = alts.size() == 1;
    return e;
  }

  expr gen_ref(const ojson& s, int depth) {
    const ojson& r = s.at("$ref");
    if (!r.is_string()) refuse_keyword("$ref", "must be a string");
    const std::string ref = r.get<std::string>();
    if (auto it = refs_.find(ref); it != refs_.end()) return {it->second, true};
    if (ref.empty() || ref[0] != '#')
      refuse_keyword("$ref", "to '" + ref + "' is not supported (only local references such as \"#/$defs/NAME\")");
    const ojson* target = nullptr;
    try {
      ojson::json_pointer ptr(ref.substr(1));
      if (root_.contains(ptr)) target = &root_.at(ptr);
    } catch (const nlohmann::json::exception&) {}
    if (!target) refuse_keyword("$ref", "to '" + ref + "' does not resolve in this schema");
    // One rule per target, named before its body is made, so a recursive reference finds it.
    std::string hint = ref.substr(ref.find_last_of('/') + 1);
    for (auto [from, to] : {std::pair{"~1", "/"}, std::pair{"~0", "~"}})
      for (size_t at; (at = hint.find(from)) != std::string::npos;) hint.replace(at, 2, to);
    std::string name = reserve(hint);
    refs_[ref] = name;
    define(name, gen(*target, name, depth + 1).text);
    return {name, true};
  }

  expr gen_string(const ojson& s) {
    if (auto f = s.find("format"); f != s.end()) {
      if (!f->is_string() || !formats.count(f->get<std::string>()))
        refuse_keyword("format", "value " + f->dump() + " is not supported (only date, time, date-time, uuid, ipv4)");
      for (const char* k : {"minLength", "maxLength"})
        if (s.contains(k)) refuse_keyword(k, "together with 'format' is not supported");
      return {quote + " " + use(f->get<std::string>()) + " " + quote, false};
    }
    int64_t lo = count(s, "minLength", 0, max_length), hi = count(s, "maxLength", unbounded, max_length);
    if (hi != unbounded && hi < lo) refuse_keyword("maxLength", "below minLength allows no string");
    if (lo == 0 && hi == unbounded) return {use("string"), true};
    if (hi == 0) return {literal("\"\""), true};
    return {quote + " " + use("char") + repeat(lo, hi) + " " + quote, false};
  }

  expr gen_number(const ojson& s, bool integer) {
    for (const char* k : {"maximum", "exclusiveMaximum", "multipleOf"})
      if (s.contains(k)) refuse_keyword(k);
    // Lower bounds that a sign or a first digit can say: >= 0 (no minus), > 0 for integers.
    bool non_negative = false, positive = false;
    if (auto m = s.find("minimum"); m != s.end()) {
      if (m->is_number() && m->get<double>() == 0) non_negative = true;
      else if (m->is_number() && m->get<double>() == 1 && integer) positive = true;
      else refuse_keyword("minimum", "is supported only as 0 (or 1 for integers)");
    }
    if (auto m = s.find("exclusiveMinimum"); m != s.end()) {
      if (m->is_number() && m->get<double>() == 0 && integer) positive = true;
      else refuse_keyword("exclusiveMinimum", "is supported only as 0 for integers");
    }
    if (!non_negative && !positive) return {use(integer ? "integer" : "number"), true};
    std::string digits = positive ? R"([1-9] [0-9]{0,15})" : R"(( "0" | [1-9] [0-9]{0,15} ))";
    if (integer) return {digits, !positive};  // the group is atomic, the sequence not
    return {digits + R"( ( "." [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,2} )?)", false};
  }

  // open, then first (rest separated by ","){lo..hi} elements in all, then close; lo, hi > 0
  // count elements, hi may be unbounded.
  std::string list(const std::string& open, const std::string& first, const std::string& rest, int64_t lo, int64_t hi,
                   const std::string& close) {
    if (hi == 0) return open + " ws " + close;
    std::string more = "( ws \",\" ws " + rest + " )" + repeat(lo > 0 ? lo - 1 : 0, hi == unbounded ? hi : hi - 1);
    if (hi == 1) more.clear();
    std::string inner = first + (more.empty() ? "" : " " + more);
    return lo > 0 ? open + " ws " + inner + " ws " + close : open + " ws ( " + inner + " ws )? " + close;
  }

  expr gen_array(const ojson& s, const std::string& name, int depth) {
    use("ws");
    int64_t lo = count(s, "minItems", 0, max_items), hi = count(s, "maxItems", unbounded, max_items);
    const ojson any = true;
    const ojson* items = &any;
    if (auto it = s.find("items"); it != s.end()) {
      if (it->is_array()) refuse_keyword("items", "as an array (draft-04 tuples) is not supported: use prefixItems");
      items = &*it;
    }
    std::vector<const ojson*> prefix;
    if (auto p = s.find("prefixItems"); p != s.end()) {
      if (!p->is_array()) refuse_keyword("prefixItems", "must be an array");
      for (const auto& v : *p) prefix.push_back(&v);
    }
    const int64_t k = int64_t(prefix.size());
    if (*items == false && (hi == unbounded || hi > k)) hi = k;
    if (hi != unbounded && lo > hi) refuse_keyword("minItems", "above the most items allowed allows no array");
    if (auto u = s.find("uniqueItems"); u != s.end() && *u != false && (hi == unbounded || hi > 1))
      refuse_keyword("uniqueItems");
    std::string item;  // the rule of the elements after the prefix
    if (hi == unbounded || hi > k) item = term(*items, name + "-item", depth + 1);
    if (k == 0) return {list("\"[\"", item, item, lo, hi, "\"]\""), false};
    // A tuple: element i (when present) matches prefixItems[i]; the first lo are required, an
    // optional one may be followed by more only if it is present (nested groups).
    std::vector<std::string> terms;
    for (int64_t i = 0; i < k && (hi == unbounded || i < hi); ++i)
      terms.push_back(term(*prefix[i], name + "-" + std::to_string(i), depth + 1));
    std::string tail;  // what may follow element n-1 of the tuple, built from the end
    int64_t n = int64_t(terms.size());
    if (hi == unbounded || hi > n)
      tail = "( ws \",\" ws " + item + " )" + repeat(std::max<int64_t>(lo - n, 0), hi == unbounded ? hi : hi - n);
    for (int64_t i = n - 1; i >= 1; --i) {
      std::string seq = "ws \",\" ws " + terms[i] + (tail.empty() ? "" : " " + tail);
      tail = i < lo ? seq : "( " + seq + " )?";
    }
    std::string inner = terms[0] + (tail.empty() ? "" : " " + tail);
    return {lo > 0 ? "\"[\" ws " + inner + " ws \"]\"" : "\"[\" ws ( " + inner + " ws )? \"]\"", false};
  }

  expr gen_object(const ojson& s, const std::string& name, int depth) {
    use("ws");
    auto props = s.find("properties");
    auto extra = s.find("additionalProperties");
    std::set<std::string> required;
    if (auto r = s.find("required"); r != s.end()) {
      if (!r->is_array()) refuse_keyword("required", "must be an array");
      for (const auto& v : *r) {
        if (!v.is_string()) refuse_keyword("required", "must list property names");
        required.insert(v.get<std::string>());
      }
    }
    int64_t min_props = count(s, "minProperties", 0, max_items),
            max_props = count(s, "maxProperties", unbounded, max_items);
    if (props == s.end()) {
      // A map: any keys, each value under additionalProperties. Duplicate keys collapse when
      // parsed, so only minProperties <= 1 is exact.
      if (!required.empty()) refuse_keyword("required", "without 'properties' is not supported");
      if (min_props > 1) refuse_keyword("minProperties", "above 1 is not supported without 'properties'");
      if (extra != s.end() && *extra == false) {
        if (min_props > 0) refuse_keyword("minProperties", "with additionalProperties false allows no object");
        return {"\"{\" ws \"}\"", false};
      }
      std::string value = extra == s.end() ? use("value") : term(*extra, name + "-value", depth + 1);
      if (min_props == 0 && max_props == unbounded && value == "value") return {use("object"), true};
      std::string entry = use("string") + " ws \":\" ws " + value;
      return {list("\"{\"", entry, entry, min_props, max_props, "\"}\""), false};
    }
    if (!props->is_object()) refuse_keyword("properties", "must be an object");
    if (extra != s.end() && *extra != false)
      refuse_keyword("additionalProperties", "other than false together with 'properties' is not supported");
    for (const auto& r : required)
      if (!props->contains(r)) refuse_keyword("required", "names '" + r + "', which is not in 'properties'");
    if (min_props > int64_t(required.size())) refuse_keyword("minProperties");
    if (max_props != unbounded && max_props < int64_t(props->size())) refuse_keyword("maxProperties");

    // Properties in order, optional ones may be left out. The first property written has no
    // comma before it; it is one of the alternatives "property k, then the rest after k" for
    // k up to the first required one. After that every property is ", key: value", optional
    // ones as a chain of rules ( item )? rest, so each valid combination parses one way.
    std::vector<std::string> kv, item;
    std::vector<bool> req;
    for (const auto& [key, v] : props->items()) {
      kv.push_back(literal(ojson(key).dump()) + " ws \":\" ws " + term(v, child(name, key), depth + 1));
      item.push_back("ws \",\" ws " + kv.back());
      req.push_back(required.count(key) > 0);
    }
    const size_t n = kv.size();
    if (n == 0) return {"\"{\" ws \"}\"", false};
    std::map<size_t, std::string> rest;  // rule for "the properties from i on", i optional
    std::function<std::string(size_t)> tail = [&](size_t i) {
      std::string out;
      for (; i < n && req[i]; ++i) out += " " + item[i];
      if (i == n) return out;
      if (!rest.count(i)) rest[i] = add_rule(name + "-rest" + std::to_string(i), "( " + item[i] + " )?" + tail(i + 1));
      return out + " " + rest[i];
    };
    std::vector<std::string> alts;
    for (size_t k = 0; k < n; ++k) {
      alts.push_back(kv[k] + tail(k + 1));
      if (req[k]) break;
    }
    std::string content = alts.size() == 1 ? alts[0] : "( " + alternatives(alts).text + " )";
    if (required.empty()) return {"\"{\" ws ( " + content + " ws )? \"}\"", false};
    return {"\"{\" ws " + content + " ws \"}\"", false};
  }

  const ojson& root_;
  std::vector<std::pair<std::string, std::string>> rules_;  // in the order made; root first
  std::map<std::string, size_t> index_;  // rule name -> position in rules_
  std::set<std::string> taken_;  // rule names, primitives' included
  std::map<std::string, std::string> by_body_;  // body -> rule name, to share rules
  std::map<std::string, std::string> refs_;  // $ref -> rule name
  std::set<std::string> used_;  // primitives used
  size_t bytes_ = 0;
};

}  // namespace

std::string json_schema_to_gbnf(const nlohmann::ordered_json& schema) {
  try {
    return converter(schema).run();
  } catch (const nlohmann::json::exception& e) {
    // A value of the wrong type somewhere (get<> on a string...) or invalid UTF-8 in a name.
    refuse(std::string("JSON Schema not supported: ") + e.what());
  }
}

std::string json_schema_to_gbnf(const nlohmann::json& schema) {
  // Keys are already sorted in a json; the ordered form keeps that order.
  return json_schema_to_gbnf(nlohmann::ordered_json::parse(schema.dump()));
}

std::string json_object_gbnf() { return json_schema_to_gbnf(nlohmann::ordered_json{{"type", "object"}}); }

}  // namespace tandem
