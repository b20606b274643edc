// jinja2's built-in filters and tests, transformers' tojson, and the template globals.
#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "text/jinja_arguments.h"
#include "text/jinja_builtins.h"
#include "text/jinja_strings.h"

namespace dspark::jinja {
namespace {

using Filter = Value (*)(const Value&, const CallArguments&);
using Test = bool (*)(const Value&, const CallArguments&);

// soft_str: strings (and Markup) pass through, everything else is str()-ed.
Value soft_string(const Value& value) {
  if (value.is_string()) return value;
  return Value::string(to_str(value));
}

int64_t length_of(const Value& value) {
  switch (value.kind()) {
    case Value::Kind::kUndefined:
      return 0;
    case Value::Kind::kString:
      return static_cast<int64_t>(code_point_count(value.as_string()));
    case Value::Kind::kDict:
      return static_cast<int64_t>(value.as_dict().size());
    case Value::Kind::kSequence:
      if (value.sequence_kind() != SequenceKind::kIterator)
        return static_cast<int64_t>(value.items().size());
      break;
    default:
      break;
  }
  fail("TypeError: object of type '{}' has no len()", value.type_name());
}

// Attribute paths as filters take them: "a.b" or "0" (an index), resolved like jinja2's
// environment.getitem for each part.
Value lookup_path(const Value& item, const Value& path) {
  if (path.is_int()) return get_item(item, path);
  const std::string& text = string_argument("attribute", path);
  Value current = item;
  size_t start = 0;
  while (true) {
    const size_t dot = text.find('.', start);
    const std::string part =
        text.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    const bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) {
      return std::isdigit(static_cast<unsigned char>(c));
    });
    current = numeric ? get_item(current, Value::integer(std::stoll(part)))
                      : get_item(current, Value::string(part));
    if (dot == std::string::npos) return current;
    start = dot + 1;
  }
}

// Case-insensitive comparisons lower-case strings first (jinja2's ignore_case).
Value sort_key(const Value& value, bool case_sensitive) {
  if (!case_sensitive && value.is_string()) return Value::string(python_lower(value.as_string()));
  return value;
}

Value filter_abs(const Value& value, const CallArguments& args) {
  BoundArguments("abs", args, {});
  if (value.is_float()) return Value::floating(std::fabs(value.as_float()));
  if (value.is_int() || value.is_bool()) {
    const int64_t n = value.integral();
    if (n == std::numeric_limits<int64_t>::min())
      fail("OverflowError: integer result does not fit in 64 bits");
    return Value::integer(n < 0 ? -n : n);
  }
  fail("TypeError: bad operand type for abs(): '{}'", value.type_name());
}

Value filter_attr(const Value& value, const CallArguments& args) {
  BoundArguments bound("attr", args, {"name"});
  return get_attribute(value, string_argument("attr", bound.required(0)));
}

Value filter_batch(const Value& value, const CallArguments& args) {
  BoundArguments bound("batch", args, {"linecount", "fill_with"});
  const int64_t size = int_argument("batch", bound.required(0));
  if (size <= 0) fail("ValueError: batch size must be positive");
  std::vector<Value> batches;
  std::vector<Value> current;
  for (const Value& item : iterate(value)) {
    current.push_back(item);
    if (static_cast<int64_t>(current.size()) == size) {
      batches.push_back(Value::list(std::move(current)));
      current.clear();
    }
  }
  if (!current.empty()) {
    if (bound.has(1) && !bound[1].is_none()) {
      while (static_cast<int64_t>(current.size()) < size) current.push_back(bound[1]);
    }
    batches.push_back(Value::list(std::move(current)));
  }
  return Value::sequence(SequenceKind::kIterator, std::move(batches));
}

Value filter_capitalize(const Value& value, const CallArguments& args) {
  BoundArguments("capitalize", args, {});
  return Value::string(python_capitalize(soft_string(value).as_string()));
}

Value filter_center(const Value& value, const CallArguments& args) {
  BoundArguments bound("center", args, {"width"});
  const std::string text = to_str(value);
  const int64_t width = int_argument("center", bound.get(0, Value::integer(80)));
  const int64_t length = static_cast<int64_t>(code_point_count(text));
  if (width <= length) return Value::string(text);
  check_string_size(static_cast<size_t>(width), "center");
  const int64_t total = width - length;
  const int64_t left = total / 2 + (total & width & 1);
  return Value::string(std::string(static_cast<size_t>(left), ' ') + text +
                       std::string(static_cast<size_t>(total - left), ' '));
}

Value filter_length(const Value& value, const CallArguments& args) {
  BoundArguments("length", args, {});
  return Value::integer(length_of(value));
}

Value filter_default(const Value& value, const CallArguments& args) {
  BoundArguments bound("default", args, {"default_value", "boolean"});
  const bool use_default =
      value.is_undefined() || (bound.get(1, Value::boolean(false)).truthy() && !value.truthy());
  return use_default ? bound.get(0, Value::string("")) : value;
}

