#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"
#include "constrain/grammar.h"

namespace dspark::constrain {
namespace {

using nlohmann::json;

bool accepts(const std::shared_ptr<const Grammar>& grammar, std::string_view text) {
  Matcher matcher(grammar);
  return matcher.advance(text) && matcher.complete();
}

std::shared_ptr<const Grammar> schema_grammar(std::string_view schema) {
  return json_schema_grammar(json::parse(schema));
}

// nlohmann's compact dump turned into json.dumps' layout by a space after every ',' and ':'
// outside strings (a different route from the grammar's own serializer).
std::string python_layout(const json& value) {
  const std::string compact = value.dump();
  std::string text;
  bool in_string = false, escaped = false;
  for (char c : compact) {
    text += c;
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == ',' || c == ':') {
      text += ' ';
    }
  }
  return text;
}

void expect_error_naming(std::string_view schema, const std::vector<std::string>& parts) {
  try {
    json_schema_grammar(json::parse(schema));
    ADD_FAILURE() << "no error for " << schema;
  } catch (const Error& error) {
    for (const std::string& part : parts) {
      EXPECT_NE(std::string(error.what()).find(part), std::string::npos)
          << error.what() << " should name " << part;
    }
  }
}

TEST(JsonSchemaTest, ScalarTypes) {
  auto string = schema_grammar(R"({"type": "string"})");
  EXPECT_TRUE(accepts(string, "\"\""));
  EXPECT_TRUE(accepts(string, "\"a\\u00e9\xC3\xA9\""));
  EXPECT_FALSE(accepts(string, "1"));

  auto number = schema_grammar(R"({"type": "number"})");
  for (const char* text : {"0", "-0", "12", "-0.5e+3", "1.25", "3E7", "1e-0", "10"}) {
    EXPECT_TRUE(accepts(number, text)) << text;
  }
  for (const char* text : {"01", "-01", "00", "1.", ".5", "-", "1e", "1e+", "+1", "1.5.2", "0x1"}) {
    EXPECT_FALSE(accepts(number, text)) << text;
  }

  auto integer = schema_grammar(R"({"type": "integer"})");
  for (const char* text : {"0", "-7", "1234567890"}) EXPECT_TRUE(accepts(integer, text)) << text;
  for (const char* text : {"1.0", "1e3", "01", "-0.5"})
    EXPECT_FALSE(accepts(integer, text)) << text;

  auto boolean = schema_grammar(R"({"type": "boolean"})");
  EXPECT_TRUE(accepts(boolean, "true"));
  EXPECT_TRUE(accepts(boolean, "false"));
  EXPECT_FALSE(accepts(boolean, "null"));

  auto either = schema_grammar(R"({"type": ["integer", "null"]})");
  EXPECT_TRUE(accepts(either, "null"));
  EXPECT_TRUE(accepts(either, "-3"));
  EXPECT_FALSE(accepts(either, "\"x\""));
}

TEST(JsonSchemaTest, CompleteAndCanContinueAtTopLevel) {
  Matcher number(schema_grammar(R"({"type": "number"})"));
  ASSERT_TRUE(number.advance(std::string_view("-")));
  EXPECT_FALSE(number.complete());
  ASSERT_TRUE(number.advance(std::string_view("12")));
  EXPECT_TRUE(number.complete());
  EXPECT_TRUE(number.can_continue());
  ASSERT_TRUE(number.advance(std::string_view("e")));
  EXPECT_FALSE(number.complete());
  ASSERT_TRUE(number.advance(std::string_view("+3")));
  EXPECT_TRUE(number.complete());

  Matcher zero(schema_grammar(R"({"type": "integer"})"));
  ASSERT_TRUE(zero.advance(std::string_view("0")));
  EXPECT_TRUE(zero.complete());
  EXPECT_FALSE(zero.can_continue());

  Matcher literal(schema_grammar(R"({"enum": ["ab", "abc"]})"));
  ASSERT_TRUE(literal.advance(std::string_view("\"ab")));
  EXPECT_FALSE(literal.complete());
  EXPECT_TRUE(literal.can_continue());
  Matcher shorter = literal;
  ASSERT_TRUE(shorter.advance(std::string_view("\"")));
  EXPECT_TRUE(shorter.complete());
  EXPECT_FALSE(shorter.can_continue());
  ASSERT_TRUE(literal.advance(std::string_view("c\"")));
  EXPECT_TRUE(literal.complete());
  EXPECT_FALSE(literal.can_continue());
}

TEST(JsonSchemaTest, NumberEndsBeforeSeparators) {
  auto grammar = schema_grammar(
      R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "number"}},
          "required": ["a"]})");
  Matcher matcher(grammar);
  ASSERT_TRUE(matcher.advance(std::string_view("{\"a\": 12")));
  EXPECT_TRUE(Matcher(matcher).advance(std::string_view(", \"b\": 1}")));
  EXPECT_TRUE(Matcher(matcher).advance(std::string_view("}")));
  EXPECT_FALSE(Matcher(matcher).advance(std::string_view(".5")));
  EXPECT_FALSE(Matcher(matcher).advance(std::string_view(",}")));
}

