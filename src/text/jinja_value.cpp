#include "text/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>

#include "base/error.h"
#include "text/jinja_strings.h"
#include "text/utf8.h"

namespace dspark::jinja {
namespace {

[[noreturn]] void fail_nesting() {
  fail("jinja: value nesting limit: lists, dicts and namespaces nested deeper than {}",
       kMaxValueNesting);
}

// Bounds the recursion of printing, comparing and serialising values whose nesting a namespace
// cycle (a namespace holding itself) leaves unbounded.
class RecursionGuard {
 public:
  RecursionGuard() {
    if (++depth_ > kMaxValueNesting) {
      --depth_;
      fail_nesting();
    }
  }
  ~RecursionGuard() { --depth_; }
  RecursionGuard(const RecursionGuard&) = delete;
  RecursionGuard& operator=(const RecursionGuard&) = delete;

 private:
  static thread_local int depth_;
};
thread_local int RecursionGuard::depth_ = 0;

thread_local size_t string_limit = size_t{32} << 20;

}  // namespace

size_t max_string_bytes() {
  return string_limit;
}

void check_string_size(size_t bytes, std::string_view operation) {
  if (bytes > string_limit) {
    fail("jinja: string size limit: {} would make {} bytes (the limit is {})", operation, bytes,
         string_limit);
  }
}

StringLimit::StringLimit(size_t bytes) : previous_(string_limit) {
  string_limit = bytes;
}
StringLimit::~StringLimit() {
  string_limit = previous_;
}

const Value* Dict::find(std::string_view key) const {
  for (const auto& [name, value] : entries_) {
    if (name == key) return &value;
  }
  return nullptr;
}

void Dict::set(std::string key, Value value) {
  const int nesting = 1 + value.nesting();
  if (nesting > kMaxValueNesting) fail_nesting();
  nesting_ = std::max(nesting_, nesting);
  for (auto& [name, existing] : entries_) {
    if (name == key) {
      existing = std::move(value);
      return;
    }
  }
  entries_.emplace_back(std::move(key), std::move(value));
}

Value Value::sequence(SequenceKind kind, std::vector<Value> items) {
  int deepest = 0;
  for (const Value& item : items) deepest = std::max(deepest, item.nesting());
  if (deepest + 1 > kMaxValueNesting) fail_nesting();
  return Value(
      SequencePtr(std::make_shared<const Sequence>(Sequence{kind, std::move(items), deepest + 1})));
}

Value Value::dict(Dict dict) {
  return Value(DictPtr(std::make_shared<const Dict>(std::move(dict))));
}

Value Value::namespace_object(Dict attributes) {
  return Value(NamespacePtr(std::make_shared<Namespace>(Namespace{std::move(attributes)})));
}

Value Value::function(std::string name, std::function<Value(const CallArguments&)> call) {
  return Value(
      FunctionPtr(std::make_shared<const Function>(Function{std::move(name), std::move(call)})));
}

Value Value::from_json(const nlohmann::ordered_json& json) {
  switch (json.type()) {
    case nlohmann::ordered_json::value_t::null:
      return none();
    case nlohmann::ordered_json::value_t::boolean:
      return boolean(json.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return integer(json.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const auto value = json.get<uint64_t>();
      if (value > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        fail("jinja: JSON integer {} does not fit in 64 bits", value);
      }
      return integer(static_cast<int64_t>(value));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return floating(json.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return string(json.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      items.reserve(json.size());
      for (const auto& item : json) items.push_back(from_json(item));
      return list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict result;
      for (const auto& [key, item] : json.items()) result.set(key, from_json(item));
      return dict(std::move(result));
    }
    default:
      fail("jinja: JSON value of type {} cannot be passed to a template", json.type_name());
  }
}

std::string Value::type_name() const {
  switch (kind()) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return is_markup() ? "Markup" : "str";
    case Kind::kSequence:
      switch (sequence_kind()) {
        case SequenceKind::kList:
          return "list";
        case SequenceKind::kTuple:
          return "tuple";
        case SequenceKind::kIterator:
          return "generator";
        case SequenceKind::kDictKeys:
          return "dict_keys";
        case SequenceKind::kDictValues:
          return "dict_values";
        case SequenceKind::kDictItems:
          return "dict_items";
      }
      break;
    case Kind::kDict:
      return "dict";
    case Kind::kNamespace:
      return "Namespace";
    case Kind::kFunction:
      return "function";
  }
  return "object";
}

bool Value::truthy() const {
  switch (kind()) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return as_bool();
    case Kind::kInt:
      return as_int() != 0;
    case Kind::kFloat:
      return as_float() != 0.0;
    case Kind::kString:
      return !as_string().empty();
    case Kind::kSequence:
      return sequence_kind() == SequenceKind::kIterator || !items().empty();
    case Kind::kDict:
      return !as_dict().empty();
    case Kind::kNamespace:
    case Kind::kFunction:
      return true;
  }
  return false;
}

bool same_object(const Value& a, const Value& b) {
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kSequence:
      return std::get<Value::SequencePtr>(a.data_) == std::get<Value::SequencePtr>(b.data_);
    case Value::Kind::kDict:
      return std::get<Value::DictPtr>(a.data_) == std::get<Value::DictPtr>(b.data_);
    case Value::Kind::kNamespace:
      return std::get<Value::NamespacePtr>(a.data_) == std::get<Value::NamespacePtr>(b.data_);
    case Value::Kind::kFunction:
      return std::get<Value::FunctionPtr>(a.data_) == std::get<Value::FunctionPtr>(b.data_);
    default:
      return equals(a, b);
  }
}

bool equals(const Value& a, const Value& b) {
  const RecursionGuard guard;
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.numeric() == b.numeric();
    return a.integral() == b.integral();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kString:
      return a.as_string() == b.as_string();
    case Value::Kind::kSequence: {
      const SequenceKind kind = a.sequence_kind();
      if (kind != b.sequence_kind()) return false;
      if (kind != SequenceKind::kList && kind != SequenceKind::kTuple) return same_object(a, b);
      const auto& x = a.items();
      const auto& y = b.items();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i) {
        if (!equals(x[i], y[i])) return false;
      }
      return true;
    }
    case Value::Kind::kDict: {
      const Dict& x = a.as_dict();
      const Dict& y = b.as_dict();
      if (x.size() != y.size()) return false;
      for (const auto& [key, value] : x.entries()) {
        const Value* other = y.find(key);
        if (other == nullptr || !equals(value, *other)) return false;
      }
      return true;
    }
    default:
      return same_object(a, b);
  }
}