Value filter_dictsort(const Value& value, const CallArguments& args) {
  BoundArguments bound("dictsort", args, {"case_sensitive", "by", "reverse"});
  if (!value.is_dict()) fail("TypeError: dictsort expects a mapping, got '{}'", value.type_name());
  const bool case_sensitive = bound.get(0, Value::boolean(false)).truthy();
  const std::string by = string_argument("dictsort", bound.get(1, Value::string("key")));
  if (by != "key" && by != "value")
    fail("FilterArgumentError: You can only sort by either \"key\" or \"value\"");
  const bool reverse = bound.get(2, Value::boolean(false)).truthy();
  std::vector<Value> items;
  for (const auto& [key, item] : value.as_dict().entries())
    items.push_back(Value::tuple({Value::string(key), item}));
  const size_t position = by == "key" ? 0 : 1;
  std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
    const int c = compare(sort_key(a.items()[position], case_sensitive),
                          sort_key(b.items()[position], case_sensitive), "<");
    return reverse ? c > 0 : c < 0;
  });
  return Value::list(std::move(items));
}

Value filter_escape(const Value& value, const CallArguments& args) {
  BoundArguments("escape", args, {});
  if (value.is_markup()) return value;
  return Value::string(html_escape(to_str(value)), true);
}

Value filter_forceescape(const Value& value, const CallArguments& args) {
  BoundArguments("forceescape", args, {});
  return Value::string(html_escape(to_str(value)), true);
}

Value filter_first(const Value& value, const CallArguments& args) {
  BoundArguments("first", args, {});
  const std::vector<Value> items = iterate(value);
  if (items.empty()) return Value::undefined("No first item, sequence was empty.");
  return items.front();
}

Value filter_last(const Value& value, const CallArguments& args) {
  BoundArguments("last", args, {});
  if (value.is_sequence() && value.sequence_kind() == SequenceKind::kIterator) {
    fail("TypeError: 'generator' object is not reversible");
  }
  const std::vector<Value> items = iterate(value);
  if (items.empty()) return Value::undefined("No last item, sequence was empty.");
  return items.back();
}

// Python's float(str): surrounding whitespace, underscores between digits, inf/nan.
std::optional<double> parse_python_float(std::string text) {
  text = python_strip(text, std::nullopt, StripSide::kBoth);
  std::string cleaned;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '_') {
      if (i == 0 || i + 1 == text.size() ||
          !std::isdigit(static_cast<unsigned char>(text[i - 1])) ||
          !std::isdigit(static_cast<unsigned char>(text[i + 1]))) {
        return std::nullopt;
      }
      continue;
    }
    cleaned += text[i];
  }
  if (cleaned.empty()) return std::nullopt;
  std::string lower = cleaned;
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const std::string unsigned_part = lower[0] == '+' || lower[0] == '-' ? lower.substr(1) : lower;
  if (unsigned_part == "inf" || unsigned_part == "infinity" || unsigned_part == "nan") {
    const double magnitude = unsigned_part == "nan" ? std::nan("") : INFINITY;
    return lower[0] == '-' ? -magnitude : magnitude;
  }
  for (char c : cleaned) {
    if (!std::isdigit(static_cast<unsigned char>(c)) && c != '.' && c != 'e' && c != 'E' &&
        c != '+' && c != '-') {
      return std::nullopt;
    }
  }
  char* end = nullptr;
  const double result = std::strtod(cleaned.c_str(), &end);
  if (end != cleaned.c_str() + cleaned.size()) return std::nullopt;
  return result;
}

std::optional<int64_t> parse_python_int(std::string text, int base) {
  text = python_strip(text, std::nullopt, StripSide::kBoth);
  bool negative = false;
  size_t i = 0;
  if (i < text.size() && (text[i] == '+' || text[i] == '-')) negative = text[i++] == '-';
  if (i + 1 < text.size() && text[i] == '0') {
    const char prefix = static_cast<char>(std::tolower(static_cast<unsigned char>(text[i + 1])));
    if ((prefix == 'x' && base == 16) || (prefix == 'o' && base == 8) ||
        (prefix == 'b' && base == 2)) {
      i += 2;
      if (i < text.size() && text[i] == '_') ++i;
    }
  }
  if (i >= text.size()) return std::nullopt;
  int64_t result = 0;
  bool previous_digit = false;
  for (; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '_') {
      if (!previous_digit || i + 1 == text.size()) return std::nullopt;
      previous_digit = false;
      continue;
    }
    int digit = -1;
    if (c >= '0' && c <= '9') digit = c - '0';
    if (c >= 'a' && c <= 'z') digit = c - 'a' + 10;
    if (c >= 'A' && c <= 'Z') digit = c - 'A' + 10;
    if (digit < 0 || digit >= base) return std::nullopt;
    if (__builtin_mul_overflow(result, base, &result) ||
        __builtin_add_overflow(result, digit, &result)) {
      fail("OverflowError: integer {} does not fit in 64 bits", text);
    }
    previous_digit = true;
  }
  return negative ? -result : result;
}