TEST(JsonSchemaTest, PropertiesInOrderWithAnySubsetOfOptionals) {
  auto grammar = schema_grammar(R"({
    "type": "object",
    "properties": {"id": {"type": "integer"}, "name": {"type": "string"},
                   "tags": {"type": "array", "items": {"type": "string"}}},
    "required": ["name"]})");
  // nlohmann::json keeps keys sorted, so "declared order" here is id, name, tags.
  for (const char* text :
       {R"({"name": "x"})", R"({"id": 1, "name": "x"})", R"({"name": "x", "tags": []})",
        R"({"id": 1, "name": "x", "tags": ["a", "b"]})"}) {
    EXPECT_TRUE(accepts(grammar, text)) << text;
  }
  for (const char* text : {"{}", R"({"id": 1})", R"({"name": "x", "id": 1})",
                           R"({"tags": [], "name": "x"})", R"({"name": "x", "other": 1})",
                           R"({"name": "x",})", R"({, "name": "x"})", R"({"id": 1 "name": "x"})",
                           R"({"name": 1})", R"({"name": "x", "name": "y"})", R"({"name":"x"})"}) {
    EXPECT_FALSE(accepts(grammar, text)) << text;
  }
}

TEST(JsonSchemaTest, OrderedJsonKeepsTheDeclaredPropertyOrder) {
  auto grammar = json_schema_grammar(nlohmann::ordered_json::parse(R"({
    "properties": {"zeta": {"type": "integer"}, "alpha": {"const": {"y": 1, "x": 2}}},
    "required": ["zeta", "alpha"]})"));
  EXPECT_TRUE(accepts(grammar, R"({"zeta": 1, "alpha": {"y": 1, "x": 2}})"));
  EXPECT_FALSE(accepts(grammar, R"({"alpha": {"y": 1, "x": 2}, "zeta": 1})"));
  EXPECT_FALSE(accepts(grammar, R"({"zeta": 1, "alpha": {"x": 2, "y": 1}})"));
}

