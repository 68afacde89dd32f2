// Tests of the Jinja interpreter (runtime/text/jinja.h).
//
// 1. Fixtures: real chat templates (tests/data/templates/*.jinja) rendered for many conversations
//    must be byte-identical to llama.cpp's renderings in reference.json (made by
//    tools/scripts/make_template_fixtures.py; the context of each case is what llama.cpp handed
//    the template, and Python's jinja2 agrees on every case).
// 2. A table of language features: (template, expected), rendered with a small fixed context;
//    every expectation is what Python's jinja2 3.1 (transformers' settings) prints.
// 3. Errors: parse errors with line/col, raise_exception, unknown filters, limits.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <sstream>

#include "runtime/text/jinja.h"

// The project's CMake defines it; a standalone build run from the repository root finds the data
// here.
#ifndef TANDEM_TEST_DATA_DIR
#define TANDEM_TEST_DATA_DIR "tests/data"
#endif

namespace {

using tandem::errc;
using tandem::failure;
using tandem::jinja::render_options;
using tandem::jinja::template_;
using ojson = nlohmann::ordered_json;

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << "cannot open " << path;
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

const std::string templates_dir = std::string(TANDEM_TEST_DATA_DIR) + "/templates/";

// ---- 1. llama.cpp fixtures ----

TEST(JinjaFixtures, RenderLikeLlamaCpp) {
  ojson cases = ojson::parse(read_file(templates_dir + "reference.json"));
  ASSERT_GE(cases.size(), 150u);
  std::map<std::string, template_> parsed;
  std::map<std::string, int> per_template;
  for (const auto& c : cases) {
    const std::string name = c.at("template").get<std::string>();
    SCOPED_TRACE(name + " " + c.at("name").get<std::string>());
    if (!parsed.count(name)) parsed.emplace(name, template_::parse(read_file(templates_dir + name)));
    render_options opt;
    if (c.contains("now")) opt.now = c.at("now").get<std::time_t>();
    std::string got;
    try {
      got = parsed.at(name).render(c.at("context"), opt);
    } catch (const failure& e) {
      ADD_FAILURE() << "render failed: " << e.what();
      continue;
    }
    EXPECT_EQ(got, c.at("expected").get<std::string>());
    ++per_template[name];
  }
  EXPECT_GE(per_template.size(), 12u);  // every template has cases
}

// A template llama.cpp cannot parse (its lexer refuses a backslash-newline in a string), checked
// here by content: strftime_now() with an injected time, and Python's line continuation (a
// backslash before a newline inside a string literal drops both, as jinja2 does).
TEST(JinjaFixtures, MistralSmallDateAndLineContinuation) {
  auto t = template_::parse(read_file(templates_dir + "mistral-small-3.1.jinja"));
  ojson ctx = {{"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"bos_token", "<s>"}, {"eos_token", "</s>"}};
  render_options opt;
  opt.now = 1721995200;  // 2024-07-26 12:00 UTC: the same date in every time zone within 11 hours
  std::string out = t.render(ctx, opt);
  EXPECT_EQ(out.rfind("<s>[SYSTEM_PROMPT]You are Mistral Small 3", 0), 0u) << out;
  EXPECT_NE(out.find("in Paris.Your knowledge base was last updated on 2023-10-01. The current date is 2024-07-26.When "
                     "you're not sure"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("(e.g. \"What are some good restaurants around me?\" => \"Where are you?\""), std::string::npos);
  EXPECT_TRUE(out.ends_with("[/SYSTEM_PROMPT][INST]Hi[/INST]")) << out;
}

// ---- 2. language features ----

struct render_case {
  const char* tpl;
  const char* expected;
};

// Context of every row: messages=[{role: user, content: P0}], bos_token=<s>, eos_token=</s>.
const render_case language_cases[] = {
    {R"J({{ [1,2] }}|{{ ['a','b'] }}|{{ {'a':1,'b':'x'} }}|{{ none }}|{{ true }}|{{ 1.0 }}|{{ 2.5 }}|{{ 1e20 }}|{{ )J"
     R"J((1,2) }})J",
     R"J([1, 2]|['a', 'b']|{'a': 1, 'b': 'x'}|None|True|1.0|2.5|1e+20|(1, 2))J"},
    {R"J({{ messages[0].nope }}|{{ messages[5] is defined }})J", R"J(|False)J"},
    {R"J({{ 7 / 2 }}|{{ 7 // 2 }}|{{ -7 // 2 }}|{{ 7 % 3 }}|{{ -7 % 3 }}|{{ 2 ** 10 }}|{{ 4 / 2 }}|{{ 1 + 1.5 }})J",
     R"J(3.5|3|-4|1|2|1024|2.0|2.5)J"},
    {R"J({{ "a" ~ 1 ~ none ~ true }}|{{ "ab" * 3 }})J", R"J(a1NoneTrue|ababab)J"},
    {R"J({{ {'b':1,'a':[1,"é",none,true,1.5]}|tojson }}|{{ {'b':1}|tojson(indent=2) }}|{{ [1,[2]]|tojson(indent=2) )J"
     R"J(}}|{{ "x\u00e9\n\"<>"|tojson }})J",
     R"J({"b": 1, "a": [1, "é", null, true, 1.5]}|{
  "b": 1
}|[
  1,
  [
    2
  ]
]|"xé\n\"<>")J"},
    {R"J({{ [] | tojson(indent=4) }}|{{ {} | tojson(indent=4) }}|{{ 1.0|tojson }}|{{ 3|tojson }})J",
     R"J([]|{}|1.0|3)J"},
    {R"J({{ "  a b  "|trim }}|{{ "Hello World"|lower }}|{{ "hello world"|title }}|{{ "hELLO"|capitalize }}|{{ "abc"|)J"
     R"J(upper }})J",
     R"J(a b|hello world|Hello World|Hello|ABC)J"},
    {R"J({{ [3,1,2]|sort }}|{{ [3,1,2]|sort(reverse=true)|join(",") }}|{{ ['b','A','a']|sort|join(",") }})J",
     R"J([1, 2, 3]|3,2,1|A,a,b)J"},
    {R"J({{ "a,b,c".split(",") }}|{{ "a b  c".split() }}|{{ "  x ".strip() }}|{{ "xxaxx".strip("x") }})J",
     R"J(['a', 'b', 'c']|['a', 'b', 'c']|x|a)J"},
    {R"J({{ range(3)|list }}|{{ range(1,7,2)|list }}|{{ range(5,0,-2)|join }})J", R"J([0, 1, 2]|[1, 3, 5]|531)J"},
    {R"J({{ [1,2,3][1:] }}|{{ [1,2,3][::-1] }}|{{ "hello"[1:3] }}|{{ "hello"[::-1] }}|{{ [1,2,3][-1] }})J",
     R"J([2, 3]|[3, 2, 1]|el|olleh|3)J"},
    {R"J({% for k, v in {'b':1,'a':2}.items() %}{{ k }}={{ v }};{% endfor %})J", R"J(b=1;a=2;)J"},
    {R"J({% for x in [1,2,3] if x > 1 %}{{ loop.index }}/{{ loop.length }}:{{ x }} {% endfor %})J",
     R"J(1/2:2 2/2:3 )J"},
    {R"J({% for x in [] %}a{% else %}empty{% endfor %})J", R"J(empty)J"},
    {R"J({{ "%s-%d"|format("a", 3) }})J", R"J(a-3)J"},
    {R"J({{ 3.7|int }}|{{ "42"|int }}|{{ "4.5"|float }}|{{ "x"|int }}|{{ -3|abs }}|{{ 2.567|round(2) }}|{{ 2.5|)J"
     R"J(round }}|{{ 3|float }})J",
     R"J(3|42|4.5|0|3|2.57|2.0|3.0)J"},
    {R"J({{ [1,2,2,3,1]|unique|list }}|{{ {'b':1,'a':2}|dictsort }}|{{ [{'a':1},{'a':2}]|map(attribute='a')|list }})J",
     R"J([1, 2, 3]|[('a', 2), ('b', 1)]|[1, 2])J"},
    {R"J({{ [1,2,3,4]|select("odd")|list }}|{{ [1,2,3,4]|reject("odd")|list }}|{{ [{'r':'u'},{'r':'a'}]|)J"
     R"J(selectattr('r','equalto','u')|list }})J",
     R"J([1, 3]|[2, 4]|[{'r': 'u'}])J"},
    {R"J({{ "a\nb"|indent(2) }}|{{ "a\nb"|indent(2, true) }}|{{ "abc"|length }}|{{ [1,2]|count }}|{{ [1,2]|first }}|)J"
     R"J({{ [1,2]|last }})J",
     R"J(a
  b|  a
  b|3|2|1|2)J"},
    {R"J({{ x|default("d") }}|{{ ""|default("d") }}|{{ ""|default("d", true) }}|{{ none|default("d") }})J",
     R"J(d||d|None)J"},
    {R"J({{ "<a>&'\""|e }}|{{ "<a>"|safe }}|{{ 1|string }}|{{ [1]|string }})J",
     R"J(&lt;a&gt;&amp;&#39;&#34;|<a>|1|[1])J"},
    {R"J({% set ns = namespace(a=1) %}{% set ns.a = ns.a + 1 %}{{ ns.a }}|{{ ns }})J", R"J(2|<Namespace {'a': 2}>)J"},
    {R"J({% macro f(a, b=2) %}{{ a }}+{{ b }}{% endmacro %}{{ f(1) }}|{{ f(1, b=3) }}|{{ f(b=5, a=4) }})J",
     R"J(1+2|1+3|4+5)J"},
    {R"J({% set x %}inner {{ 1 }}{% endset %}[{{ x }}])J", R"J([inner 1])J"},
    {R"J({%- for i in range(5) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 3 %}{% break %}{% endif %}{{ i )J"
     R"J(}}{% endfor %})J",
     R"J(02)J"},
    {R"J({{ 1 is odd }}|{{ 2 is even }}|{{ 6 is divisibleby 3 }}|{{ "a" is string }}|{{ 1 is number }}|{{ 1.5 is )J"
     R"J(integer }}|{{ [] is iterable }}|{{ {} is mapping }}|{{ none is none }}|{{ true is boolean }}|{{ "x" is )J"
     R"J(sequence }})J",
     R"J(True|True|True|True|True|False|True|True|True|True|True)J"},
    {R"J({{ 1 == 1.0 }}|{{ "a" < "b" }}|{{ [1,2] == [1,2] }}|{{ 'a' in 'cat' }}|{{ 1 in [1,2] }}|{{ 'k' in {'k':1} )J"
     R"J(}}|{{ 3 not in [1] }})J",
     R"J(True|True|True|True|True|True|True)J"},
    {R"J({{ "x" if false else "y" }}|{{ "x" if false }}|{{ not none }}|{{ [] or "e" }}|{{ 0 and 1 }})J",
     R"J(y||True|e|0)J"},
    {R"J({{ "{} and {}".format(1, 2) }}|{{ "abc".find("c") }}|{{ "abc".startswith("a") }}|{{ "a-b".replace("-", )J"
     R"J("+") }}|{{ "a"|replace("a","b") }})J",
     R"J(1 and 2|2|True|a+b|b)J"},
    {R"J({{ {'a':1}.get('a') }}|{{ {'a':1}.get('b', 9) }}|{{ {'a':1}.keys()|list }}|{{ {'a':1}.values()|list }}|{{ )J"
     R"J({'a':1}.items()|list }}|{{ {'a':1}|items|list }})J",
     R"J(1|9|['a']|[1]|[('a', 1)]|[('a', 1)])J"},
    {R"J({{ dict(a=1, b=2) }}|{{ [1,2,3,4,5]|batch(2)|list }}|{{ "abc"|list }}|{{ [3,4]|sum }}|{{ [3,4]|max }}|{{ )J"
     R"J([3,4]|min }}|{{ ["a","b"]|reverse|list }})J",
     R"J({'a': 1, 'b': 2}|[[1, 2], [3, 4], [5]]|['a', 'b', 'c']|7|4|3|['b', 'a'])J"},
    {R"J({{ "x"|wordcount }}|{{ "Hello"|center(9) }}|{{ 'a' + 'b' }}|{{ [1] + [2] }}|{{ -(3) }}|{{ +3 }}|{{ 1 < 2 < )J"
     R"J(3 }})J",
     R"J(1|  Hello  |ab|[1, 2]|-3|3|True)J"},
    {R"J({{ '\x41\u00e9\t|' }}|{{ "a\'b" }}|{{ 'it''s' }}|{{ 0x10 }}|{{ 1_000 }})J", R"J(Aé	||a'b|its|16|1000)J"},
    {R"J({% raw %}{{ x }}{% endraw %}|{# comment #}|{% filter upper %}abc{% endfilter %})J", R"J({{ x }}||ABC)J"},
    {R"J({% set a, b = 1, 2 %}{{ a }}{{ b }}|{% set t = (1,) %}{{ t }}|{{ (1) }})J", R"J(12|(1,)|1)J"},
    {R"J({{ [1,2]|join }}|{{ [none, true]|join(",") }}|{{ {'a':1}|length }}|{{ "é"|length }}|{{ "É"|lower }})J",
     R"J(12|None,True|1|1|é)J"},
    {R"J({{ true|tojson }}|{{ none|tojson }}|{{ "a"|tojson }}|{{ 1.5e300|tojson }}|{{ 0.1|tojson }}|{{ 1e-7 }}|{{ )J"
     R"J(100000000000000000000.0 }})J",
     R"J(true|null|"a"|1.5e+300|0.1|1e-07|1e+20)J"},
    {R"J({{ 10/3 }}|{{ 0.1 + 0.2 }}|{{ 1/3 }}|{{ 2.0 }}|{{ -0.0 }}|{{ 1e16 }}|{{ 123456789.123 }})J",
     R"J(3.3333333333333335|0.30000000000000004|0.3333333333333333|2.0|-0.0|1e+16|123456789.123)J"},
    {R"J({{ undefined_thing|length }})J", R"J(0)J"},
    {R"J({{ [1,2]|map('string')|join('-') }}|{{ ["A","B"]|map('lower')|list }})J", R"J(1-2|['a', 'b'])J"},
    {R"J({{ 'abc'[5] }})J", R"J()J"},
    {R"J({{ none.x }})J", R"J()J"},
    {R"J({{ none }}|{{ [1,2] }}|{{ ['a','b'] }}|{{ {'a':1,'b':'x'} }}|{{ true }}|{{ 1.0 }}|{{ 2.5 }})J",
     R"J(None|[1, 2]|['a', 'b']|{'a': 1, 'b': 'x'}|True|1.0|2.5)J"},
    {R"J(A\n  {% if true %}\n  B\n  {% endif %}\nC\n{{ 1 }}\n  {{ 2 }}  \nD {# c #}\n  {# c2 #}\nE)J",
     R"J(A\n  \n  B\n  \nC\n1\n  2  \nD \n  \nE)J"},
    {R"J({{ 7 // 2 }}|{{ -7 // 2 }}|{{ 7 % 3 }}|{{ -7 % 3 }}|{{ 2 ** 10 }}|{{ 1 + 1.5 }})J", R"J(3|-4|1|2|1024|2.5)J"},
    {R"J({{ 7 / 2 }})J", R"J(3.5)J"},
    {R"J({{ 4 / 2 }})J", R"J(2.0)J"},
    {R"J({{ {'b':1,'a':[1,"é",none,true,1.5]}|tojson }}|{{ {'b':1}|tojson(indent=2) }}|{{ [1,[2]]|tojson(indent=2) )J"
     R"J(}}|{{ "x\n\"<>"|tojson }})J",
     R"J({"b": 1, "a": [1, "é", null, true, 1.5]}|{
  "b": 1
}|[
  1,
  [
    2
  ]
]|"x\n\"<>")J"},
    {R"J({{ 1 is odd }}|{{ 2 is even }}|{{ "a" is string }}|{{ 1 is number }}|{{ 1.5 is integer }}|{{ [] is )J"
     R"J(iterable }}|{{ {} is mapping }}|{{ none is none }}|{{ true is boolean }}|{{ "x" is sequence }})J",
     R"J(True|True|True|True|False|True|True|True|True|True)J"},
    {R"J({{ 6 is divisibleby 3 }})J", R"J(True)J"},
    {R"J({{ 6 is divisibleby(3) }})J", R"J(True)J"},
    {R"J({{ 1 == 1.0 }}|{{ [1,2] == [1,2] }}|{{ 'a' in 'cat' }}|{{ 1 in [1,2] }}|{{ 'k' in {'k':1} }}|{{ 3 not in )J"
     R"J([1] }})J",
     R"J(True|True|True|True|True|True)J"},
    {R"J({{ "abc".find("c") }}|{{ "abc".startswith("a") }}|{{ "a-b".replace("-", "+") }}|{{ "a"|replace("a","b") }})J",
     R"J(2|True|a+b|b)J"},
    {R"J({{ "x"|wordcount }}|{{ 'a' + 'b' }}|{{ [1] + [2] }}|{{ -(3) }}|{{ +3 }})J", R"J(1|ab|[1, 2]|-3|3)J"},
    {R"J({{ 1 < 2 < 3 }})J", R"J(True)J"},
    {R"J({{ "a\'b" }}|{{ 'it''s' }}|{{ "tab\there" }})J", R"J(a'b|its|tab	here)J"},
    {R"J({% set a, b = 1, 2 %}{{ a }}{{ b }})J", R"J(12)J"},
    {R"J({% set t = (1,) %}{{ t }})J", R"J((1,))J"},
    {R"J({{ (1) }}|{{ (1, 2)|length }})J", R"J(1|2)J"},
    {R"J({{ true|tojson }}|{{ none|tojson }}|{{ "a"|tojson }}|{{ 0.1|tojson }}|{{ 1.5|tojson }})J",
     R"J(true|null|"a"|0.1|1.5)J"},
    {R"J({{ 10/3 }}|{{ 0.1 + 0.2 }}|{{ 2.0 }}|{{ 123456789.123 }})J",
     R"J(3.3333333333333335|0.30000000000000004|2.0|123456789.123)J"},
    {R"J({{ messages }})J", R"J([{'role': 'user', 'content': 'P0'}])J"},
    {R"J({{ messages[0] }})J", R"J({'role': 'user', 'content': 'P0'})J"},
    {R"J({{ {'a': none}.a }}|{{ {'a': none}.a is none }}|{{ {'a': none}.b is defined }})J", R"J(None|True|False)J"},
    {R"J({% for m in messages %}{{ loop.first }}{{ loop.last }}{{ loop.revindex }}{{ loop.revindex0 }}{{ )J"
     R"J(loop.previtem is defined }}{% endfor %})J",
     R"J(TrueTrue10False)J"},
    {R"J({{ [1,2,3]|join(", ") }}|{{ ["a","b"]|join }}|{{ "abc"|first }}|{{ [3,1]|max }})J", R"J(1, 2, 3|ab|a|3)J"},
    {R"J({{ "aXbXc".split("X", 1) }})J", R"J(['a', 'bXc'])J"},
    {R"J({{ "Hello"|center(9) }})J", R"J(  Hello  )J"},
    {R"J({{ "  a\n"|trim("x") }}|{{ "xax"|trim("x") }})J",
     R"J(  a
|a)J"},
    {R"J({{ "ab" in ["ab"] }}|{{ none is not none }}|{{ x is not defined }})J", R"J(True|False|True)J"},
    {R"J({% if messages|selectattr("role", "equalto", "user")|list|length > 0 %}yes{% endif %})J", R"J(yes)J"},
    {R"J({{ messages|map(attribute="role")|join(",") }})J", R"J(user)J"},
    {R"J({{ messages|selectattr("role", "eq", "user")|list|length }}|{{ messages|rejectattr("role", "eq", "user")|)J"
     R"J(list|length }})J",
     R"J(1|0)J"},
    {R"J({{ messages|selectattr("content")|list|length }})J", R"J(1)J"},
    {R"J({{ {'a':1,'b':2}|dictsort|list }})J", R"J([('a', 1), ('b', 2)])J"},
    {R"J({{ "%d items"|format(3) }})J", R"J(3 items)J"},
    {R"J({{ 3.0|int }}|{{ "42"|int }}|{{ "4.5"|float }}|{{ -3|abs }}|{{ 3|float }})J", R"J(3|42|4.5|3|3.0)J"},
    {R"J({{ "x"|int }})J", R"J(0)J"},
    {R"J({{ [1,2,3]|length }}|{{ {'a': [1]}['a'][0] }})J", R"J(3|1)J"},
    {R"J({{ "abc".upper() }}|{{ "ABC".lower() }}|{{ "a b".title() }}|{{ "  x".lstrip() }}|{{ "x  ".rstrip() }}|{{ )J"
     R"J("abc".endswith("c") }})J",
     R"J(ABC|abc|A B|x|x|True)J"},
    {R"J({{ "a"|indent(4, first=true) }})J", R"J(    a)J"},
    {R"J({{ "line1\nline2\n"|indent }})J",
     R"J(line1
    line2
)J"},
    {R"J({{ 'ÉÀÖ'|lower }}|{{ 'éàöÿ'|upper }}|{{ 'ĀāŁł'|lower }}|{{ 'ΑΒΓ'|lower }}|{{ 'абв'|upper }}|{{ 0x1F }}|{{ )J"
     R"J(0b101 }}|{{ 0o17 }})J",
     R"J(éàö|ÉÀÖŸ|āāłł|αβγ|АБВ|31|5|15)J"},
    {R"J({% for x in [1,2,3] %}{{ loop.cycle('a','b') }}{{ loop.previtem }}{{ loop.nextitem }}{{ loop.depth }}{% )J"
     R"J(endfor %})J",
     R"J(a21b131a21)J"},
    {R"J({% for a in [1,2] %}{% for b in [3] %}{{ loop.depth }}{{ loop.depth0 }}{% endfor %}{% endfor %})J",
     R"J(1010)J"},
    {R"J({% macro m(a, b=a~'x') %}{{ a }}{{ b }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1) }}|{{ m(1, 2, 3, )J"
     R"J(z=4) }})J",
     R"J(11x(){}|12(3,){'z': 4})J"},
    {R"J({% macro m() %}[{{ caller() }}]{% endmacro %}{% call m() %}in{% endcall %})J", R"J([in])J"},
    {R"J({% macro m(x) %}[{{ caller(x) }}]{% endmacro %}{% call(y) m(5) %}got {{ y }}{% endcall %})J", R"J([got 5])J"},
    {R"J({% set x | upper %}abc{% endset %}{{ x }}|{% filter replace('a','b') %}aaa{% endfilter %})J", R"J(ABC|bbb)J"},
    {R"J({{ '%s and %s' % ('a', 'b') }}|{{ '%d%%' % 5 }}|{{ '%-5s|' % 'ab' }}|{{ '%05.1f' % 3.14159 }}|{{ '%x' % )J"
     R"J(255 }})J",
     R"J(a and b|5%|ab   ||003.1|ff)J"},
    {R"J({{ 'a{}b{}'.format(1, 'x') }}|{{ '{0}{0}{name}'.format(7, name='n') }}|{{ '{!r}'.format('q') }})J",
     R"J(a1bx|77n|'q')J"},
    {R"J({{ '  a  b  '.split() }}|{{ 'a,b,,c'.split(',') }}|{{ 'a b c'.split(' ', 1) }}|{{ ' a b '.split(None, 1) )J"
     R"J(}}|{{ 'ab'.split('b') }})J",
     R"J(['a', 'b']|['a', 'b', '', 'c']|['a', 'b c']|['a', 'b ']|['a', ''])J"},
    {R"J({{ 'x\u3000 '|trim }}|{{ '\u00a0x'.strip() }}|{{ 'abcab'.rstrip('ab') }}|{{ 'abc'.lstrip('ba') }})J",
     R"J(x|x|abc|c)J"},
    {R"J({{ 'Hello World'.replace('o', '0', 1) }}|{{ 'abc'.replace('', '-') }}|{{ 'aaa'|replace('a', 'b', 2) }})J",
     R"J(Hell0 World|-a-b-c-|bba)J"},
    {R"J({{ [3,1,2]|sort(attribute=none) }}|{{ [{'n':'b'},{'n':'A'}]|sort(attribute='n')|map(attribute='n')|join }}|)J"
     R"J({{ ['b','a']|sort(true)|join }})J",
     R"J([1, 2, 3]|Ab|ba)J"},
    {R"J({{ ['a','A','b']|unique|list }}|{{ ['a','A']|unique(case_sensitive=true)|list }}|{{ [1,1.0,True]|unique|)J"
     R"J(list }})J",
     R"J(['a', 'b']|['a', 'A']|[1])J"},
    {R"J({{ {'b':2,'a':1,'C':3}|dictsort }}|{{ {'b':2,'a':1}|dictsort(by='value', reverse=true) }})J",
     R"J([('a', 1), ('b', 2), ('C', 3)]|[('b', 2), ('a', 1)])J"},
    {R"J({{ [1,2,3]|sum }}|{{ [1.5,2]|sum }}|{{ [{'v':1},{'v':2}]|sum(attribute='v') }}|{{ ['b','a','C']|max }}|{{ )J"
     R"J(['b','a','C']|min }})J",
     R"J(6|3.5|3|C|a)J"},
    {R"J({{ 'hello world foo'|wordcount }}|{{ 'ab'|center(7) }}|{{ 'ab'|center(6) }}|{{ 'abc'|center(6) }})J",
     R"J(3|   ab  |  ab  | abc  )J"},
    {R"J({{ 1.5|round }}|{{ 0.5|round }}|{{ -1.5|round }}|{{ 2.675|round(2) }}|{{ 1.25|round(1) }}|{{ 7|round }}|{{ )J"
     R"J(3.7|round(method='floor') }}|{{ 3.2|round(0, 'ceil') }})J",
     R"J(2.0|0.0|-2.0|2.67|1.2|7|3.0|4.0)J"},
    {R"J({{ 5 // 2 }}|{{ -5 // 2 }}|{{ 5 % -3 }}|{{ -5 % 3 }}|{{ 5.5 // 2 }}|{{ -5.5 % 2 }}|{{ 2 ** -1 }}|{{ 2 ** )J"
     R"J(0.5 }}|{{ true + 1 }}|{{ 10 / 4 }})J",
     R"J(2|-3|-1|1|2.0|0.5|0.5|1.4142135623730951|2|2.5)J"},
    {R"J({{ [1,2] * 2 }}|{{ 'ab' * 0 }}|{{ 3 * 'x' }}|{{ (1,2) + (3,) }}|{{ [1] + [2] }})J",
     R"J([1, 2, 1, 2]||xxx|(1, 2, 3)|[1, 2])J"},
    {R"J({{ 1 if true }}|{{ 1 if false }}|{{ none if true else 1 }}|{{ 'a' if 'x' in 'xyz' else 'b' }})J",
     R"J(1||None|a)J"},
    {R"J({{ x is defined }}|{{ x is undefined }}|{{ none is none }}|{{ x is none }}|{{ 1 is integer }}|{{ true is )J"
     R"J(integer }}|{{ 1.0 is float }}|{{ true is number }}|{{ '1' is number }})J",
     R"J(False|True|True|False|True|False|True|True|False)J"},
    {R"J({{ 'ab' is lower }}|{{ 'AB' is upper }}|{{ 'Ab' is lower }}|{{ range is callable }}|{{ 'x' is in 'xy' }}|)J"
     R"J({{ 2 is in [1,2] }}|{{ none is sameas none }}|{{ 3 is gt 2 }}|{{ 3 is lessthan 2 }}|{{ 1 is ne 2 }})J",
     R"J(True|True|False|True|True|True|True|True|False|True)J"},
    {R"J({{ x is iterable }}|{{ x is sequence }}|{{ 1 is iterable }}|{{ {} is sequence }}|{{ x is mapping }}|{{ 'a' )J"
     R"J(is mapping }})J",
     R"J(True|True|False|True|False|False)J"},
    {R"J({{ [1,2,3][1] }}|{{ [1,2,3][-4] }}|{{ [1,2,3][0:2] }}|{{ [1,2,3][:-1] }}|{{ [1,2,3,4,5][::2] }}|{{ [1,2,3,)J"
     R"J(4,5][4:1:-2] }}|{{ 'héllo'[1] }}|{{ 'héllo'[-1:] }}|{{ 'héllo'[1:3] }})J",
     R"J(2||[1, 2]|[1, 2]|[1, 3, 5]|[5, 3]|é|o|él)J"},
    {R"J({{ [1,[2,[3]]] }}|{{ ('a',) }}|{{ () }}|{{ {'a':(1,2),'b':[none,true,'it\'s']} }}|{{ '\n\t' }}|{{ )J"
     R"J(['\n\'"'] }})J",
     R"J([1, [2, [3]]]|('a',)|()|{'a': (1, 2), 'b': [None, True, "it's"]}|
	|['\n\'"'])J"},
    {R"J({{ 1e3 }}|{{ 1.5e-3 }}|{{ 12345678901234567.0 }}|{{ 0.000123 }}|{{ 1/3*3 }}|{{ 2.5e-5 }}|{{ -1e100 }}|{{ )J"
     R"J(1_000.5 }})J",
     R"J(1000.0|0.0015|1.2345678901234568e+16|0.000123|1.0|2.5e-05|-1e+100|1000.5)J"},
    {R"J({{ 'a' 'b' }}|{{ "it's" }}|{{ 'say "hi"' }}|{{ ['it\'s', 'say "hi"', 'both \' "'] }})J",
     R"J(ab|it's|say "hi"|["it's", 'say "hi"', 'both \' "'])J"},
    {R"J({% set a = [1,2] %}{% set b = a + [3] %}{{ a }}{{ b }}|{% set x, y = 'ab' %}{{ y }}{{ x }}|{% set t = 1, 2 )J"
     R"J(%}{{ t }})J",
     R"J([1, 2][1, 2, 3]|ba|(1, 2))J"},
    {R"J({% for k in {'b':1,'a':2} %}{{ k }}{% endfor %}|{% for c in 'hé' %}[{{ c }}]{% endfor %}|{% for x in )J"
     R"J(none_var %}x{% else %}none{% endfor %})J",
     R"J(ba|[h][é]|none)J"},
    {R"J({% for i in range(10) if i is odd %}{% if loop.index > 3 %}{% break %}{% endif %}{{ i }}{{ loop.length )J"
     R"J(}}{% endfor %})J",
     R"J(153555)J"},
    {R"J({{ [1,2,3,4]|select('even')|list }}|{{ [1,2,3,4]|select('divisibleby', 3)|list }}|{{ [1,2,3]|)J"
     R"J(reject('equalto', 2)|list }}|{{ [none, 1, 0]|select|list }}|{{ ['a','b']|select('in', 'abc')|list }})J",
     R"J([2, 4]|[3]|[1, 3]|[1]|['a', 'b'])J"},
    {R"J({{ [{'a':1},{'b':2},{'a':none}]|selectattr('a')|list }}|{{ [{'a':1},{'b':2}]|selectattr('a', 'defined')|)J"
     R"J(list }}|{{ [{'a':1},{'b':2}]|rejectattr('a', 'defined')|list }}|{{ [{'a':{'b':1}}]|map(attribute='a.b')|)J"
     R"J(list }})J",
     R"J([{'a': 1}]|[{'a': 1}]|[{'b': 2}]|[1])J"},
    {R"J({{ ['A','B']|map('lower')|join(',') }}|{{ [1.6,2.4]|map('round')|list }}|{{ [{'n':'x'}]|map(attribute='q', )J"
     R"J(default='d')|list }}|{{ [[1,2],[3]]|map('length')|list }}|{{ ['a','b']|map('replace', 'a', 'z')|list }})J",
     R"J(a,b|[2.0, 2.0]|['d']|[2, 1]|['z', 'b'])J"},
    {R"J({{ [1,2,3,4,5]|batch(2)|list }}|{{ [1,2,3]|batch(2, 'x')|list }}|{{ [1,2]|first }}|{{ []|first }}|{{ 'abc'|)J"
     R"J(last }}|{{ 'abc'|reverse }}|{{ [1,2]|reverse|list }})J",
     R"J([[1, 2], [3, 4], [5]]|[[1, 2], [3, 'x']]|1||c|cba|[2, 1])J"},
    {R"J({{ '<b>"&\''|escape }}|{{ 5|string ~ 'x' }}|{{ none|string }}|{{ [1,'a']|string }}|{{ '3'|int + 1 }}|{{ )J"
     R"J('0x1A'|int(0, 16) }}|{{ 'x'|float }}|{{ '1e3'|float }}|{{ true|int }}|{{ ' 12 '|int }})J",
     R"J(&lt;b&gt;&#34;&amp;&#39;|5x|None|[1, 'a']|4|26|0.0|1000.0|1|12)J"},
    {R"J({{ 'a\n\nb\n'|indent(2) }}|{{ 'a\n\nb'|indent(2, blank=true) }}|{{ 'a\nb'|indent('> ', true) }}|{{ ''|)J"
     R"J(indent(2, true) }})J",
     R"J(a

  b
|a
  
  b|> a
> b|  )J"},
    {R"J({{ {'b': 1, 'a': {'c': [1, 2]}}|tojson(indent=2) }}|{{ {'b': 1, 'a': 2}|tojson(sort_keys=true) }}|{{ )J"
     R"J('é\u2028😀'|tojson(ensure_ascii=true) }}|{{ [1,2]|tojson(separators=[',', ':']) }}|{{ '\x01\x7f'|tojson )J"
     R"J(}})J",
     R"J({
  "b": 1,
  "a": {
    "c": [
      1,
      2
    ]
  }
}|{"a": 2, "b": 1}|"\u00e9\u2028\ud83d\ude00"|[1,2]|"\u0001")J"},
    {R"J({{ 'abc'.upper() }}|{{ 'aBc'.capitalize() }}|{{ 'hello wORLD'.title() }}|{{ 'abc'.find('z') }}|{{ )J"
     R"J('héllo'.find('l') }}|{{ 'a-b-c'.rfind('-') }}|{{ 'aaa'.count('a') }}|{{ 'a b'.startswith(('x', 'a')) }}|)J"
     R"J({{ 'ab'.endswith('b') }})J",
     R"J(ABC|Abc|Hello World|-1|2|3|3|True|True)J"},
    {R"J({{ '-'.join(['a','b']) }}|{{ 'a\nb\r\nc'.splitlines() }}|{{ '12'.isdigit() }}|{{ 'ab'.isalpha() }}|{{ ' )J"
     R"J('.isspace() }}|{{ 'AB'.isupper() }})J",
     R"J(a-b|['a', 'b', 'c']|True|True|True|True)J"},
    {R"J({{ dict(a=1, b='x') }}|{{ dict({'a':1}, b=2) }}|{{ dict([('k', 'v')]) }}|{% set ns = namespace(a=1, b=[]) )J"
     R"J(%}{% set ns.b = ns.b + [ns.a] %}{{ ns.b }}|{{ ns }})J",
     R"J({'a': 1, 'b': 'x'}|{'a': 1, 'b': 2}|{'k': 'v'}|[1]|<Namespace {'a': 1, 'b': [1]}>)J"},
    {R"J({{ 1 < 2 <= 2 < 3 }}|{{ 3 > 2 > 2 }}|{{ 'a' < 'b' }}|{{ [1,2] < [1,3] }}|{{ (1,2) == (1,2) }}|{{ (1,2) == )J"
     R"J([1,2] }}|{{ {'a':1,'b':2} == {'b':2,'a':1} }}|{{ 1 == true }}|{{ 0 == false }}|{{ none == none }}|{{ 1 )J"
     R"J(!= 1.0 }})J",
     R"J(True|False|True|True|True|False|True|True|True|True|False)J"},
    {R"J({{ not 1 }}|{{ not not [] }}|{{ 0 or '' or 'z' }}|{{ 1 and 'y' }}|{{ [] and 1 }}|{{ none or none }}|{{ 'a' )J"
     R"J(~ 1 ~ 2.0 ~ none ~ [1] }})J",
     R"J(False|False|z|y|[]|None|a12.0None[1])J"},
    {R"J({% if x %}a{% elif y %}b{% elif 1 %}c{% else %}d{% endif %}|{% if [] %}e{% else %}f{% endif %})J", R"J(c|f)J"},
    {R"J(  {%- if true %}
  x
  {%- endif %}
  y  {{- ' z ' -}}  w
  {%+ if true %}p{% endif +%}
q)J",
     R"J(  x  y z w
  p
