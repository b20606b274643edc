// A request's JSON Schema is untrusted input: nesting is bounded by a clear error (not a stack
// overflow), compiling is linear in the schema's size, and a time/size budget stops it.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "../error_of.h"
#include "base/error.h"
#include "constrain/grammar.h"

namespace dspark::constrain {
namespace {

using nlohmann::json;

// {"type":"object","properties":{"a":{...}}} nested `depth` levels, built as text and parsed
// (nlohmann parses and destroys without recursing).
json nested_properties(int depth) {
  std::string text;
  for (int i = 0; i < depth; ++i) text += R"({"type": "object", "properties": {"a": )";
  text += R"({"type": "string"})";
  for (int i = 0; i < depth; ++i) text += "}}";
  return json::parse(text);
}

// prefix + i (written out: GCC 12's -Wrestrict misfires on "literal" + std::to_string).
std::string numbered(const char* prefix, int i) {
  std::string name = prefix;
  name += std::to_string(i);
  return name;
}

using testing::error_of;

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

TEST(SchemaLimits, NestingPastTheLimitIsAClearErrorAndFast) {
  const json schema = nested_properties(50000);
  const auto start = std::chrono::steady_clock::now();
  const std::string message = error_of([&] { json_schema_grammar(schema); });
  const double seconds = seconds_since(start);
  std::string pointer = "#";
  for (int i = 0; i < 64; ++i) pointer += "/properties/a";
  EXPECT_EQ(message, "JSON schema nested deeper than 64 at " + pointer);
  std::printf("depth 50000 schema refused in %.4f s\n", seconds);
  // The issue's figure: depth 4000 took 12 s to compile before the limit.
  const json depth_4000 = nested_properties(4000);
  const auto start_4000 = std::chrono::steady_clock::now();
  EXPECT_NE(error_of([&] { json_schema_grammar(depth_4000); }).find("nested deeper than 64"),
            std::string::npos);
  std::printf("depth 4000 schema refused in %.4f s\n", seconds_since(start_4000));
}

TEST(SchemaLimits, DeepAnyOfItemsAndRefChainsAreBoundedToo) {
  std::string any_of;
  for (int i = 0; i < 20000; ++i) any_of += R"({"anyOf": [)";
  any_of += R"({"type": "null"})";
  for (int i = 0; i < 20000; ++i) any_of += "]}";
  EXPECT_NE(error_of([&] {
              json_schema_grammar(json::parse(any_of));
            }).find("JSON schema nested deeper than 64 at #/anyOf/0/anyOf/0"),
            std::string::npos);
  std::string items;
  for (int i = 0; i < 20000; ++i) items += R"({"type": "array", "items": )";
  items += "true";
  for (int i = 0; i < 20000; ++i) items += "}";
  EXPECT_NE(error_of([&] {
              json_schema_grammar(json::parse(items));
            }).find("JSON schema nested deeper than 64 at #/items/items"),
            std::string::npos);
  json chain = {{"$ref", "#/$defs/d0"}, {"$defs", json::object()}};
  for (int i = 0; i < 1000; ++i) {
    chain["$defs"][numbered("d", i)] = {{"$ref", numbered("#/$defs/d", i + 1)}};
  }
  chain["$defs"]["d1000"] = {{"type", "integer"}};
  EXPECT_NE(error_of([&] { json_schema_grammar(chain); }).find("JSON schema nested deeper than 64"),
            std::string::npos);
  std::string deep_value;
  for (int i = 0; i < 50000; ++i) deep_value += "[";
  for (int i = 0; i < 50000; ++i) deep_value += "]";
  EXPECT_TRUE(json_nested_deeper_than(json::parse(deep_value), 64));
  EXPECT_FALSE(json_nested_deeper_than(json::parse("[[[1], {\"a\": []}]]"), 4));
  EXPECT_TRUE(json_nested_deeper_than(json::parse("[[[1], {\"a\": []}]]"), 3));
  EXPECT_EQ(error_of([&] { json_schema_grammar(json::parse(R"({"const": )" + deep_value + "}")); }),
            "JSON schema at #/const: a value nested deeper than 64");
  EXPECT_EQ(
      error_of([&] { json_schema_grammar(json::parse(R"({"enum": [)" + deep_value + "]}")); }),
      "JSON schema at #/enum: a value nested deeper than 64");
}

TEST(SchemaLimits, DepthAtTheLimitCompilesAndMatches) {
  const json schema = nested_properties(63);
  const auto start = std::chrono::steady_clock::now();
  const auto grammar = json_schema_grammar(schema);
  const double seconds = seconds_since(start);
  std::string text;
  for (int i = 0; i < 63; ++i) text += R"({"a": )";
  text += R"("x")";
  for (int i = 0; i < 63; ++i) text += "}";
  Matcher matcher(grammar);
  EXPECT_TRUE(matcher.advance(text) && matcher.complete());
  std::printf("depth 63 schema compiled in %.4f s\n", seconds);
}

TEST(SchemaLimits, WideSchemasCompileAndTooManyOptionalPropertiesAreRefused) {
  auto wide = [](int properties, bool required) {
    json schema = {{"type", "object"}, {"properties", json::object()}};
    for (int i = 0; i < properties; ++i) {
      schema["properties"][numbered("p", i)] = {{"type", "string"}, {"maxLength", 8}};
      if (required) schema["required"].push_back(numbered("p", i));
    }
    return schema;
  };
  auto time = [&](int properties, bool required) {
    const json schema = wide(properties, required);
    const auto start = std::chrono::steady_clock::now();
    EXPECT_NE(json_schema_grammar(schema, CompileBudget{}), nullptr);
    return seconds_since(start);
  };
  // Timings are printed, not asserted, and the compiles run without the default 5 s deadline: a
  // sanitizer build on a busy machine is many times slower. The 300-rule refusal bounds them.
  const double small = time(250, true), large = time(1000, true);
  const double optional = time(256, false);
  std::printf("wide schema: 250 required properties %.4f s, 1000 %.4f s; 256 optional %.4f s\n",
              small, large, optional);
  EXPECT_EQ(error_of([&] { json_schema_grammar(wide(300, false)); }),
            "JSON schema at #/properties: 300 optional properties; at most 256 are supported");
}

TEST(SchemaLimits, BudgetDeadlineCancellationAndRuleCountAreEnforced) {
  json schema = {{"type", "object"}, {"properties", json::object()}};
  for (int i = 0; i < 300; ++i) {
    schema["properties"][numbered("p", i)] = {{"type", "string"}, {"maxLength", 1000}};
    schema["required"].push_back(numbered("p", i));
  }
  EXPECT_EQ(error_of([&] { json_schema_grammar(schema); }),
            "JSON schema grammar size limit: the schema unrolls into more than 200000 rules");
  CompileBudget past;
  past.deadline = std::chrono::steady_clock::now() - std::chrono::seconds(1);
  EXPECT_EQ(error_of([&] {
              json_schema_grammar(json{{"type", "string"}}, past);
            }),
            "JSON schema compilation time limit: the compile ran past its deadline");
  CompileBudget cancel;
  cancel.cancelled = [] { return true; };
  EXPECT_EQ(error_of([&] {
              json_schema_grammar(json{{"type", "string"}}, cancel);
            }),
            "JSON schema compilation was cancelled");
  CompileBudget shallow;
  shallow.max_depth = 2;
  EXPECT_EQ(error_of([&] { json_schema_grammar(nested_properties(2), shallow); }),
            "JSON schema nested deeper than 2 at #/properties/a/properties/a");
}

}  // namespace
}  // namespace dspark::constrain
