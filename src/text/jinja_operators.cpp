// Python semantics of operators, iteration, attribute/item access and the str/dict/list methods,
// as jinja2's ImmutableSandboxedEnvironment exposes them.
#include <algorithm>
#include <cmath>
#include <limits>

#include "text/jinja_arguments.h"
#include "text/jinja_builtins.h"
#include "text/jinja_strings.h"

namespace dspark::jinja {
namespace {

[[noreturn]] void fail_undefined(const Value& value) {
  fail("UndefinedError: {}", value.undefined_message());
}

bool is_indexable_sequence(const Value& value) {
  return value.is_sequence() && (value.sequence_kind() == SequenceKind::kList ||
                                 value.sequence_kind() == SequenceKind::kTuple);
}

// Python ints are unbounded; ours are 64-bit, so overflow is an error rather than a wrong value.
Value checked_integer(bool overflow, int64_t result) {
  if (overflow) fail("OverflowError: integer result does not fit in 64 bits");
  return Value::integer(result);
}

// Python's float divmod, so // and % on floats round like CPython.
std::pair<double, double> float_divmod(double x, double y) {
  if (y == 0.0) fail("ZeroDivisionError: float divmod()");
  double mod = std::fmod(x, y);
  double div = (x - mod) / y;
  if (mod != 0.0) {
    if ((y < 0) != (mod < 0)) {
      mod += y;
      div -= 1.0;
    }
  } else {
    mod = std::copysign(0.0, y);
  }
  double floor_div;
  if (div != 0.0) {
    floor_div = std::floor(div);
    if (div - floor_div > 0.5) floor_div += 1.0;
  } else {
    floor_div = std::copysign(0.0, x / y);
  }
  return {floor_div, mod};
}

std::pair<int64_t, int64_t> int_divmod(int64_t x, int64_t y) {
  if (y == 0) fail("ZeroDivisionError: integer division or modulo by zero");
  if (x == std::numeric_limits<int64_t>::min() && y == -1)
    fail("OverflowError: integer result does not fit in 64 bits");
  int64_t div = x / y;
  int64_t mod = x % y;
  if (mod != 0 && ((mod < 0) != (y < 0))) {
    mod += y;
    div -= 1;
  }
  return {div, mod};
}

Value repeat(const Value& sequence, int64_t times) {
  if (times <= 0) times = 0;
  if (sequence.is_string()) {
    if (times > 0) {
      check_string_size(
          static_cast<size_t>(times) >
                  max_string_bytes() / std::max<size_t>(1, sequence.as_string().size())
              ? max_string_bytes() + 1
              : static_cast<size_t>(times) * sequence.as_string().size(),
          "repetition");
    }
    std::string out;
    for (int64_t i = 0; i < times; ++i) out += sequence.as_string();
    return Value::string(std::move(out), sequence.is_markup());
  }
  // Repeated items are copies (strings included): bound the bytes the copies take.
  size_t bytes_per_copy = 0;
  for (const Value& item : sequence.items()) {
    bytes_per_copy += sizeof(Value) + (item.is_string() ? item.as_string().size() : 0);
  }
  if (times > 0 && bytes_per_copy > 0) {
    check_string_size(static_cast<size_t>(times) > max_string_bytes() / bytes_per_copy
                          ? max_string_bytes() + 1
                          : static_cast<size_t>(times) * bytes_per_copy,
                      "list repetition");
  }
  std::vector<Value> items;
  for (int64_t i = 0; i < times; ++i)
    items.insert(items.end(), sequence.items().begin(), sequence.items().end());
  return Value::sequence(sequence.sequence_kind(), std::move(items));
}

// A width or precision in a %-format; at most 4 digits, which covers any sensible template.
size_t read_count(const std::string& format, size_t& i) {
  size_t count = 0;
  for (int digits = 0; i < format.size() && std::isdigit(static_cast<unsigned char>(format[i]));
       ++i) {
    if (++digits > 4) fail("jinja: %-format width or precision too large");
    count = count * 10 + static_cast<size_t>(format[i] - '0');
  }
  return count;
}

// Python's printf-style `format % args` for the common conversions.
Value percent_format(const Value& format_value, const Value& args) {
  const std::string& format = format_value.as_string();
  std::vector<Value> positional;
  const Dict* named = nullptr;
  if (args.is_sequence() && args.sequence_kind() == SequenceKind::kTuple) {
    positional = args.items();
  } else if (args.is_dict()) {
    named = &args.as_dict();
    positional.push_back(args);
  } else {
    positional.push_back(args);
  }
  size_t next_arg = 0;
  bool used_name = false;
  std::string out;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] != '%') {
      out += format[i];
      continue;
    }
    if (++i >= format.size()) fail("ValueError: incomplete format");
    const Value* arg = nullptr;
    if (format[i] == '(') {
      const size_t close = format.find(')', i);
      if (close == std::string::npos) fail("ValueError: incomplete format key");
      if (named == nullptr) fail("TypeError: format requires a mapping");
      const std::string key = format.substr(i + 1, close - i - 1);
      arg = named->find(key);
      if (arg == nullptr) fail("KeyError: '{}'", key);
      used_name = true;
      i = close + 1;
    }
    std::string flags;
    while (i < format.size() && std::string_view("-+ 0#").find(format[i]) != std::string_view::npos)
      flags += format[i++];
    if (flags.find('#') != std::string::npos) fail("jinja: the '#' %-format flag is not supported");
    const bool left_align = flags.find('-') != std::string::npos;
    const std::string sign = flags.find('+') != std::string::npos
                                 ? "+"
                                 : (flags.find(' ') != std::string::npos ? " " : "");
    const size_t width = read_count(format, i);
    std::optional<size_t> precision;
    if (i < format.size() && format[i] == '.') precision = read_count(format, ++i);
    if (i >= format.size()) fail("ValueError: incomplete format");
    const char conversion = format[i];
    if (conversion == '%') {
      out += '%';
      continue;
    }
    if (arg == nullptr) {
      if (next_arg >= positional.size()) fail("TypeError: not enough arguments for format string");
      arg = &positional[next_arg++];
    }
    const bool numeric = conversion != 's' && conversion != 'r';
    std::string text;
    switch (conversion) {
      case 's':
      case 'r': {
        text = conversion == 's' ? to_str(*arg) : to_repr(*arg);
        if (precision) text = encode_utf8(decode_utf8(text).substr(0, *precision));
        break;
      }
      case 'd':
      case 'i':
      case 'f':
      case 'F':
      case 'e':
      case 'x':
      case 'X': {
        if (!arg->is_number())
          fail("TypeError: %{} format: a real number is required, not {}", conversion,
               arg->type_name());
        if (conversion == 'd' || conversion == 'i' || conversion == 'x' || conversion == 'X') {
          const int64_t n =
              arg->is_float() ? static_cast<int64_t>(std::trunc(arg->as_float())) : arg->integral();
          const std::string type = conversion == 'x' ? "x" : (conversion == 'X' ? "X" : "d");
          text = fmt::format(fmt::runtime("{:" + sign + type + "}"), n);
        } else {
          const std::string type(1, conversion == 'F' ? 'f' : conversion);
          text = fmt::format(
              fmt::runtime("{:" + sign + "." + std::to_string(precision.value_or(6)) + type + "}"),
              arg->numeric());
        }
        break;
      }
      default:
        fail("ValueError: unsupported format character '{}' in a %-format string", conversion);
    }
    const size_t length = code_point_count(text);
    if (length < width) {
      if (left_align) {
        text.append(width - length, ' ');
      } else if (numeric && flags.find('0') != std::string::npos) {
        const size_t sign_length =
            !text.empty() && (text[0] == '-' || text[0] == '+' || text[0] == ' ') ? 1 : 0;
        text.insert(sign_length, width - length, '0');
      } else {
        text.insert(0, width - length, ' ');
      }
    }
    out += text;
  }
  if (!used_name && named == nullptr && next_arg < positional.size()) {
    fail("TypeError: not all arguments converted during string formatting");
  }
  return Value::string(std::move(out));
}

