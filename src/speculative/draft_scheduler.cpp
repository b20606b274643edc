#include "speculative/draft_scheduler.h"

#include <algorithm>
#include <cmath>

#include "base/error.h"

namespace dspark {

DraftAllocation allocate_drafts(const CostCurves& curves,
                                const std::vector<DraftCandidate>& candidates,
                                int plain_sequences) {
  if (curves.empty()) fail("drafts cannot be allocated without measured verify costs");
  struct Pair {
    double survival;
    int position;
    int candidate;
  };
  std::vector<Pair> pairs;
  for (size_t m = 0; m < candidates.size(); ++m) {
    double running = 1.0;
    for (size_t k = 0; k < candidates[m].survival.size(); ++k) {
      running = std::min(running, std::clamp(candidates[m].survival[k], 0.0, 1.0));
      pairs.push_back({running, static_cast<int>(k), static_cast<int>(m)});
    }
  }
  std::stable_sort(pairs.begin(), pairs.end(), [](const Pair& a, const Pair& b) {
    if (a.survival != b.survival) return a.survival > b.survival;
    if (a.position != b.position) return a.position < b.position;
    return a.candidate < b.candidate;
  });

  const int sequences = static_cast<int>(candidates.size()) + std::max(plain_sequences, 0);
  std::vector<int> caps(candidates.size(), 0);
  // The step's cost without the verify forward: drafting and each sequence's attention depth.
  double side_ms =
      static_cast<double>(std::max(plain_sequences, 0)) * curves.depth(1, curves.reference_context);
  for (const DraftCandidate& candidate : candidates) side_ms += curves.depth(1, candidate.context);
  double committed = sequences;

  DraftAllocation best{caps, 0, committed / (side_ms + curves.verify(sequences))};
  for (size_t n = 0; n < pairs.size(); ++n) {
    const Pair& pair = pairs[n];
    const DraftCandidate& candidate = candidates[pair.candidate];
    int& cap = caps[pair.candidate];
    if (!candidate.drafted) {
      side_ms +=
          curves.drafter(cap + 1, candidate.context) - curves.drafter(cap, candidate.context);
    }
    side_ms += curves.depth(cap + 2, candidate.context) - curves.depth(cap + 1, candidate.context);
    ++cap;
    committed += pair.survival;
    const int drafts = static_cast<int>(n) + 1;
    const double rate =
        committed / (side_ms + curves.verify(sequences + drafts) + curves.overhead_ms);
    if (rate > best.tokens_per_ms) best = DraftAllocation{caps, drafts, rate};
  }
  return best;
}

DraftScheduler::DraftScheduler(CostCurves curves, int max_cap)
    : curves_(std::move(curves)), max_cap_(max_cap) {
  if (curves_.empty()) fail("the draft scheduler needs measured verify costs");
  if (max_cap < 1) fail("the largest draft cap must be at least 1, not {}", max_cap);
}

int DraftScheduler::join() {
  std::lock_guard lock(mutex_);
  const int member = next_member_++;
  members_[member] = Posted{};
  return member;
}

void DraftScheduler::leave(int member) {
  std::lock_guard lock(mutex_);
  members_.erase(member);
}

void DraftScheduler::post(int member, double acceptance, int64_t context) {
  std::lock_guard lock(mutex_);
  members_[member] = Posted{acceptance, context};
}

std::vector<DraftCandidate> DraftScheduler::candidates(int member, size_t& self,
                                                       double& acceptance) const {
  std::vector<DraftCandidate> candidates;
  std::lock_guard lock(mutex_);
  candidates.reserve(members_.size());
  for (const auto& [id, posted] : members_) {
    DraftCandidate candidate;
    candidate.context = posted.context;
    if (id == member) {
      self = candidates.size();
      acceptance = posted.acceptance;
    } else {
      double running = 1.0;
      for (int k = 0; k < max_cap_; ++k) candidate.survival.push_back(running *= posted.acceptance);
    }
    candidates.push_back(std::move(candidate));
  }
  return candidates;
}

int DraftScheduler::cap_for(int member, int sequences) const {
  size_t self = 0;
  double acceptance = kDerivedCapPrior;
  std::vector<DraftCandidate> all = candidates(member, self, acceptance);
  double running = 1.0;
  for (int k = 0; k < max_cap_; ++k) all[self].survival.push_back(running *= acceptance);
  const int plain = std::max(0, sequences - static_cast<int>(all.size()));
  return allocate_drafts(curves_, all, plain).caps.at(self);
}

int drafts_worth_verifying(const CostCurves& curves, std::vector<DraftCandidate> candidates,
                           size_t self, double acceptance, int plain_sequences,
                           const std::vector<double>& survival) {
  candidates.at(self).drafted = true;
  std::vector<double>& known = candidates[self].survival;
  const int offered = static_cast<int>(survival.size());
  for (int j = 1; j <= offered; ++j) {
    known.assign(survival.begin(), survival.begin() + j);
    double running = std::clamp(known.back(), 0.0, 1.0);
    for (int k = j; k < offered; ++k) known.push_back(running *= acceptance);
    if (allocate_drafts(curves, candidates, plain_sequences).caps[self] < j) return j - 1;
  }
  return offered;
}

int DraftScheduler::drafts_for(int member, int sequences,
                               const std::vector<double>& survival) const {
  size_t self = 0;
  double acceptance = kDerivedCapPrior;
  std::vector<DraftCandidate> all = candidates(member, self, acceptance);
  const int plain = std::max(0, sequences - static_cast<int>(all.size()));
  return drafts_worth_verifying(curves_, std::move(all), self, acceptance, plain, survival);
}

DerivedCap::DerivedCap(std::shared_ptr<DraftScheduler> scheduler, bool use_survival)
    : scheduler_(std::move(scheduler)), use_survival_(use_survival), member_(scheduler_->join()) {}

DerivedCap::~DerivedCap() {
  scheduler_->leave(member_);
}

int DerivedCap::current_cap() const {
  return scheduler_->cap_for(member_, sequences_);
}

int DerivedCap::drafts_to_verify(const std::vector<double>& survival, int offered) {
  if (!use_survival_) return offered;
  const int keep = std::min(offered, scheduler_->drafts_for(member_, sequences_, survival));
  if (keep == 0 && offered > 0) {
    // Nothing is verified, so the round shows no acceptance: the survivals stand in for it, so
    // that a drafter whose confidences keep saying no stops being run (the cap falls to 0).
    acceptance_.observe_expected(survival);
    scheduler_->post(member_, acceptance(), context_);
  }
  return keep;
}

int DerivedCap::cap_for_round() {
  const int cap = current_cap();
  if (cap == 0) {
    acceptance_.relax(0.002);
    scheduler_->post(member_, acceptance(), context_);
  }
  return cap;
}

void DerivedCap::on_context(int64_t tokens) {
  context_ = tokens;
  scheduler_->post(member_, acceptance(), context_);
}

void DerivedCap::on_round(const RoundOutcome& round) {
  if (round.verified < 1) return;
  acceptance_.observe(round.verified, round.accepted);
  scheduler_->post(member_, acceptance(), context_);
}

}  // namespace dspark
