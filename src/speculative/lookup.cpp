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

std::vector<int32_t> NGramIndex::propose(bool allow_long) const {
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
    int64_t cap = params_.max_draft;
    if (allow_long && params_.long_ceiling > cap) {
      int64_t match = gram;
      int64_t i = end - gram - 1;
      int64_t j = position - gram - 1;
      while (j >= 0 && match < params_.long_ceiling && tokens_[i] == tokens_[j]) {
        ++match;
        --i;
        --j;
      }
      if (match >= 8) cap = std::min<int64_t>(params_.long_ceiling, 2 * match);
    }
    const int64_t stop = std::min(end, position + cap);
    if (stop > position) return {tokens_.begin() + position, tokens_.begin() + stop};
  }
  return {};
}

LookupDrafter::LookupDrafter(LookupParams params) : params_(params), index_(params) {}

void LookupDrafter::sync(const std::vector<int32_t>& committed) {
  const size_t known = index_.tokens().size();
  if (committed.size() > known) {
    index_.extend(committed.data() + known, static_cast<int64_t>(committed.size() - known));
  }
}

Draft LookupDrafter::propose(const DraftRequest& request) {
  sync(request.committed);
  const bool allow_long = long_failures_ < 2 || base_rounds_since_long_ >= 8;
  Draft draft;
  draft.from_lookup = true;
  draft.tokens = index_.propose(allow_long);
  if (static_cast<int>(draft.tokens.size()) > request.cap) draft.tokens.resize(request.cap);
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
