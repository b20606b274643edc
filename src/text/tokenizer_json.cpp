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

bool is_token_id(const nlohmann::json& value) {
  if (value.is_number_unsigned()) return value.get<uint64_t>() < uint64_t{kMaxTokenIds};
  return value.is_number_integer() && value.get<int64_t>() >= 0 &&
         value.get<int64_t>() < kMaxTokenIds;
}

int32_t json_token_id(const nlohmann::json& value, std::string_view what, std::string_view source) {
  if (!is_token_id(value)) {
    fail("{}: {} {} is not a token id (an integer in [0, {}))", source, what, value.dump(),
         kMaxTokenIds);
  }
  return static_cast<int32_t>(value.get<int64_t>());
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
