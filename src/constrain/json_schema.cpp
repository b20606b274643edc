// JSON grammars in Python json.dumps layout: the rules for any JSON value, and a compiler from
// JSON Schema to rules.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "base/error.h"
#include "constrain/grammar.h"
#include "constrain/grammar_rules.h"

namespace dspark::constrain {
namespace {

using nlohmann::json;

constexpr uint64_t kUnbounded = std::numeric_limits<uint64_t>::max();
// Bounds unroll into one rule per count; this keeps a hostile schema from building a huge grammar.
constexpr uint64_t kMaxBound = 1000;
// Optional properties: after each member, any later optional one may come next, so the grammar's
// expansions grow with the square of their count (and its solver recurses along them).
constexpr size_t kMaxOptionalProperties = 256;

// `value` written the way json.dumps writes it: ", " between items, ": " after keys.
template <typename Json>
std::string dumps(const Json& value) {
  if (value.is_object()) {
    std::string text = "{";
    bool first = true;
    for (const auto& [key, item] : value.items()) {
      if (!first) text += ", ";
      first = false;
      text += Json(key).dump() + ": " + dumps(item);
    }
    return text + "}";
  }
  if (value.is_array()) {
    std::string text = "[";
    for (size_t i = 0; i < value.size(); ++i) {
      if (i > 0) text += ", ";
      text += dumps(value[i]);
    }
    return text + "]";
  }
  return value.dump();
}

// The rules every JSON grammar shares, made once per builder.
class JsonRules {
 public:
  explicit JsonRules(GrammarBuilder& builder) : b_(builder) {
    value_ = b_.declare("value");
    object_ = b_.declare("object");
    array_ = b_.declare("array");
    character_ = make_character();
    characters_ = b_.declare("characters");
    b_.define(characters_,
              {{GrammarBuilder::rule(character_), GrammarBuilder::rule(characters_)}, {}});
    string_ =
        b_.add("string",
               {concat({b_.literal("\""), {GrammarBuilder::rule(characters_)}, b_.literal("\"")})});
    digits_ = b_.declare("digits");
    b_.define(digits_, {{b_.byte_range('0', '9'), GrammarBuilder::rule(digits_)}, {}});
    const uint32_t natural = b_.add(
        "natural", {b_.literal("0"), {b_.byte_range('1', '9'), GrammarBuilder::rule(digits_)}});
    const uint32_t sign = b_.add("sign", {b_.literal("-"), {}});
    integer_ = b_.add("integer", {{GrammarBuilder::rule(sign), GrammarBuilder::rule(natural)}});
    const uint32_t fraction = b_.add(
        "fraction", {{b_.byte('.'), b_.byte_range('0', '9'), GrammarBuilder::rule(digits_)}, {}});
    const uint32_t exponent_sign = b_.add("exponent_sign", {b_.literal("+"), b_.literal("-"), {}});
    const uint32_t exponent =
        b_.add("exponent", {{b_.bytes(byte_set_of("eE")), GrammarBuilder::rule(exponent_sign),
                             b_.byte_range('0', '9'), GrammarBuilder::rule(digits_)},
                            {}});
    number_ = b_.add("number", {{GrammarBuilder::rule(integer_), GrammarBuilder::rule(fraction),
                                 GrammarBuilder::rule(exponent)}});
    boolean_ = b_.add("boolean", {b_.literal("true"), b_.literal("false")});
    null_ = b_.add("null", {b_.literal("null")});

    b_.define(value_, {{GrammarBuilder::rule(object_)},
                       {GrammarBuilder::rule(array_)},
                       {GrammarBuilder::rule(string_)},
                       {GrammarBuilder::rule(number_)},
                       {GrammarBuilder::rule(boolean_)},
                       {GrammarBuilder::rule(null_)}});
    const uint32_t member = b_.add("member", {concat({{GrammarBuilder::rule(string_)},
                                                      b_.literal(": "),
                                                      {GrammarBuilder::rule(value_)}})});
    b_.define(object_, {concat({b_.literal("{"),
                                {GrammarBuilder::rule(list(member, "members"))},
                                b_.literal("}")})});
    b_.define(array_, {concat({b_.literal("["),
                               {GrammarBuilder::rule(list(value_, "items"))},
                               b_.literal("]")})});
  }