int compare(const Value& a, const Value& b, std::string_view op) {
  if (a.is_undefined()) fail("UndefinedError: {}", a.undefined_message());
  if (b.is_undefined()) fail("UndefinedError: {}", b.undefined_message());
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) {
      const double x = a.numeric();
      const double y = b.numeric();
      return x < y ? -1 : (x > y ? 1 : 0);
    }
    const int64_t x = a.integral();
    const int64_t y = b.integral();
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  if (a.is_string() && b.is_string()) {
    // UTF-8 byte order is code point order, which is how Python orders str.
    const int c = a.as_string().compare(b.as_string());
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if (a.is_sequence() && b.is_sequence() && a.sequence_kind() == b.sequence_kind() &&
      (a.sequence_kind() == SequenceKind::kList || a.sequence_kind() == SequenceKind::kTuple)) {
    const auto& x = a.items();
    const auto& y = b.items();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!equals(x[i], y[i])) return compare(x[i], y[i], op);
    }
    return x.size() < y.size() ? -1 : (x.size() > y.size() ? 1 : 0);
  }
  fail("TypeError: '{}' not supported between instances of '{}' and '{}'", op, a.type_name(),
       b.type_name());
}

std::string format_float(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  if (value == 0.0) return std::signbit(value) ? "-0.0" : "0.0";
  // Shortest round-trip digits, then laid out as Python's float.__repr__ does: positional
  // notation for decimal exponents in [-4, 16), scientific otherwise.
  char buffer[64];
  const auto result =
      std::to_chars(buffer, buffer + sizeof(buffer), value, std::chars_format::scientific);
  std::string scientific(buffer, result.ptr);
  const bool negative = scientific[0] == '-';
  if (negative) scientific.erase(0, 1);
  const size_t e_pos = scientific.find('e');
  std::string digits = scientific.substr(0, e_pos);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int exponent = std::stoi(scientific.substr(e_pos + 1));
  std::string out = negative ? "-" : "";
  if (exponent >= -4 && exponent < 16) {
    if (exponent < 0) {
      out += "0.";
      out.append(static_cast<size_t>(-exponent - 1), '0');
      out += digits;
    } else if (static_cast<size_t>(exponent) + 1 >= digits.size()) {
      out += digits;
      out.append(static_cast<size_t>(exponent) + 1 - digits.size(), '0');
      out += ".0";
    } else {
      out += digits.substr(0, static_cast<size_t>(exponent) + 1);
      out += '.';
      out += digits.substr(static_cast<size_t>(exponent) + 1);
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) {
    out += '.';
    out += digits.substr(1);
  }
  out += exponent < 0 ? "e-" : "e+";
  const std::string magnitude = std::to_string(std::abs(exponent));
  if (magnitude.size() < 2) out += '0';
  out += magnitude;
  return out;
}

namespace {

void append_hex_escape(std::string& out, char32_t c) {
  const char* prefix = c < 0x100 ? "\\x" : (c < 0x10000 ? "\\u" : "\\U");
  const int width = c < 0x100 ? 2 : (c < 0x10000 ? 4 : 8);
  out += fmt::format("{}{:0{}x}", prefix, static_cast<uint32_t>(c), width);
}

std::string repr_string(const std::string& text) {
  const bool has_single = text.find('\'') != std::string::npos;
  const bool has_double = text.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (char32_t c : decode_utf8(text)) {
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (!is_python_printable(c)) {
      append_hex_escape(out, c);
    } else {
      utf8_append(out, c);
    }
  }
  out += quote;
  return out;
}

std::string join_reprs(const std::vector<Value>& items) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += ", ";
    out += to_repr(items[i]);
  }
  return out;
}

