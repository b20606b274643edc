#include "text/unicode_regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "base/error.h"
#include "text/utf8.h"

namespace dspark {
namespace {

// Per-thread match state: a one-pair match block (only the overall match is read) and a JIT stack
// large enough for patterns like \s+(?!\S) over long whitespace runs.
class MatchScratch {
 public:
  MatchScratch() {
    match_data_ = pcre2_match_data_create(1, nullptr);
    context_ = pcre2_match_context_create(nullptr);
    jit_stack_ = pcre2_jit_stack_create(64 * 1024, 16 * 1024 * 1024, nullptr);
    if (match_data_ == nullptr || context_ == nullptr || jit_stack_ == nullptr) {
      fail("out of memory allocating PCRE2 match state");
    }
    pcre2_jit_stack_assign(context_, nullptr, jit_stack_);
  }
  ~MatchScratch() {
    pcre2_jit_stack_free(jit_stack_);
    pcre2_match_context_free(context_);
    pcre2_match_data_free(match_data_);
  }
  MatchScratch(const MatchScratch&) = delete;
  MatchScratch& operator=(const MatchScratch&) = delete;

  pcre2_match_data* match_data() { return match_data_; }
  pcre2_match_context* context() { return context_; }

 private:
  pcre2_match_data* match_data_ = nullptr;
  pcre2_match_context* context_ = nullptr;
  pcre2_jit_stack* jit_stack_ = nullptr;
};

MatchScratch& scratch() {
  thread_local MatchScratch instance;
  return instance;
}

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(code, buffer, sizeof(buffer));
  return reinterpret_cast<const char*>(buffer);
}

}  // namespace

std::string adapt_oniguruma_pattern(std::string_view pattern) {
  // Oniguruma's \s is exactly Unicode White_Space. PCRE2's differs (it adds U+180E and drops
  // U+0085), so \s and \S are spelled out. Oniguruma's \h is a hex digit, PCRE2's a space.
  constexpr std::string_view kWhiteSpace =
      "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
      "\\x{202F}\\x{205F}\\x{3000}";
  constexpr std::string_view kHexDigit = "0-9a-fA-F";
  std::string out;
  out.reserve(pattern.size() + 16);
  int class_depth = 0;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char escaped = pattern[++i];
      const bool in_class = class_depth > 0;
      const bool negated = escaped == 'S' || escaped == 'H';
      const std::string_view* items = nullptr;
      if (escaped == 's' || escaped == 'S') items = &kWhiteSpace;
      if (escaped == 'h' || escaped == 'H') items = &kHexDigit;
      if (items != nullptr && !(in_class && negated)) {
        if (in_class) {
          out += *items;
        } else {
          out += negated ? "[^" : "[";
          out += *items;
          out += ']';
        }
      } else {
        out += '\\';
        out += escaped;
      }
      continue;
    }
    if (c == '[') {
      ++class_depth;
      out += c;
      // A ']' or '^]' right after the opening bracket is a literal, not the end of the class.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
      continue;
    }
    if (c == ']' && class_depth > 0) --class_depth;
    out += c;
  }
  return out;
}

std::string regex_escape(std::string_view literal) {
  std::string out;
  out.reserve(literal.size() * 2);
  for (const char c : literal) {
    if (std::string_view("\\^$.|?*+()[]{}-/#").find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out;
}

UnicodeRegex::UnicodeRegex(std::string_view pattern) : pattern_(pattern) {
  const std::string adapted = adapt_oniguruma_pattern(pattern);
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(adapted.data()), adapted.size(),
                        PCRE2_UTF | PCRE2_UCP, &error_code, &error_offset, nullptr);
  if (code_ == nullptr) {
    fail("tokenizer regex '{}' does not compile: {} at offset {}", pattern_,
         pcre2_message(error_code), error_offset);
  }
  // Without JIT, pcre2_match interprets the pattern: slower but the same matches.
  pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);
}

UnicodeRegex::~UnicodeRegex() {
  pcre2_code_free(code_);
}

bool UnicodeRegex::find(std::string_view text, size_t start, size_t* begin, size_t* end) const {
  MatchScratch& state = scratch();
  const int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), start,
                             PCRE2_NO_UTF_CHECK, state.match_data(), state.context());
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) fail("tokenizer regex '{}' failed to match: {}", pattern_, pcre2_message(rc));
  const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(state.match_data());
  *begin = ovector[0];
  *end = ovector[1];
  return true;
}

bool UnicodeRegex::search(std::string_view text) const {
  size_t begin;
  size_t end;
  return find(text, 0, &begin, &end);
}

size_t UnicodeRegex::next_char(std::string_view text, size_t pos) {
  if (pos >= text.size()) return pos + 1;
  return pos + utf8_sequence_length(static_cast<uint8_t>(text[pos]));
}

}  // namespace dspark