q)J"},
    {R"J({%- macro render(x) -%}
  <{{ x }}>
{%- endmacro -%}
{% for i in [1, 2] -%}
  {{ render(i) }}
{% endfor -%}
end)J",
     R"J(<1>
<2>
end)J"},
    {R"J({% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{% set y = 3 %}{% endfor %}{{ x }}{{ y }}|{% set ns = )J"
     R"J(namespace(v=0) %}{% for i in [1,2,3] %}{% set ns.v = ns.v + i %}{% endfor %}{{ ns.v }})J",
     R"J(1|6)J"},
    {R"J({%- set m = messages[0] -%}{{ m.role }}:{{ m['content'] }}:{{ m.nope is defined }}:{{ messages|length )J"
     R"J(}}:{{ messages[0].content|upper }}:{{ bos_token ~ eos_token }})J",
     R"J(user:P0:False:1:P0:<s></s>)J"},
    {R"J({{ '{{' }}|{{ '}}' }}|{{ {'a': {'b': 1}} }}|{{ {'k': [{'x': 1}]}|tojson }})J",
     R"J({{|}}|{'a': {'b': 1}}|{"k": [{"x": 1}]})J"},
    {R"J(A
  {% if true %}
  B
  {% endif %}
C
{{ 1 }}
  {{ 2 }}  
D {# c #}
  {# c2 #}
E)J",
     R"J(A
  B
C
1
  2  
D E)J"},
    {R"J(a  {% if true %}  b
{% endif %}c
	{% if true %}d{% endif %}
)J",
     R"J(a    b
c
d)J"},
    {"q\n{% set x = 1 %}\r\nr\n   {{- x -}}   \ns",
     R"J(q
r1s)J"},
    {R"J({% macro m(x) %}
  <{{ x }}>
{% endmacro %}
{{ m(1) }}{{ m(2) }}
)J",
     R"J(  <1>
  <2>
)J"},
    {R"J({{ 'x' }}
{# comment #}
y
  {#- c -#}  
z)J",
     R"J(x
yz)J"},
    {R"J({% if true %}   
A{% endif %})J",
     R"J(   
A)J"},
    {R"J(line
)J",
     R"J(line)J"},
    {"{% if true %}\r\nA\r\n{% endif %}\r\n",
     R"J(A
)J"},
};