std::string repr_dict_entries(const Dict& dict) {
  std::string out = "{";
  bool first = true;
  for (const auto& [key, value] : dict.entries()) {
    if (!first) out += ", ";
    first = false;
    out += repr_string(key);
    out += ": ";
    out += to_repr(value);
  }
  out += '}';
  return out;
}

}  // namespace

std::string to_str(const Value& value) {
  switch (value.kind()) {
    case Value::Kind::kUndefined:
      return "";
    case Value::Kind::kString:
      return value.as_string();
    default:
      return to_repr(value);
  }
}

std::string to_repr(const Value& value) {
  const RecursionGuard guard;
  switch (value.kind()) {
    case Value::Kind::kUndefined:
      return "Undefined";
    case Value::Kind::kNone:
      return "None";
    case Value::Kind::kBool:
      return value.as_bool() ? "True" : "False";
    case Value::Kind::kInt:
      return std::to_string(value.as_int());
    case Value::Kind::kFloat:
      return format_float(value.as_float());
    case Value::Kind::kString:
      return value.is_markup() ? "Markup(" + repr_string(value.as_string()) + ")"
                               : repr_string(value.as_string());
    case Value::Kind::kSequence:
      switch (value.sequence_kind()) {
        case SequenceKind::kList:
          return "[" + join_reprs(value.items()) + "]";
        case SequenceKind::kTuple:
          return value.items().size() == 1 ? "(" + to_repr(value.items()[0]) + ",)"
                                           : "(" + join_reprs(value.items()) + ")";
        case SequenceKind::kDictKeys:
          return "dict_keys([" + join_reprs(value.items()) + "])";
        case SequenceKind::kDictValues:
          return "dict_values([" + join_reprs(value.items()) + "])";
        case SequenceKind::kDictItems:
          return "dict_items([" + join_reprs(value.items()) + "])";
        case SequenceKind::kIterator:
          fail("jinja: printing a generator is not supported (Python prints its address)");
      }
      break;
    case Value::Kind::kDict:
      return repr_dict_entries(value.as_dict());
    case Value::Kind::kNamespace:
      return "<Namespace " + repr_dict_entries(value.as_namespace().attributes) + ">";
    case Value::Kind::kFunction:
      fail("jinja: printing the function '{}' is not supported (Python prints its address)",
           value.as_function().name);
  }
  return "";
}