TEST(JsonSchemaTest, AllOptionalPropertiesSharingKeyPrefixes) {
  auto grammar = schema_grammar(R"({
    "properties": {"a": {"type": "integer"}, "ab": {"type": "integer"},
                   "abc": {"type": "string"}}})");
  const std::vector<std::string> members{"\"a\": 1", "\"ab\": 2", "\"abc\": \"s\""};
  for (int subset = 0; subset < 8; ++subset) {
    std::string text = "{";
    bool first = true;
    for (int i = 0; i < 3; ++i) {
      if (!(subset & (1 << i))) continue;
      if (!first) text += ", ";
      first = false;
      text += members[i];
    }
    text += "}";
    EXPECT_TRUE(accepts(grammar, text)) << text;
  }
  EXPECT_FALSE(accepts(grammar, R"({"abc": "s", "a": 1})"));
  EXPECT_FALSE(accepts(grammar, R"({"ab": "s"})"));
  EXPECT_FALSE(accepts(grammar, R"({"abcd": 1})"));
  EXPECT_FALSE(accepts(grammar, R"({"a": 1,})"));

  // The matcher holds several readings of `{"a` at once; each resolves on later bytes.
  Matcher matcher(grammar);
  ASSERT_TRUE(matcher.advance(std::string_view("{\"a")));
  EXPECT_TRUE(Matcher(matcher).advance(std::string_view("\": 1}")));
  EXPECT_TRUE(Matcher(matcher).advance(std::string_view("b\": 1}")));
  EXPECT_TRUE(Matcher(matcher).advance(std::string_view("bc\": \"\"}")));
  EXPECT_FALSE(Matcher(matcher).advance(std::string_view("bc\": 1")));
}

TEST(JsonSchemaTest, AdditionalProperties) {
  auto closed = schema_grammar(R"({"type": "object", "properties": {"a": {"type": "integer"}}})");
  EXPECT_TRUE(accepts(closed, "{}"));
  EXPECT_TRUE(accepts(closed, R"({"a": 1})"));
  EXPECT_FALSE(accepts(closed, R"({"a": 1, "b": 2})"));

  auto open = schema_grammar(R"({"type": "object", "properties": {"a": {"type": "integer"}},
                                 "additionalProperties": true})");
  for (const char* text :
       {"{}", R"({"a": 1})", R"({"a": 1, "b": [true]})", R"({"b": {}})", R"({"b": 1, "c": "x"})"}) {
    EXPECT_TRUE(accepts(open, text)) << text;
  }
  EXPECT_FALSE(accepts(open, R"({"a": 1, "b": 2,})"));
  EXPECT_FALSE(accepts(open, R"({"a": 1 "b": 2})"));

  auto typed = schema_grammar(R"({"type": "object", "additionalProperties": {"type": "integer"}})");
  EXPECT_TRUE(accepts(typed, R"({"x": 1, "y": 2})"));
  EXPECT_FALSE(accepts(typed, R"({"x": "1"})"));

  auto any_object = schema_grammar(R"({"type": "object"})");
  EXPECT_TRUE(accepts(any_object, R"({"x": [1, {"y": null}]})"));
  EXPECT_FALSE(accepts(any_object, "[]"));
}

TEST(JsonSchemaTest, ArraysWithBounds) {
  auto bounded = schema_grammar(
      R"({"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 3})");
  EXPECT_FALSE(accepts(bounded, "[]"));
  EXPECT_FALSE(accepts(bounded, "[1]"));
  EXPECT_TRUE(accepts(bounded, "[1, 2]"));
  EXPECT_TRUE(accepts(bounded, "[1, 2, 3]"));
  EXPECT_FALSE(accepts(bounded, "[1, 2, 3, 4]"));
  EXPECT_FALSE(accepts(bounded, "[1, \"2\"]"));
  EXPECT_FALSE(accepts(bounded, "[1,2]"));

  auto at_most_one = schema_grammar(R"({"type": "array", "maxItems": 1})");
  EXPECT_TRUE(accepts(at_most_one, "[]"));
  EXPECT_TRUE(accepts(at_most_one, "[{\"a\": []}]"));
  EXPECT_FALSE(accepts(at_most_one, "[1, 2]"));

  auto at_least_one = schema_grammar(R"({"items": {"type": "boolean"}, "minItems": 1})");
  EXPECT_FALSE(accepts(at_least_one, "[]"));
  EXPECT_TRUE(accepts(at_least_one, "[true, false, true]"));

  auto empty_only = schema_grammar(R"({"type": "array", "maxItems": 0})");
  EXPECT_TRUE(accepts(empty_only, "[]"));
  EXPECT_FALSE(accepts(empty_only, "[1]"));
}

