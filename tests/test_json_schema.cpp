// Tests of the JSON Schema -> GBNF converter (runtime/structured/json_schema.h), through the grammar
// engine (runtime/structured/grammar.h): for each schema, texts the grammar must accept and texts it must
// reject; every accepted text must also parse as JSON (the grammar never over-accepts JSON).
// Then the keywords that are refused (the message names them), the limits, and the rule names.
#include <gtest/gtest.h>

#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/errors.h"
#include "runtime/structured/grammar.h"
#include "runtime/structured/json_schema.h"

namespace {

using tandem::errc;
using tandem::failure;
using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

bool matches(const std::shared_ptr<const tandem::grammar>& g, const std::string& text) {
  tandem::grammar_matcher m(g, nullptr);
  return m.accept_bytes(text) && m.complete();
}

struct table_case {
  std::string name;
  std::string schema;  // JSON text, parsed into an ordered_json (properties keep their order)
  std::vector<std::string> accept, reject;
};

void check(const std::string& name, const std::string& gbnf, const table_case& c) {
  SCOPED_TRACE(name);
  std::shared_ptr<const tandem::grammar> g;
  try {
    g = tandem::grammar::compile(gbnf);
  } catch (const failure& e) {
    FAIL() << "does not compile: " << e.what() << "\n" << gbnf;
  }
  for (const auto& t : c.accept) {
    EXPECT_TRUE(matches(g, t)) << "should accept: " << t << "\n" << gbnf;
    json parsed;
    EXPECT_NO_THROW(parsed = json::parse(t)) << "accepted but not JSON: " << t;
  }
  for (const auto& t : c.reject) EXPECT_FALSE(matches(g, t)) << "should reject: " << t << "\n" << gbnf;
}

void run(const std::vector<table_case>& cases) {
  for (const auto& c : cases) {
    std::string gbnf;
    try {
      gbnf = tandem::json_schema_to_gbnf(ojson::parse(c.schema));
    } catch (const failure& e) {
      ADD_FAILURE() << c.name << ": refused: " << e.what();
      continue;
    }
    check(c.name, gbnf, c);
  }
}

TEST(JsonSchema, Objects) {
  run({
      {"required and optional",
       R"({"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},
           "email":{"type":"string"},"admin":{"type":"boolean"}},"required":["name","age"],)"
       R"("additionalProperties":false})",
       {R"({"name":"Ann","age":30})", R"({"name":"Ann","age":30,"email":"a@b"})",
        R"({"name":"Ann","age":30,"admin":true})", R"({"name":"Ann","age":30,"email":"a@b","admin":false})",
        R"({ "name" : "Ann" , "age" : -3 })", "{\n  \"name\": \"A\",\n  \"age\": 0\n}",
        "{\n\t\"name\":\"A\",\n\t\"age\":0}"},
       {R"({"name":"Ann"})", R"({"age":30})", R"({"name":"Ann","age":30,"x":1})", R"({"name":"Ann","age":"30"})",
        R"({"name":"Ann","age":30,})", R"({"name":"Ann","age":030})", R"({"name":"Ann","age":30.5})",
        "{\"name\":\"A\nB\",\"age\":1}", R"({,"name":"Ann","age":30})",
        R"({"name":"Ann","age":30,"email":"a","email":"b"})", R"({"name":"Ann","age":30,,"admin":true})",
        R"({"age":30,"name":"Ann"})", R"({"name":"Ann","age":30} )", R"( {"name":"Ann","age":30})",
        R"({"name":"Ann" "age":30})", R"({"name":"Ann","age":30)", R"({})"}},
      {"all optional",
       R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"},"c":{"type":"integer"}}})",
       {"{}", "{ }", R"({"a":1})", R"({"b":2})", R"({"c":3})", R"({"a":1,"c":3})", R"({"b":2,"c":3})",
        R"({"a":1,"b":2})", R"({"a":1,"b":2,"c":3})", R"({ "a":1 , "c":3 })"},
       {R"({,"b":2})", R"({"a":1,})", R"({"b":1,"a":2})", R"({"a":1 "b":2})", R"({"d":1})", "{  }",
        R"({"a":1,"a":1})"}},
      {"required in the middle",
       R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"},"c":{"type":"integer"}},)"
       R"("required":["b"]})",
       {R"({"b":1})", R"({"a":1,"b":2})", R"({"b":1,"c":2})", R"({"a":1,"b":2,"c":3})"},
       {"{}", R"({"a":1})", R"({"a":1,"c":3})", R"({"c":3})"}},
      {"nested",
       R"({"type":"object","properties":{"user":{"type":"object","properties":{"id":{"type":"integer"},
           "address":{"type":"object","properties":{"city":{"type":"string"},"zip":{"type":"string"}},)"
       R"("required":["city"]}},
           "required":["id","address"]}},"required":["user"]})",
       {R"({"user":{"id":1,"address":{"city":"Oslo"}}})", R"({"user":{"id":1,"address":{"city":"Oslo","zip":"0150"}}})",
        "{\n  \"user\": {\n    \"id\": 1,\n    \"address\": {\n      \"city\": \"Oslo\"\n    }\n  }\n}"},
       {R"({"user":{"id":1}})", R"({"user":{"id":1,"address":{}}})",
        R"({"user":{"id":1,"address":{"city":"Oslo","x":1}}})", R"({"user":{"address":{"city":"Oslo"},"id":1}})",
        R"({"user":null})"}},
      {"empty properties: only {}", R"({"type":"object","properties":{}})", {"{}", "{ }"}, {R"({"a":1})"}},
      {"map of integers",
       R"({"type":"object","additionalProperties":{"type":"integer"}})",
       {"{}", R"({"x":1})", R"({"x":1, "y":-2,"":3})", R"({"x":1,"x":2})"},
       {R"({"x":"1"})", R"({"x":1,})", R"({x:1})"}},
      {"map with bounds",
       R"({"type":"object","additionalProperties":true,"minProperties":1,"maxProperties":2})",
       {R"({"a":null})", R"({"a":[1],"b":{"c":"d"}})"},
       {"{}", R"({"a":1,"b":2,"c":3})"}},
      {"no other properties", R"({"type":"object","additionalProperties":false})", {"{}"}, {R"({"a":1})"}},
      {"property names that need escaping",
       R"({"type":"object","properties":{"a b":{"type":"object","properties":{"x":{"type":"integer"}},"required":["x"]},
           "a-b":{"type":"object","properties":{"y":{"type":"integer"}},"required":["y"]},"":{"type":"array",)"
       R"("items":{"type":"string"}},
           "quote\"d":{"type":"integer"},"é":{"type":"null"}},"required":["a b","a-b","","quote\"d","é"]})",
       {R"({"a b":{"x":1},"a-b":{"y":2},"":["s"],"quote\"d":3,"é":null})"},
       {R"({"a b":{"x":1},"a-b":{"y":2},"":["s"],"quote"d":3,"é":null})"}},
  });
}

