#include "speculative/drafter.h"

#include <map>

namespace dspark {

std::vector<DraftOutcome> propose_together(std::span<const DraftCall> calls) {
  std::vector<DraftOutcome> outcomes(calls.size());
  // Calls by group, in call order; ungrouped drafters draft at once.
  std::map<const void*, std::vector<size_t>> groups;
  for (size_t i = 0; i < calls.size(); ++i) {
    Drafter* member = calls[i].drafter->grouped();
    if (member != nullptr && member->group() != nullptr) {
      groups[member->group()].push_back(i);
      continue;
    }
    try {
      const DrafterRows& unfed = calls[i].unfed;
      if (unfed.n > 0) calls[i].drafter->on_target_rows(unfed.tokens, unfed.n, unfed.taps);
      outcomes[i].draft = calls[i].drafter->propose(calls[i].request);
    } catch (...) {
      outcomes[i].error = std::current_exception();
    }
  }
  for (const auto& [key, indices] : groups) {
    std::vector<Drafter*> members;
    std::vector<const DraftRequest*> requests;
    std::vector<DrafterRows> unfed;
    for (size_t i : indices) {
      members.push_back(calls[i].drafter->grouped());
      requests.push_back(&calls[i].request);
      unfed.push_back(calls[i].unfed);
    }
    std::vector<Draft> drafts(indices.size());
    try {
      members.front()->feed_group(members, unfed);
      members.front()->propose_group(members, requests, drafts);
      for (size_t k = 0; k < indices.size(); ++k) outcomes[indices[k]].draft = std::move(drafts[k]);
    } catch (...) {
      for (size_t i : indices) outcomes[i].error = std::current_exception();
    }
  }
  return outcomes;
}

}  // namespace dspark
