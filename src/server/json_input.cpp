#include "server/json_input.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <vector>

#include "server/request.h"

namespace dspark::server {

size_t invalid_utf8_offset(std::string_view text) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char lead = bytes[i];
    if (lead < 0x80) {
      ++i;
      continue;
    }
    // The length of the sequence and the range its second byte must fall in (the narrower
    // ranges exclude overlong forms, UTF-16 surrogates and code points past U+10FFFF).
    size_t length = 0;
    unsigned char low = 0x80, high = 0xBF;
    if (lead >= 0xC2 && lead <= 0xDF) {
      length = 2;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
      length = 3;
      if (lead == 0xE0) low = 0xA0;
      if (lead == 0xED) high = 0x9F;
    } else if (lead >= 0xF0 && lead <= 0xF4) {
      length = 4;
      if (lead == 0xF0) low = 0x90;
      if (lead == 0xF4) high = 0x8F;
    } else {
      return i;
    }
    if (i + length > n || bytes[i + 1] < low || bytes[i + 1] > high) return i;
    for (size_t k = 2; k < length; ++k) {
      if (bytes[i + k] < 0x80 || bytes[i + k] > 0xBF) return i;
    }
    i += length;
  }
  return std::string_view::npos;
}

namespace {

// One flat pass over JSON text: the deepest nesting (stopping once past kMaxJsonDepth) and, when
// asked, the first NaN / Infinity literal and the first number too large for a double (which
// nlohmann refuses with a message that names no field), each with the path of object keys it
// sits under ("response_format.json_schema.schema.maximum").
struct JsonScan {
  bool too_deep = false;
  bool non_finite = false;
  std::string non_finite_field;
  std::string overflow_field;
  std::string overflow_literal;  // as shown in the message: its first 32 characters
};

// Keys longer than this are cut in messages: a hostile key must not make a huge error body.
constexpr size_t kMaxKeyInMessage = 64;

// Whether a JSON number literal (digits, sign, point, exponent) is beyond a double's range.
bool overflows_double(std::string_view literal) {
  // Without an exponent, 309 digits are needed to pass DBL_MAX (about 1.8e308).
  if (literal.find_first_of("eE") == std::string_view::npos && literal.size() < 309) return false;
  return std::isinf(std::strtod(std::string(literal).c_str(), nullptr));
}

JsonScan scan_json(std::string_view text, bool check_numbers) {
  JsonScan scan;
  int depth = 0;
  bool in_string = false;
  size_t string_start = 0;
  std::string_view last_string;
  // keys[d]: the key of the member being read in the object at depth d ("" in an array).
  std::vector<std::string_view> keys(1);
  auto path = [&] {
    std::string joined;
    for (std::string_view key : keys) {
      if (key.empty()) continue;
      if (!joined.empty()) joined += '.';
      joined += key.substr(0, kMaxKeyInMessage);
    }
    return joined;
  };
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
        last_string = text.substr(string_start, i - string_start);
      }
      continue;
    }
    switch (c) {
      case '"':
        in_string = true;
        string_start = i + 1;
        break;
      case ':':
        keys.back() = last_string;
        break;
      case '[':
      case '{':
        if (++depth > kMaxJsonDepth) {
          scan.too_deep = true;
          return scan;
        }
        keys.emplace_back();
        break;
      case ']':
      case '}':
        --depth;
        if (keys.size() > 1) keys.pop_back();
        break;
      case 'N':  // NaN: not JSON, but some encoders write it (Python's json.dumps)
      case 'I':  // Infinity, -Infinity
        if (check_numbers && !scan.non_finite) {
          scan.non_finite = true;
          scan.non_finite_field = path();
        }
        break;
      case '-':
      case '0':
      case '1':
      case '2':
      case '3':
      case '4':
      case '5':
      case '6':
      case '7':
      case '8':
      case '9': {
        const size_t end = std::min(text.find_first_not_of("0123456789+-.eE", i), text.size());
        const std::string_view literal = text.substr(i, end - i);
        if (check_numbers && scan.overflow_literal.empty() && overflows_double(literal)) {
          scan.overflow_field = path();
          scan.overflow_literal = literal.size() <= 32 ? std::string(literal)
                                                       : std::string(literal.substr(0, 32)) + "...";
        }
        i = end - 1;
        break;
      }
      default:
        break;
    }
  }
  return scan;
}

}  // namespace

bool nests_too_deep(std::string_view text) {
  return scan_json(text, false).too_deep;
}

void check_json_text(std::string_view text, std::string_view what) {
  const size_t bad = invalid_utf8_offset(text);
  if (bad != std::string_view::npos) {
    throw ApiError(400, fmt::format("{} is not valid UTF-8 (byte {})", what, bad));
  }
  const JsonScan scan = scan_json(text, true);
  if (scan.too_deep) {
    throw ApiError(400, fmt::format("{} nests deeper than {} levels of arrays and objects", what,
                                    kMaxJsonDepth));
  }
  if (scan.non_finite) {
    if (scan.non_finite_field.empty()) {
      throw ApiError(400, fmt::format("{} holds NaN or Infinity, which JSON does not allow", what));
    }
    throw ApiError(400,
                   fmt::format("'{}' must be a finite number: NaN and Infinity are not JSON",
                               scan.non_finite_field),
                   "", scan.non_finite_field);
  }
  if (!scan.overflow_literal.empty()) {
    if (scan.overflow_field.empty()) {
      throw ApiError(400, fmt::format("{} holds the number {}, which is too large for a double",
                                      what, scan.overflow_literal));
    }
    throw ApiError(400,
                   fmt::format("'{}' holds the number {}, which is too large for a double",
                               scan.overflow_field, scan.overflow_literal),
                   "", scan.overflow_field);
  }
}

nlohmann::json parse_json_input(std::string_view text, std::string_view what) {
  check_json_text(text, what);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw ApiError(400, fmt::format("{} is not valid JSON: {}", what, e.what()));
  }
}

nlohmann::ordered_json parse_ordered_json_input(std::string_view text, std::string_view what) {
  check_json_text(text, what);
  try {
    return nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw ApiError(400, fmt::format("{} is not valid JSON: {}", what, e.what()));
  }
}

size_t field_bytes(const nlohmann::json& value) {
  return value.is_string() ? value.get_ref<const std::string&>().size() : dump_json(value).size();
}

void check_field_size(const nlohmann::json& value, const std::string& field, size_t limit) {
  const size_t bytes = field_bytes(value);
  if (bytes > limit) {
    throw ApiError(400,
                   fmt::format("'{}' is {} bytes; at most {} ({} KiB) are allowed", field, bytes,
                               limit, limit >> 10),
                   "", field);
  }
}

std::string dump_json(const nlohmann::json& value) {
  return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string dump_json(const nlohmann::ordered_json& value) {
  return value.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

}  // namespace dspark::server