Value add(const Value& left, const Value& right) {
  if (left.is_number() && right.is_number()) {
    if (left.is_float() || right.is_float())
      return Value::floating(left.numeric() + right.numeric());
    int64_t result;
    const bool overflow = __builtin_add_overflow(left.integral(), right.integral(), &result);
    return checked_integer(overflow, result);
  }
  if (left.is_string() && right.is_string()) {
    // markupsafe: adding plain text to Markup escapes the plain side.
    if (left.is_markup() != right.is_markup()) {
      const std::string l = left.is_markup() ? left.as_string() : html_escape(left.as_string());
      const std::string r = right.is_markup() ? right.as_string() : html_escape(right.as_string());
      return Value::string(l + r, true);
    }
    return Value::string(left.as_string() + right.as_string(), left.is_markup());
  }
  if (left.is_sequence() && right.is_sequence() && left.sequence_kind() == right.sequence_kind() &&
      is_indexable_sequence(left)) {
    std::vector<Value> items = left.items();
    items.insert(items.end(), right.items().begin(), right.items().end());
    return Value::sequence(left.sequence_kind(), std::move(items));
  }
  if (left.is_string() || is_indexable_sequence(left)) {
    fail("TypeError: can only concatenate {} (not \"{}\") to {}", left.type_name(),
         right.type_name(), left.type_name());
  }
  fail("TypeError: unsupported operand type(s) for +: '{}' and '{}'", left.type_name(),
       right.type_name());
}

