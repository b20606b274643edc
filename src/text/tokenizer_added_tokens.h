#pragma once
// Added tokens (special and not) and how HF finds them in text before anything else runs:
// leftmost-longest matching, then the single_word, lstrip and rstrip rules.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dspark {

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
  bool special = false;
  // What decode and id_to_token give for this token: HF shows a normalized token through the
  // normalizer (a "Hello" added under a lowercasing normalizer decodes as "hello").
  std::string decoded;
};

// A stretch of text [begin, end): either plain text (added_id < 0) or one added token.
struct TextSegment {
  size_t begin;
  size_t end;
  int32_t added_id;
};

class AddedTokenMatcher {
 public:
  // Each entry pairs the string to look for with the token it stands for (the pattern differs
  // from the token content for tokens matched after normalization).
  struct Pattern {
    std::string text;
    const AddedToken* token;
  };
  explicit AddedTokenMatcher(const std::vector<Pattern>& patterns);

  bool empty() const { return nodes_.size() <= 1; }

  // Appends to `out` segments covering `text` (offsets relative to `text`). A special token
  // whose match would start at one of `plain_starts` (sorted offsets) is not matched there: it
  // stays plain text, as with HF's encode_special_tokens.
  void split(std::string_view text, std::vector<TextSegment>& out,
             const std::vector<size_t>& plain_starts = {}) const;

 private:
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> edges;  // sorted by byte
    const AddedToken* token = nullptr;
  };
  int32_t child(int32_t node, uint8_t byte) const;
  // Longest pattern starting at text[pos]: its length (0 if none) and token.
  size_t longest_at(std::string_view text, size_t pos, const AddedToken** token) const;

  std::vector<Node> nodes_;
  bool first_byte_[256] = {};
};

}  // namespace dspark
