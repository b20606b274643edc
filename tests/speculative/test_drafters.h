#pragma once
// Drafters for the lossless tests: always right, always wrong, random, and lookup.
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "speculative/drafter.h"
#include "speculative/lookup.h"

namespace dspark::testing {

// Proposes the plain greedy continuation (always right) or something else (always wrong).
class OracleDrafter : public Drafter {
 public:
  OracleDrafter(std::vector<int32_t> plain, bool wrong, int64_t vocab)
      : plain_(std::move(plain)), wrong_(wrong), vocab_(vocab) {}
  std::string name() const override { return wrong_ ? "always-wrong" : "always-right"; }
  Draft propose(const DraftRequest& request) override {
    Draft draft;
    for (size_t at = request.committed.size();
         at < plain_.size() && static_cast<int>(draft.tokens.size()) < request.cap; ++at) {
      draft.tokens.push_back(wrong_ ? static_cast<int32_t>((plain_[at] + 1) % vocab_) : plain_[at]);
    }
    if (wrong_ && draft.tokens.empty()) draft.tokens.assign(request.cap, 0);
    return draft;
  }

 private:
  std::vector<int32_t> plain_;
  bool wrong_;
  int64_t vocab_;
};

class RandomDrafter : public Drafter {
 public:
  RandomDrafter(int64_t vocab, uint32_t seed) : vocab_(vocab), rng_(seed) {}
  std::string name() const override { return "random"; }
  Draft propose(const DraftRequest& request) override {
    Draft draft;
    for (int i = 0; i < request.cap; ++i)
      draft.tokens.push_back(static_cast<int32_t>(rng_() % vocab_));
    return draft;
  }

 private:
  int64_t vocab_;
  std::mt19937 rng_;
};

// The drafter kinds every lossless test runs: 0 always right (drafts `full`), 1 always wrong, 2
// random, 3 lookup.
inline std::unique_ptr<Drafter> make_drafter(int kind, const std::vector<int32_t>& full,
                                             int64_t vocab, uint32_t seed, int cap) {
  if (kind == 0) return std::make_unique<OracleDrafter>(full, false, vocab);
  if (kind == 1) return std::make_unique<OracleDrafter>(full, true, vocab);
  if (kind == 2) return std::make_unique<RandomDrafter>(vocab, seed);
  return std::make_unique<LookupDrafter>(LookupParams{1, 2, cap, cap});
}

}  // namespace dspark::testing