Value multiply(const Value& left, const Value& right) {
  if (left.is_number() && right.is_number()) {
    if (left.is_float() || right.is_float())
      return Value::floating(left.numeric() * right.numeric());
    int64_t result;
    const bool overflow = __builtin_mul_overflow(left.integral(), right.integral(), &result);
    return checked_integer(overflow, result);
  }
  const bool left_repeatable = left.is_string() || is_indexable_sequence(left);
  const bool right_repeatable = right.is_string() || is_indexable_sequence(right);
  if (left_repeatable && (right.is_int() || right.is_bool())) return repeat(left, right.integral());
  if (right_repeatable && (left.is_int() || left.is_bool())) return repeat(right, left.integral());
  fail("TypeError: unsupported operand type(s) for *: '{}' and '{}'", left.type_name(),
       right.type_name());
}

Value power(const Value& left, const Value& right) {
  if (!left.is_float() && !right.is_float()) {
    const int64_t base = left.integral();
    const int64_t exponent = right.integral();
    if (exponent >= 0) {
      int64_t result = 1;
      for (int64_t i = 0; i < exponent; ++i) {
        if (__builtin_mul_overflow(result, base, &result))
          fail("OverflowError: integer result does not fit in 64 bits");
        if (result == 0 || result == 1) break;
      }
      if (result == 1 && base == -1 && exponent % 2 == 1) result = -1;
      return Value::integer(result);
    }
  }
  const double base = left.numeric();
  const double exponent = right.numeric();
  if (base == 0.0 && exponent < 0)
    fail("ZeroDivisionError: 0.0 cannot be raised to a negative power");
  if (base < 0 && exponent != std::floor(exponent)) {
    fail("ValueError: a negative number raised to a fractional power is complex (not supported)");
  }
  return Value::floating(std::pow(base, exponent));
}

}  // namespace

Value binary_operation(std::string_view op, const Value& left, const Value& right) {
  if (left.is_undefined()) fail_undefined(left);
  if (right.is_undefined()) fail_undefined(right);
  if (op == "+") return add(left, right);
  if (op == "*") return multiply(left, right);
  if (op == "%" && left.is_string()) return percent_format(left, right);
  if (!left.is_number() || !right.is_number()) {
    fail("TypeError: unsupported operand type(s) for {}: '{}' and '{}'", op, left.type_name(),
         right.type_name());
  }
  const bool floating = left.is_float() || right.is_float();
  if (op == "-") {
    if (floating) return Value::floating(left.numeric() - right.numeric());
    int64_t result;
    const bool overflow = __builtin_sub_overflow(left.integral(), right.integral(), &result);
    return checked_integer(overflow, result);
  }
  if (op == "/") {
    if (right.numeric() == 0.0) fail("ZeroDivisionError: division by zero");
    return Value::floating(left.numeric() / right.numeric());
  }
  if (op == "//") {
    if (floating) return Value::floating(float_divmod(left.numeric(), right.numeric()).first);
    return Value::integer(int_divmod(left.integral(), right.integral()).first);
  }
  if (op == "%") {
    if (floating) return Value::floating(float_divmod(left.numeric(), right.numeric()).second);
    return Value::integer(int_divmod(left.integral(), right.integral()).second);
  }
  if (op == "**") return power(left, right);
  fail("jinja: unknown operator '{}'", op);
}

Value negate(const Value& value) {
  if (value.is_undefined()) fail_undefined(value);
  if (value.is_float()) return Value::floating(-value.as_float());
  if (value.is_int() || value.is_bool()) {
    if (value.integral() == std::numeric_limits<int64_t>::min())
      fail("OverflowError: integer result does not fit in 64 bits");
    return Value::integer(-value.integral());
  }
  fail("TypeError: bad operand type for unary -: '{}'", value.type_name());
}