  static Sequence concat(std::vector<Sequence> parts) {
    Sequence sequence;
    for (const Sequence& part : parts) sequence.insert(sequence.end(), part.begin(), part.end());
    return sequence;
  }

  // Zero or more `item`s separated by ", ".
  uint32_t list(uint32_t item, const std::string& name) {
    const uint32_t rest = b_.declare(name + "_rest");
    b_.define(
        rest,
        {concat({b_.literal(", "), {GrammarBuilder::rule(item), GrammarBuilder::rule(rest)}}), {}});
    return b_.add(name, {{GrammarBuilder::rule(item), GrammarBuilder::rule(rest)}, {}});
  }

  // A string of min_length..max_length characters (code points, an escape counting as one).
  uint32_t string(uint64_t min_length, uint64_t max_length) {
    if (min_length == 0 && max_length == kUnbounded) return string_;
    Sequence body = b_.literal("\"");
    for (uint64_t i = 0; i < min_length; ++i) body.push_back(GrammarBuilder::rule(character_));
    if (max_length == kUnbounded) {
      body.push_back(GrammarBuilder::rule(characters_));
    } else {
      uint32_t optional = b_.add("no_more_characters", {{}});
      for (uint64_t i = min_length; i < max_length; ++i) {
        if (on_rule_) on_rule_();
        optional = b_.add("up_to_characters",
                          {{GrammarBuilder::rule(character_), GrammarBuilder::rule(optional)}, {}});
      }
      body.push_back(GrammarBuilder::rule(optional));
    }
    body.push_back(b_.byte('"'));
    return b_.add("bounded_string", {body});
  }

  // Called before each rule a bounded string unrolls, so the compile budget can stop it.
  void on_rule(std::function<void()> callback) { on_rule_ = std::move(callback); }

  uint32_t value() const { return value_; }
  uint32_t object() const { return object_; }
  uint32_t array() const { return array_; }
  uint32_t string() const { return string_; }
  uint32_t number() const { return number_; }
  uint32_t integer() const { return integer_; }
  uint32_t boolean() const { return boolean_; }
  uint32_t null() const { return null_; }

 private:
  // One character of a JSON string's body: an unescaped UTF-8 character other than '"', '\' and
  // controls, or an escape. \u escapes must pair surrogates so every string decodes to Unicode.
  uint32_t make_character() {
    auto range = [&](uint8_t first, uint8_t last) { return b_.byte_range(first, last); };
    ByteSet plain{};
    for (unsigned c = 0x20; c < 0x80; ++c) {
      if (c != '"' && c != '\\') plain[c >> 6] |= uint64_t{1} << (c & 63);
    }
    ByteSet hex{};
    for (unsigned c = 0; c < 0x80; ++c) {
      if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')) {
        hex[c >> 6] |= uint64_t{1} << (c & 63);
      }
    }
    const Element h = b_.bytes(hex);
    const Element d = b_.bytes(byte_set_of("Dd"));
    const uint32_t unicode =
        b_.add("unicode_escape", {{b_.bytes(byte_set_of("0123456789ABCabc")), h, h, h},
                                  {d, b_.bytes(byte_set_of("01234567")), h, h},
                                  {b_.bytes(byte_set_of("EFef")), h, h, h},
                                  concat({{d, b_.bytes(byte_set_of("89ABab")), h, h},
                                          b_.literal("\\u"),
                                          {d, b_.bytes(byte_set_of("CDEFcdef")), h, h}})});
    const Element tail = range(0x80, 0xBF);
    return b_.add("character", {{b_.bytes(plain)},
                                {b_.byte('\\'), b_.bytes(byte_set_of("\"\\/bfnrt"))},
                                {b_.byte('\\'), b_.byte('u'), GrammarBuilder::rule(unicode)},
                                {range(0xC2, 0xDF), tail},
                                {b_.byte(0xE0), range(0xA0, 0xBF), tail},
                                {range(0xE1, 0xEC), tail, tail},
                                {b_.byte(0xED), range(0x80, 0x9F), tail},
                                {range(0xEE, 0xEF), tail, tail},
                                {b_.byte(0xF0), range(0x90, 0xBF), tail, tail},
                                {range(0xF1, 0xF3), tail, tail, tail},
                                {b_.byte(0xF4), range(0x80, 0x8F), tail, tail}});
  }

