#pragma once
// Binds the arguments of a call to a built-in (filter, test, method or global) to its parameter
// names the way Python does, rejecting unknown keywords and surplus positional arguments.
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"
#include "text/jinja_value.h"

namespace dspark::jinja {

class BoundArguments {
 public:
  // `arguments` excludes a filter's or method's subject, which the caller holds.
  BoundArguments(std::string_view function, const CallArguments& arguments,
                 std::initializer_list<std::string_view> names)
      : function_(function), names_(names), values_(names.size()), given_(names.size(), false) {
    if (arguments.positional.size() > names_.size()) {
      fail("TypeError: {}() takes at most {} argument(s) ({} given)", function_, names_.size(),
           arguments.positional.size());
    }
    for (size_t i = 0; i < arguments.positional.size(); ++i) {
      values_[i] = arguments.positional[i];
      given_[i] = true;
    }
    for (const auto& [key, value] : arguments.keyword) {
      size_t i = 0;
      while (i < names_.size() && names_[i] != key) ++i;
      if (i == names_.size())
        fail("TypeError: {}() got an unexpected keyword argument '{}'", function_, key);
      if (given_[i]) fail("TypeError: {}() got multiple values for argument '{}'", function_, key);
      values_[i] = value;
      given_[i] = true;
    }
  }

  bool has(size_t i) const { return given_[i]; }
  const Value& operator[](size_t i) const { return values_[i]; }
  Value get(size_t i, Value fallback) const { return given_[i] ? values_[i] : std::move(fallback); }
  // The argument, which must be present.
  const Value& required(size_t i) const {
    if (!given_[i]) fail("TypeError: {}() missing required argument '{}'", function_, names_[i]);
    return values_[i];
  }

 private:
  std::string_view function_;
  std::vector<std::string_view> names_;
  std::vector<Value> values_;
  std::vector<bool> given_;
};

// Argument checks shared by the built-ins.
inline const std::string& string_argument(std::string_view function, const Value& value) {
  if (!value.is_string())
    fail("TypeError: {}() expected a string, got '{}'", function, value.type_name());
  return value.as_string();
}

inline int64_t int_argument(std::string_view function, const Value& value) {
  if (!value.is_int() && !value.is_bool()) {
    fail("TypeError: {}() expected an integer, got '{}'", function, value.type_name());
  }
  return value.integral();
}

}  // namespace dspark::jinja