TEST(JsonSchema, Arrays) {
  run({
      {"1..3 integers",
       R"({"type":"array","items":{"type":"integer"},"minItems":1,"maxItems":3})",
       {"[1]", "[1,2,3]", "[ 1 , 2 ]", "[\n  1,\n  2\n]"},
       {"[]", "[1,2,3,4]", "[1,]", "[,1]", "[1 2]", "[\"1\"]", "[1"}},
      {"any number of strings",
       R"({"type":"array","items":{"type":"string"}})",
       {"[]", "[ ]", R"(["a"])", R"(["a","b","c","d","e","f"])"},
       {"[1]", R"(["a",])", "[[]]"}},
      {"at least two",
       R"({"type":"array","items":{"type":"boolean"},"minItems":2})",
       {"[true,false]", "[true,false,true,true]"},
       {"[]", "[true]"}},
      {"no items", R"({"type":"array","maxItems":0})", {"[]", "[ ]"}, {"[1]"}},
      {"items of any type", R"({"type":"array"})", {"[]", R"([1,"a",null,{"b":[true]}])"}, {"[1,]"}},
      {"tuple, closed",
       R"({"type":"array","prefixItems":[{"type":"string"},{"type":"integer"}],"items":false})",
       {"[]", R"(["a"])", R"(["a",1])", R"([ "a" , 1 ])"},
       {"[1]", R"(["a",1,2])", R"(["a","b"])", R"(["a",])"}},
      {"tuple, then booleans, at least 2",
       R"({"type":"array","prefixItems":[{"type":"string"}],"items":{"type":"boolean"},"minItems":2,"maxItems":3})",
       {R"(["a",true])", R"(["a",true,false])"},
       {R"(["a"])", R"(["a",1])", "[true,true]", R"(["a",true,true,true])"}},
      {"uniqueItems false is fine",
       R"({"type":"array","items":{"type":"null"},"uniqueItems":false})",
       {"[null,null]"},
       {}},
      {"nested arrays",
       R"({"type":"array","items":{"type":"array","items":{"type":"integer"},"maxItems":2},"maxItems":2})",
       {"[[],[1,2]]", "[[1]]"},
       {"[[1,2,3]]", "[[],[],[]]"}},
  });
}

