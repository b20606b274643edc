#pragma once
// The values a Jinja template computes with, modelled on the Python objects that jinja2 renders:
// None, bool, int, float, str (optionally "safe" markup), list, tuple, one-shot iterators
// (jinja2's generators), dict (insertion-ordered, string keys), namespace, callables and
// Undefined. Lists and dicts are immutable once built (transformers renders templates in
// jinja2's ImmutableSandboxedEnvironment, where mutating methods are refused), so they are shared
// by pointer; namespaces are the one mutable object and are shared by reference, as in Python.
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace dspark::jinja {

class Value;

// Python's sequence flavours. kIterator stands for generators (filters such as select or map
// return them): iterable but without len() or indexing, and always truthy. The dict views are
// what dict.keys()/values()/items() return.
enum class SequenceKind { kList, kTuple, kIterator, kDictKeys, kDictValues, kDictItems };

struct Sequence;
class Dict;
struct Namespace;
struct Function;
struct CallArguments;

struct UndefinedValue {
  // The jinja2 message to raise when the value is used in a way Undefined refuses
  // (attribute access, arithmetic, calls), e.g. "'x' is undefined".
  std::string message;
};
struct NoneValue {};
struct StringValue {
  std::string text;
  bool markup = false;  // jinja2 Markup (from |safe, |escape); only matters for `+` escaping
};

class Value {
 public:
  enum class Kind {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kSequence,
    kDict,
    kNamespace,
    kFunction
  };

  Value() : data_(UndefinedValue{}) {}
  static Value undefined(std::string message) { return Value(UndefinedValue{std::move(message)}); }
  static Value none() { return Value(NoneValue{}); }
  static Value boolean(bool b) { return Value(b); }
  static Value integer(int64_t i) { return Value(i); }
  static Value floating(double d) { return Value(d); }
  static Value string(std::string text, bool markup = false) {
    return Value(StringValue{std::move(text), markup});
  }
  static Value sequence(SequenceKind kind, std::vector<Value> items);
  static Value list(std::vector<Value> items) {
    return sequence(SequenceKind::kList, std::move(items));
  }
  static Value tuple(std::vector<Value> items) {
    return sequence(SequenceKind::kTuple, std::move(items));
  }
  static Value dict(Dict dict);
  static Value namespace_object(Dict attributes);
  static Value function(std::string name, std::function<Value(const CallArguments&)> call);

  // JSON objects keep their key order (ordered_json), as Python's json.loads does.
  static Value from_json(const nlohmann::ordered_json& json);

  Kind kind() const { return static_cast<Kind>(data_.index()); }
  // Levels of lists, dicts and namespaces inside this value (0 for scalars). Building a value
  // deeper than kMaxValueNesting fails, so the recursive printers, comparisons and destructors
  // stay far from the stack's end.
  int nesting() const;
  bool is_undefined() const { return kind() == Kind::kUndefined; }
  bool is_none() const { return kind() == Kind::kNone; }
  bool is_bool() const { return kind() == Kind::kBool; }
  bool is_int() const { return kind() == Kind::kInt; }
  bool is_float() const { return kind() == Kind::kFloat; }
  // Python numbers; bool counts, as it subclasses int.
  bool is_number() const { return is_bool() || is_int() || is_float(); }
  bool is_string() const { return kind() == Kind::kString; }
  bool is_sequence() const { return kind() == Kind::kSequence; }
  bool is_dict() const { return kind() == Kind::kDict; }
  bool is_namespace() const { return kind() == Kind::kNamespace; }
  bool is_function() const { return kind() == Kind::kFunction; }

  const std::string& undefined_message() const { return std::get<UndefinedValue>(data_).message; }
  bool as_bool() const { return std::get<bool>(data_); }
  int64_t as_int() const { return std::get<int64_t>(data_); }
  double as_float() const { return std::get<double>(data_); }
  // bool and int as int (Python's int(True) == 1); only for is_bool() or is_int().
  int64_t integral() const { return is_bool() ? (as_bool() ? 1 : 0) : as_int(); }
  // Any number as a double.
  double numeric() const { return is_float() ? as_float() : static_cast<double>(integral()); }
  const std::string& as_string() const { return std::get<StringValue>(data_).text; }
  bool is_markup() const { return is_string() && std::get<StringValue>(data_).markup; }
  SequenceKind sequence_kind() const;
  const std::vector<Value>& items() const;
  const Dict& as_dict() const { return *std::get<DictPtr>(data_); }
  Namespace& as_namespace() const { return *std::get<NamespacePtr>(data_); }
  const Function& as_function() const { return *std::get<FunctionPtr>(data_); }

  // Python's type(x).__name__, for error messages.
  std::string type_name() const;
  // bool(x).
  bool truthy() const;

 private:
  using SequencePtr = std::shared_ptr<const Sequence>;
  using DictPtr = std::shared_ptr<const Dict>;
  using NamespacePtr = std::shared_ptr<Namespace>;
  using FunctionPtr = std::shared_ptr<const Function>;
  using Data = std::variant<UndefinedValue, NoneValue, bool, int64_t, double, StringValue,
                            SequencePtr, DictPtr, NamespacePtr, FunctionPtr>;
  template <typename T>
  explicit Value(T data) : data_(std::move(data)) {}

  friend bool same_object(const Value& a, const Value& b);
  Data data_;
};

constexpr int kMaxValueNesting = 256;

struct Sequence {
  SequenceKind kind = SequenceKind::kList;
  std::vector<Value> items;
  int nesting = 1;
};

// Insertion-ordered mapping with string keys (JSON objects and template dict literals).
class Dict {
 public:
  const Value* find(std::string_view key) const;
  void set(std::string key, Value value);
  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  const std::vector<std::pair<std::string, Value>>& entries() const { return entries_; }
  // 1 + the deepest value ever set (an upper bound once entries are replaced).
  int nesting() const { return nesting_; }

 private:
  std::vector<std::pair<std::string, Value>> entries_;
  int nesting_ = 1;
};

struct Namespace {
  Dict attributes;
};

struct CallArguments {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

struct Function {
  std::string name;
  std::function<Value(const CallArguments&)> call;
};

inline SequenceKind Value::sequence_kind() const {
  return std::get<SequencePtr>(data_)->kind;
}
inline const std::vector<Value>& Value::items() const {
  return std::get<SequencePtr>(data_)->items;
}
inline int Value::nesting() const {
  switch (kind()) {
    case Kind::kSequence:
      return std::get<SequencePtr>(data_)->nesting;
    case Kind::kDict:
      return std::get<DictPtr>(data_)->nesting();
    case Kind::kNamespace:
      return 1 + std::get<NamespacePtr>(data_)->attributes.nesting();
    default:
      return 0;
  }
}

// The largest string a render may build (rendered output, captured blocks, values). Checked
// before the operations that multiply sizes (repetition, padding, join, replace) allocate.
// StringLimit sets it for the renders on this thread while it lives.
size_t max_string_bytes();
void check_string_size(size_t bytes, std::string_view operation);
class StringLimit {
 public:
  explicit StringLimit(size_t bytes);
  ~StringLimit();
  StringLimit(const StringLimit&) = delete;
  StringLimit& operator=(const StringLimit&) = delete;

 private:
  size_t previous_;
};

// Python's `a is b` for the shared kinds, value equality for the scalar ones.
bool same_object(const Value& a, const Value& b);

// Python's ==.
bool equals(const Value& a, const Value& b);
// Python's <, raising TypeError's message for unorderable operands. Returns -1, 0 or 1.
int compare(const Value& a, const Value& b, std::string_view op);

// str(x) as jinja2 prints it ({{ x }}, ~, |string): Undefined prints as "".
std::string to_str(const Value& value);
// repr(x).
std::string to_repr(const Value& value);
// repr(float), the shortest text that reads back to the same double ("1.0", "1e-05", "inf").
std::string format_float(double value);

struct JsonOptions {
  bool ensure_ascii = false;
  std::optional<std::string> indent;  // newline + this per level; nullopt = one line
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool sort_keys = false;
};
// Python's json.dumps with the given options; fails for values JSON cannot hold.
std::string to_json_text(const Value& value, const JsonOptions& options);

}  // namespace dspark::jinja
