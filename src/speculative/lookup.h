#pragma once
// N-gram prompt lookup (docs/speculative.md §10): drafts copied from the latest earlier occurrence
// of the longest matching suffix n-gram in the prompt and output so far.
#include <cstdint>
#include <map>
#include <unordered_map>
#include <vector>

#include "speculative/drafter.h"

namespace dspark {

struct LookupParams {
  int min_n = 3;
  int max_n = 4;
  int max_draft = 6;
  int long_ceiling = 32;  // match-scaled long drafts up to this many tokens; <= max_draft disables
};

// For every n in [min_n, max_n], the two most recent end positions (index just past the n-gram) of
// each n-gram. Built incrementally; equal to a bulk build over the same tokens.
class NGramIndex {
 public:
  explicit NGramIndex(LookupParams params) : params_(params) {}

  void extend(const int32_t* tokens, int64_t n);
  const std::vector<int32_t>& tokens() const { return tokens_; }
  // A draft copied after the latest earlier occurrence of the longest matching suffix; up to
  // max_draft tokens, or up to 2·match (<= long_ceiling) when the match runs 8 or more tokens and
  // `allow_long` is set. Empty when nothing matches.
  std::vector<int32_t> propose(bool allow_long) const;

 private:
  struct Ends {
    int64_t previous = -1;
    int64_t latest = -1;
  };
  struct VectorHash {
    size_t operator()(const std::vector<int32_t>& key) const;
  };

  LookupParams params_;
  std::vector<int32_t> tokens_;
  std::vector<std::unordered_map<std::vector<int32_t>, Ends, VectorHash>> index_;  // by n - min_n
};

// Standalone lookup drafting (--mode lookup) and the hybrid pre-step of model drafters
// (--lookup-drafts): a Drafter over an NGramIndex with the long-draft gate of §10.3.
class LookupDrafter : public Drafter {
 public:
  explicit LookupDrafter(LookupParams params = {});

  std::string name() const override { return "lookup"; }
  Draft propose(const DraftRequest& request) override;
  // Feeds the long-draft gate.
  void on_verified(int drafted, int accepted) override;

 private:
  void sync(const std::vector<int32_t>& committed);

  LookupParams params_;
  NGramIndex index_;
  int long_failures_ = 0;
  int base_rounds_since_long_ = 0;
};

}  // namespace dspark