TEST(JsonSchemaTest, StringLengthCountsCharacters) {
  auto grammar = schema_grammar(R"({"type": "string", "minLength": 2, "maxLength": 3})");
  EXPECT_FALSE(accepts(grammar, "\"a\""));
  EXPECT_TRUE(accepts(grammar, "\"ab\""));
  EXPECT_TRUE(accepts(grammar, "\"\xC3\xA9\\n\xF0\x9F\x98\x80\""));
  EXPECT_FALSE(accepts(grammar, "\"abcd\""));
  EXPECT_TRUE(accepts(schema_grammar(R"({"minLength": 1})"), "\"abcdefgh\""));
}

TEST(JsonSchemaTest, EnumAndConstAreExact) {
  auto grammar = schema_grammar(R"({"enum": ["red", 1, null, {"x": [1, 2], "y": "z"}, 2.5]})");
  for (const char* text : {"\"red\"", "1", "null", R"({"x": [1, 2], "y": "z"})", "2.5"}) {
    EXPECT_TRUE(accepts(grammar, text)) << text;
  }
  for (const char* text : {"\"re\"", "\"redd\"", "10", "1.0", R"({"x":[1,2],"y":"z"})",
                           R"({"y": "z", "x": [1, 2]})", "2.50", "true"}) {
    EXPECT_FALSE(accepts(grammar, text)) << text;
  }
  auto typed_enum = schema_grammar(R"({"type": "string", "enum": ["a", 1]})");
  EXPECT_TRUE(accepts(typed_enum, "\"a\""));
  EXPECT_FALSE(accepts(typed_enum, "1"));

  auto constant = schema_grammar(R"({"const": "caf\u00e9 \"q\""})");
  EXPECT_TRUE(accepts(constant, "\"caf\xC3\xA9 \\\"q\\\"\""));
  EXPECT_FALSE(accepts(constant, "\"caf\\u00e9 \\\"q\\\"\""));
}

TEST(JsonSchemaTest, AnyOfAndOneOf) {
  auto grammar = schema_grammar(R"({"anyOf": [{"type": "integer"}, {"type": "string",
                                    "maxLength": 1}, {"type": "number"}]})");
  EXPECT_TRUE(accepts(grammar, "5"));
  EXPECT_TRUE(accepts(grammar, "5.5"));
  EXPECT_TRUE(accepts(grammar, "\"x\""));
  EXPECT_FALSE(accepts(grammar, "\"xy\""));
  EXPECT_FALSE(accepts(grammar, "null"));

  auto one_of = schema_grammar(R"({"properties": {"v": {"oneOf": [{"type": "null"},
                                   {"type": "array", "items": {"type": "null"}}]}},
                                   "required": ["v"]})");
  EXPECT_TRUE(accepts(one_of, R"({"v": null})"));
  EXPECT_TRUE(accepts(one_of, R"({"v": [null, null]})"));
  EXPECT_FALSE(accepts(one_of, R"({"v": 1})"));
}

