// A model's chat template is untrusted input: self-calling macros, deep nesting, nested loops and
// string doubling end in an error naming the limit, quickly, instead of a crash, a hang or
// running out of memory.
#include <gtest/gtest.h>

#include <chrono>

#include "text/jinja_template.h"

namespace dspark::jinja {
namespace {

// The error of parsing and rendering `source`, and how long that took.
struct Outcome {
  std::string error = "no error";
  double seconds = 0.0;
};

Outcome run(const std::string& source, const RenderLimits& limits = {}) {
  const auto start = std::chrono::steady_clock::now();
  Outcome outcome;
  try {
    Template(source, "t").render(Dict(), limits);
  } catch (const dspark::Error& e) {
    outcome.error = e.what();
  }
  outcome.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return outcome;
}

TEST(JinjaLimits, SelfCallingMacroHitsTheRecursionLimit) {
  const Outcome outcome = run("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  EXPECT_EQ(outcome.error, "t line 1: jinja: recursion limit: more than 64 nested macro calls");
}

TEST(JinjaLimits, MutualRecursionThroughCallerHitsTheRecursionLimit) {
  const Outcome outcome =
      run("{% macro a() %}{% call b() %}x{% endcall %}{% endmacro %}"
          "{% macro b() %}{{ caller() }}{{ a() }}{% endmacro %}{{ a() }}");
  EXPECT_EQ(outcome.error, "t line 1: jinja: recursion limit: more than 64 nested macro calls");
}

TEST(JinjaLimits, DeepButBoundedRecursionStillRenders) {
  EXPECT_EQ(Template("{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ n }}{% endif %}{% endmacro %}"
                     "{{ f(50) | length }}",
                     "t")
                .render(Dict()),
            "91");
}

TEST(JinjaLimits, NestedRangeLoopsHitTheIterationLimit) {
  const Outcome outcome =
      run("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}");
  EXPECT_EQ(outcome.error,
            "t line 1: jinja: loop iteration limit: more than 1000000 loop iterations in one "
            "render");
  // The refusal itself shows the loops are bounded (about 1 s in a release build; no time is
  // asserted: a sanitizer build on a busy machine takes many times longer).
  std::printf("nested range(100000) loops refused after %.2f s\n", outcome.seconds);
  RenderLimits small;
  small.max_loop_iterations = 1000;
  EXPECT_EQ(
      run("{% for i in range(40) %}{% for j in range(30) %}{% endfor %}{% endfor %}", small).error,
      "t line 1: jinja: loop iteration limit: more than 1000 loop iterations in one render");
}

TEST(JinjaLimits, StringDoublingHitsTheStringSizeLimit) {
  const Outcome outcome =
      run("{% set ns = namespace(s='ab') %}{% for i in range(100) %}{% set ns.s = ns.s ~ ns.s %}"
          "{% endfor %}{{ ns.s }}");
  EXPECT_EQ(outcome.error,
            "t line 1: jinja: string size limit: a value of 67108864 bytes (the limit is "
            "33554432)");
  std::printf("string doubling refused after %.2f s\n", outcome.seconds);
}

TEST(JinjaLimits, StringAndListRepetitionAreRefusedBeforeAllocating) {
  const Outcome text = run("{{ 'x' * 1000000000000 }}");
  EXPECT_EQ(text.error,
            "t line 1: jinja: string size limit: repetition would make 33554433 bytes (the "
            "limit is 33554432)");
  EXPECT_NE(run("{{ (['x' * 1000000] * 1000000) | length }}").error.find("string size limit"),
            std::string::npos);
  EXPECT_NE(run("{{ 'x' | center(1000000000) }}").error.find("string size limit: center"),
            std::string::npos);
  EXPECT_NE(run("{{ 'x'.ljust(1000000000) }}").error.find("string size limit: padding"),
            std::string::npos);
  EXPECT_NE(run("{{ ('x' * 1000000).replace('x', 'y' * 1000) }}")
                .error.find("string size limit: replace"),
            std::string::npos);
}

TEST(JinjaLimits, OutputIsBoundedToo) {
  RenderLimits small;
  small.max_string_bytes = 1000;
  EXPECT_EQ(run("{% for i in range(200) %}{{ 'abcdef' }}{% endfor %}", small).error,
            "t line 1: jinja: output size limit: the rendered text passed 1000 bytes");
}

TEST(JinjaLimits, DeeplyNestedSourceIsRefusedByTheParser) {
  const std::string brackets = std::string(50000, '(') + "1" + std::string(50000, ')');
  const Outcome parens = run("{{ " + brackets + " }}");
  EXPECT_EQ(parens.error,
            "t line 1: nesting limit: brackets, expressions or blocks nested deeper than 128");
  const Outcome lists = run("{{ " + std::string(50000, '[') + std::string(50000, ']') + " }}");
  EXPECT_EQ(lists.error,
            "t line 1: nesting limit: brackets, expressions or blocks nested deeper than 128");
  const Outcome nots = run("{{ " + [] {
    std::string s;
    for (int i = 0; i < 50000; ++i) s += "not ";
    return s;
  }() + "1 }}");
  EXPECT_EQ(nots.error,
            "t line 1: nesting limit: brackets, expressions or blocks nested deeper than 128");
  std::string ifs;
  for (int i = 0; i < 50000; ++i) ifs += "{% if true %}";
  EXPECT_EQ(run(ifs).error,
            "t line 1: nesting limit: brackets, expressions or blocks nested deeper than 128");
  std::string chain = "{{ 1";
  for (int i = 0; i < 100000; ++i) chain += " + 1";
  const Outcome sum = run(chain + " }}");
  EXPECT_EQ(sum.error,
            "t line 1: nesting limit: an expression nested deeper than 128 (a chain of operators, "
            "filters or calls)");
  std::string filters = "{{ 'a'";
  for (int i = 0; i < 100000; ++i) filters += " | string";
  EXPECT_NE(run(filters + " }}").error.find("nesting limit: an expression nested deeper"),
            std::string::npos);
  // Printed, not asserted: a sanitizer build on a busy machine takes many times longer.
  std::printf("50000-deep sources refused in %.2f s\n",
              parens.seconds + lists.seconds + nots.seconds + sum.seconds);
}

TEST(JinjaLimits, DeeplyNestedValuesAreRefused) {
  EXPECT_EQ(run("{% set ns = namespace(x=[]) %}{% for i in range(100000) %}{% set ns.x = [ns.x] "
                "%}{% endfor %}{{ ns.x }}")
                .error,
            "t line 1: jinja: value nesting limit: lists, dicts and namespaces nested deeper than "
            "256");
  // A namespace holding itself prints without recursing forever.
  EXPECT_NE(run("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}")
                .error.find("value nesting limit"),
            std::string::npos);
}

}  // namespace
}  // namespace dspark::jinja