TEST(JsonSchema, EnumsAndConst) {
  run({
      {"mixed enum",
       R"({"enum":["red","green",1,2.5,null,true,{"k":[1,"x"]}]})",
       {R"("red")", R"("green")", "1", "2.5", "null", "true", R"({"k":[1,"x"]})"},
       {R"("blue")", R"("Red")", "2.50", R"({"k": [1, "x"]})", R"("red"x)", "false", "red"}},
      {"enum filtered by type", R"({"type":"string","enum":["a",1]})", {R"("a")"}, {"1"}},
      {"const", R"({"const":"fixed"})", {R"("fixed")"}, {R"("fixe")", R"("fixed" )"}},
      {"escapes as dump writes them",
       R"({"enum":["é","a\"b","tab\t","\u0001"]})",
       {R"("é")", R"("a\"b")", R"("tab\t")", R"("\u0001")"},
       {"\"tab\t\"", R"("\u00e9")"}},
      {"enum of integers", R"({"type":"integer","enum":[1,2,30]})", {"1", "30"}, {"3", "1.0"}},
  });
}

TEST(JsonSchema, Composition) {
  run({
      {"anyOf",
       R"({"anyOf":[{"type":"string","maxLength":3},{"type":"integer"},
           {"type":"object","properties":{"k":{"const":1}},"required":["k"]}]})",
       {R"("abc")", R"("")", "12", R"({"k":1})"},
       {R"("abcd")", "1.5", R"({"k":2})", "null"}},
      {"oneOf", R"({"oneOf":[{"type":"boolean"},{"type":"null"}]})", {"true", "null"}, {"0"}},
      {"allOf with one element", R"({"allOf":[{"type":"integer"}],"description":"x"})", {"7"}, {"\"7\""}},
      {"recursive tree",
       R"({"$defs":{"node":{"type":"object","properties":{"value":{"type":"integer"},
           "children":{"type":"array","items":{"$ref":"#/$defs/node"}}},"required":["value"]}},"$ref":"#/$defs/node"})",
       {R"({"value":1})", R"({"value":1,"children":[]})",
        R"({"value":1,"children":[{"value":2,"children":[{"value":3}]}]})"},
       {R"({"value":1,"children":[{}]})", R"({"children":[]})", R"({"value":1,"children":[{"value":"2"}]})"}},
      {"linked list through #",
       R"({"type":"object","properties":{"v":{"type":"integer"},"next":{"$ref":"#"}},"required":["v"]})",
       {R"({"v":1})", R"({"v":1,"next":{"v":2,"next":{"v":3}}})"},
       {R"({"v":1,"next":{}})"}},
      {"definitions and a shared ref",
       R"({"definitions":{"pt":{"type":"array","prefixItems":[{"type":"number"},{"type":"number"}],"minItems":2,)"
       R"("items":false}},
           "type":"object","properties":{"from":{"$ref":"#/definitions/pt"},"to":{"$ref":"#/definitions/pt"}},
           "required":["from","to"]})",
       {R"({"from":[0,0],"to":[1.5,-2e3]})"},
       {R"({"from":[0],"to":[1,2]})"}},
  });
}