class JinjaRender : public ::testing::TestWithParam<render_case> {};

TEST_P(JinjaRender, MatchesJinja2) {
  const render_case& c = GetParam();
  ojson ctx = {{"messages", {{{"role", "user"}, {"content", "P0"}}}}, {"bos_token", "<s>"}, {"eos_token", "</s>"}};
  std::string got;
  try {
    got = template_::parse(c.tpl).render(ctx);
  } catch (const failure& e) {
    FAIL() << "template: " << c.tpl << "\nfailed: " << e.what();
  }
  EXPECT_EQ(got, c.expected) << "template: " << c.tpl;
}

INSTANTIATE_TEST_SUITE_P(Language, JinjaRender, ::testing::ValuesIn(language_cases));

// Deviations from Python's jinja2 that follow llama.cpp (lenient undefined attributes) or are
// spelled differently where no chat template looks (views print as lists).
TEST(JinjaRender, DocumentedDeviations) {
  ojson ctx = ojson::object();
  auto r = [&](const char* src) { return template_::parse(src).render(ctx); };
  EXPECT_EQ(r("[{{ x.y }}]{{ x.y is defined }}{{ x.y.z is undefined }}"), "[]FalseTrue");  // jinja2 raises
  EXPECT_EQ(r("{{ {'a': 1}.items() }}|{{ {'a': 1}.keys() }}|{{ range(2) }}"), "[('a', 1)]|['a']|[0, 1]");
  EXPECT_EQ(r("{% generation %}g{% endgeneration %}"), "g");  // transformers' tag, not plain jinja2
}