int64_t float_to_int(double value) {
  if (!std::isfinite(value))
    fail("OverflowError: cannot convert float {} to integer", format_float(value));
  const double truncated = std::trunc(value);
  if (truncated < -9.2233720368547758e18 || truncated >= 9.2233720368547758e18) {
    fail("OverflowError: integer {} does not fit in 64 bits", format_float(truncated));
  }
  return static_cast<int64_t>(truncated);
}

Value filter_float(const Value& value, const CallArguments& args) {
  BoundArguments bound("float", args, {"default"});
  if (value.is_number()) return Value::floating(value.numeric());
  if (value.is_string()) {
    if (const auto parsed = parse_python_float(value.as_string())) return Value::floating(*parsed);
  }
  return bound.get(0, Value::floating(0.0));
}

Value filter_int(const Value& value, const CallArguments& args) {
  BoundArguments bound("int", args, {"default", "base"});
  const Value fallback = bound.get(0, Value::integer(0));
  if (value.is_int() || value.is_bool()) return Value::integer(value.integral());
  if (value.is_float()) return Value::integer(float_to_int(value.as_float()));
  if (value.is_string()) {
    const int64_t base = int_argument("int", bound.get(1, Value::integer(10)));
    if (base < 2 || base > 36) fail("ValueError: int() base must be >= 2 and <= 36");
    if (const auto parsed = parse_python_int(value.as_string(), static_cast<int>(base)))
      return Value::integer(*parsed);
    // jinja2 then tries int(float(value)), so "42.23"|int is 42.
    if (const auto parsed = parse_python_float(value.as_string())) {
      if (std::isfinite(*parsed)) return Value::integer(float_to_int(*parsed));
    }
  }
  return fallback;
}

Value filter_format(const Value& value, const CallArguments& args) {
  if (!args.keyword.empty() && !args.positional.empty()) {
    fail("FilterArgumentError: can't handle positional and keyword arguments at the same time");
  }
  Value format_args;
  if (!args.keyword.empty()) {
    Dict named;
    for (const auto& [key, item] : args.keyword) named.set(key, item);
    format_args = Value::dict(std::move(named));
  } else {
    format_args = Value::tuple(args.positional);
  }
  return binary_operation("%", soft_string(value), format_args);
}

Value filter_indent(const Value& value, const CallArguments& args) {
  BoundArguments bound("indent", args, {"width", "first", "blank"});
  const Value width = bound.get(0, Value::integer(4));
  if (!width.is_string())
    check_string_size(static_cast<size_t>(std::max<int64_t>(0, int_argument("indent", width))),
                      "indent");
  const std::string indentation =
      width.is_string()
          ? width.as_string()
          : std::string(static_cast<size_t>(std::max<int64_t>(0, int_argument("indent", width))),
                        ' ');
  const bool first = bound.get(1, Value::boolean(false)).truthy();
  const bool blank = bound.get(2, Value::boolean(false)).truthy();
  const std::vector<std::string> lines = python_splitlines(to_str(value) + "\n", false);
  std::string out;
  if (blank) {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i > 0) out += "\n" + indentation;
      out += lines[i];
    }
  } else {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i > 0) out += "\n" + (lines[i].empty() ? std::string() : indentation);
      out += lines[i];
    }
  }
  if (first) out = indentation + out;
  return Value::string(std::move(out), value.is_markup());
}

Value filter_items(const Value& value, const CallArguments& args) {
  BoundArguments("items", args, {});
  if (value.is_undefined()) return Value::sequence(SequenceKind::kIterator, {});
  if (!value.is_dict()) fail("TypeError: Can only get item pairs from a mapping.");
  std::vector<Value> pairs;
  for (const auto& [key, item] : value.as_dict().entries())
    pairs.push_back(Value::tuple({Value::string(key), item}));
  return Value::sequence(SequenceKind::kIterator, std::move(pairs));
}

Value filter_join(const Value& value, const CallArguments& args) {
  BoundArguments bound("join", args, {"d", "attribute"});
  const std::string separator = to_str(bound.get(0, Value::string("")));
  std::string out;
  bool first = true;
  for (const Value& item : iterate(value)) {
    if (!first) out += separator;
    first = false;
    out += to_str(bound.has(1) && !bound[1].is_none() ? lookup_path(item, bound[1]) : item);
    check_string_size(out.size(), "join");
  }
  return Value::string(std::move(out));
}

Value filter_list(const Value& value, const CallArguments& args) {
  BoundArguments("list", args, {});
  return Value::list(iterate(value));
}

Value filter_lower(const Value& value, const CallArguments& args) {
  BoundArguments("lower", args, {});
  return Value::string(python_lower(soft_string(value).as_string()));
}

Value filter_upper(const Value& value, const CallArguments& args) {
  BoundArguments("upper", args, {});
  return Value::string(python_upper(soft_string(value).as_string()));
}

