#include "text/tokenizer_json.h"

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "text/unicode_regex.h"
#include "text/utf8.h"

namespace dspark {

std::string pattern_to_regex(const nlohmann::json& pattern, std::string_view source) {
  if (pattern.contains("Regex")) return pattern.at("Regex").get<std::string>();
  if (pattern.contains("String")) return regex_escape(pattern.at("String").get<std::string>());
  fail("{}: pattern {} is neither String nor Regex", source, pattern.dump());
}

char32_t json_single_char(const nlohmann::json& value, std::string_view field,
                          std::string_view source) {
  const std::string text = value.get<std::string>();
  char32_t code_point = 0;
  if (text.empty() || utf8_decode(text, 0, &code_point) != text.size()) {
    fail("{}: field '{}' must be a single character, got '{}'", source, field, text);
  }
  return code_point;
}

}  // namespace dspark