Value unary_plus(const Value& value) {
  if (value.is_undefined()) fail_undefined(value);
  if (value.is_float()) return value;
  if (value.is_int() || value.is_bool()) return Value::integer(value.integral());
  fail("TypeError: bad operand type for unary +: '{}'", value.type_name());
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::kUndefined:
      return false;  // Undefined iterates as empty
    case Value::Kind::kString:
      if (!item.is_string()) {
        fail("TypeError: 'in <string>' requires string as left operand, not {}", item.type_name());
      }
      return container.as_string().find(item.as_string()) != std::string::npos;
    case Value::Kind::kSequence:
      for (const Value& element : container.items()) {
        if (equals(element, item)) return true;
      }
      return false;
    case Value::Kind::kDict:
      if (item.is_sequence() && item.sequence_kind() != SequenceKind::kTuple)
        fail("TypeError: unhashable type: '{}'", item.type_name());
      if (item.is_dict() || item.is_namespace())
        fail("TypeError: unhashable type: '{}'", item.type_name());
      return item.is_string() && container.as_dict().find(item.as_string()) != nullptr;
    default:
      fail("TypeError: argument of type '{}' is not iterable", container.type_name());
  }
}

std::vector<Value> iterate(const Value& value) {
  switch (value.kind()) {
    case Value::Kind::kUndefined:
      return {};
    case Value::Kind::kSequence:
      return value.items();
    case Value::Kind::kDict: {
      std::vector<Value> keys;
      for (const auto& entry : value.as_dict().entries())
        keys.push_back(Value::string(entry.first));
      return keys;
    }
    case Value::Kind::kString: {
      std::vector<Value> characters;
      for (char32_t c : decode_utf8(value.as_string())) {
        characters.push_back(Value::string(encode_utf8(std::u32string(1, c)), value.is_markup()));
      }
      return characters;
    }
    default:
      fail("TypeError: '{}' object is not iterable", value.type_name());
  }
}

