#pragma once
// UTF-8 helpers for the tokenizer: decoding code points, repairing invalid input the way Rust's
// String::from_utf8_lossy does (one U+FFFD per maximal invalid subpart), and finding how much of a
// byte string ends on a complete character.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace dspark {

inline constexpr char32_t kReplacementChar = 0xFFFD;

// Length of the UTF-8 sequence announced by lead byte `lead` (1 for continuation or invalid
// bytes, so callers always make progress).
inline size_t utf8_sequence_length(uint8_t lead) {
  if (lead < 0x80) return 1;
  if ((lead & 0xE0) == 0xC0) return 2;
  if ((lead & 0xF0) == 0xE0) return 3;
  if ((lead & 0xF8) == 0xF0) return 4;
  return 1;
}

// Decodes the well-formed character at text[pos]. Returns its length in bytes, or 0 when the bytes
// there are not a well-formed UTF-8 sequence (overlong, surrogate, beyond U+10FFFF, truncated).
size_t utf8_decode(std::string_view text, size_t pos, char32_t* code_point);

void utf8_append(std::string& out, char32_t code_point);

bool utf8_is_valid(std::string_view text);

// `text` with every ill-formed subsequence replaced by U+FFFD, following the Unicode "maximal
// subpart" practice that Rust's from_utf8_lossy and Python's errors="replace" both implement.
std::string utf8_repair(std::string_view text);

// The longest prefix of `text` that does not end inside a character that further bytes could
// still complete. Ill-formed bytes count as complete (they will never become valid).
size_t utf8_complete_prefix_length(std::string_view text);

}  // namespace dspark