  GrammarBuilder& b_;
  std::function<void()> on_rule_;
  uint32_t value_, object_, array_, character_, characters_, string_, digits_, integer_, number_,
      boolean_, null_;
};

std::string escape_pointer_token(const std::string& token) {
  std::string escaped;
  for (char c : token) {
    if (c == '~') {
      escaped += "~0";
    } else if (c == '/') {
      escaped += "~1";
    } else {
      escaped += c;
    }
  }
  return escaped;
}

std::string unescape_pointer_token(const std::string& token) {
  std::string unescaped;
  for (size_t i = 0; i < token.size(); ++i) {
    if (token[i] == '~' && i + 1 < token.size() && (token[i + 1] == '0' || token[i + 1] == '1')) {
      unescaped += token[i + 1] == '0' ? '~' : '/';
      ++i;
    } else {
      unescaped += token[i];
    }
  }
  return unescaped;
}

const std::set<std::string>& annotation_keywords() {
  static const std::set<std::string> keywords{
      "title",    "description", "default",  "examples",  "$schema", "$id",        "strict",
      "$comment", "deprecated",  "readOnly", "writeOnly", "$defs",   "definitions"};
  return keywords;
}

const std::set<std::string>& supported_keywords() {
  static const std::set<std::string> keywords{
      "type",      "properties", "required", "additionalProperties",
      "items",     "minItems",   "maxItems", "enum",
      "const",     "anyOf",      "oneOf",    "$ref",
      "minLength", "maxLength"};
  return keywords;
}

// Whether `value` nests arrays and objects deeper than `limit`, found without recursing (the value
// may be nested far deeper than the stack allows).
template <typename Json>
bool nested_deeper_than(const Json& value, int limit) {
  std::vector<std::pair<const Json*, int>> pending{{&value, 0}};
  while (!pending.empty()) {
    const auto [node, depth] = pending.back();
    pending.pop_back();
    if (!node->is_structured()) continue;
    if (depth + 1 > limit) return true;
    for (const auto& item : *node) pending.emplace_back(&item, depth + 1);
  }
  return false;
}

// Json: nlohmann::json, or nlohmann::ordered_json to keep the order `properties` lists.
template <typename Json>
class SchemaCompiler {
 public:
  SchemaCompiler(const Json& root, GrammarBuilder& builder, JsonRules& rules,
                 const CompileBudget& budget)
      : root_(root), b_(builder), rules_(rules), budget_(budget) {}

  uint32_t compile(const Json& schema, const std::string& pointer) {
    if (depth_ >= budget_.max_depth) {
      fail("JSON schema nested deeper than {} at {}", budget_.max_depth, pointer);
    }
    ++depth_;
    const uint32_t rule = compile_unbounded(schema, pointer);
    --depth_;
    return rule;
  }

  // Throws once the budget's deadline passed, it was cancelled or the grammar grew too big.
  void check_budget() const {
    if (b_.rule_count() > budget_.max_rules) {
      fail("JSON schema grammar size limit: the schema unrolls into more than {} rules",
           budget_.max_rules);
    }
    if (budget_.cancelled && budget_.cancelled()) {
      fail("JSON schema compilation was cancelled");
    }
    if (std::chrono::steady_clock::now() > budget_.deadline) {
      fail("JSON schema compilation time limit: the compile ran past its deadline");
    }
  }