namespace {

// A method bound to its subject, like Python's bound methods.
Value method(const Value& subject, const std::string& name,
             std::function<Value(const Value&, const CallArguments&)> body) {
  return Value::function(name, [subject, body = std::move(body)](const CallArguments& args) {
    return body(subject, args);
  });
}

// jinja2's sandbox answers a mutating method with an Undefined that raises when used.
Value unsafe_method(const std::string& type, const std::string& name) {
  return Value::undefined(
      fmt::format("access to attribute '{}' of '{}' object is unsafe.", name, type));
}

std::optional<std::string> optional_string(std::string_view function, const Value& value) {
  if (value.is_none() || value.is_undefined()) return std::nullopt;
  return string_argument(function, value);
}

Value string_list(const std::vector<std::string>& parts) {
  std::vector<Value> items;
  items.reserve(parts.size());
  for (const auto& part : parts) items.push_back(Value::string(part));
  return Value::list(std::move(items));
}

bool affix_matches(std::string_view function, const std::string& text, const Value& affix,
                   bool prefix) {
  auto one = [&](const Value& candidate) {
    const std::string& a = string_argument(function, candidate);
    return prefix ? std::string_view(text).starts_with(a) : std::string_view(text).ends_with(a);
  };
  if (affix.is_sequence() && affix.sequence_kind() == SequenceKind::kTuple) {
    for (const Value& candidate : affix.items()) {
      if (one(candidate)) return true;
    }
    return false;
  }
  return one(affix);
}

std::string pad(const std::string& text, int64_t width, const std::string& fill, char align) {
  if (code_point_count(fill) != 1)
    fail("TypeError: the fill character must be exactly one character long");
  const int64_t length = static_cast<int64_t>(code_point_count(text));
  if (width <= length) return text;
  check_string_size(static_cast<size_t>(width) * fill.size(), "padding");
  const int64_t total = width - length;
  int64_t left = 0;
  if (align == '>') left = total;
  if (align == '^') left = total / 2 + (total & width & 1);  // CPython's str.center split
  std::string out;
  for (int64_t i = 0; i < left; ++i) out += fill;
  out += text;
  for (int64_t i = left; i < total; ++i) out += fill;
  return out;
}

// The character-class predicates (isdigit, isalpha, ...) are exact for ASCII text only.
Value ascii_predicate(const Value& subject, const std::string& name,
                      bool (*predicate)(unsigned char)) {
  return method(subject, name, [name, predicate](const Value& s, const CallArguments& args) {
    BoundArguments(name, args, {});
    const std::string& text = s.as_string();
    if (!is_ascii(text)) fail("jinja: str.{}() of non-ASCII text is not supported", name);
    if (text.empty()) return Value::boolean(false);
    for (char c : text) {
      if (!predicate(static_cast<unsigned char>(c))) return Value::boolean(false);
    }
    return Value::boolean(true);
  });
}

Value str_format(const std::string& format, const CallArguments& args);

Value string_method(const Value& subject, const std::string& name) {
  using Args = const CallArguments&;
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const StripSide side = name == "strip"
                               ? StripSide::kBoth
                               : (name == "lstrip" ? StripSide::kLeft : StripSide::kRight);
    return method(subject, name, [name, side](const Value& s, Args args) {
      BoundArguments bound(name, args, {"chars"});
      return Value::string(
          python_strip(s.as_string(), optional_string(name, bound.get(0, Value::none())), side));
    });
  }
  if (name == "split" || name == "rsplit") {
    return method(subject, name, [name](const Value& s, Args args) {
      BoundArguments bound(name, args, {"sep", "maxsplit"});
      return string_list(
          python_split(s.as_string(), optional_string(name, bound.get(0, Value::none())),
                       int_argument(name, bound.get(1, Value::integer(-1))), name == "rsplit"));
    });
  }
  if (name == "splitlines") {
    return method(subject, name, [](const Value& s, Args args) {
      BoundArguments bound("splitlines", args, {"keepends"});
      return string_list(
          python_splitlines(s.as_string(), bound.get(0, Value::boolean(false)).truthy()));
    });
  }
  if (name == "startswith" || name == "endswith") {
    return method(subject, name, [name](const Value& s, Args args) {
      BoundArguments bound(name, args, {"prefix"});
      return Value::boolean(
          affix_matches(name, s.as_string(), bound.required(0), name == "startswith"));
    });
  }
  if (name == "replace") {
    return method(subject, name, [](const Value& s, Args args) {
      BoundArguments bound("replace", args, {"old", "new", "count"});
      return Value::string(
          python_replace(s.as_string(), string_argument("replace", bound.required(0)),
                         string_argument("replace", bound.required(1)),
                         int_argument("replace", bound.get(2, Value::integer(-1)))));
    });
  }
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
    return method(subject, name, [name](const Value& s, Args args) {
      BoundArguments(name, args, {});
      const std::string& text = s.as_string();
      if (name == "upper") return Value::string(python_upper(text));
      if (name == "lower") return Value::string(python_lower(text));
      if (name == "title") return Value::string(python_title(text));
      return Value::string(python_capitalize(text));
    });
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex") {
    return method(subject, name, [name](const Value& s, Args args) {
      BoundArguments bound(name, args, {"sub"});
      const int64_t position =
          python_find(s.as_string(), string_argument(name, bound.required(0)), name[0] == 'r');
      if (position < 0 && (name == "index" || name == "rindex"))
        fail("ValueError: substring not found");
      return Value::integer(position);
    });
  }
  if (name == "count") {
    return method(subject, name, [](const Value& s, Args args) {
      BoundArguments bound("count", args, {"sub"});
      return Value::integer(
          python_count(s.as_string(), string_argument("count", bound.required(0))));
    });
  }
  if (name == "join") {
    return method(subject, name, [](const Value& s, Args args) {
      BoundArguments bound("join", args, {"iterable"});
      std::string out;
      bool first = true;
      for (const Value& item : iterate(bound.required(0))) {
        if (!item.is_string())
          fail("TypeError: sequence item: expected str instance, {} found", item.type_name());
        if (!first) out += s.as_string();
        first = false;
        out += item.as_string();
      }
      return Value::string(std::move(out));
    });
  }
  if (name == "format") {
    return method(subject, name,
                  [](const Value& s, Args args) { return str_format(s.as_string(), args); });
  }
  if (name == "isspace") {
    return method(subject, name, [](const Value& s, Args args) {
      BoundArguments("isspace", args, {});
      const std::u32string cps = decode_utf8(s.as_string());
      return Value::boolean(!cps.empty() && std::all_of(cps.begin(), cps.end(), is_python_space));
    });
  }
  if (name == "isdigit" || name == "isdecimal" || name == "isnumeric") {
    return ascii_predicate(subject, name, [](unsigned char c) { return std::isdigit(c) != 0; });
  }
  if (name == "isalpha")
    return ascii_predicate(subject, name, [](unsigned char c) { return std::isalpha(c) != 0; });
  if (name == "isalnum")
    return ascii_predicate(subject, name, [](unsigned char c) { return std::isalnum(c) != 0; });
  if (name == "islower" || name == "isupper") {
    return method(subject, name, [name](const Value& s, Args args) {
      BoundArguments(name, args, {});
      const std::string& text = s.as_string();
      const std::string lower = python_lower(text);
      const std::string upper = python_upper(text);
      return Value::boolean(name == "islower" ? (text == lower && text != upper)
                                              : (text == upper && text != lower));
    });
  }
  if (name == "zfill") {
    return method(subject, name, [](const Value& s, Args args) {
      BoundArguments bound("zfill", args, {"width"});
      std::string text = s.as_string();
      const int64_t width = int_argument("zfill", bound.required(0));
      const int64_t length = static_cast<int64_t>(code_point_count(text));
      if (length >= width) return Value::string(text);
      check_string_size(static_cast<size_t>(width), "zfill");
      const size_t sign = !text.empty() && (text[0] == '-' || text[0] == '+') ? 1 : 0;
      text.insert(sign, static_cast<size_t>(width - length), '0');
      return Value::string(std::move(text));
    });
  }
  if (name == "center" || name == "ljust" || name == "rjust") {
    return method(subject, name, [name](const Value& s, Args args) {
      BoundArguments bound(name, args, {"width", "fillchar"});
      const char align = name == "center" ? '^' : (name == "ljust" ? '<' : '>');
      return Value::string(pad(s.as_string(), int_argument(name, bound.required(0)),
                               string_argument(name, bound.get(1, Value::string(" "))), align));
    });
  }
  if (name == "removeprefix" || name == "removesuffix") {
    return method(subject, name, [name](const Value& s, Args args) {
      BoundArguments bound(name, args, {"affix"});
      const std::string& text = s.as_string();
      const std::string& affix = string_argument(name, bound.required(0));
      if (name == "removeprefix" && std::string_view(text).starts_with(affix))
        return Value::string(text.substr(affix.size()));
      if (name == "removesuffix" && !affix.empty() && std::string_view(text).ends_with(affix)) {
        return Value::string(text.substr(0, text.size() - affix.size()));
      }
      return Value::string(text);
    });
  }
  if (name == "partition" || name == "rpartition") {
    return method(subject, name, [name](const Value& s, Args args) {
      BoundArguments bound(name, args, {"sep"});
      const std::string& text = s.as_string();
      const std::string& sep = string_argument(name, bound.required(0));
      if (sep.empty()) fail("ValueError: empty separator");
      const size_t found = name == "partition" ? text.find(sep) : text.rfind(sep);
      if (found == std::string::npos) {
        return name == "partition"
                   ? Value::tuple({Value::string(text), Value::string(""), Value::string("")})
                   : Value::tuple({Value::string(""), Value::string(""), Value::string(text)});
      }
      return Value::tuple({Value::string(text.substr(0, found)), Value::string(sep),
                           Value::string(text.substr(found + sep.size()))});
    });
  }
  return Value::undefined(fmt::format("'str object' has no attribute '{}'", name));
}