// map(attribute='x', default=...) or map('filter', args...).
Value filter_map(const Value& value, const CallArguments& args) {
  std::vector<Value> out;
  const Value* attribute = nullptr;
  const Value* fallback = nullptr;
  for (const auto& [key, item] : args.keyword) {
    if (key == "attribute") {
      attribute = &item;
    } else if (key == "default") {
      fallback = &item;
    } else if (args.positional.empty()) {
      fail("TypeError: map() got an unexpected keyword argument '{}'", key);
    }
  }
  if (attribute != nullptr) {
    if (!args.positional.empty())
      fail("FilterArgumentError: map with an attribute takes no positional arguments");
    for (const Value& item : iterate(value)) {
      Value mapped = lookup_path(item, *attribute);
      if (mapped.is_undefined() && fallback != nullptr) mapped = *fallback;
      out.push_back(std::move(mapped));
    }
    return Value::sequence(SequenceKind::kIterator, std::move(out));
  }
  if (args.positional.empty()) fail("FilterArgumentError: map requires a filter argument");
  const std::string& name = string_argument("map", args.positional[0]);
  if (!has_filter(name)) fail("FilterArgumentError: No filter named '{}'", name);
  CallArguments rest{{args.positional.begin() + 1, args.positional.end()}, args.keyword};
  for (const Value& item : iterate(value)) out.push_back(apply_filter(name, item, rest));
  return Value::sequence(SequenceKind::kIterator, std::move(out));
}

Value select_or_reject(const Value& value, const CallArguments& args, bool by_attribute,
                       bool select) {
  const char* function =
      by_attribute ? (select ? "selectattr" : "rejectattr") : (select ? "select" : "reject");
  size_t next = 0;
  const Value* attribute = nullptr;
  if (by_attribute) {
    if (args.positional.empty()) fail("TypeError: {}() missing the attribute argument", function);
    attribute = &args.positional[next++];
  }
  std::string test;
  if (next < args.positional.size()) test = string_argument(function, args.positional[next++]);
  if (!test.empty() && !has_test(test)) fail("TemplateRuntimeError: No test named '{}'", test);
  CallArguments test_args{
      {args.positional.begin() + static_cast<ptrdiff_t>(next), args.positional.end()},
      args.keyword};
  std::vector<Value> out;
  for (const Value& item : iterate(value)) {
    const Value subject = attribute != nullptr ? lookup_path(item, *attribute) : item;
    const bool passed = test.empty() ? subject.truthy() : apply_test(test, subject, test_args);
    if (passed == select) out.push_back(item);
  }
  return Value::sequence(SequenceKind::kIterator, std::move(out));
}

Value filter_select(const Value& value, const CallArguments& args) {
  return select_or_reject(value, args, false, true);
}
Value filter_reject(const Value& value, const CallArguments& args) {
  return select_or_reject(value, args, false, false);
}
Value filter_selectattr(const Value& value, const CallArguments& args) {
  return select_or_reject(value, args, true, true);
}
Value filter_rejectattr(const Value& value, const CallArguments& args) {
  return select_or_reject(value, args, true, false);
}

Value min_or_max(const Value& value, const CallArguments& args, bool want_max) {
  const char* function = want_max ? "max" : "min";
  BoundArguments bound(function, args, {"case_sensitive", "attribute"});
  const bool case_sensitive = bound.get(0, Value::boolean(false)).truthy();
  const std::vector<Value> items = iterate(value);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  auto key = [&](const Value& item) {
    return sort_key(bound.has(1) && !bound[1].is_none() ? lookup_path(item, bound[1]) : item,
                    case_sensitive);
  };
  size_t best = 0;
  for (size_t i = 1; i < items.size(); ++i) {
    const int c = compare(key(items[i]), key(items[best]), want_max ? ">" : "<");
    if (want_max ? c > 0 : c < 0) best = i;
  }
  return items[best];
}

Value filter_max(const Value& value, const CallArguments& args) {
  return min_or_max(value, args, true);
}
Value filter_min(const Value& value, const CallArguments& args) {
  return min_or_max(value, args, false);
}

Value filter_replace(const Value& value, const CallArguments& args) {
  BoundArguments bound("replace", args, {"old", "new", "count"});
  const Value count = bound.get(2, Value::none());
  return Value::string(python_replace(to_str(value), to_str(bound.required(0)),
                                      to_str(bound.required(1)),
                                      count.is_none() ? -1 : int_argument("replace", count)));
}

Value filter_reverse(const Value& value, const CallArguments& args) {
  BoundArguments("reverse", args, {});
  if (value.is_string()) {
    std::u32string cps = decode_utf8(value.as_string());
    std::reverse(cps.begin(), cps.end());
    return Value::string(encode_utf8(cps));
  }
  std::vector<Value> items = iterate(value);
  std::reverse(items.begin(), items.end());
  // reversed() of a list or dict is an iterator; a generator is first copied into a list.
  const bool was_iterator = value.is_sequence() && value.sequence_kind() == SequenceKind::kIterator;
  return Value::sequence(was_iterator ? SequenceKind::kList : SequenceKind::kIterator,
                         std::move(items));
}

