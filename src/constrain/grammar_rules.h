#pragma once
// Building a byte grammar from rules, and the compiled form the Matcher walks.
//
// A rule is a list of alternatives; an alternative is a sequence of elements, each a set of bytes
// or a reference to a rule. The compiled grammar lays every alternative out flat, ending each
// with an end marker, so a parse position is one index. For every position it precomputes the
// expansions: the ways the text may go on from there, each a byte set plus the return positions
// to push, so advancing a parse stack over one byte never recurses through rules.
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "constrain/grammar.h"

namespace dspark::constrain {

using ByteSet = std::array<uint64_t, 4>;

inline bool contains(const ByteSet& set, uint8_t byte) {
  return (set[byte >> 6] >> (byte & 63)) & 1;
}

inline ByteSet byte_set_of(std::string_view bytes) {
  ByteSet set{};
  for (char c : bytes) {
    const auto byte = static_cast<uint8_t>(c);
    set[byte >> 6] |= uint64_t{1} << (byte & 63);
  }
  return set;
}

struct Element {
  enum class Kind : uint8_t { kEnd, kBytes, kRule };
  Kind kind;
  uint32_t value;  // kBytes: index of the byte set; kRule: rule id
};

using Sequence = std::vector<Element>;

class GrammarBuilder {
 public:
  // A rule id to refer to before its alternatives are known (recursive rules).
  uint32_t declare(std::string name);
  void define(uint32_t rule, std::vector<Sequence> alternatives);
  uint32_t add(std::string name, std::vector<Sequence> alternatives);
  size_t rule_count() const { return rules_.size(); }

  Element bytes(const ByteSet& set);
  Element byte_range(uint8_t first, uint8_t last);
  Element byte(uint8_t value) { return byte_range(value, value); }
  static Element rule(uint32_t id) { return {Element::Kind::kRule, id}; }
  // One element per byte of `text`.
  Sequence literal(std::string_view text);

  // `root` becomes the start symbol; fails on a left-recursive or undefined rule.
  // `on_progress`, when given, is called every few hundred positions (a budget check may throw).
  std::shared_ptr<const Grammar> build(uint32_t root,
                                       const std::function<void()>& on_progress = {}) const;

 private:
  std::vector<std::string> names_;
  std::vector<std::vector<Sequence>> rules_;
  std::vector<bool> defined_;
  std::vector<ByteSet> byte_sets_;
};

class Grammar {
 public:
  // From a position, the text may take one byte of `byte_set`, then continue with `push`
  // (return positions, outermost first, then the position after that byte) on top of the stack.
  struct Expansion {
    uint32_t byte_set;
    uint32_t push_offset;
    uint32_t push_length;
  };

  uint32_t start_position() const { return start_position_; }
  // What may follow position p: expansions_[expansion_begin_[p] .. expansion_begin_[p + 1]).
  const Expansion* expansions_begin(uint32_t position) const {
    return expansions_.data() + expansion_begin_[position];
  }
  const Expansion* expansions_end(uint32_t position) const {
    return expansions_.data() + expansion_begin_[position + 1];
  }
  const uint32_t* pushes(const Expansion& expansion) const {
    return pushes_.data() + expansion.push_offset;
  }
  const ByteSet& byte_set(uint32_t id) const { return byte_sets_[id]; }
  // Whether everything from `position` to the end of its alternative may be empty.
  bool nullable(uint32_t position) const { return nullable_[position] != 0; }
  // Union of the byte sets of the position's expansions.
  const ByteSet& first_bytes(uint32_t position) const { return first_bytes_[position]; }

 private:
  friend class GrammarBuilder;
  uint32_t start_position_ = 0;
  std::vector<ByteSet> byte_sets_;
  std::vector<uint32_t> expansion_begin_;
  std::vector<Expansion> expansions_;
  std::vector<uint32_t> pushes_;
  std::vector<uint8_t> nullable_;
  std::vector<ByteSet> first_bytes_;
};

}  // namespace dspark::constrain
