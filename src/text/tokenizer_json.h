#pragma once
// Small readers shared by the tokenizer.json component parsers.
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>

namespace dspark {

// A tokenizer.json pattern object, {"String": literal} or {"Regex": pattern}, as a regex source.
std::string pattern_to_regex(const nlohmann::json& pattern, std::string_view source);

// The single character of a one-character string field such as Metaspace's "replacement".
char32_t json_single_char(const nlohmann::json& value, std::string_view field,
                          std::string_view source);

// Token ids a tokenizer.json may use: below the largest vocabulary a model config may declare
// (model/loader.h kMaxConfigVocab), so that tables indexed by id stay allocatable.
constexpr int64_t kMaxTokenIds = int64_t{1} << 24;

// Whether `value` is an integer in [0, kMaxTokenIds). A float or a huge integer would otherwise be
// converted to int32 unchecked (undefined for a float out of range).
bool is_token_id(const nlohmann::json& value);
// A token id field (`what` names it), or an error naming it.
int32_t json_token_id(const nlohmann::json& value, std::string_view what, std::string_view source);

}  // namespace dspark