 private:
  uint32_t compile_unbounded(const Json& schema, const std::string& pointer) {
    check_budget();
    if (schema.is_boolean()) {
      if (!schema.template get<bool>())
        fail("JSON schema at {} is false: no value matches it", pointer);
      return rules_.value();
    }
    if (!schema.is_object()) fail("JSON schema at {} must be an object or a boolean", pointer);
    std::vector<std::string> constraints;
    for (const auto& [key, unused] : schema.items()) {
      if (annotation_keywords().count(key)) continue;
      if (!supported_keywords().count(key)) {
        fail("JSON schema keyword \"{}\" at {} is not supported", key, pointer);
      }
      constraints.push_back(key);
    }
    for (const char* combinator : {"$ref", "anyOf", "oneOf", "enum", "const"}) {
      if (!schema.contains(combinator)) continue;
      const bool typed_values =
          std::string_view(combinator) == "enum" || std::string_view(combinator) == "const";
      for (const std::string& other : constraints) {
        if (other != combinator && !(typed_values && other == "type")) {
          fail("JSON schema at {}: \"{}\" next to \"{}\" is not supported", pointer, combinator,
               other);
        }
      }
    }
    if (schema.contains("$ref")) return reference(schema["$ref"], pointer);
    if (schema.contains("anyOf")) return any_of(schema["anyOf"], pointer + "/anyOf");
    if (schema.contains("oneOf")) return any_of(schema["oneOf"], pointer + "/oneOf");
    const std::vector<std::string> types = declared_types(schema, pointer);
    if (schema.contains("const")) {
      if (nested_deeper_than(schema["const"], budget_.max_depth)) {
        fail("JSON schema at {}/const: a value nested deeper than {}", pointer, budget_.max_depth);
      }
      return enumeration(Json::array({schema["const"]}), types, pointer + "/const");
    }
    if (schema.contains("enum")) return enumeration(schema["enum"], types, pointer + "/enum");
    std::vector<Sequence> alternatives;
    for (const std::string& type : types) {
      alternatives.push_back({GrammarBuilder::rule(typed(type, schema, pointer))});
    }
    if (alternatives.empty()) return rules_.value();
    return b_.add(pointer, std::move(alternatives));
  }

 private:
  // The types `type` names, or the one the keywords imply; empty for any value.
  static std::vector<std::string> declared_types(const Json& schema, const std::string& pointer) {
    std::vector<std::string> types;
    if (schema.contains("type")) {
      const Json& type = schema["type"];
      if (type.is_string()) {
        types.push_back(type.template get<std::string>());
      } else if (type.is_array() && !type.empty()) {
        for (const Json& item : type) {
          if (!item.is_string()) fail("JSON schema at {}/type: types must be strings", pointer);
          types.push_back(item.template get<std::string>());
        }
      } else {
        fail("JSON schema at {}/type must be a type name or a list of them", pointer);
      }
    } else if (schema.contains("properties") || schema.contains("required") ||
               schema.contains("additionalProperties")) {
      types.push_back("object");
    } else if (schema.contains("items") || schema.contains("minItems") ||
               schema.contains("maxItems")) {
      types.push_back("array");
    } else if (schema.contains("minLength") || schema.contains("maxLength")) {
      types.push_back("string");
    }
    static const std::set<std::string> known{"string", "number", "integer", "boolean",
                                             "null",   "object", "array"};
    for (const std::string& type : types) {
      if (!known.count(type)) fail("JSON schema at {}/type: unknown type \"{}\"", pointer, type);
    }
    return types;
  }

  static bool has_type(const Json& value, const std::string& type) {
    if (type == "string") return value.is_string();
    if (type == "number") return value.is_number();
    if (type == "integer") {
      return value.is_number_integer() ||
             (value.is_number_float() &&
              value.template get<double>() == std::floor(value.template get<double>()));
    }
    if (type == "boolean") return value.is_boolean();
    if (type == "null") return value.is_null();
    if (type == "object") return value.is_object();
    if (type == "array") return value.is_array();
    return false;
  }

