#pragma once
// The Python and jinja2 runtime behaviour that templates see: attribute and item access as
// jinja2's ImmutableSandboxedEnvironment performs it (including the str/dict/list methods and the
// refusal of mutating ones), operators with Python semantics, iteration, the built-in filters
// (with transformers' tojson) and tests, and the global functions.
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"
#include "text/jinja_value.h"

namespace dspark::jinja {

// The message of a template's raise_exception(message), thrown as is (no line prefix), so callers
// can report it to the user.
class TemplateRaisedError : public dspark::Error {
 public:
  explicit TemplateRaisedError(const std::string& message) : dspark::Error(message) {}
};

bool has_filter(std::string_view name);
bool has_test(std::string_view name);
Value apply_filter(const std::string& name, const Value& operand, const CallArguments& arguments);
bool apply_test(const std::string& name, const Value& operand, const CallArguments& arguments);

// jinja2's environment.getattr / getitem: obj.name, obj[key], obj[start:stop:step].
Value get_attribute(const Value& object, const std::string& name);
Value get_item(const Value& object, const Value& key);
Value get_slice(const Value& object, const Value& start, const Value& stop, const Value& step);
Value call(const Value& callee, const CallArguments& arguments);

// The items a for loop or a filter iterates over (dict keys, string characters, ...).
std::vector<Value> iterate(const Value& value);

// Python operators: + - * / // % ** on two values, unary - and +, and `item in container`.
Value binary_operation(std::string_view op, const Value& left, const Value& right);
Value negate(const Value& value);
Value unary_plus(const Value& value);
bool contains(const Value& container, const Value& item);

// Global functions (range, dict, namespace, raise_exception, strftime_now); Undefined when there
// is no global of that name.
Value global(const std::string& name);

}  // namespace dspark::jinja