// Python's round(x, n) for floats: correctly rounded, ties to even.
double round_python(double value, int64_t digits) {
  if (!std::isfinite(value)) return value;
  if (digits == 0) return std::nearbyint(value);
  if (digits > 0) {
    char buffer[512];
    std::snprintf(buffer, sizeof(buffer), "%.*f", static_cast<int>(std::min<int64_t>(digits, 300)),
                  value);
    return std::strtod(buffer, nullptr);
  }
  const double factor = std::pow(10.0, static_cast<double>(-digits));
  return std::nearbyint(value / factor) * factor;
}

Value filter_round(const Value& value, const CallArguments& args) {
  BoundArguments bound("round", args, {"precision", "method"});
  const int64_t precision = int_argument("round", bound.get(0, Value::integer(0)));
  const std::string method = string_argument("round", bound.get(1, Value::string("common")));
  if (method != "common" && method != "ceil" && method != "floor") {
    fail("FilterArgumentError: method must be common, ceil or floor");
  }
  if (!value.is_number())
    fail("TypeError: type {} doesn't define __round__ method", value.type_name());
  if (method == "common") {
    if (!value.is_float()) {
      if (precision >= 0) return Value::integer(value.integral());
      fail("jinja: round() of an integer to negative precision is not supported");
    }
    return Value::floating(round_python(value.as_float(), precision));
  }
  const double factor = std::pow(10.0, static_cast<double>(precision));
  const double scaled = value.numeric() * factor;
  return Value::floating((method == "ceil" ? std::ceil(scaled) : std::floor(scaled)) / factor);
}

Value filter_safe(const Value& value, const CallArguments& args) {
  BoundArguments("safe", args, {});
  return Value::string(to_str(value), true);
}

Value filter_sort(const Value& value, const CallArguments& args) {
  BoundArguments bound("sort", args, {"reverse", "case_sensitive", "attribute"});
  const bool reverse = bound.get(0, Value::boolean(false)).truthy();
  const bool case_sensitive = bound.get(1, Value::boolean(false)).truthy();
  std::vector<Value> attributes;
  if (bound.has(2) && !bound[2].is_none()) {
    if (bound[2].is_string()) {
      for (const auto& part : python_split(bound[2].as_string(), std::string(","), -1, false)) {
        attributes.push_back(Value::string(python_strip(part, std::nullopt, StripSide::kBoth)));
      }
    } else {
      attributes.push_back(bound[2]);
    }
  }
  std::vector<Value> items = iterate(value);
  auto key = [&](const Value& item) {
    if (attributes.empty()) return sort_key(item, case_sensitive);
    std::vector<Value> parts;
    for (const Value& attribute : attributes)
      parts.push_back(sort_key(lookup_path(item, attribute), case_sensitive));
    return parts.size() == 1 ? parts[0] : Value::list(std::move(parts));
  };
  std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
    return reverse ? compare(key(b), key(a), "<") < 0 : compare(key(a), key(b), "<") < 0;
  });
  return Value::list(std::move(items));
}

Value filter_string(const Value& value, const CallArguments& args) {
  BoundArguments("string", args, {});
  return soft_string(value);
}

Value filter_sum(const Value& value, const CallArguments& args) {
  BoundArguments bound("sum", args, {"attribute", "start"});
  Value total = bound.get(1, Value::integer(0));
  for (const Value& item : iterate(value)) {
    total = binary_operation(
        "+", total, bound.has(0) && !bound[0].is_none() ? lookup_path(item, bound[0]) : item);
  }
  return total;
}

// jinja2's title filter: words start after '-', whitespace and opening brackets.
Value filter_title(const Value& value, const CallArguments& args) {
  BoundArguments("title", args, {});
  const std::u32string cps = decode_utf8(soft_string(value).as_string());
  auto is_separator = [](char32_t c) {
    return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || is_python_space(c);
  };
  std::string out;
  size_t i = 0;
  while (i < cps.size()) {
    size_t j = i;
    const bool separator = is_separator(cps[i]);
    while (j < cps.size() && is_separator(cps[j]) == separator) ++j;
    const std::u32string_view run = std::u32string_view(cps).substr(i, j - i);
    out += python_upper(encode_utf8(run.substr(0, 1)));
    out += python_lower(encode_utf8(run.substr(1)));
    i = j;
  }
  return Value::string(std::move(out));
}