  uint32_t typed(const std::string& type, const Json& schema, const std::string& pointer) {
    if (type == "string") {
      const uint64_t min_length = bound(schema, "minLength", pointer, 0);
      const uint64_t max_length = bound(schema, "maxLength", pointer, kUnbounded);
      // No string satisfies it: refused like minItems > maxItems, not met by one that breaks it.
      if (min_length > max_length) fail("JSON schema at {}: minLength > maxLength", pointer);
      return rules_.string(min_length, max_length);
    }
    if (type == "number") return rules_.number();
    if (type == "integer") return rules_.integer();
    if (type == "boolean") return rules_.boolean();
    if (type == "null") return rules_.null();
    if (type == "object") return object(schema, pointer);
    return array(schema, pointer);
  }

  static uint64_t bound(const Json& schema, const char* keyword, const std::string& pointer,
                        uint64_t absent) {
    if (!schema.contains(keyword)) return absent;
    const Json& value = schema[keyword];
    if (!value.is_number_integer() || value.template get<int64_t>() < 0) {
      fail("JSON schema at {}/{} must be a non-negative integer", pointer, keyword);
    }
    const uint64_t bound = value.template get<uint64_t>();
    if (bound > kMaxBound) {
      fail("JSON schema at {}/{} is {}; at most {} is supported", pointer, keyword, bound,
           kMaxBound);
    }
    return bound;
  }

  uint32_t reference(const Json& target, const std::string& pointer) {
    if (!target.is_string()) fail("JSON schema at {}/$ref must be a string", pointer);
    const std::string ref = target.template get<std::string>();
    if (auto found = references_.find(ref); found != references_.end()) return found->second;
    const Json* schema = nullptr;
    if (ref == "#") {
      schema = &root_;
    } else {
      for (const char* container : {"#/$defs/", "#/definitions/"}) {
        const std::string prefix = container;
        if (ref.rfind(prefix, 0) != 0) continue;
        const std::string token = ref.substr(prefix.size());
        const std::string name = unescape_pointer_token(token);
        const std::string key = prefix.substr(2, prefix.size() - 3);
        if (token.find('/') == std::string::npos && root_.contains(key) && root_[key].is_object() &&
            root_[key].contains(name)) {
          schema = &root_[key][name];
        }
      }
    }
    if (schema == nullptr) {
      fail(
          "JSON schema at {}/$ref: \"{}\" is not a reference to #/$defs/NAME or "
          "#/definitions/NAME in this schema",
          pointer, ref);
    }
    const uint32_t id = b_.declare(ref);
    references_[ref] = id;
    b_.define(id, {{GrammarBuilder::rule(compile(*schema, ref))}});
    return id;
  }

  uint32_t any_of(const Json& branches, const std::string& pointer) {
    if (!branches.is_array() || branches.empty()) {
      fail("JSON schema at {} must be a non-empty array", pointer);
    }
    std::vector<Sequence> alternatives;
    for (size_t i = 0; i < branches.size(); ++i) {
      alternatives.push_back(
          {GrammarBuilder::rule(compile(branches[i], pointer + "/" + std::to_string(i)))});
    }
    return b_.add(pointer, std::move(alternatives));
  }

  // The listed values (those of the declared types), each written exactly as Json.dumps would.
  uint32_t enumeration(const Json& values, const std::vector<std::string>& types,
                       const std::string& pointer) {
    if (!values.is_array() || values.empty()) {
      fail("JSON schema at {} must be a non-empty array", pointer);
    }
    if (nested_deeper_than(values, budget_.max_depth)) {
      fail("JSON schema at {}: a value nested deeper than {}", pointer, budget_.max_depth);
    }
    std::vector<Sequence> alternatives;
    for (const Json& value : values) {
      const bool typed = types.empty() || std::any_of(types.begin(), types.end(), [&](auto& type) {
                           return has_type(value, type);
                         });
      if (typed) alternatives.push_back(b_.literal(dumps(value)));
    }
    if (alternatives.empty()) fail("JSON schema at {}: no value has the schema's type", pointer);
    return b_.add(pointer, std::move(alternatives));
  }