TEST(JsonSchema, Strings) {
  run({
      {"escapes and unicode",
       R"({"type":"string"})",
       {R"("")", R"("a\"b")", R"("\\")", R"("\/")", R"("\b\f\n\r\t")", R"("\u00e9")", R"("\uD83D\uDE00")", "\"é日本😀\"",
        "\"\x7f\"", R"("\u007F")"},
       {R"("\x")", R"("\u12")", R"("\uD800")", R"("\uDC00")", R"("\uD800\u0041")", "\"a\tb\"", std::string("\"\0\"", 3),
        R"("abc)", "\"\xed\xa0\x80\"", "\"\xff\"", "\"\x80\"", R"('a')", "abc"}},
      {"length in characters",
       R"({"type":"string","minLength":2,"maxLength":3})",
       {R"("ab")", R"("abc")", "\"é😀\"", R"("\n\t")", R"("\uD83D\uDE00x")"},
       {R"("a")", R"("abcd")", R"("")", R"("\uD83D\uDE00")"}},
      {"empty only", R"({"type":"string","maxLength":0})", {R"("")"}, {R"("a")"}},
      {"date",
       R"({"type":"string","format":"date"})",
       {R"("2024-02-29")", R"("1999-12-31")", R"("0001-01-01")"},
       {R"("2024-13-01")", R"("2024-00-10")", R"("2024-01-32")", R"("2024-01-00")", R"("24-01-01")", R"("2024-1-01")",
        "2024-01-01"}},
      {"time",
       R"({"type":"string","format":"time"})",
       {R"("12:34:56Z")", R"("23:59:60.123+05:30")", R"("00:00:00-00:00")"},
       {R"("24:00:00Z")", R"("12:34:56")", R"("12:60:00Z")", R"("1:02:03Z")", R"("12:34:56+5:30")"}},
      {"date-time",
       R"({"type":"string","format":"date-time"})",
       {R"("2024-01-02T03:04:05.678Z")", R"("2024-01-02t03:04:05+01:00")"},
       {R"("2024-01-02 03:04:05Z")", R"("2024-01-02")", R"("2024-01-02T03:04Z")"}},
      {"uuid",
       R"({"type":"string","format":"uuid"})",
       {R"("123e4567-e89b-12d3-a456-426614174000")", R"("ABCDEF01-2345-6789-abcd-ef0123456789")"},
       {R"("123e4567-e89b-12d3-a456-42661417400")", R"("123e4567e89b12d3a456426614174000")",
        R"("g23e4567-e89b-12d3-a456-426614174000")"}},
      {"ipv4",
       R"({"type":"string","format":"ipv4"})",
       {R"("192.168.0.1")", R"("255.255.255.255")", R"("0.0.0.0")"},
       {R"("256.1.1.1")", R"("01.2.3.4")", R"("1.2.3")", R"("1.2.3.4.5")"}},
  });
}

// Bytes that are not UTF-8 never match, though they decode to a code point the grammar allows:
// overlong forms (C0 AF is '/', C0 A2 is '"'), code points past U+10FFFF, raw surrogates.
TEST(JsonSchema, InvalidUtf8IsRejected) {
  run({{"string",
        R"({"type":"string"})",
        {},
        {"\"\xc0\xaf\"", "\"\xe0\x80\xaf\"", "\"\xf0\x80\x80\xaf\"", "\"\xf4\x90\x80\x80\"", "\"\xf7\xbf\xbf\xbf\"",
         "\"\xed\xa0\x80\""}},
       {"an overlong quote",
        R"({"const":"a"})",
        {},
        {"\xc0\xa2"
         "a\""}}});
}

TEST(JsonSchema, NumbersAndLiterals) {
  run({
      {"integer",
       R"({"type":"integer"})",
       {"0", "-0", "42", "-17", "1234567890123456"},
       {"01", "1.0", "1e3", "+1", "-", "12345678901234567", "--1", " 1", "", "1 "}},
      {"number",
       R"({"type":"number"})",
       {"0", "-0.5", "3.14", "1e10", "1E-5", "2.5e+3", "0.0", "-0e0"},
       {".5", "5.", "01.5", "1e", "1e+", "1e100", "NaN", "Infinity", "0x10", "1.2.3"}},
      {"non-negative integer", R"({"type":"integer","minimum":0})", {"0", "5", "10"}, {"-1", "-0", "05"}},
      {"positive integer", R"({"type":"integer","exclusiveMinimum":0})", {"1", "99"}, {"0", "-1"}},
      {"non-negative number", R"({"type":"number","minimum":0})", {"0", "0.5", "3e-2"}, {"-0.5", "-1"}},
      {"number covers integer", R"({"type":["integer","number"]})", {"1", "1.5"}, {"\"1\""}},
      {"boolean", R"({"type":"boolean"})", {"true", "false"}, {"True", "1", "\"true\""}},
      {"null", R"({"type":"null"})", {"null"}, {"nil", "\"null\""}},
  });
}

