#include "server/json_input.h"

#include <fmt/format.h>

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
// asked, the key of the first NaN / Infinity literal outside a string.
struct JsonScan {
  bool too_deep = false;
  bool non_finite = false;
  std::string_view non_finite_key;
};

JsonScan scan_json(std::string_view text, bool find_non_finite) {
  JsonScan scan;
  int depth = 0;
  bool in_string = false;
  size_t string_start = 0;
  std::string_view last_string, last_key;
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
        last_key = last_string;
        break;
      case '[':
      case '{':
        if (++depth > kMaxJsonDepth) {
          scan.too_deep = true;
          return scan;
        }
        break;
      case ']':
      case '}':
        --depth;
        break;
      case 'N':  // NaN: not JSON, but some encoders write it (Python's json.dumps)
      case 'I':  // Infinity, -Infinity
        if (find_non_finite && !scan.non_finite) {
          scan.non_finite = true;
          scan.non_finite_key = last_key.substr(0, 64);
        }
        break;
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
    const std::string field(scan.non_finite_key);
    if (field.empty()) {
      throw ApiError(400, fmt::format("{} holds NaN or Infinity, which JSON does not allow", what));
    }
    throw ApiError(
        400, fmt::format("'{}' must be a finite number: NaN and Infinity are not JSON", field), "",
        field);
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

std::string dump_json(const nlohmann::json& value) {
  return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string dump_json(const nlohmann::ordered_json& value) {
  return value.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

}  // namespace dspark::server
