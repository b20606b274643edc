#include "text/tokenizer_added_tokens.h"

#include <algorithm>

#include "text/unicode_properties.h"
#include "text/utf8.h"

namespace dspark {
namespace {

// The code point that ends text[0, pos), or 0 at the start.
char32_t char_before(std::string_view text, size_t pos) {
  if (pos == 0) return 0;
  size_t start = pos - 1;
  while (start > 0 && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) --start;
  char32_t code_point = 0;
  return utf8_decode(text, start, &code_point) != 0 ? code_point : 0;
}

char32_t char_at(std::string_view text, size_t pos) {
  char32_t code_point = 0;
  return (pos < text.size() && utf8_decode(text, pos, &code_point) != 0) ? code_point : 0;
}

// Start of the whitespace run that ends at `pos`.
size_t whitespace_start_before(std::string_view text, size_t pos) {
  while (pos > 0) {
    size_t start = pos - 1;
    while (start > 0 && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) --start;
    char32_t code_point = 0;
    if (utf8_decode(text, start, &code_point) == 0 || !unicode_is_white_space(code_point)) break;
    pos = start;
  }
  return pos;
}

// End of the whitespace run that starts at `pos`.
size_t whitespace_end_after(std::string_view text, size_t pos) {
  while (pos < text.size()) {
    char32_t code_point = 0;
    const size_t length = utf8_decode(text, pos, &code_point);
    if (length == 0 || !unicode_is_white_space(code_point)) break;
    pos += length;
  }
  return pos;
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(const std::vector<Pattern>& patterns) {
  nodes_.emplace_back();
  for (const Pattern& pattern : patterns) {
    if (pattern.text.empty()) continue;
    int32_t node = 0;
    for (const char c : pattern.text) {
      const auto byte = static_cast<uint8_t>(c);
      int32_t next = child(node, byte);
      if (next < 0) {
        next = static_cast<int32_t>(nodes_.size());
        nodes_.emplace_back();
        auto& edges = nodes_[node].edges;
        edges.insert(std::lower_bound(edges.begin(), edges.end(), std::make_pair(byte, int32_t{0})),
                     {byte, next});
      }
      node = next;
    }
    // The first token listed for a string wins, like the first pattern in HF's automaton.
    if (nodes_[node].token == nullptr) nodes_[node].token = pattern.token;
    first_byte_[static_cast<uint8_t>(pattern.text[0])] = true;
  }
}

int32_t AddedTokenMatcher::child(int32_t node, uint8_t byte) const {
  const auto& edges = nodes_[node].edges;
  const auto it = std::lower_bound(edges.begin(), edges.end(), std::make_pair(byte, int32_t{0}));
  return (it != edges.end() && it->first == byte) ? it->second : -1;
}

size_t AddedTokenMatcher::longest_at(std::string_view text, size_t pos,
                                     const AddedToken** token) const {
  size_t best = 0;
  int32_t node = 0;
  for (size_t i = pos; i < text.size(); ++i) {
    node = child(node, static_cast<uint8_t>(text[i]));
    if (node < 0) break;
    if (nodes_[node].token != nullptr) {
      best = i + 1 - pos;
      *token = nodes_[node].token;
    }
  }
  return best;
}

void AddedTokenMatcher::split(std::string_view text, std::vector<TextSegment>& out,
                              const std::vector<size_t>& plain_starts) const {
  size_t emitted = 0;  // end of the last segment pushed
  size_t pos = 0;      // where the search for the next match resumes
  while (pos < text.size()) {
    if (!first_byte_[static_cast<uint8_t>(text[pos])]) {
      ++pos;
      continue;
    }
    const AddedToken* token = nullptr;
    const size_t length = longest_at(text, pos, &token);
    if (length == 0 ||
        (token->special && std::binary_search(plain_starts.begin(), plain_starts.end(), pos))) {
      ++pos;
      continue;
    }
    size_t start = pos;
    size_t stop = pos + length;
    pos = stop;
    if (token->single_word) {
      const bool word_before = unicode_is_word_char(char_before(text, start));
      const bool word_after = stop < text.size() && unicode_is_word_char(char_at(text, stop));
      if (word_before || word_after) continue;
    }
    if (token->lstrip) start = std::max(whitespace_start_before(text, start), emitted);
    if (token->rstrip) stop = whitespace_end_after(text, stop);
    if (emitted < start) out.push_back({emitted, start, -1});
    out.push_back({start, stop, token->id});
    emitted = stop;
  }
  if (emitted < text.size()) out.push_back({emitted, text.size(), -1});
}

}  // namespace dspark
