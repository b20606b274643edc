#include "server/prefix_cache.h"

#include <algorithm>

namespace dspark::server {

size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

PrefixCache::PrefixCache(const Model& model, StatePool& pool, PrefixCacheOptions options)
    : pool_(pool), options_(options), recurrent_(model.state_layout().mamba_layers > 0) {}

CacheLease PrefixCache::acquire(const std::vector<int32_t>& prompt, bool reuse) {
  CacheLease lease;
  const int64_t limit = reuse ? static_cast<int64_t>(prompt.size()) - 1 : 0;
  std::unique_lock lock(mutex_);
  ++lookups_;
  auto best = slots_.end();
  int64_t best_usable = 0;
  const StateSnapshot* best_checkpoint = nullptr;
  for (auto it = slots_.begin(); options_.enabled && it != slots_.end(); ++it) {
    int64_t shared =
        std::min<int64_t>(static_cast<int64_t>(common_prefix(it->tokens, prompt)), limit);
    shared = std::min(shared, pool_.attached_rows(it->sequence.id()));
    int64_t usable = 0;
    const StateSnapshot* checkpoint = nullptr;
    if (!recurrent_) {
      usable = std::min(shared, pool_.length(it->sequence.id()));
    } else {
      for (const auto& candidate : it->checkpoints) {
        if (candidate.length <= shared && candidate.length > usable) {
          usable = candidate.length;
          checkpoint = &candidate;
        }
      }
    }
    if (usable > best_usable) {
      best = it;
      best_usable = usable;
      best_checkpoint = checkpoint;
    }
  }
  if (best == slots_.end()) {
    if (pool_.open_count() == pool_.capacity() && !slots_.empty()) slots_.pop_back();
    lock.unlock();
    lease.sequence = OwnedSequence(pool_);
    return lease;
  }
  ++hits_;
  Slot slot = std::move(*best);
  slots_.erase(best);
  lock.unlock();
  lease.sequence = std::move(slot.sequence);
  if (recurrent_) {
    pool_.restore(lease.sequence.id(), *best_checkpoint);
  } else {
    pool_.trim(lease.sequence.id(), best_usable);
  }
  lease.cached_tokens = best_usable;
  for (auto& checkpoint : slot.checkpoints) {
    if (checkpoint.length <= best_usable) lease.checkpoints.push_back(std::move(checkpoint));
  }
  return lease;
}

void PrefixCache::release(CacheLease lease, std::vector<int32_t> tokens) {
  if (!options_.enabled) return;
  tokens.resize(std::min<size_t>(tokens.size(), pool_.length(lease.sequence.id())));
  Slot slot{std::move(tokens), std::move(lease.sequence), std::move(lease.checkpoints)};
  std::lock_guard lock(mutex_);
  slots_.push_front(std::move(slot));
  while (static_cast<int>(slots_.size()) > std::max(options_.slots, 1)) slots_.pop_back();
}

void PrefixCache::clear() {
  std::lock_guard lock(mutex_);
  slots_.clear();
}

int64_t PrefixCache::slot_bytes(const Slot& slot) const {
  const auto& layout = pool_.layout();
  int64_t bytes =
      2 * pool_.length(slot.sequence.id()) * layout.kv_row_bytes() * layout.attention_layers;
  for (const auto& checkpoint : slot.checkpoints) bytes += checkpoint.bytes();
  return bytes;
}

PrefixCache::Counters PrefixCache::counters() const {
  std::lock_guard lock(mutex_);
  Counters counters{lookups_, hits_, static_cast<int64_t>(slots_.size()), 0};
  for (const auto& slot : slots_) counters.bytes += slot_bytes(slot);
  return counters;
}

}  // namespace dspark::server
