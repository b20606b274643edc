#pragma once
// Unicode-aware regular expressions for tokenizer split patterns, on PCRE2 (UTF + UCP, JIT).
// Patterns come from tokenizer.json files written for Oniguruma (what HF tokenizers uses), so the
// constructor adapts the few constructs whose meaning differs between the two engines.
#include <cstddef>
#include <string>
#include <string_view>

struct pcre2_real_code_8;

namespace dspark {

class UnicodeRegex {
 public:
  // Throws dspark::Error naming the pattern when it does not compile.
  explicit UnicodeRegex(std::string_view pattern);
  ~UnicodeRegex();
  UnicodeRegex(const UnicodeRegex&) = delete;
  UnicodeRegex& operator=(const UnicodeRegex&) = delete;

  const std::string& pattern() const { return pattern_; }

  // Calls on_match(begin, end) with byte offsets of each successive non-overlapping match in
  // `text`, which must be valid UTF-8. After an empty match the search resumes one character on.
  template <typename OnMatch>
  void for_each_match(std::string_view text, OnMatch&& on_match) const {
    size_t start = 0;
    size_t begin = 0;
    size_t end = 0;
    while (start <= text.size() && find(text, start, &begin, &end)) {
      on_match(begin, end);
      start = end > begin ? end : next_char(text, end);
    }
  }

  // Whether `text` contains a match.
  bool search(std::string_view text) const;

 private:
  bool find(std::string_view text, size_t start, size_t* begin, size_t* end) const;
  static size_t next_char(std::string_view text, size_t pos);

  std::string pattern_;
  pcre2_real_code_8* code_ = nullptr;
};

// Rewrites an Oniguruma pattern (as found in tokenizer.json) into PCRE2 syntax with the same
// meaning. Exposed for tests.
std::string adapt_oniguruma_pattern(std::string_view pattern);

// Escapes `literal` so that it matches itself verbatim.
std::string regex_escape(std::string_view literal);

}  // namespace dspark