TEST(JinjaRender, KeyOrderFollowsTheJsonType) {
  auto t = template_::parse("{{ d|tojson }}|{% for k, v in d.items() %}{{ k }}{% endfor %}");
  ojson ordered = {{"d", {{"b", 1}, {"a", 2}}}};
  EXPECT_EQ(t.render(ordered), "{\"b\": 1, \"a\": 2}|ba");
  nlohmann::json sorted = {{"d", {{"b", 1}, {"a", 2}}}};
  EXPECT_EQ(t.render(sorted), "{\"a\": 2, \"b\": 1}|ab");
}

TEST(JinjaRender, StrftimeNowUsesInjectedTime) {
  auto t = template_::parse("{{ strftime_now('%Y-%m-%d') }}|{{ strftime_now is defined }}");
  render_options opt;
  opt.now = 1721995200;  // 2024-07-26 12:00 UTC
  EXPECT_EQ(t.render(ojson::object(), opt), "2024-07-26|True");
}

TEST(JinjaRender, ContextValuesOfEveryJsonType) {
  auto t = template_::parse("{{ i }} {{ u }} {{ f }} {{ b }} {{ n }} {{ s }} {{ l }} {{ o }} {{ o|tojson }}");
  ojson ctx = {{"i", -3},       {"u", 18446744073709551615ull}, {"f", 0.5}, {"b", false}, {"n", nullptr}, {"s", "é"},
               {"l", {1, "x"}}, {"o", {{"k", {true}}}}};
  EXPECT_EQ(t.render(ctx), "-3 1.8446744073709552e+19 0.5 False None é [1, 'x'] {'k': [True]} {\"k\": [true]}");
  EXPECT_EQ(template_::parse("[{{ i }}{{ l|length }}]").render(ojson()), "[0]");  // null context: all undefined
}