TEST(JsonSchemaTest, RecursiveReferences) {
  auto grammar = schema_grammar(R"({
    "$defs": {"node": {"type": "object",
                       "properties": {"value": {"type": "integer"},
                                      "children": {"type": "array",
                                                   "items": {"$ref": "#/$defs/node"}}},
                       "required": ["children", "value"]}},
    "$ref": "#/$defs/node"})");
  EXPECT_TRUE(accepts(grammar, R"({"children": [], "value": 1})"));
  EXPECT_TRUE(accepts(
      grammar,
      R"({"children": [{"children": [{"children": [], "value": 3}], "value": 2}], "value": 1})"));
  EXPECT_FALSE(accepts(grammar, R"({"children": [{"value": 2}], "value": 1})"));

  auto root_recursion = schema_grammar(R"({"type": "array", "items": {"$ref": "#"}})");
  EXPECT_TRUE(accepts(root_recursion, "[[], [[]]]"));
  EXPECT_FALSE(accepts(root_recursion, "[1]"));

  auto definitions = schema_grammar(R"({"definitions": {"a/b": {"type": "null"}},
                                        "items": {"$ref": "#/definitions/a~1b"}})");
  EXPECT_TRUE(accepts(definitions, "[null]"));

  expect_error_naming(R"({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"})",
                      {"#/$defs/a", "left-recursive"});
  expect_error_naming(R"({"$ref": "#/$defs/missing"})", {"#/$defs/missing"});
  expect_error_naming(R"({"$ref": "http://example.com/schema"})", {"http://example.com/schema"});
}

TEST(JsonSchemaTest, EmptySchemaIsAnyValue) {
  for (const char* schema : {"{}", "true", R"({"title": "t", "description": "d"})"}) {
    auto grammar = schema_grammar(schema);
    for (const char* text : {"1", "\"s\"", "[1, {}]", "{\"a\": null}", "false"}) {
      EXPECT_TRUE(accepts(grammar, text)) << schema << " " << text;
    }
    EXPECT_FALSE(accepts(grammar, "[1,2]"));
  }
}

TEST(JsonSchemaTest, UnsupportedKeywordsNameKeywordAndPointer) {
  expect_error_naming(R"({"properties": {"a": {"type": "string", "pattern": "^a"}}})",
                      {"pattern", "#/properties/a"});
  expect_error_naming(R"({"type": "string", "format": "date-time"})", {"format", "#"});
  expect_error_naming(R"({"allOf": [{}]})", {"allOf"});
  expect_error_naming(R"({"not": {}})", {"not"});
  expect_error_naming(R"({"if": {}, "then": {}})", {"if"});
  expect_error_naming(R"({"type": "object", "patternProperties": {}})", {"patternProperties"});
  expect_error_naming(R"({"items": {"type": "number", "minimum": 0}})", {"minimum", "#/items"});
  expect_error_naming(R"({"type": "date"})", {"date", "#/type"});
  expect_error_naming(R"({"type": "array", "maxItems": 100000})", {"maxItems"});
  expect_error_naming(R"({"type": "array", "minItems": 3, "maxItems": 2})",
                      {"minItems > maxItems"});
  expect_error_naming(
      R"({"properties": {"s": {"type": "string", "minLength": 5, "maxLength": 2}}})",
      {"minLength > maxLength", "#/properties/s"});
  expect_error_naming(R"({"type": "object", "anyOf": [{}]})", {"anyOf", "type"});
  expect_error_naming(R"({"properties": {"a": {}}, "required": ["b"]})", {"required", "\"b\""});
  expect_error_naming(R"({"properties": {"a": false}})", {"#/properties/a"});
}

// A deterministic generator of JSON values that exercise the whole grammar.
class ValueGenerator {
 public:
  explicit ValueGenerator(uint32_t seed) : random_(seed) {}

  json value(int depth) {
    switch (pick(depth > 0 ? 9 : 6)) {
      case 0:
        return string();
      case 1:
        return static_cast<int64_t>(random_()) - (int64_t{1} << 31);
      case 2:
        return std::ldexp(static_cast<double>(random_()) - 2e9, static_cast<int>(pick(80)) - 40);
      case 3:
        return pick(2) == 0;
      case 4:
        return nullptr;
      case 5:
        return static_cast<int>(pick(10));
      case 6:
      case 7: {
        json object = json::object();
        for (uint32_t i = pick(4); i > 0; --i) object[string()] = value(depth - 1);
        return object;
      }
      default: {
        json array = json::array();
        for (uint32_t i = pick(4); i > 0; --i) array.push_back(value(depth - 1));
        return array;
      }
    }
  }

  json object(int depth) {
    json object = json::object();
    for (uint32_t i = pick(5); i > 0; --i) object[string()] = value(depth);
    return object;
  }

  uint32_t pick(uint32_t n) { return random_() % n; }

 private:
  std::string string() {
    std::string text;
    for (uint32_t i = pick(6); i > 0; --i) {
      uint32_t code;
      switch (pick(5)) {
        case 0:
          code = pick(0x20);  // control characters, written as escapes
          break;
        case 1:
          code = "\"\\/ az"[pick(6)];
          break;
        case 2:
          code = 0x80 + pick(0x800 - 0x80);
          break;
        case 3:
          code = 0x800 + pick(0x10000 - 0x800);
          if (code >= 0xD800 && code < 0xE000) code -= 0x800;
          break;
        default:
          code = 0x10000 + pick(0x110000 - 0x10000);
      }
      append_utf8(text, code);
    }
    return text;
  }

  static void append_utf8(std::string& text, uint32_t code) {
    if (code < 0x80) {
      text += static_cast<char>(code);
    } else if (code < 0x800) {
      text += static_cast<char>(0xC0 | (code >> 6));
      text += static_cast<char>(0x80 | (code & 0x3F));
    } else if (code < 0x10000) {
      text += static_cast<char>(0xE0 | (code >> 12));
      text += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
      text += static_cast<char>(0x80 | (code & 0x3F));
    } else {
      text += static_cast<char>(0xF0 | (code >> 18));
      text += static_cast<char>(0x80 | ((code >> 12) & 0x3F));
      text += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
      text += static_cast<char>(0x80 | (code & 0x3F));
    }
  }

  std::mt19937 random_;
};

// Canonical dumps of generated values are accepted; whatever nlohmann's parser rejects after a
// one-byte change (replace, insert or delete) the grammar rejects too.
void cross_check(const std::shared_ptr<const Grammar>& grammar, bool objects_only, uint32_t seed) {
  ValueGenerator generator(seed);
  const std::string interesting = std::string("{}[]\",: 0123456789-+.eEtfnul\\/bu\x7f") +
                                  "\x80\xBF\xC2\xC3\xE0\xED\xF0\xF4\xFF" + std::string(1, '\0');
  int rejected_mutations = 0;
  for (int round = 0; round < 300; ++round) {
    const json value = objects_only ? generator.object(3) : generator.value(3);
    const std::string text = python_layout(value);
    ASSERT_TRUE(accepts(grammar, text)) << text;
    for (int mutation = 0; mutation < 20; ++mutation) {
      std::string changed = text;
      const size_t at = generator.pick(static_cast<uint32_t>(text.size()));
      const char byte = interesting[generator.pick(static_cast<uint32_t>(interesting.size()))];
      switch (generator.pick(3)) {
        case 0:
          changed[at] = byte;
          break;
        case 1:
          changed.insert(changed.begin() + at, byte);
          break;
        default:
          changed.erase(at, 1);
      }
      bool valid = true;
      try {
        const json parsed = json::parse(changed);
        valid = !objects_only || parsed.is_object();
      } catch (const json::parse_error&) {
        valid = false;
      } catch (const json::out_of_range&) {
        continue;  // a number too large for a double: valid JSON syntax all the same
      }
      if (!valid) {
        ++rejected_mutations;
        EXPECT_FALSE(accepts(grammar, changed)) << "original " << text << "\nchanged  " << changed;
      }
    }
  }
  EXPECT_GT(rejected_mutations, 1000);
}

TEST(JsonCrossCheckTest, JsonObjectGrammarAgreesWithNlohmann) {
  cross_check(json_object_grammar(), true, 1);
}

TEST(JsonCrossCheckTest, AnyValueSchemaAgreesWithNlohmann) {
  cross_check(schema_grammar("{}"), false, 2);
}

}  // namespace
}  // namespace dspark::constrain