Value dict_method(const Value& subject, const std::string& name) {
  using Args = const CallArguments&;
  if (name == "get") {
    return method(subject, name, [](const Value& d, Args args) {
      BoundArguments bound("get", args, {"key", "default"});
      const Value& key = bound.required(0);
      const Value* found = key.is_string() ? d.as_dict().find(key.as_string()) : nullptr;
      return found != nullptr ? *found : bound.get(1, Value::none());
    });
  }
  if (name == "items" || name == "keys" || name == "values") {
    return method(subject, name, [name](const Value& d, Args args) {
      BoundArguments(name, args, {});
      std::vector<Value> items;
      for (const auto& [key, value] : d.as_dict().entries()) {
        if (name == "items") {
          items.push_back(Value::tuple({Value::string(key), value}));
        } else {
          items.push_back(name == "keys" ? Value::string(key) : value);
        }
      }
      const SequenceKind kind =
          name == "items" ? SequenceKind::kDictItems
                          : (name == "keys" ? SequenceKind::kDictKeys : SequenceKind::kDictValues);
      return Value::sequence(kind, std::move(items));
    });
  }
  if (name == "copy") {
    return method(subject, name, [](const Value& d, Args args) {
      BoundArguments("copy", args, {});
      return Value::dict(d.as_dict());
    });
  }
  if (name == "pop" || name == "popitem" || name == "setdefault" || name == "update" ||
      name == "clear") {
    return unsafe_method("dict", name);
  }
  return Value();  // not a method: the caller looks the key up
}

