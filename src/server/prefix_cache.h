#pragma once
// Reuse of model state across requests (multi-turn conversations). A slot keeps the pool sequence
// of one finished generation and the tokens it holds; a lease hands that sequence itself (no copy)
// to the next generation that shares its prefix, and a miss opens a new one. Attention-only models
// trim the state back to the longest common prefix with the new prompt. Recurrent (Mamba) layers
// cannot be trimmed without a record, so for hybrid models a slot also keeps checkpoints (state
// snapshots) taken at the stable prompt boundary, every `rung_interval` prompt tokens and at the
// end of the generation; the deepest checkpoint inside the common prefix is restored. A model
// drafter's context (the projected target rows it consumed) is kept in the pool with the sequence
// (StatePool attachments) and cut to the same prefix by the trim or restore, so a hit gives the
// drafter the context it would have had without the cache. Slots are evicted LRU.
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <vector>

#include "model/model.h"
#include "model/state.h"
#include "model/state_pool.h"

namespace dspark::server {

struct PrefixCacheOptions {
  bool enabled = true;
  int slots = 2;
  int64_t rung_interval = 8192;  // 0 = no periodic checkpoints
};

// A pool sequence checked out for one generation (closed if the lease is dropped unreleased).
struct CacheLease {
  OwnedSequence sequence;
  int64_t cached_tokens = 0;               // prompt tokens the state already holds
  std::vector<StateSnapshot> checkpoints;  // all are prefixes of the new prompt
};

class PrefixCache {
 public:
  // Cached sequences live in `pool`, beside the running ones: its capacity must leave room for
  // options.slots of them (a miss with the pool full evicts cached ones first).
  PrefixCache(const Model& model, StatePool& pool, PrefixCacheOptions options);

  // A sequence holding the longest reusable prefix of `prompt` (never all of it: the last prompt
  // token must be run to get the first logits); without `reuse`, an empty one (every prompt row
  // must run: prompt scoring).
  CacheLease acquire(const std::vector<int32_t>& prompt, bool reuse = true);
  // Gives the sequence back; `tokens` are the tokens it holds (its first length() tokens). An
  // attachment (a drafter's context) holding fewer rows than the sequence limits later reuse to
  // its rows.
  void release(CacheLease lease, std::vector<int32_t> tokens);
  // Forgets everything (after a failure that may have left a state inconsistent).
  void clear();

  bool enabled() const { return options_.enabled; }
  bool checkpointed() const { return recurrent_; }
  const PrefixCacheOptions& options() const { return options_; }

  struct Counters {
    int64_t lookups = 0;
    int64_t hits = 0;
    int64_t entries = 0;
    int64_t bytes = 0;
  };
  Counters counters() const;

 private:
  struct Slot {
    std::vector<int32_t> tokens;
    OwnedSequence sequence;
    std::vector<StateSnapshot> checkpoints;
  };
  int64_t slot_bytes(const Slot& slot) const;

  StatePool& pool_;
  PrefixCacheOptions options_;
  bool recurrent_;
  mutable std::mutex mutex_;
  std::list<Slot> slots_;  // most recently used first
  int64_t lookups_ = 0;
  int64_t hits_ = 0;
};

// Length of the longest common prefix.
size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b);

}  // namespace dspark::server