// transformers replaces jinja2's tojson with json.dumps(x, ensure_ascii=False, indent=indent,
// separators=separators, sort_keys=sort_keys), which neither HTML-escapes nor marks the result
// safe.
Value filter_tojson(const Value& value, const CallArguments& args) {
  BoundArguments bound("tojson", args, {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonOptions options;
  options.ensure_ascii = bound.get(0, Value::boolean(false)).truthy();
  const Value indent = bound.get(1, Value::none());
  if (indent.is_string()) {
    options.indent = indent.as_string();
  } else if (!indent.is_none()) {
    options.indent =
        std::string(static_cast<size_t>(std::max<int64_t>(0, int_argument("tojson", indent))), ' ');
  }
  if (options.indent) options.item_separator = ",";
  const Value separators = bound.get(2, Value::none());
  if (!separators.is_none()) {
    if (!separators.is_sequence() || separators.items().size() != 2) {
      fail("ValueError: tojson separators must be a pair of strings");
    }
    options.item_separator = string_argument("tojson", separators.items()[0]);
    options.key_separator = string_argument("tojson", separators.items()[1]);
  }
  options.sort_keys = bound.get(3, Value::boolean(false)).truthy();
  return Value::string(to_json_text(value, options));
}

Value filter_trim(const Value& value, const CallArguments& args) {
  BoundArguments bound("trim", args, {"chars"});
  const Value chars = bound.get(0, Value::none());
  return Value::string(python_strip(
      to_str(value), chars.is_none() ? std::nullopt : std::optional<std::string>(to_str(chars)),
      StripSide::kBoth));
}

Value filter_unique(const Value& value, const CallArguments& args) {
  BoundArguments bound("unique", args, {"case_sensitive", "attribute"});
  const bool case_sensitive = bound.get(0, Value::boolean(false)).truthy();
  std::vector<Value> seen;
  std::vector<Value> out;
  for (const Value& item : iterate(value)) {
    const Value key = sort_key(
        bound.has(1) && !bound[1].is_none() ? lookup_path(item, bound[1]) : item, case_sensitive);
    if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, key); }))
      continue;
    seen.push_back(key);
    out.push_back(item);
  }
  return Value::sequence(SequenceKind::kIterator, std::move(out));
}

Value filter_wordcount(const Value& value, const CallArguments& args) {
  BoundArguments("wordcount", args, {});
  const std::string text = to_str(value);
  if (!is_ascii(text)) fail("jinja: wordcount of non-ASCII text is not supported");
  int64_t count = 0;
  bool in_word = false;
  for (char c : text) {
    const bool word = std::isalnum(static_cast<unsigned char>(c)) || c == '_';
    if (word && !in_word) ++count;
    in_word = word;
  }
  return Value::integer(count);
}

Value filter_unsupported(const Value&, const CallArguments&) {
  fail("jinja: this filter is not supported");
}

const std::map<std::string, Filter, std::less<>>& filters() {
  static const std::map<std::string, Filter, std::less<>> kFilters = {
      {"abs", filter_abs},
      {"attr", filter_attr},
      {"batch", filter_batch},
      {"capitalize", filter_capitalize},
      {"center", filter_center},
      {"count", filter_length},
      {"d", filter_default},
      {"default", filter_default},
      {"dictsort", filter_dictsort},
      {"e", filter_escape},
      {"escape", filter_escape},
      {"first", filter_first},
      {"float", filter_float},
      {"forceescape", filter_forceescape},
      {"format", filter_format},
      {"indent", filter_indent},
      {"int", filter_int},
      {"items", filter_items},
      {"join", filter_join},
      {"last", filter_last},
      {"length", filter_length},
      {"list", filter_list},
      {"lower", filter_lower},
      {"map", filter_map},
      {"max", filter_max},
      {"min", filter_min},
      {"reject", filter_reject},
      {"rejectattr", filter_rejectattr},
      {"replace", filter_replace},
      {"reverse", filter_reverse},
      {"round", filter_round},
      {"safe", filter_safe},
      {"select", filter_select},
      {"selectattr", filter_selectattr},
      {"sort", filter_sort},
      {"string", filter_string},
      {"sum", filter_sum},
      {"title", filter_title},
      {"tojson", filter_tojson},
      {"trim", filter_trim},
      {"unique", filter_unique},
      {"upper", filter_upper},
      {"wordcount", filter_wordcount},
      // jinja2 filters this engine does not implement: known, so templates parse, but they fail
      // when applied.
      {"filesizeformat", filter_unsupported},
      {"groupby", filter_unsupported},
      {"pprint", filter_unsupported},
      {"random", filter_unsupported},
      {"slice", filter_unsupported},
      {"striptags", filter_unsupported},
      {"truncate", filter_unsupported},
      {"urlencode", filter_unsupported},
      {"urlize", filter_unsupported},
      {"wordwrap", filter_unsupported},
      {"xmlattr", filter_unsupported},
  };
  return kFilters;
}

const Value& test_argument(const char* test, const CallArguments& args) {
  if (args.positional.size() != 1 || !args.keyword.empty())
    fail("TypeError: test '{}' takes one argument", test);
  return args.positional[0];
}

void no_arguments(const char* test, const CallArguments& args) {
  if (!args.positional.empty() || !args.keyword.empty())
    fail("TypeError: test '{}' takes no arguments", test);
}

bool is_iterable(const Value& value) {
  return value.is_undefined() || value.is_string() || value.is_sequence() || value.is_dict();
}