TEST(JinjaRender, ParsedTemplateIsReusableAndCopyable) {
  auto t = template_::parse("{% for m in messages %}{{ m.content }};{% endfor %}");
  template_ copy = t;
  EXPECT_EQ(t.render(ojson{{"messages", {{{"content", "a"}}}}}), "a;");
  EXPECT_EQ(copy.render(ojson{{"messages", {{{"content", "b"}}, {{"content", "c"}}}}}), "b;c;");
}

// ---- 3. errors ----

std::string error_of(const std::string& src, const ojson& ctx = ojson::object(), const render_options& opt = {}) {
  try {
    template_::parse(src).render(ctx, opt);
  } catch (const failure& e) {
    EXPECT_EQ(e.code(), errc::invalid_argument);
    return e.what();
  }
  return "(no error)";
}

TEST(JinjaErrors, ParseErrorsCarryLineAndColumn) {
  EXPECT_EQ(error_of("ab\n  {{ 1 + }}"), "template line 2 col 10: expected an expression, got '}}'");
  EXPECT_EQ(error_of("{% if x %}\nabc"),
            "template line 2 col 4: unexpected end of template: 'if' opened at line 1 col 4 is not closed "
            "(expected 'elif', 'else' or 'endif')");
  EXPECT_EQ(error_of("{% for x in y %}{% endif %}"),
            "template line 1 col 20: unexpected 'endif' tag: no open block it could close");
  EXPECT_EQ(error_of("x\n{% frobnicate %}"), "template line 2 col 4: unknown or unsupported tag 'frobnicate'");
  EXPECT_EQ(error_of("{{ 'abc }}"), "template line 1 col 4: unterminated string literal");
  EXPECT_EQ(error_of("{{ x"), "template line 1 col 5: unterminated tag: expected '}}'");
  EXPECT_EQ(error_of("{# never closed"), "template line 1 col 1: unterminated comment");
  EXPECT_EQ(error_of("{% raw %}abc"), "template line 1 col 1: unterminated 'raw' block: no {% endraw %}");
  EXPECT_EQ(error_of("{{ a ? b }}"), "template line 1 col 6: unexpected character '?'");
  // Inside an open bracket `%}` belongs to the expression (as in Jinja2), so the tag never ends.
  EXPECT_EQ(error_of("{% macro m(a %}{% endmacro %}"), "template line 1 col 30: unterminated tag: expected '%}'");
  EXPECT_EQ(error_of("{% macro m(a b) %}{% endmacro %}"), "template line 1 col 14: expected ')', got 'b'");
  EXPECT_EQ(error_of("{% for x in xs recursive %}{% endfor %}"),
            "template line 1 col 16: recursive for loops are not supported");
}