namespace {

void append_json_string(std::string& out, const std::string& text, bool ensure_ascii) {
  out += '"';
  for (size_t pos = 0; pos < text.size();) {
    const auto byte = static_cast<uint8_t>(text[pos]);
    if (byte < 0x80) {
      switch (byte) {
        case '"':
          out += "\\\"";
          break;
        case '\\':
          out += "\\\\";
          break;
        case '\n':
          out += "\\n";
          break;
        case '\r':
          out += "\\r";
          break;
        case '\t':
          out += "\\t";
          break;
        case '\b':
          out += "\\b";
          break;
        case '\f':
          out += "\\f";
          break;
        default:
          // ensure_ascii escapes everything outside ' '..'~', so DEL as well.
          if (byte < 0x20 || (byte == 0x7F && ensure_ascii)) {
            out += fmt::format("\\u{:04x}", byte);
          } else {
            out += static_cast<char>(byte);
          }
      }
      ++pos;
      continue;
    }
    char32_t c;
    const size_t length = utf8_decode(text, pos, &c);
    if (length == 0) fail("jinja: tojson got a string that is not valid UTF-8");
    if (!ensure_ascii) {
      out.append(text, pos, length);
    } else if (c < 0x10000) {
      out += fmt::format("\\u{:04x}", static_cast<uint32_t>(c));
    } else {
      const uint32_t v = static_cast<uint32_t>(c) - 0x10000;
      out += fmt::format("\\u{:04x}\\u{:04x}", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
    }
    pos += length;
  }
  out += '"';
}

void append_json(std::string& out, const Value& value, const JsonOptions& options, int depth) {
  const RecursionGuard guard;
  auto newline = [&](int level) {
    out += '\n';
    for (int i = 0; i < level; ++i) out += *options.indent;
  };
  switch (value.kind()) {
    case Value::Kind::kNone:
      out += "null";
      return;
    case Value::Kind::kBool:
      out += value.as_bool() ? "true" : "false";
      return;
    case Value::Kind::kInt:
      out += std::to_string(value.as_int());
      return;
    case Value::Kind::kFloat: {
      const double d = value.as_float();
      if (std::isnan(d)) {
        out += "NaN";
      } else if (std::isinf(d)) {
        out += d > 0 ? "Infinity" : "-Infinity";
      } else {
        out += format_float(d);
      }
      return;
    }
    case Value::Kind::kString:
      append_json_string(out, value.as_string(), options.ensure_ascii);
      return;
    case Value::Kind::kSequence: {
      const SequenceKind kind = value.sequence_kind();
      if (kind != SequenceKind::kList && kind != SequenceKind::kTuple) break;
      const auto& items = value.items();
      if (items.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out += options.item_separator;
        if (options.indent) newline(depth + 1);
        append_json(out, items[i], options, depth + 1);
      }
      if (options.indent) newline(depth);
      out += ']';
      return;
    }
    case Value::Kind::kDict: {
      const Dict& dict = value.as_dict();
      if (dict.empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> entries;
      for (const auto& entry : dict.entries()) entries.push_back(&entry);
      if (options.sort_keys) {
        std::stable_sort(entries.begin(), entries.end(),
                         [](const auto* x, const auto* y) { return x->first < y->first; });
      }
      out += '{';
      for (size_t i = 0; i < entries.size(); ++i) {
        if (i > 0) out += options.item_separator;
        if (options.indent) newline(depth + 1);
        append_json_string(out, entries[i]->first, options.ensure_ascii);
        out += options.key_separator;
        append_json(out, entries[i]->second, options, depth + 1);
      }
      if (options.indent) newline(depth);
      out += '}';
      return;
    }
    default:
      break;
  }
  fail("TypeError: Object of type {} is not JSON serializable", value.type_name());
}

}  // namespace

std::string to_json_text(const Value& value, const JsonOptions& options) {
  std::string out;
  append_json(out, value, options, 0);
  return out;
}

}  // namespace dspark::jinja
