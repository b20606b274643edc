#include "constrain/grammar.h"

#include <gtest/gtest.h>

#include <string>

#include "base/error.h"
#include "constrain/grammar_rules.h"

namespace dspark::constrain {
namespace {

// Whether the grammar takes every byte of `text` (a prefix of some sentence).
bool takes(const std::shared_ptr<const Grammar>& grammar, std::string_view text) {
  Matcher matcher(grammar);
  for (char c : text) {
    if (!matcher.advance(static_cast<uint8_t>(c))) return false;
  }
  return true;
}

// Whether `text` is a whole sentence of the grammar.
bool accepts(const std::shared_ptr<const Grammar>& grammar, std::string_view text) {
  Matcher matcher(grammar);
  return matcher.advance(text) && matcher.complete();
}

TEST(GrammarTest, AlternativesSequencesAndEmpty) {
  GrammarBuilder builder;
  const uint32_t ab = builder.add("ab", {builder.literal("ab"), builder.literal("a"), {}});
  const uint32_t root = builder.add(
      "root", {{GrammarBuilder::rule(ab), builder.byte('x'), GrammarBuilder::rule(ab)}});
  auto grammar = builder.build(root);
  for (const char* text : {"x", "ax", "abx", "xa", "xab", "axab", "abxab"}) {
    EXPECT_TRUE(accepts(grammar, text)) << text;
  }
  for (const char* text : {"", "a", "ab", "b", "xb", "abab", "xx", "abxabx", "xaa"}) {
    EXPECT_FALSE(accepts(grammar, text)) << text;
  }
}

TEST(GrammarTest, RejectedByteLeavesMatcherUnchanged) {
  auto grammar = json_object_grammar();
  Matcher matcher(grammar);
  ASSERT_TRUE(matcher.advance(std::string_view("{\"a\": 1")));
  const Matcher before = matcher;
  EXPECT_FALSE(matcher.advance(static_cast<uint8_t>('x')));
  EXPECT_TRUE(matcher == before);
  EXPECT_FALSE(matcher.advance(std::string_view("}}")));
  EXPECT_TRUE(matcher == before);
  EXPECT_TRUE(matcher.advance(std::string_view("}")));
  EXPECT_TRUE(matcher.complete());
}

TEST(GrammarTest, LeftRecursionIsAnError) {
  GrammarBuilder builder;
  const uint32_t list = builder.declare("list");
  builder.define(list, {{GrammarBuilder::rule(list), builder.byte('a')}, builder.literal("a")});
  try {
    builder.build(list);
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("list is left-recursive"), std::string::npos);
  }
}

TEST(GrammarTest, UndefinedRuleIsAnError) {
  GrammarBuilder builder;
  const uint32_t missing = builder.declare("missing");
  const uint32_t root = builder.add("root", {{GrammarBuilder::rule(missing)}});
  EXPECT_THROW(builder.build(root), Error);
}

TEST(GrammarTest, RightRecursionKeepsTheStateBounded) {
  // A long repetition must not grow the state: the text 'aaaa...' reaches one state.
  GrammarBuilder builder;
  const uint32_t many = builder.declare("many");
  builder.define(many, {{builder.byte('a'), GrammarBuilder::rule(many)}, {}});
  auto grammar = builder.build(many);
  Matcher matcher(grammar);
  ASSERT_TRUE(matcher.advance(static_cast<uint8_t>('a')));
  const Matcher after_one = matcher;
  for (int i = 0; i < 1000; ++i) ASSERT_TRUE(matcher.advance(static_cast<uint8_t>('a')));
  EXPECT_TRUE(matcher == after_one);
  EXPECT_EQ(matcher.hash(), after_one.hash());
}

TEST(JsonObjectGrammarTest, AcceptsObjectsInJsonDumpsLayout) {
  auto grammar = json_object_grammar();
  for (const char* text :
       {"{}", "{\"a\": 1}", "{\"a\": 1, \"b\": [1, 2]}", "{\"\": \"\"}",
        "{\"a\": {\"b\": {\"c\": [[], {}, [[1]], null, true, false]}}}",
        "{\"n\": -0.5e+3, \"m\": 0, \"k\": 10.25E-7, \"z\": -0, \"e\": 1e5}",
        "{\"s\": \"\\\" \\\\ \\/ \\b \\f \\n \\r \\t \\u00e9 \\uD83D\\uDE00\"}",
        "{\"utf8\": \"\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80 \xED\x9F\xBF \xF4\x8F\xBF\xBF\"}"}) {
    EXPECT_TRUE(accepts(grammar, text)) << text;
  }
}

TEST(JsonObjectGrammarTest, RejectsOtherLayoutsAndInvalidJson) {
  auto grammar = json_object_grammar();
  for (const char* text : {"[]",
                           "1",
                           "\"a\"",
                           "{ }",
                           "{\"a\":1}",
                           "{\"a\" : 1}",
                           "{\"a\": 1,}",
                           "{\"a\": 1,\"b\": 2}",
                           "{\"a\":  1}",
                           " {}",
                           "{}\n",
                           "{\"a\": [1,2]}",
                           "{\"a\": [1 ]}",
                           "{\"a\": 01}",
                           "{\"a\": -}",
                           "{\"a\": 1.}",
                           "{\"a\": .5}",
                           "{\"a\": 1e}",
                           "{\"a\": +1}",
                           "{\"a\": tru}",
                           "{\"a\": True}",
                           "{\"a\": \"\\x\"}",
                           "{\"a\": \"\\u12G4\"}",
                           "{\"a\": \"\t\"}",
                           "{\"a\": \"\\uDE00\"}",
                           "{\"a\": \"\\uD83D\"}",
                           "{\"a\": \"\\uD83Dx\"}",
                           "{1: 2}",
                           "{\"a\": 1}}",
                           "{\"a\"}",
                           "{\"a\": [1, 2,]}"}) {
    EXPECT_FALSE(accepts(grammar, text)) << text;
  }
}

TEST(JsonObjectGrammarTest, RejectsMalformedUtf8) {
  auto grammar = json_object_grammar();
  const std::string open = "{\"a\": \"";
  for (const std::string bad :
       {"\xC0\xAF", "\xC1\xBF", "\xE0\x80\xAF", "\xED\xA0\x80", "\xF0\x80\x80\xAF",
        "\xF4\x90\x80\x80", "\xF5\x80\x80\x80", "\xFF", "\x80", "\xC3\x28", "\xE2\x82\x28"}) {
    EXPECT_FALSE(takes(grammar, open + bad)) << testing::PrintToString(bad);
  }
  // A prefix may stop inside a multi-byte character; the string may not end there.
  for (const std::string partial : {"\xC3", "\xE2", "\xE2\x82", "\xF0\x9F", "\xF0\x9F\x98"}) {
    EXPECT_TRUE(takes(grammar, open + partial)) << testing::PrintToString(partial);
    EXPECT_FALSE(takes(grammar, open + partial + "\"")) << testing::PrintToString(partial);
  }
}

TEST(JsonObjectGrammarTest, CompleteAndCanContinue) {
  auto grammar = json_object_grammar();
  Matcher matcher(grammar);
  EXPECT_FALSE(matcher.complete());
  EXPECT_TRUE(matcher.can_continue());
  ASSERT_TRUE(matcher.advance(std::string_view("{\"a\": 12")));
  EXPECT_FALSE(matcher.complete());
  EXPECT_TRUE(matcher.can_continue());
  // The number may go on or end here; each of its continuations is open.
  for (const char* next : {"3", ".", "e", "E", ",", "}"}) {
    Matcher copy = matcher;
    EXPECT_TRUE(copy.advance(std::string_view(next))) << next;
  }
  ASSERT_TRUE(matcher.advance(std::string_view("}")));
  EXPECT_TRUE(matcher.complete());
  EXPECT_FALSE(matcher.can_continue());
  EXPECT_FALSE(matcher.advance(static_cast<uint8_t>(' ')));
}

TEST(JsonObjectGrammarTest, SamePositionGivesEqualMatchers) {
  auto grammar = json_object_grammar();
  Matcher first(grammar), second(grammar);
  ASSERT_TRUE(first.advance(std::string_view("{\"a\": \"hello")));
  ASSERT_TRUE(second.advance(std::string_view("{\"bcd\": \"x\\n\xC3\xA9")));
  EXPECT_TRUE(first == second);
  EXPECT_EQ(first.hash(), second.hash());

  Matcher third(grammar), fourth(grammar);
  ASSERT_TRUE(third.advance(std::string_view("{\"a\": [1, 2], \"b\": 3")));
  ASSERT_TRUE(fourth.advance(std::string_view("{\"x\": {}, \"y\": 4")));
  EXPECT_TRUE(third == fourth);
  EXPECT_EQ(third.hash(), fourth.hash());

  // Different nesting depths are different positions.
  Matcher shallow(grammar), deep(grammar);
  ASSERT_TRUE(shallow.advance(std::string_view("{\"a\": \"x")));
  ASSERT_TRUE(deep.advance(std::string_view("{\"a\": [\"x")));
  EXPECT_FALSE(shallow == deep);
  EXPECT_TRUE(shallow == first);
}

TEST(JsonObjectGrammarTest, CopiesAdvanceIndependently) {
  auto grammar = json_object_grammar();
  Matcher original(grammar);
  ASSERT_TRUE(original.advance(std::string_view("{\"a\": ")));
  Matcher copy = original;
  ASSERT_TRUE(copy.advance(std::string_view("1}")));
  EXPECT_TRUE(copy.complete());
  EXPECT_FALSE(original.complete());
  ASSERT_TRUE(original.advance(std::string_view("[]}")));
  EXPECT_TRUE(original.complete());
  Matcher moved = std::move(copy);
  EXPECT_TRUE(moved.complete());
  copy = original;
  EXPECT_TRUE(copy == original);
}

TEST(JsonObjectGrammarTest, DeepNesting) {
  auto grammar = json_object_grammar();
  std::string text = "{\"a\": ";
  for (int i = 0; i < 200; ++i) text += "[{\"b\": ";
  text += "1";
  // The deepest point keeps hundreds of stack entries: copies and comparisons must hold there too.
  Matcher deep(grammar);
  ASSERT_TRUE(deep.advance(std::string_view(text)));
  const Matcher copy = deep;
  EXPECT_TRUE(copy == deep);
  EXPECT_EQ(copy.hash(), deep.hash());
  ASSERT_TRUE(deep.advance(std::string_view("}]")));
  EXPECT_FALSE(copy == deep);
  for (int i = 0; i < 200; ++i) text += "}]";
  EXPECT_TRUE(accepts(grammar, text + "}"));
  EXPECT_FALSE(accepts(grammar, text));
  EXPECT_FALSE(accepts(grammar, text + "]}"));
}

}  // namespace
}  // namespace dspark::constrain