TEST(JsonSchema, TypeListsAndAny) {
  run({
      {"string or null",
       R"({"type":["string","null"],"maxLength":2})",
       {R"("ab")", "null"},
       {R"("abc")", "1", R"("null")"}},
      {"nullable", R"({"type":"integer","nullable":true})", {"1", "null"}, {"\"1\"", "nul"}},
      {"nullable object",
       R"({"type":"object","properties":{"a":{"type":"integer"}},"required":["a"],"nullable":true})",
       {R"({"a":1})", "null"},
       {"{}"}},
      {"no type: anything",
       "{}",
       {"1", R"("s")", "null", R"({"a":[1,{"b":false}]})", "[]", "-2.5e-3"},
       {"", "nul", "[1,]", "{\"a\"}"}},
      {"true: anything", "true", {"1", "[[]]"}, {"x"}},
      {"type inferred from keywords",
       R"({"properties":{"a":{"type":"integer"}},"required":["a"]})",
       {R"({"a":1})"},
       {"1"}},
      {"annotations ignored",
       R"({"title":"t","description":"d","default":1,"examples":[1],)"
       R"("$schema":"https://json-schema.org/draft/2020-12/schema",
           "$id":"x","$comment":"c","deprecated":false,"readOnly":true,"writeOnly":false,"type":"integer"})",
       {"1"},
       {"\"1\""}},
      {"keywords of another type are ignored",
       R"({"type":"string","minimum":3,"items":{"type":"integer"}})",
       {R"("x")"},
       {"5"}},
  });
}

TEST(JsonSchema, JsonObject) {
  const table_case c{
      "json_object",
      "",
      {"{}", R"({"a":[1,{"b":null}],"c":"d"})", "{\n  \"a\": 1,\n  \"b\": [\n    true\n  ]\n}", R"({"a":1,"a":2})"},
      {"[]", R"("x")", R"({"a":})", R"({"a":1,})", "{a:1}", R"({"a":1}{)", "1", "null", R"({"a":01})"}};
  check(c.name, tandem::json_object_gbnf(), c);
}

// Properties come in the schema's order when it is an ordered_json, alphabetically from a json.
TEST(JsonSchema, PropertyOrder) {
  const std::string schema =
      R"({"type":"object","properties":{"z":{"type":"integer"},"a":{"type":"integer"}},"required":["z","a"]})";
  check("ordered", tandem::json_schema_to_gbnf(ojson::parse(schema)),
        {"", "", {R"({"z":1,"a":2})"}, {R"({"a":2,"z":1})"}});
  check("sorted", tandem::json_schema_to_gbnf(json::parse(schema)),
        {"", "", {R"({"a":2,"z":1})"}, {R"({"z":1,"a":2})"}});
}

std::string refusal(const std::string& schema) {
  try {
    tandem::json_schema_to_gbnf(ojson::parse(schema));
  } catch (const failure& e) {
    EXPECT_EQ(e.code(), errc::invalid_argument);
    return e.what();
  }
  return "(accepted)";
}