  uint32_t object(const Json& schema, const std::string& pointer) {
    const bool has_properties = schema.contains("properties");
    if (has_properties && !schema["properties"].is_object()) {
      fail("JSON schema at {}/properties must be an object", pointer);
    }
    static const Json no_properties = Json::object();
    const Json& properties = has_properties ? schema["properties"] : no_properties;
    std::set<std::string> required;
    if (schema.contains("required")) {
      const Json& names = schema["required"];
      if (!names.is_array()) fail("JSON schema at {}/required must be an array", pointer);
      for (const Json& name : names) {
        if (!name.is_string()) fail("JSON schema at {}/required must list strings", pointer);
        required.insert(name.template get<std::string>());
      }
    }
    // Without "properties" an object schema means any object, as JSON Schema has it; with them,
    // a missing additionalProperties means false (OpenAI strict mode).
    std::optional<uint32_t> extra_value;
    if (schema.contains("additionalProperties")) {
      const Json& additional = schema["additionalProperties"];
      if (!(additional.is_boolean() && !additional.template get<bool>())) {
        extra_value = compile(additional, pointer + "/additionalProperties");
      }
    } else if (!has_properties) {
      extra_value = rules_.value();
    }
    for (const std::string& name : required) {
      if (!properties.contains(name)) {
        fail("JSON schema at {}/required: \"{}\" is not among the properties", pointer, name);
      }
    }
    if (properties.size() - required.size() > kMaxOptionalProperties) {
      fail("JSON schema at {}/properties: {} optional properties; at most {} are supported",
           pointer, properties.size() - required.size(), kMaxOptionalProperties);
    }

    // first[i] / rest[i]: the members from property i on, before / after a member was written
    // (only the latter start with ", ").
    const size_t count = properties.size();
    std::vector<uint32_t> first(count + 1), rest(count + 1);
    for (size_t i = 0; i <= count; ++i) {
      first[i] = b_.declare(pointer + "/members");
      rest[i] = b_.declare(pointer + "/more_members");
    }
    if (extra_value) {
      const uint32_t extra_member =
          b_.add(pointer + "/additional_member",
                 {JsonRules::concat({{GrammarBuilder::rule(rules_.string())},
                                     b_.literal(": "),
                                     {GrammarBuilder::rule(*extra_value)}})});
      b_.define(rest[count], {JsonRules::concat({b_.literal(", "),
                                                 {GrammarBuilder::rule(extra_member),
                                                  GrammarBuilder::rule(rest[count])}}),
                              {}});
      b_.define(first[count],
                {{GrammarBuilder::rule(extra_member), GrammarBuilder::rule(rest[count])}, {}});
    } else {
      b_.define(rest[count], {{}});
      b_.define(first[count], {{}});
    }
    size_t i = 0;
    for (const auto& [name, property_schema] : properties.items()) {
      const std::string property_pointer = pointer + "/properties/" + escape_pointer_token(name);
      const uint32_t member =
          b_.add(property_pointer,
                 {JsonRules::concat(
                     {b_.literal(Json(name).dump() + ": "),
                      {GrammarBuilder::rule(compile(property_schema, property_pointer))}})});
      std::vector<Sequence> first_alternatives{
          {GrammarBuilder::rule(member), GrammarBuilder::rule(rest[i + 1])}};
      std::vector<Sequence> rest_alternatives{JsonRules::concat(
          {b_.literal(", "), {GrammarBuilder::rule(member), GrammarBuilder::rule(rest[i + 1])}})};
      if (!required.count(name)) {
        first_alternatives.push_back({GrammarBuilder::rule(first[i + 1])});
        rest_alternatives.push_back({GrammarBuilder::rule(rest[i + 1])});
      }
      b_.define(first[i], std::move(first_alternatives));
      b_.define(rest[i], std::move(rest_alternatives));
      ++i;
    }
    return b_.add(
        pointer,
        {JsonRules::concat({b_.literal("{"), {GrammarBuilder::rule(first[0])}, b_.literal("}")})});
  }