Value list_method(const Value& subject, const std::string& name) {
  using Args = const CallArguments&;
  const bool is_list = subject.sequence_kind() == SequenceKind::kList;
  if (name == "index" || name == "count") {
    return method(subject, name, [name](const Value& l, Args args) {
      BoundArguments bound(name, args, {"value"});
      int64_t count = 0;
      for (size_t i = 0; i < l.items().size(); ++i) {
        if (!equals(l.items()[i], bound.required(0))) continue;
        if (name == "index") return Value::integer(static_cast<int64_t>(i));
        ++count;
      }
      if (name == "index") fail("ValueError: value is not in {}", l.type_name());
      return Value::integer(count);
    });
  }
  if (is_list && name == "copy") {
    return method(subject, name, [](const Value& l, Args args) {
      BoundArguments("copy", args, {});
      return Value::list(l.items());
    });
  }
  if (is_list && (name == "append" || name == "clear" || name == "extend" || name == "insert" ||
                  name == "pop" || name == "remove" || name == "reverse" || name == "sort")) {
    return unsafe_method("list", name);
  }
  return Value::undefined(
      fmt::format("'{} object' has no attribute '{}'", subject.type_name(), name));
}

// str.format() with positional ({} {0}) and named ({name}) fields, !s/!r conversions and format
// specs of the common kinds (fill, align, sign, zero padding, width, precision, d/f/s).
Value str_format(const std::string& format, const CallArguments& args) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < format.size(); ++i) {
    const char c = format[i];
    if (c == '}') {
      if (i + 1 < format.size() && format[i + 1] == '}') {
        out += '}';
        ++i;
        continue;
      }
      fail("ValueError: Single '}}' encountered in format string");
    }
    if (c != '{') {
      out += c;
      continue;
    }
    if (i + 1 < format.size() && format[i + 1] == '{') {
      out += '{';
      ++i;
      continue;
    }
    const size_t close = format.find('}', i);
    if (close == std::string::npos) fail("ValueError: Single '{{' encountered in format string");
    std::string field = format.substr(i + 1, close - i - 1);
    i = close;
    std::string spec;
    if (const size_t colon = field.find(':'); colon != std::string::npos) {
      spec = field.substr(colon + 1);
      field.resize(colon);
    }
    char conversion = 's';
    if (const size_t bang = field.find('!'); bang != std::string::npos) {
      if (bang + 2 != field.size() || (field[bang + 1] != 's' && field[bang + 1] != 'r')) {
        fail("ValueError: unsupported conversion in format string field '{}'", field);
      }
      conversion = field[bang + 1];
      field.resize(bang);
    }
    const Value* arg = nullptr;
    if (field.empty() || std::all_of(field.begin(), field.end(), [](char d) {
          return std::isdigit(static_cast<unsigned char>(d));
        })) {
      const size_t index = field.empty() ? auto_index++ : std::stoul(field);
      if (index >= args.positional.size())
        fail("IndexError: Replacement index {} out of range for positional args tuple", index);
      arg = &args.positional[index];
    } else {
      for (const auto& [key, value] : args.keyword) {
        if (key == field) arg = &value;
      }
      if (arg == nullptr) fail("KeyError: '{}'", field);
    }
    if (spec.empty() || conversion == 'r') {
      out += conversion == 'r' ? to_repr(*arg) : to_str(*arg);
      continue;
    }
    try {
      if (arg->is_string()) {
        out += fmt::format(fmt::runtime("{:" + spec + "}"), arg->as_string());
      } else if (arg->is_int() || arg->is_bool()) {
        out += fmt::format(fmt::runtime("{:" + spec + "}"), arg->integral());
      } else if (arg->is_float()) {
        out += fmt::format(fmt::runtime("{:" + spec + "}"), arg->as_float());
      } else {
        fail("jinja: format spec '{}' for a {} is not supported", spec, arg->type_name());
      }
    } catch (const fmt::format_error& e) {
      fail("ValueError: invalid format spec '{}': {}", spec, e.what());
    }
  }
  return Value::string(std::move(out));
}

std::string object_description(const Value& value) {
  if (value.is_none()) return "None";
  return value.type_name() + " object";
}

}  // namespace

Value get_attribute(const Value& object, const std::string& name) {
  switch (object.kind()) {
    case Value::Kind::kUndefined:
      fail_undefined(object);
    case Value::Kind::kString:
      return string_method(object, name);
    case Value::Kind::kDict: {
      Value bound = dict_method(object, name);
      if (bound.is_function() || !bound.undefined_message().empty()) return bound;
      if (const Value* found = object.as_dict().find(name)) return *found;
      return Value::undefined(fmt::format("'dict object' has no attribute '{}'", name));
    }
    case Value::Kind::kNamespace:
      if (const Value* found = object.as_namespace().attributes.find(name)) return *found;
      return Value::undefined(fmt::format("'Namespace object' has no attribute '{}'", name));
    case Value::Kind::kSequence:
      if (is_indexable_sequence(object)) return list_method(object, name);
      break;
    default:
      break;
  }
  return Value::undefined(
      fmt::format("'{}' has no attribute '{}'", object_description(object), name));
}

