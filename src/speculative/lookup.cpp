#include "speculative/lookup.h"

#include <algorithm>

namespace dspark {

size_t NGramIndex::VectorHash::operator()(const std::vector<int32_t>& key) const {
  uint64_t hash = 1469598103934665603ull;
  for (int32_t id : key) hash = (hash ^ static_cast<uint32_t>(id)) * 1099511628211ull;
  return static_cast<size_t>(hash);
}

void NGramIndex::extend(const int32_t* tokens, int64_t n) {
  if (index_.empty()) index_.resize(params_.max_n - params_.min_n + 1);
  for (int64_t k = 0; k < n; ++k) {
    tokens_.push_back(tokens[k]);
    const int64_t end = static_cast<int64_t>(tokens_.size());
    for (int gram = params_.min_n; gram <= params_.max_n; ++gram) {
      if (end < gram) continue;
      std::vector<int32_t> key(tokens_.end() - gram, tokens_.end());
      Ends& ends = index_[gram - params_.min_n][key];
      ends.previous = ends.latest;
      ends.latest = end;
    }
  }
}

LookupProposal NGramIndex::propose(bool allow_long) const {
  const int64_t end = static_cast<int64_t>(tokens_.size());
  for (int gram = params_.max_n; gram >= params_.min_n; --gram) {
    if (end < gram || index_.empty()) continue;
    const std::vector<int32_t> key(tokens_.end() - gram, tokens_.end());
    const auto& table = index_[gram - params_.min_n];
    auto hit = table.find(key);
    if (hit == table.end()) continue;
    // The suffix itself is the latest occurrence; copy after the one before it.
    const int64_t position = hit->second.latest != end ? hit->second.latest : hit->second.previous;
    if (position < 0) continue;
    const int64_t horizon = std::max<int64_t>(kMatchHorizon, params_.long_ceiling);
    int64_t match = gram;
    int64_t i = end - gram - 1;
    int64_t j = position - gram - 1;
    while (j >= 0 && match < horizon && tokens_[i] == tokens_[j]) {
      ++match;
      --i;
      --j;
    }
    int64_t cap = params_.max_draft;
    if (allow_long && params_.long_ceiling > cap && match >= 8) {
      cap = std::min<int64_t>(params_.long_ceiling, 2 * match);
    }
    const int64_t stop = std::min(end, position + cap);
    if (stop > position) return {{tokens_.begin() + position, tokens_.begin() + stop}, match};
  }
  return {};
}

void SlotSurvival::start() {
  for (double& count : reached_) count *= kForgetting;
  for (double& count : matched_) count *= kForgetting;
}

void SlotSurvival::observe(int slot, bool matched) {
  if (static_cast<int>(reached_.size()) <= slot) {
    reached_.resize(slot + 1, 0.0);
    matched_.resize(slot + 1, 0.0);
  }
  reached_[slot] += 1.0;
  if (matched) matched_[slot] += 1.0;
}

std::vector<double> SlotSurvival::survival(int slots) const {
  double later_reached = 0.0, later_matched = 0.0;
  for (size_t i = 1; i < reached_.size(); ++i) {
    later_reached += reached_[i];
    later_matched += matched_[i];
  }
  const double continuation =
      (later_matched + kPriorWeight * continuation_prior_) / (later_reached + kPriorWeight);
  std::vector<double> survival;
  survival.reserve(std::max(slots, 0));
  double all_accepted = 1.0;
  for (int i = 0; i < slots; ++i) {
    const double prior = i == 0 ? first_prior_ : continuation;
    const bool seen = i < static_cast<int>(reached_.size());
    const double reached = seen ? reached_[i] : 0.0;
    const double matched = seen ? matched_[i] : 0.0;
    all_accepted *= (matched + kPriorWeight * prior) / (reached + kPriorWeight);
    survival.push_back(all_accepted);
  }
  return survival;
}

LookupDrafter::LookupDrafter(LookupParams params) : params_(params), index_(params) {}

void LookupDrafter::sync(const std::vector<int32_t>& committed) {
  const size_t known = index_.tokens().size();
  if (committed.size() > known) {
    index_.extend(committed.data() + known, static_cast<int64_t>(committed.size() - known));
  }
}

size_t LookupDrafter::kind_of(int64_t match) {
  if (match < 6) return 0;
  return match < 12 ? 1 : 2;
}

void LookupDrafter::settle(const std::vector<int32_t>& committed) {
  const int64_t known = static_cast<int64_t>(committed.size());
  std::erase_if(pending_, [&](Pending& proposal) {
    const int64_t offered = static_cast<int64_t>(proposal.tokens.size());
    SlotSurvival& outcomes = outcomes_[proposal.kind];
    while (proposal.checked < offered && proposal.start + proposal.checked < known) {
      const bool matched =
          committed[proposal.start + proposal.checked] == proposal.tokens[proposal.checked];
      outcomes.observe(static_cast<int>(proposal.checked), matched);
      if (!matched) return true;
      ++proposal.checked;
    }
    return proposal.checked == offered;
  });
}

std::vector<double> LookupDrafter::survival(int64_t match, int slots) const {
  return outcomes_[kind_of(match)].survival(slots);
}

Draft LookupDrafter::propose(const DraftRequest& request) {
  sync(request.committed);
  settle(request.committed);
  const bool allow_long = long_failures_ < 2 || base_rounds_since_long_ >= 8;
  LookupProposal proposal = index_.propose(allow_long);
  Draft draft;
  draft.from_lookup = true;
  if (proposal.tokens.empty()) return draft;
  const size_t kind = kind_of(proposal.match);
  outcomes_[kind].start();
  pending_.push_back(
      Pending{static_cast<int64_t>(request.committed.size()), proposal.tokens, kind});
  draft.tokens = std::move(proposal.tokens);
  if (static_cast<int>(draft.tokens.size()) > request.cap) draft.tokens.resize(request.cap);
  draft.survival = survival(proposal.match, static_cast<int>(draft.tokens.size()));
  return draft;
}

void LookupDrafter::on_verified(int drafted, int accepted) {
  if (drafted > params_.max_draft) {
    long_failures_ = 2 * accepted < drafted ? long_failures_ + 1 : 0;
    base_rounds_since_long_ = 0;
  } else if (drafted > 0) {
    ++base_rounds_since_long_;
  }
}

}  // namespace dspark
