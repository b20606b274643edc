#include "text/utf8.h"

namespace dspark {
namespace {

// Valid range of the second byte for each three- and four-byte lead (Unicode Table 3-7); this
// excludes overlongs, surrogates and code points above U+10FFFF.
bool second_byte_ok(uint8_t lead, uint8_t second) {
  if (lead == 0xE0) return second >= 0xA0 && second <= 0xBF;
  if (lead == 0xED) return second >= 0x80 && second <= 0x9F;
  if (lead == 0xF0) return second >= 0x90 && second <= 0xBF;
  if (lead == 0xF4) return second >= 0x80 && second <= 0x8F;
  return second >= 0x80 && second <= 0xBF;
}

bool is_continuation(uint8_t byte) {
  return (byte & 0xC0) == 0x80;
}

// Length of a well-formed sequence at text[pos] (0 if ill-formed), and in `prefix_length` the
// length of the maximal subpart: how many bytes form a valid but possibly incomplete start.
// `truncated` tells that the text ended inside a sequence that more bytes could complete.
size_t scan(std::string_view text, size_t pos, size_t* prefix_length, bool* truncated = nullptr) {
  const auto lead = static_cast<uint8_t>(text[pos]);
  *prefix_length = 1;
  if (truncated != nullptr) *truncated = false;
  if (lead < 0x80) return 1;
  size_t length;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
  } else {
    return 0;
  }
  for (size_t i = 1; i < length; ++i) {
    if (pos + i >= text.size()) {
      if (truncated != nullptr) *truncated = true;
      return 0;
    }
    const auto byte = static_cast<uint8_t>(text[pos + i]);
    const bool ok = i == 1 ? second_byte_ok(lead, byte) : is_continuation(byte);
    if (!ok) return 0;
    *prefix_length = i + 1;
  }
  return length;
}

}  // namespace

size_t utf8_decode(std::string_view text, size_t pos, char32_t* code_point) {
  size_t prefix;
  const size_t length = scan(text, pos, &prefix);
  if (length == 0) return 0;
  const auto* bytes = reinterpret_cast<const uint8_t*>(text.data() + pos);
  switch (length) {
    case 1:
      *code_point = bytes[0];
      break;
    case 2:
      *code_point = (char32_t(bytes[0] & 0x1F) << 6) | (bytes[1] & 0x3F);
      break;
    case 3:
      *code_point =
          (char32_t(bytes[0] & 0x0F) << 12) | (char32_t(bytes[1] & 0x3F) << 6) | (bytes[2] & 0x3F);
      break;
    default:
      *code_point = (char32_t(bytes[0] & 0x07) << 18) | (char32_t(bytes[1] & 0x3F) << 12) |
                    (char32_t(bytes[2] & 0x3F) << 6) | (bytes[3] & 0x3F);
      break;
  }
  return length;
}

void utf8_append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool utf8_is_valid(std::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    if (static_cast<uint8_t>(text[pos]) < 0x80) {
      ++pos;
      continue;
    }
    size_t prefix;
    const size_t length = scan(text, pos, &prefix);
    if (length == 0) return false;
    pos += length;
  }
  return true;
}

std::string utf8_repair(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    size_t prefix;
    const size_t length = scan(text, pos, &prefix);
    if (length == 0) {
      utf8_append(out, kReplacementChar);
      pos += prefix;
    } else {
      out.append(text.substr(pos, length));
      pos += length;
    }
  }
  return out;
}

size_t utf8_complete_prefix_length(std::string_view text) {
  // A character is at most 4 bytes, so only the last 3 bytes can start an unfinished one.
  const size_t first = text.size() > 3 ? text.size() - 3 : 0;
  for (size_t pos = first; pos < text.size(); ++pos) {
    if (is_continuation(static_cast<uint8_t>(text[pos]))) continue;
    size_t prefix;
    bool truncated;
    if (scan(text, pos, &prefix, &truncated) == 0 && truncated) return pos;
  }
  return text.size();
}

}  // namespace dspark