const std::map<std::string, Test, std::less<>>& tests() {
  static const std::map<std::string, Test, std::less<>> kTests = {
      {"boolean",
       [](const Value& v, const CallArguments& a) {
         no_arguments("boolean", a);
         return v.is_bool();
       }},
      {"callable",
       [](const Value& v, const CallArguments& a) {
         no_arguments("callable", a);
         return v.is_function();
       }},
      {"defined",
       [](const Value& v, const CallArguments& a) {
         no_arguments("defined", a);
         return !v.is_undefined();
       }},
      {"undefined",
       [](const Value& v, const CallArguments& a) {
         no_arguments("undefined", a);
         return v.is_undefined();
       }},
      {"none",
       [](const Value& v, const CallArguments& a) {
         no_arguments("none", a);
         return v.is_none();
       }},
      {"true",
       [](const Value& v, const CallArguments& a) {
         no_arguments("true", a);
         return v.is_bool() && v.as_bool();
       }},
      {"false",
       [](const Value& v, const CallArguments& a) {
         no_arguments("false", a);
         return v.is_bool() && !v.as_bool();
       }},
      {"integer",
       [](const Value& v, const CallArguments& a) {
         no_arguments("integer", a);
         return v.is_int();
       }},
      {"float",
       [](const Value& v, const CallArguments& a) {
         no_arguments("float", a);
         return v.is_float();
       }},
      {"number",
       [](const Value& v, const CallArguments& a) {
         no_arguments("number", a);
         return v.is_number();
       }},
      {"string",
       [](const Value& v, const CallArguments& a) {
         no_arguments("string", a);
         return v.is_string();
       }},
      {"mapping",
       [](const Value& v, const CallArguments& a) {
         no_arguments("mapping", a);
         return v.is_dict();
       }},
      {"iterable",
       [](const Value& v, const CallArguments& a) {
         no_arguments("iterable", a);
         return is_iterable(v);
       }},
      // Python's "has len() and __getitem__": jinja2's Undefined qualifies too.
      {"sequence",
       [](const Value& v, const CallArguments& a) {
         no_arguments("sequence", a);
         return v.is_undefined() || v.is_string() || v.is_dict() ||
                (v.is_sequence() && (v.sequence_kind() == SequenceKind::kList ||
                                     v.sequence_kind() == SequenceKind::kTuple));
       }},
      {"escaped",
       [](const Value& v, const CallArguments& a) {
         no_arguments("escaped", a);
         return v.is_markup();
       }},
      {"lower",
       [](const Value& v, const CallArguments& a) {
         no_arguments("lower", a);
         if (!v.is_string()) return false;
         return v.as_string() == python_lower(v.as_string()) &&
                v.as_string() != python_upper(v.as_string());
       }},
      {"upper",
       [](const Value& v, const CallArguments& a) {
         no_arguments("upper", a);
         if (!v.is_string()) return false;
         return v.as_string() == python_upper(v.as_string()) &&
                v.as_string() != python_lower(v.as_string());
       }},
      {"odd",
       [](const Value& v, const CallArguments& a) {
         no_arguments("odd", a);
         return binary_operation("%", v, Value::integer(2)).numeric() == 1;
       }},
      {"even",
       [](const Value& v, const CallArguments& a) {
         no_arguments("even", a);
         return binary_operation("%", v, Value::integer(2)).numeric() == 0;
       }},
      {"divisibleby",
       [](const Value& v, const CallArguments& a) {
         return binary_operation("%", v, test_argument("divisibleby", a)).numeric() == 0;
       }},
      {"in",
       [](const Value& v, const CallArguments& a) { return contains(test_argument("in", a), v); }},
      {"sameas", [](const Value& v,
                    const CallArguments& a) { return same_object(v, test_argument("sameas", a)); }},
      {"eq",
       [](const Value& v, const CallArguments& a) { return equals(v, test_argument("eq", a)); }},
      {"equalto", [](const Value& v,
                     const CallArguments& a) { return equals(v, test_argument("equalto", a)); }},
      {"==",
       [](const Value& v, const CallArguments& a) { return equals(v, test_argument("==", a)); }},
      {"ne",
       [](const Value& v, const CallArguments& a) { return !equals(v, test_argument("ne", a)); }},
      {"!=",
       [](const Value& v, const CallArguments& a) { return !equals(v, test_argument("!=", a)); }},
      {"lt", [](const Value& v,
                const CallArguments& a) { return compare(v, test_argument("lt", a), "<") < 0; }},
      {"lessthan",
       [](const Value& v, const CallArguments& a) {
         return compare(v, test_argument("lessthan", a), "<") < 0;
       }},
      {"<", [](const Value& v,
               const CallArguments& a) { return compare(v, test_argument("<", a), "<") < 0; }},
      {"le", [](const Value& v,
                const CallArguments& a) { return compare(v, test_argument("le", a), "<=") <= 0; }},
      {"<=", [](const Value& v,
                const CallArguments& a) { return compare(v, test_argument("<=", a), "<=") <= 0; }},
      {"gt", [](const Value& v,
                const CallArguments& a) { return compare(v, test_argument("gt", a), ">") > 0; }},
      {"greaterthan",
       [](const Value& v, const CallArguments& a) {
         return compare(v, test_argument("greaterthan", a), ">") > 0;
       }},
      {">", [](const Value& v,
               const CallArguments& a) { return compare(v, test_argument(">", a), ">") > 0; }},
      {"ge", [](const Value& v,
                const CallArguments& a) { return compare(v, test_argument("ge", a), ">=") >= 0; }},
      {">=", [](const Value& v,
                const CallArguments& a) { return compare(v, test_argument(">=", a), ">=") >= 0; }},
      {"filter",
       [](const Value& v, const CallArguments& a) {
         no_arguments("filter", a);
         return v.is_string() && has_filter(v.as_string());
       }},
      {"test",
       [](const Value& v, const CallArguments& a) {
         no_arguments("test", a);
         return v.is_string() && has_test(v.as_string());
       }},
  };
  return kTests;
}