TEST(JinjaErrors, RaiseExceptionPassesTheMessageVerbatim) {
  EXPECT_EQ(error_of("{{ raise_exception('Roles must alternate: user/assistant/...') }}"),
            "template raised an exception: Roles must alternate: user/assistant/...");
  auto gemma2 = template_::parse(read_file(templates_dir + "gemma2.jinja"));
  ojson ctx = {{"messages", {{{"role", "system"}, {"content", "S"}}, {{"role", "user"}, {"content", "U"}}}}};
  try {
    gemma2.render(ctx);
    ADD_FAILURE() << "gemma2 takes no system message";
  } catch (const failure& e) {
    EXPECT_STREQ(e.what(), "template raised an exception: System role not supported");
  }
}

TEST(JinjaErrors, RuntimeTypeErrorsAndUnknownNames) {
  EXPECT_EQ(error_of("{{ [1]|frobnicate }}"), "template line 1 col 8: unknown filter 'frobnicate'");
  EXPECT_EQ(error_of("{{ 1 is frobnicated }}"), "template line 1 col 6: unknown test 'frobnicated'");
  EXPECT_EQ(error_of("\n{{ 1 + 'a' }}"), "template line 2 col 6: unsupported operand type(s) for +: 'int' and 'str'");
  EXPECT_EQ(error_of("{{ nope(1) }}"), "template line 1 col 8: 'nope' is undefined");
  EXPECT_EQ(error_of("{{ 'x'.nope() }}"), "template line 1 col 12: 'str' object has no attribute 'nope'");
  EXPECT_EQ(error_of("{{ 1 / 0 }}"), "template line 1 col 6: division by zero");
  EXPECT_EQ(error_of("{{ 'a' < 1 }}"), "template line 1 col 4: '<' not supported between instances of 'str' and 'int'");
  EXPECT_EQ(error_of("{% for x in 5 %}{% endfor %}"), "template line 1 col 4: 'int' object is not iterable");
  EXPECT_EQ(error_of("{% set a, b = [1] %}"), "template line 1 col 4: cannot unpack 1 values into 2 names");
  EXPECT_EQ(error_of("{% set x = 1 %}{% set x.y = 2 %}"),
            "template line 1 col 19: cannot assign attribute 'y' on 'x': not a namespace");
  EXPECT_EQ(error_of("{{ x|tojson }}"), "template line 1 col 6: Object of type Undefined is not JSON serializable");
  EXPECT_EQ(error_of("{% break %}"), "template: 'break' or 'continue' outside a loop");
  EXPECT_EQ(error_of("{{ 9223372036854775807 + 1 }}"), "template line 1 col 24: integer overflow");
  EXPECT_EQ(error_of("{{ [1][::0] }}"), "template line 1 col 7: slice step cannot be zero");
}

