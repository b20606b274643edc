#pragma once
// Confidence-scheduled verification under load (docs/speculative.md §16.6): the generations
// sharing the target's steps each post the acceptance their rounds have shown, and every round
// the batch's draft budget goes to the (generation, position) pairs most likely to survive, as
// many as keep the step's expected committed tokens per millisecond rising.
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "speculative/cap.h"

namespace dspark {

// One generation offering drafts in a shared step.
struct DraftCandidate {
  // survival[k]: the probability that drafts 0..k are all accepted; its length is the most drafts
  // the generation may offer. Read as non-increasing (a later draft survives only after the
  // earlier ones).
  std::vector<double> survival;
  int64_t context = 512;  // the generation's context depth, for the depth term
  bool drafted = false;   // its drafts exist already: their drafting is not priced
};

struct DraftAllocation {
  std::vector<int> caps;  // per candidate
  int drafts = 0;         // the batch's draft budget: the sum of caps
  double tokens_per_ms = 0.0;
};

// The allocation that maximises expected committed tokens per step millisecond:
//   (B + Σ admitted survival) / (Σ drafter(c_m) + verify(B + drafts) + Σ depth(c_m + 1, ctx_m)
//                               + overhead when anyone drafts)
// with B = the candidates plus `plain_sequences` generations that only decode. Pairs are admitted
// in order of survival (ties: earlier position, then earlier candidate), and every budget from 0
// to all pairs is priced: the step cost need not make the rate unimodal. Ties go to the smaller
// budget. With one candidate at survival p^(k+1) this is derive_cap.
DraftAllocation allocate_drafts(const CostCurves& curves,
                                const std::vector<DraftCandidate>& candidates,
                                int plain_sequences = 0);

// The stopping rule of confidence-scheduled verification: how many of a drafted candidate's
// drafts to verify, given their survival estimates (the confidence head's). Draft j is admitted
// while the allocation over `candidates` (`self` being the one that drafted, its drafting paid,
// its survival known up to draft j and continued beyond it at `acceptance`) still gives it more
// than j - 1 drafts. Deciding draft j from the survivals up to j only (each depends on the drafts
// before it, never on draft j) is a stopping rule, under which rejection sampling stays exact;
// letting the survival of draft j + 1 decide would let draft j's own value decide whether it is
// verified, which biases sampled output. The continuation at `acceptance` lets a fixed per-round
// cost be spread over the drafts that follow, where a walk stopping at the first budget that
// lowers the rate would never verify a first draft that does not pay alone.
int drafts_worth_verifying(const CostCurves& curves, std::vector<DraftCandidate> candidates,
                           size_t self, double acceptance, int plain_sequences,
                           const std::vector<double>& survival);

// The candidates of one server (or one benchmark arm): each generation's derived-cap policy joins
// it, and asks it for its cap when more than one generation shares the steps.
class DraftScheduler {
 public:
  DraftScheduler(CostCurves curves, int max_cap);
  const CostCurves& curves() const { return curves_; }
  int max_cap() const { return max_cap_; }

  int join();
  void leave(int member);
  // The member's acceptance estimate (continuation probability p of a geometric run) and depth.
  void post(int member, double acceptance, int64_t context);
  // The member's cap in the allocation over every member, with `sequences` generations sharing
  // the step (those beyond the members decode plain).
  int cap_for(int member, int sequences) const;
  // How many of the member's drafts to verify once it has drafted, given their survival
  // estimates: drafts_worth_verifying, continued at the member's posted acceptance, the others
  // priced as in cap_for.
  int drafts_for(int member, int sequences, const std::vector<double>& survival) const;

 private:
  // The other members as candidates, this member's at index `self` with no survival yet.
  std::vector<DraftCandidate> candidates(int member, size_t& self, double& acceptance) const;
  struct Posted {
    double acceptance = kDerivedCapPrior;
    int64_t context = 512;
  };
  CostCurves curves_;
  int max_cap_;
  mutable std::mutex mutex_;
  std::map<int, Posted> members_;
  int next_member_ = 0;
};

// The derived cap as a policy: the scheduler's allocation over every generation sharing the steps
// (alone, derive_cap), fed the acceptance this generation's rounds have shown (accepted drafts
// over accepted drafts plus rejections, from the prior worth four rounds), so its first round
// takes the calibrated derived cap and a drafter that keeps missing stops being run. A generation
// given no drafts shows no acceptance, so each of its plain steps moves its evidence 0.2 % back
// toward the prior's: it is tried again after a number of plain steps that grows with the evidence
// against it (an always-wrong drafter whose drafts would pay at 20 % acceptance runs on about 2 %
// of steps). With `use_survival`, a drafter's per-draft survival estimates (a DSpark confidence
// head) then decide how many of the round's drafts are verified (DraftScheduler::drafts_for):
// the paper's confidence-scheduled verification. A round none of whose drafts is verified feeds
// the estimate its survivals in expectation.
class DerivedCap : public CapPolicy {
 public:
  explicit DerivedCap(std::shared_ptr<DraftScheduler> scheduler, bool use_survival = true);
  ~DerivedCap() override;
  DerivedCap(const DerivedCap&) = delete;
  DerivedCap& operator=(const DerivedCap&) = delete;

  int cap_for_round() override;
  int current_cap() const override;
  int drafts_to_verify(const std::vector<double>& survival, int offered) override;
  void on_load(int sequences) override { sequences_ = std::max(sequences, 1); }
  void on_context(int64_t tokens) override;
  void on_round(const RoundOutcome& round) override;
  double acceptance() const { return acceptance_.value(); }

 private:
  std::shared_ptr<DraftScheduler> scheduler_;
  bool use_survival_;
  int member_;
  int sequences_ = 1;
  int64_t context_ = 512;
  ContinuationEstimate acceptance_{kDerivedCapPrior};
};

}  // namespace dspark