Value global_range(const CallArguments& args) {
  if (!args.keyword.empty()) fail("TypeError: range() takes no keyword arguments");
  if (args.positional.empty() || args.positional.size() > 3)
    fail("TypeError: range expected 1 to 3 arguments");
  int64_t start = 0;
  int64_t stop;
  int64_t step = 1;
  if (args.positional.size() == 1) {
    stop = int_argument("range", args.positional[0]);
  } else {
    start = int_argument("range", args.positional[0]);
    stop = int_argument("range", args.positional[1]);
    if (args.positional.size() == 3) step = int_argument("range", args.positional[2]);
  }
  if (step == 0) fail("ValueError: range() arg 3 must not be zero");
  std::vector<Value> items;
  constexpr size_t kMaxRange = 100000;  // jinja2's sandbox limit
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    if (items.size() >= kMaxRange)
      fail(
          "OverflowError: Range too big. The sandbox blocks ranges larger than MAX_RANGE "
          "(100000).");
    items.push_back(Value::integer(i));
  }
  return Value::list(std::move(items));
}

Dict keyword_dict(const CallArguments& args) {
  Dict dict;
  for (const auto& [key, value] : args.keyword) dict.set(key, value);
  return dict;
}

Value global_dict(const CallArguments& args) {
  if (!args.positional.empty()) fail("jinja: dict() with positional arguments is not supported");
  return Value::dict(keyword_dict(args));
}

Value global_namespace(const CallArguments& args) {
  Dict attributes;
  if (args.positional.size() > 1)
    fail("TypeError: namespace() takes at most one positional argument");
  if (args.positional.size() == 1) {
    if (!args.positional[0].is_dict())
      fail("jinja: namespace() takes a mapping as positional argument");
    attributes = args.positional[0].as_dict();
  }
  for (const auto& [key, value] : args.keyword) attributes.set(key, value);
  return Value::namespace_object(std::move(attributes));
}

Value global_raise_exception(const CallArguments& args) {
  BoundArguments bound("raise_exception", args, {"message"});
  throw TemplateRaisedError(to_str(bound.required(0)));
}

// datetime.now().strftime(format): the local time, formatted by the C library as Python does.
Value global_strftime_now(const CallArguments& args) {
  BoundArguments bound("strftime_now", args, {"format"});
  const std::string& format = string_argument("strftime_now", bound.required(0));
  const time_t now = time(nullptr);
  struct tm local;
  localtime_r(&now, &local);
  std::string buffer(format.size() * 8 + 64, '\0');
  const size_t length = strftime(buffer.data(), buffer.size(), format.c_str(), &local);
  if (length == 0 && !format.empty()) fail("jinja: strftime_now({}) produced no text", format);
  buffer.resize(length);
  return Value::string(std::move(buffer));
}

}  // namespace

bool has_filter(std::string_view name) {
  return filters().count(name) != 0;
}

bool has_test(std::string_view name) {
  return tests().count(name) != 0;
}

Value apply_filter(const std::string& name, const Value& operand, const CallArguments& arguments) {
  const auto it = filters().find(name);
  if (it == filters().end()) fail("jinja: no filter named '{}'", name);
  if (it->second == filter_unsupported) fail("jinja: the '{}' filter is not supported", name);
  return it->second(operand, arguments);
}

bool apply_test(const std::string& name, const Value& operand, const CallArguments& arguments) {
  const auto it = tests().find(name);
  if (it == tests().end()) fail("jinja: no test named '{}'", name);
  return it->second(operand, arguments);
}

Value global(const std::string& name) {
  if (name == "range") return Value::function(name, global_range);
  if (name == "dict") return Value::function(name, global_dict);
  if (name == "namespace") return Value::function(name, global_namespace);
  if (name == "raise_exception") return Value::function(name, global_raise_exception);
  if (name == "strftime_now") return Value::function(name, global_strftime_now);
  if (name == "lipsum" || name == "cycler" || name == "joiner") {
    return Value::function(name, [name](const CallArguments&) -> Value {
      fail("jinja: the global function '{}' is not supported", name);
    });
  }
  return Value::undefined(fmt::format("'{}' is undefined", name));
}

}  // namespace dspark::jinja