TEST(JinjaErrors, LimitsStopHostileTemplates) {
  // Endless recursion.
  EXPECT_EQ(error_of("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"),
            "template line 1 col 21: recursion deeper than 256 levels");
  // Output size.
  render_options small;
  small.max_output_bytes = 1000;
  EXPECT_EQ(error_of("{% for i in range(100) %}0123456789ABCDEF{% endfor %}", ojson::object(), small),
            "template line 1 col 26: output exceeds 1000 bytes");
  // Strings that double until they are too long (the cap applies to every string built).
  EXPECT_EQ(
      error_of("{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}"),
      "template line 1 col 76: string too long");
  // Work: loops nested deep enough to run for hours.
  render_options few;
  few.max_steps = 100000;
  EXPECT_EQ(
      error_of("{% for a in range(1000) %}{% for b in range(1000) %}{% endfor %}{% endfor %}", ojson::object(), few),
      "template line 1 col 30: template ran more than 100000 steps");
  EXPECT_EQ(error_of("{{ range(100000000)|length }}"), "template line 1 col 9: range() longer than 1048576 items");
  EXPECT_EQ(error_of("{{ [1] * 100000000 }}"), "template line 1 col 8: list repetition too long");
  // Values nested without bound.
  EXPECT_EQ(error_of("{% set ns = namespace(x=[]) %}{% for i in range(1000) %}{% set ns.x = [ns.x] %}{% endfor %}"),
            "template line 1 col 60: values nest deeper than 256 levels");
  EXPECT_EQ(error_of("{% set ns = namespace() %}{% set ns.me = [ns] %}"),
            "template line 1 col 30: a namespace attribute cannot hold a namespace");
  // Syntax nested without bound.
  EXPECT_EQ(error_of("{{ " + std::string(1000, '(') + "1" + std::string(1000, ')') + " }}"),
            "template line 1 col 89: template nests deeper than 256 levels");
  EXPECT_EQ(error_of("{{ " + std::string(1000, '[') + std::string(1000, ']') + " }}").find("nests deeper than 256"),
            33u);
  std::string ifs;
  for (int i = 0; i < 300; ++i) ifs += "{% if true %}";
  EXPECT_NE(error_of(ifs).find("template nests deeper than 256 levels"), std::string::npos);
  // Context nested without bound.
  ojson deep = ojson::array();
  for (int i = 0; i < 300; ++i) deep = ojson::array({deep});
  EXPECT_EQ(error_of("{{ x }}", ojson{{"x", deep}}), "template: context nests deeper than 256 levels");
}

TEST(JinjaErrors, ContextMustBeAnObject) {
  EXPECT_EQ(error_of("x", ojson::array({1})), "template: the context must be a JSON object");
}

}  // namespace
