#pragma once
// Character classes that HF tokenizers tests with Rust's regex crate (\s, \w) when it places added
// tokens: used for their lstrip, rstrip and single_word flags.
namespace dspark {

// Unicode White_Space.
bool unicode_is_white_space(char32_t code_point);

// Rust regex \w: Alphabetic, marks, decimal digits, connector punctuation and joiners.
bool unicode_is_word_char(char32_t code_point);

}  // namespace dspark