  uint32_t array(const Json& schema, const std::string& pointer) {
    if (schema.contains("items") && schema["items"].is_array()) {
      fail("JSON schema at {}/items: a list of item schemas is not supported", pointer);
    }
    const uint32_t item =
        schema.contains("items") ? compile(schema["items"], pointer + "/items") : rules_.value();
    const uint64_t min_items = bound(schema, "minItems", pointer, 0);
    const uint64_t max_items = bound(schema, "maxItems", pointer, kUnbounded);
    if (min_items > max_items) fail("JSON schema at {}: minItems > maxItems", pointer);
    // more: the items after the first, at least `needed` more and at most `allowed` more.
    const auto more = [&](uint64_t needed, uint64_t allowed) {
      uint32_t tail;
      if (allowed == kUnbounded) {
        tail = b_.declare(pointer + "/more_items");
        b_.define(tail,
                  {JsonRules::concat({b_.literal(", "),
                                      {GrammarBuilder::rule(item), GrammarBuilder::rule(tail)}}),
                   {}});
      } else {
        tail = b_.add(pointer + "/no_more_items", {{}});
        for (uint64_t k = needed; k < allowed; ++k) {
          check_budget();
          tail =
              b_.add(pointer + "/more_items",
                     {JsonRules::concat({b_.literal(", "),
                                         {GrammarBuilder::rule(item), GrammarBuilder::rule(tail)}}),
                      {}});
        }
      }
      for (uint64_t k = 0; k < needed; ++k) {
        check_budget();
        tail =
            b_.add(pointer + "/more_items",
                   {JsonRules::concat({b_.literal(", "),
                                       {GrammarBuilder::rule(item), GrammarBuilder::rule(tail)}})});
      }
      return tail;
    };
    std::vector<Sequence> alternatives;
    if (min_items == 0) alternatives.push_back(b_.literal("[]"));
    if (max_items > 0) {
      const uint64_t needed = min_items > 0 ? min_items - 1 : 0;
      const uint64_t allowed = max_items == kUnbounded ? kUnbounded : max_items - 1;
      alternatives.push_back(JsonRules::concat(
          {b_.literal("["),
           {GrammarBuilder::rule(item), GrammarBuilder::rule(more(needed, allowed))},
           b_.literal("]")}));
    }
    return b_.add(pointer, std::move(alternatives));
  }

  const Json& root_;
  GrammarBuilder& b_;
  JsonRules& rules_;
  const CompileBudget& budget_;
  int depth_ = 0;
  std::map<std::string, uint32_t> references_;
};

}  // namespace

std::shared_ptr<const Grammar> json_object_grammar() {
  static const std::shared_ptr<const Grammar> grammar = [] {
    GrammarBuilder builder;
    JsonRules rules(builder);
    return builder.build(rules.object());
  }();
  return grammar;
}

namespace {

template <typename Json>
std::shared_ptr<const Grammar> compile_schema(const Json& schema, const CompileBudget& budget) {
  GrammarBuilder builder;
  JsonRules rules(builder);
  SchemaCompiler<Json> compiler(schema, builder, rules, budget);
  rules.on_rule([&] { compiler.check_budget(); });
  const uint32_t root = compiler.compile(schema, "#");
  compiler.check_budget();
  return builder.build(root, [&] { compiler.check_budget(); });
}

}  // namespace

bool json_nested_deeper_than(const nlohmann::json& value, int limit) {
  return nested_deeper_than(value, limit);
}

bool json_nested_deeper_than(const nlohmann::ordered_json& value, int limit) {
  return nested_deeper_than(value, limit);
}

CompileBudget default_compile_budget() {
  CompileBudget budget;
  budget.deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  return budget;
}

std::shared_ptr<const Grammar> json_schema_grammar(const nlohmann::json& schema) {
  return compile_schema(schema, default_compile_budget());
}

std::shared_ptr<const Grammar> json_schema_grammar(const nlohmann::ordered_json& schema) {
  return compile_schema(schema, default_compile_budget());
}

std::shared_ptr<const Grammar> json_schema_grammar(const nlohmann::json& schema,
                                                   const CompileBudget& budget) {
  return compile_schema(schema, budget);
}

std::shared_ptr<const Grammar> json_schema_grammar(const nlohmann::ordered_json& schema,
                                                   const CompileBudget& budget) {
  return compile_schema(schema, budget);
}

}  // namespace dspark::constrain