Value get_item(const Value& object, const Value& key) {
  if (object.is_undefined()) fail_undefined(object);
  if (object.is_dict()) {
    if (key.is_string()) {
      if (const Value* found = object.as_dict().find(key.as_string())) return *found;
      Value bound = dict_method(object, key.as_string());
      if (bound.is_function()) return bound;
    }
    return Value::undefined(fmt::format("'dict object' has no attribute '{}'", to_str(key)));
  }
  if ((is_indexable_sequence(object) || object.is_string()) && (key.is_int() || key.is_bool())) {
    int64_t index = key.integral();
    if (object.is_string()) {
      const std::string& text = object.as_string();
      if (is_ascii(text)) {
        const auto size = static_cast<int64_t>(text.size());
        if (index < 0) index += size;
        if (index >= 0 && index < size)
          return Value::string(text.substr(static_cast<size_t>(index), 1));
      } else {
        const std::u32string cps = decode_utf8(text);
        const auto size = static_cast<int64_t>(cps.size());
        if (index < 0) index += size;
        if (index >= 0 && index < size)
          return Value::string(encode_utf8(cps.substr(static_cast<size_t>(index), 1)));
      }
    } else {
      const auto size = static_cast<int64_t>(object.items().size());
      if (index < 0) index += size;
      if (index >= 0 && index < size) return object.items()[static_cast<size_t>(index)];
    }
    return Value::undefined(
        fmt::format("{} object has no element {}", object.type_name(), key.integral()));
  }
  if (key.is_string()) return get_attribute(object, key.as_string());
  return Value::undefined(
      fmt::format("'{}' has no attribute '{}'", object_description(object), to_str(key)));
}

namespace {

// Python's slice.indices(length).
void slice_indices(int64_t length, const Value& start_value, const Value& stop_value,
                   const Value& step_value, int64_t* start, int64_t* stop, int64_t* step) {
  auto as_index = [](const Value& v) {
    if (!v.is_int() && !v.is_bool()) fail("TypeError: slice indices must be integers or None");
    return v.integral();
  };
  *step = step_value.is_none() ? 1 : as_index(step_value);
  if (*step == 0) fail("ValueError: slice step cannot be zero");
  const int64_t lower = *step < 0 ? -1 : 0;
  const int64_t upper = *step < 0 ? length - 1 : length;
  auto clamp = [&](const Value& v, int64_t fallback) {
    if (v.is_none()) return fallback;
    int64_t i = as_index(v);
    if (i < 0) {
      i += length;
      return i < lower ? lower : i;
    }
    return i > upper ? upper : i;
  };
  *start = clamp(start_value, *step < 0 ? upper : lower);
  *stop = clamp(stop_value, *step < 0 ? lower : upper);
}

template <typename Container>
Container slice_container(const Container& items, int64_t start, int64_t stop, int64_t step) {
  Container out;
  if (step > 0) {
    for (int64_t i = start; i < stop; i += step) out.push_back(items[static_cast<size_t>(i)]);
  } else {
    for (int64_t i = start; i > stop; i += step) out.push_back(items[static_cast<size_t>(i)]);
  }
  return out;
}

}  // namespace

Value get_slice(const Value& object, const Value& start, const Value& stop, const Value& step) {
  if (object.is_undefined()) fail_undefined(object);
  int64_t from, to, stride;
  if (object.is_string()) {
    const std::u32string cps = decode_utf8(object.as_string());
    slice_indices(static_cast<int64_t>(cps.size()), start, stop, step, &from, &to, &stride);
    return Value::string(encode_utf8(slice_container(cps, from, to, stride)), object.is_markup());
  }
  if (is_indexable_sequence(object)) {
    slice_indices(static_cast<int64_t>(object.items().size()), start, stop, step, &from, &to,
                  &stride);
    return Value::sequence(object.sequence_kind(),
                           slice_container(object.items(), from, to, stride));
  }
  return Value::undefined(fmt::format("'{}' is not subscriptable", object_description(object)));
}

Value call(const Value& callee, const CallArguments& arguments) {
  if (callee.is_function()) return callee.as_function().call(arguments);
  if (callee.is_undefined()) {
    // The sandbox's refusals read as SecurityError; other Undefineds as UndefinedError.
    const std::string& message = callee.undefined_message();
    if (message.find("is unsafe.") != std::string::npos) fail("SecurityError: {}", message);
    fail_undefined(callee);
  }
  fail("TypeError: '{}' object is not callable", callee.type_name());
}

}  // namespace dspark::jinja
