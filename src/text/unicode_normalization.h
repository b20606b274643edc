#pragma once
// Unicode normalization forms and lower-casing, through ICU. Normalization is restricted to the
// characters of Unicode 9.0, because that is the table HF tokenizers normalizes with: newer
// characters pass through unchanged and act as starters, exactly as they do there.
#include <string>
#include <string_view>

namespace dspark {

enum class NormalizationForm { kNfc, kNfd, kNfkc, kNfkd };

// `text` must be valid UTF-8.
std::string unicode_normalize(std::string_view text, NormalizationForm form);

// Full Unicode lower-casing (root locale), including the context-dependent final sigma.
std::string unicode_lowercase(std::string_view text);

}  // namespace dspark
