// The Jinja engine on its own: constructs, whitespace control, Python value semantics and the
// errors for what it does not support. Expected strings are what Python jinja2 3.1 renders with
// transformers' settings (see tests/oracle/test_chat_templates_jinja2.py for the live comparison).
#include <gtest/gtest.h>

#include "text/jinja_template.h"

namespace dspark::jinja {
namespace {

std::string render(std::string_view source,
                   const nlohmann::ordered_json& variables = nlohmann::ordered_json::object()) {
  Dict dict;
  for (const auto& [key, value] : variables.items()) dict.set(key, Value::from_json(value));
  return Template(source, "test").render(dict);
}

std::string error_of(std::string_view source,
                     const nlohmann::ordered_json& variables = nlohmann::ordered_json::object()) {
  try {
    render(source, variables);
  } catch (const dspark::Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(Jinja, WhitespaceControlFollowsTrimAndLstripBlocks) {
  EXPECT_EQ(render("  {% if true %}\n  a\n  {% endif %}\n  {{ 1 }}\n  {# c #}\n  b"),
            "  a\n  1\n  b");
  EXPECT_EQ(render("{%- if true -%}\n  a  \n{%- endif -%}\n b"), "ab");
  EXPECT_EQ(render("{%+ if true %}x{% endif +%}\nb"), "x\nb");
  EXPECT_EQ(render("a {#- c -#} b"), "ab");
  EXPECT_EQ(render("{% raw %}{{ x }}{% endraw %}"), "{{ x }}");
}

TEST(Jinja, NewlinesAreNormalisedAndOneTrailingNewlineDropped) {
  EXPECT_EQ(render("a\r\nb\rc\n"), "a\nb\nc");
  EXPECT_EQ(render("{{ 'x' }}\n\n"), "x\n");
  EXPECT_EQ(render("{% if true %}\r\n  x\r\n{% endif %}\r\n"), "  x\n");
}

TEST(Jinja, LoopScopingAndLoopVariables) {
  EXPECT_EQ(
      render("{% set x = 5 %}{% for i in [1,2] %}[{{ x }}]{% set x = i %}{% endfor %}{{ x }}"),
      "[5][5]5");
  EXPECT_EQ(render("{% for x in [1,2,3] if x != 2 %}{{ loop.index }}/{{ loop.length }}{{ "
                   "loop.previtem }}{% else %}E{% endfor %}"),
            "1/22/21");
  EXPECT_EQ(render("{% for x in [] %}a{% else %}E{% endfor %}"), "E");
  EXPECT_EQ(render("{% for x in [1,2,3] %}{% if x == 2 %}{% continue %}{% endif %}{{ x }}{% if x "
                   "== 3 %}{% break %}{% endif %}{% endfor %}"),
            "13");
  EXPECT_EQ(render("{% for x in [1,2,3] %}{{ loop.cycle('a','b') }}{{ loop.revindex }}{{ "
                   "loop.first }}{{ loop.last }}{% endfor %}"),
            "a3TrueFalseb2FalseFalsea1FalseTrue");
  EXPECT_EQ(render("{% for a, b in [(1,2),(3,4)] %}{{ a }}{{ b }}{% endfor %}"), "1234");
  EXPECT_EQ(render("{% for k, v in {'a': 1, 'b': 2}|items %}{{ k }}={{ v }};{% endfor %}"),
            "a=1;b=2;");
}

TEST(Jinja, NamespacesMacrosAndCallBlocks) {
  EXPECT_EQ(render("{% set ns = namespace(a=1) %}{% for i in [1,2] %}{% set ns.a = ns.a + i %}{% "
                   "endfor %}{{ ns.a }}"),
            "4");
  EXPECT_EQ(
      render("{% macro m(a, b='x') %}[{{ a }}{{ b }}]{% endmacro %}{{ m(1) }}{{ m(1, b=3) }}"),
      "[1x][13]");
  EXPECT_EQ(render("{% macro m(x) %}<{{ caller(x * 2) }}>{% endmacro %}{% call(v) m(21) %}got {{ v "
                   "}}{% endcall %}"),
            "<got 42>");
  EXPECT_EQ(render("{% set x %}  a {{ 1 }} {% endset %}[{{ x }}]"), "[  a 1 ]");
  EXPECT_EQ(render("{% generation %}kept{% endgeneration %}"), "kept");
  EXPECT_EQ(render("{% filter upper %}abc{% endfilter %}"), "ABC");
  EXPECT_EQ(render("{% with a = 1 %}{{ a }}{% endwith %}[{{ a }}]"), "1[]");
}

TEST(Jinja, PythonValueSemantics) {
  EXPECT_EQ(render("{{ 7//2 }} {{ -7//2 }} {{ -7 % 3 }} {{ 7/2 }} {{ 1/3 }} {{ 1e16 }} {{ 1.0 }} "
                   "{{ 1e-5 }} {{ 0.1+0.2 }}"),
            "3 -4 2 3.5 0.3333333333333333 1e+16 1.0 1e-05 0.30000000000000004");
  EXPECT_EQ(render("{{ 'a' ~ 1 ~ none ~ true }} {{ [1,'a',none,true,1.5] }} {{ {'a':1,'b':'c'} }} "
                   "{{ (1,) }}"),
            "a1NoneTrue [1, 'a', None, True, 1.5] {'a': 1, 'b': 'c'} (1,)");
  EXPECT_EQ(render("{{ [\"it's\"] }} {{ ['a\"b'] }}"), "[\"it's\"] ['a\"b']");
  EXPECT_EQ(render("{{ 'abc'[::-1] }} {{ 'héllo'[1:3] }} {{ 'héllo'|length }} {{ [1,2,3][-1] }}"),
            "cba él 5 3");
  EXPECT_EQ(render("{{ 1 == 1.0 }} {{ true == 1 }} {{ (1,2) == [1,2] }} {{ 'a' in ['a'] }} {{ 'b' "
                   "not in 'abc' }}"),
            "True True False True False");
  EXPECT_EQ(render("{{ -1|abs }} {{ 2**3**2 }} {{ 'x' if false }}|{{ 0 or 'y' }}"), "1 64 |y");
  EXPECT_EQ(render("{{ 'ß'.upper() }} {{ 'ÉA'.lower() }} {{ 'hello world-foo'|title }} {{ "
                   "\"they're\".title() }}"),
            "SS éa Hello World-Foo They'Re");
  EXPECT_EQ(render("{{ '  a b  '.split() }} {{ 'a,b,c'.rsplit(',', 1) }} {{ ' a '.strip() }}"),
            "['a', 'b'] ['a,b', 'c'] a");
  EXPECT_EQ(render("{{ '%s-%d' % ('a', 3) }} {{ '{}-{x}'.format(1, x=2) }}"), "a-3 1-2");
}

TEST(Jinja, UndefinedBehavesLikeJinja2) {
  EXPECT_EQ(render("[{{ u }}]{{ u is defined }}{{ u|length }}{{ u ~ 'x' }}{{ u|default('d') }}{{ u "
                   "is sequence }}"),
            "[]False0xdTrue");
  EXPECT_EQ(render("{{ none.x }}|{{ {'a': 1}.b is defined }}|{{ [1][5] is defined }}"),
            "|False|False");
  EXPECT_NE(error_of("{{ u.x }}").find("'u' is undefined"), std::string::npos);
  EXPECT_NE(error_of("{{ u + 1 }}").find("UndefinedError"), std::string::npos);
}

TEST(Jinja, TojsonIsTransformersJsonDumps) {
  const nlohmann::ordered_json x = {{"b", {1, 2.0, nullptr, true, "é\n\"<>&'"}},
                                    {"a", nlohmann::ordered_json::object()}};
  EXPECT_EQ(render("{{ x|tojson }}", {{"x", x}}),
            "{\"b\": [1, 2.0, null, true, \"é\\n\\\"<>&'\"], \"a\": {}}");
  EXPECT_EQ(render("{{ x|tojson(indent=2) }}", {{"x", {{"a", {1}}}}}),
            "{\n  \"a\": [\n    1\n  ]\n}");
  EXPECT_EQ(render("{{ 'é'|tojson(ensure_ascii=true) }} {{ x|tojson(sort_keys=true, "
                   "separators=(',', ':')) }}",
                   {{"x", {{"b", 1}, {"a", 2}}}}),
            "\"\\u00e9\" {\"a\":2,\"b\":1}");
}

TEST(Jinja, SandboxRefusesMutation) {
  EXPECT_NE(error_of("{% set l = [1] %}{{ l.append(2) }}")
                .find("SecurityError: access to attribute 'append' of 'list' object is unsafe."),
            std::string::npos);
  EXPECT_NE(error_of("{{ {'a': 1}.update({}) }}").find("unsafe"), std::string::npos);
}

TEST(Jinja, RaiseExceptionCarriesTheTemplateMessage) {
  try {
    render(
        "{% if true %}\n{{ raise_exception('Conversation roles must alternate') }}\n{% endif %}");
    FAIL() << "expected an error";
  } catch (const TemplateRaisedError& e) {
    EXPECT_STREQ(e.what(), "Conversation roles must alternate");
  }
}

TEST(Jinja, UnsupportedConstructsNameThemselvesAndTheirLine) {
  const std::string include = error_of("a\nb\n{% include 'other.jinja' %}");
  EXPECT_NE(include.find("line 3"), std::string::npos) << include;
  EXPECT_NE(include.find("include"), std::string::npos) << include;
  const std::string recursive = error_of("\n{% for x in y recursive %}{% endfor %}");
  EXPECT_NE(recursive.find("line 2"), std::string::npos) << recursive;
  EXPECT_NE(recursive.find("recursive"), std::string::npos) << recursive;
  const std::string groupby = error_of("x\n\n\n{{ items|groupby('a') }}", {{"items", {1}}});
  EXPECT_NE(groupby.find("line 4"), std::string::npos) << groupby;
  EXPECT_NE(groupby.find("'groupby' filter is not supported"), std::string::npos) << groupby;
  const std::string star = error_of("{{ f(*args) }}");
  EXPECT_NE(star.find("*args"), std::string::npos) << star;
  const std::string unknown_filter = error_of("\n{{ x|frobnicate }}");
  EXPECT_NE(unknown_filter.find("line 2: no filter named 'frobnicate'"), std::string::npos)
      << unknown_filter;
  const std::string unknown_tag = error_of("{% if true %}\n{% frob %}{% endif %}");
  EXPECT_NE(unknown_tag.find("line 2: unknown tag 'frob'"), std::string::npos) << unknown_tag;
  const std::string unclosed = error_of("{% for x in y %}");
  EXPECT_NE(unclosed.find("'endfor'"), std::string::npos) << unclosed;
  const std::string printed = error_of("{{ 'abc'.upper }}");
  EXPECT_NE(printed.find("printing the function 'upper' is not supported"), std::string::npos)
      << printed;
}

TEST(Jinja, RuntimeErrorsNameTheirLine) {
  const std::string error = error_of("ok\n{{ 1 + 'a' }}");
  EXPECT_EQ(error, "test line 2: TypeError: unsupported operand type(s) for +: 'int' and 'str'");
  EXPECT_NE(error_of("{{ 'a' in none }}").find("argument of type 'NoneType' is not iterable"),
            std::string::npos);
  EXPECT_NE(error_of("{{ 10000000000 * 10000000000 }}").find("OverflowError"), std::string::npos);
}

TEST(Jinja, SelfReferencesRenderAndAreReleased) {
  // Under AddressSanitizer's leak checker these would leak if cycles were kept.
  EXPECT_EQ(render("{% set ns = namespace() %}{% set ns.self = ns %}{{ ns.self.self is defined }}"),
            "True");
  EXPECT_EQ(
      render("{% macro again(n) %}{{ n }}{% if n > 0 %}{{ again(n - 1) }}{% endif %}{% endmacro %}"
             "{{ again(3) }}"),
      "3210");
}

TEST(JinjaValue, FloatsPrintLikePythonRepr) {
  EXPECT_EQ(format_float(1.0), "1.0");
  EXPECT_EQ(format_float(-0.0), "-0.0");
  EXPECT_EQ(format_float(1e16), "1e+16");
  EXPECT_EQ(format_float(123456789012345.0), "123456789012345.0");
  EXPECT_EQ(format_float(1.5e-5), "1.5e-05");
  EXPECT_EQ(format_float(0.0001), "0.0001");
  EXPECT_EQ(format_float(1e100), "1e+100");
  EXPECT_EQ(format_float(2.5), "2.5");
}

TEST(JinjaValue, JsonKeepsKeyOrder) {
  const auto json =
      nlohmann::ordered_json::parse(R"({"z": 1, "a": [true, null, "x"], "m": {"k": 2.5}})");
  EXPECT_EQ(to_json_text(Value::from_json(json), JsonOptions{}),
            R"({"z": 1, "a": [true, null, "x"], "m": {"k": 2.5}})");
}

}  // namespace
}  // namespace dspark::jinja
