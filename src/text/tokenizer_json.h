#pragma once
// Small readers shared by the tokenizer.json component parsers.
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>

namespace dspark {

// A tokenizer.json pattern object, {"String": literal} or {"Regex": pattern}, as a regex source.
std::string pattern_to_regex(const nlohmann::json& pattern, std::string_view source);

// The single character of a one-character string field such as Metaspace's "replacement".
char32_t json_single_char(const nlohmann::json& value, std::string_view field,
                          std::string_view source);

}  // namespace dspark