TEST(JsonSchema, RefusesWhatItCannotHonourNamingTheKeyword) {
  const std::pair<const char*, const char*> rows[] = {
      {R"({"type":"string","pattern":"^a"})", "pattern"},
      {R"({"not":{"type":"string"}})", "not"},
      {R"({"if":{"type":"string"},"then":{"maxLength":1}})", "if"},
      {R"({"type":"object","patternProperties":{"^a":{}}})", "patternProperties"},
      {R"({"type":"object","properties":{"a":{}},"dependentRequired":{"a":["b"]}})", "dependentRequired"},
      {R"({"type":"array","uniqueItems":true})", "uniqueItems"},
      {R"({"type":"array","contains":{"type":"integer"}})", "contains"},
      {R"({"propertyNames":{"maxLength":3}})", "propertyNames"},
      {R"({"type":"object","unevaluatedProperties":false})", "unevaluatedProperties"},
      {R"({"$anchor":"x"})", "$anchor"},
      {R"({"type":"integer","minimum":5})", "minimum"},
      {R"({"type":"number","maximum":5})", "maximum"},
      {R"({"type":"number","exclusiveMaximum":5})", "exclusiveMaximum"},
      {R"({"type":"number","exclusiveMinimum":0})", "exclusiveMinimum"},
      {R"({"type":"integer","multipleOf":2})", "multipleOf"},
      {R"({"type":"string","format":"email"})", "format"},
      {R"({"type":"string","format":"date","maxLength":10})", "maxLength"},
      {R"({"type":"object","properties":{"a":{}},"additionalProperties":{"type":"string"}})", "additionalProperties"},
      {R"({"type":"object","properties":{"a":{}},"additionalProperties":true})", "additionalProperties"},
      {R"({"type":"object","properties":{"a":{}},"minProperties":1})", "minProperties"},
      {R"({"type":"object","properties":{"a":{},"b":{}},"maxProperties":1})", "maxProperties"},
      {R"({"type":"object","minProperties":2})", "minProperties"},
      {R"({"type":"object","properties":{"a":{}},"required":["b"]})", "required"},
      {R"({"allOf":[{"type":"string"},{"maxLength":3}]})", "allOf"},
      {R"({"anyOf":[{"type":"string"}],"type":"string"})", "anyOf"},
      {R"({"anyOf":[]})", "anyOf"},
      {R"({"$ref":"https://example.com/s.json"})", "$ref"},
      {R"({"$ref":"#/$defs/missing"})", "$ref"},
      {R"({"type":"array","maxItems":100000})", "maxItems"},
      {R"({"type":"array","minItems":3,"maxItems":2})", "minItems"},
      {R"({"type":"array","items":[{"type":"string"}]})", "items"},
      {R"({"type":"string","maxLength":100000})", "maxLength"},
      {R"({"type":"string","minLength":-1})", "minLength"},
      {R"({"type":"string","enum":[1,2]})", "enum"},
      {R"({"enum":"a"})", "enum"},
      {R"({"type":"strin"})", "type"},
      {R"({"type":[]})", "type"},
      {R"({"type":"integer","nullable":"yes"})", "nullable"},
      {R"({"type":"object","properties":{"a":false},"required":["a"]})", "false"},
  };
  for (const auto& [schema, keyword] : rows) {
    const std::string msg = refusal(schema);
    EXPECT_NE(msg.find(std::string("'") + keyword + "'"), std::string::npos) << schema << " -> " << msg;
  }
  EXPECT_EQ(refusal(R"({"type":"string","pattern":"^a"})"), "JSON Schema keyword 'pattern' is not supported");
}

TEST(JsonSchema, Limits) {
  auto nested = [](int depth) {
    std::string s = R"({"type":"integer"})";
    for (int i = 0; i < depth; ++i) s = R"({"type":"array","items":)" + s + "}";
    return s;
  };
  EXPECT_NO_THROW(tandem::json_schema_to_gbnf(ojson::parse(nested(60))));
  EXPECT_NE(refusal(nested(70)).find("deeper than 64"), std::string::npos) << refusal(nested(70));
  ojson big = {{"enum", ojson::array()}};
  for (int i = 0; i < 20000; ++i) big["enum"].push_back(std::string(60, 'a') + std::to_string(i));
  EXPECT_NE(refusal(big.dump()).find("1 MiB"), std::string::npos) << refusal(big.dump()).substr(0, 200);
  // The largest bounds allowed still compile, quickly.
  for (const char* s : {R"({"type":"array","items":{"type":"integer"},"maxItems":1000})",
                        R"({"type":"string","minLength":10000,"maxLength":10000})"})
    EXPECT_NO_THROW(tandem::grammar::compile(tandem::json_schema_to_gbnf(ojson::parse(s)))) << s;
}

// Rule names are [a-zA-Z0-9-]+, unique, and identical bodies are one rule.
TEST(JsonSchema, RuleNames) {
  const std::string gbnf = tandem::json_schema_to_gbnf(ojson::parse(
      R"({"type":"object","properties":{"a b/c":{"type":"array","items":{"type":"integer"}},
          "p":{"type":"array","items":{"type":"integer"}},"value":{"type":"array","items":{"type":"string"}},"any":{},
          "x":{"type":"object","properties":{"y":{"type":"array","items":{"type":"boolean"}}}}}})"));
  std::istringstream in(gbnf);
  std::set<std::string> names;
  for (std::string line; std::getline(in, line);) {
    const auto at = line.find(" ::= ");
    ASSERT_NE(at, std::string::npos) << line;
    const std::string name = line.substr(0, at);
    EXPECT_EQ(name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-"),
              std::string::npos)
        << name;
    EXPECT_TRUE(names.insert(name).second) << "twice: " << name;
  }
  EXPECT_TRUE(names.count("a-b-c")) << gbnf;
  EXPECT_FALSE(names.count("p")) << "same body as a-b-c:\n" << gbnf;
  EXPECT_TRUE(names.count("value") && names.count("value-2")) << gbnf;  // the primitive keeps its name
  EXPECT_TRUE(names.count("x-y")) << gbnf;
}

}  // namespace
