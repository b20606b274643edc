#pragma once
// N-gram prompt lookup (docs/speculative.md §10): drafts copied from the latest earlier occurrence
// of the longest matching suffix n-gram in the prompt and output so far.
#include <array>
#include <cstdint>
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

// A proposal: the tokens copied, and how many tokens before them matched the occurrence they were
// copied from (the n-gram and on backwards, up to NGramIndex::kMatchHorizon).
struct LookupProposal {
  std::vector<int32_t> tokens;
  int64_t match = 0;
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
  // `allow_long` is set. No tokens when nothing matches.
  LookupProposal propose(bool allow_long) const;
  static constexpr int64_t kMatchHorizon = 32;

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

// What a kind of proposal has shown: per slot, how often a proposal reached it (every earlier
// token was what was committed) and how often its own token was committed too. Older evidence
// fades (each new proposal weighs the earlier ones by kForgetting) so the estimate follows the
// text.
class SlotSurvival {
 public:
  // The rates assumed before any evidence: the first draft's, and a later draft's given the
  // earlier ones.
  SlotSurvival(double first_prior, double continuation_prior)
      : first_prior_(first_prior), continuation_prior_(continuation_prior) {}
  // A proposal starts: older evidence fades.
  void start();
  // A proposal reached `slot`, and its token there was (or was not) the one committed.
  void observe(int slot, bool matched);
  // survival[i]: the estimated probability that drafts 0..i are all accepted, i < slots. The first
  // slot's rate starts from the first prior; a later slot's from the rate of all later slots
  // together (which starts from the continuation prior), each prior worth kPriorWeight
  // observations: a copied span tends to continue at one rate, which the pooled slots learn long
  // before each slot does.
  std::vector<double> survival(int slots) const;

  static constexpr double kForgetting = 0.95;
  static constexpr double kPriorWeight = 2.0;

 private:
  double first_prior_;
  double continuation_prior_;
  std::vector<double> reached_;
  std::vector<double> matched_;
};

// Standalone lookup drafting (--mode lookup) and the hybrid pre-step of model drafters
// (--lookup-drafts): a Drafter over an NGramIndex with the long-draft gate of §10.3. Each draft
// carries survival estimates (Draft::survival) from the outcomes of earlier proposals with a
// match of the same length class (§10.5). A proposal's outcome is read off the tokens committed
// after it, whether its drafts were verified or not: the committed token equals a point-mass
// draft with the probability that verifying would have accepted it (1 or 0 when greedy, the
// target's probability of the draft when sampling), so rounds that verify nothing still measure
// what verifying would have gained.
class LookupDrafter : public Drafter {
 public:
  explicit LookupDrafter(LookupParams params = {});

  std::string name() const override { return "lookup"; }
  Draft propose(const DraftRequest& request) override;
  // Feeds the long-draft gate.
  void on_verified(int drafted, int accepted) override;
  // The survival estimates a proposal of `slots` drafts after a `match`-token match gets now.
  std::vector<double> survival(int64_t match, int slots) const;

 private:
  struct Pending {
    int64_t start = 0;  // where in the committed tokens its first draft would stand
    std::vector<int32_t> tokens;
    size_t kind = 0;
    int64_t checked = 0;  // its drafts compared with committed tokens so far (all matched)
  };
  static size_t kind_of(int64_t match);
  void sync(const std::vector<int32_t>& committed);
  // Compares the pending proposals with the tokens committed since, slot by slot; a proposal is
  // dropped at its first miss or its last draft.
  void settle(const std::vector<int32_t>& committed);

  LookupParams params_;
  NGramIndex index_;
  std::vector<Pending> pending_;
  // By the match's length: under 6 tokens, 6 to 11, 12 or more. The priors are the rates measured
  // over the benchmark prompts (docs/speculative.md §10.5): the longer the match, the likelier
  // the copy goes on.
  std::array<SlotSurvival, 3> outcomes_{SlotSurvival(0.55, 0.7), SlotSurvival(0.8, 0.85),
                                        SlotSurvival(0.95, 0.95)};
  int long_failures_ = 0;
  int base_rounds_since_long_ = 0;
};

}  // namespace dspark
