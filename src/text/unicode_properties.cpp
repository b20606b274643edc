#include "text/unicode_properties.h"

#include <unicode/uchar.h>

namespace dspark {

bool unicode_is_white_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

bool unicode_is_word_char(char32_t c) {
  if (c < 0x80) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  }
  const auto code_point = static_cast<UChar32>(c);
  if (u_hasBinaryProperty(code_point, UCHAR_ALPHABETIC) ||
      u_hasBinaryProperty(code_point, UCHAR_JOIN_CONTROL)) {
    return true;
  }
  const int8_t type = u_charType(code_point);
  return type == U_NON_SPACING_MARK || type == U_ENCLOSING_MARK ||
         type == U_COMBINING_SPACING_MARK || type == U_DECIMAL_DIGIT_NUMBER ||
         type == U_CONNECTOR_PUNCTUATION;
}

}  // namespace dspark
