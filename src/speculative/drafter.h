#pragma once
// The drafter interface every draft source plugs into (lookup, DSpark, DFlash, and the test
// drafters): propose up to `cap` tokens after the pending token, with the distributions they were
// drawn from when sampling. The one verify loop (verify.h) owns acceptance and rollback; drafters
// only see what was committed.
#include <cstdint>
#include <exception>
#include <span>
#include <string>
#include <vector>

#include "engine/sampler.h"
#include "model/state_pool.h"

namespace dspark {

struct Draft {
  std::vector<int32_t> tokens;
  // proposals[i]: the distribution tokens[i] was sampled from, truncated like the target's. Empty
  // means point masses (lookup copies, argmax drafts): q = δ(tokens[i]).
  std::vector<TokenDistribution> proposals;
  // survival[i]: the drafter's own estimate that drafts 0..i are all accepted (the product of a
  // DSpark head's confidences); empty when it has no such estimate. A cap policy may verify only
  // the drafts worth their verify rows (CapPolicy::drafts_to_verify).
  std::vector<double> survival;
  bool from_lookup = false;

  // Keeps the first n drafts (with their proposals and survivals).
  void keep_first(size_t n) {
    if (tokens.size() > n) tokens.resize(n);
    if (proposals.size() > n) proposals.resize(n);
    if (survival.size() > n) survival.resize(n);
  }
};

// Target rows a drafter has not been fed yet: n tokens and their taps [n, taps * hidden].
struct DrafterRows {
  const int32_t* tokens = nullptr;
  int64_t n = 0;
  const float* taps = nullptr;
};

struct DraftRequest {
  // Every committed token so far: prompt, then generated tokens; the last one is pending (already
  // emitted, not yet run through the target).
  const std::vector<int32_t>& committed;
  int cap = 0;
  const SamplingParams& sampling;
  Rng& rng;
};

class Drafter {
 public:
  virtual ~Drafter() = default;
  virtual std::string name() const = 0;
  // Target layers whose residual stream (taps) the drafter reads; empty for none.
  virtual std::vector<int> tap_layers() const { return {}; }
  // The target processed `n` tokens (prompt chunks, or the pending token plus accepted drafts of a
  // round); taps holds [n, tap_layers().size() * hidden] rows when tap_layers() is non-empty.
  virtual void on_target_rows(const int32_t* tokens, int64_t n, const float* taps) {
    (void)tokens, (void)n, (void)taps;
  }
  // Target rows the drafter holds (what on_target_rows fed it, in order); 0 for drafters that
  // keep no per-row context.
  virtual int64_t context_rows() const { return 0; }
  // The drafter will draft for `sequence` of `pool`: a drafter with a per-row context keeps it in
  // the pool with the sequence, so that it lives, is cut back and is resumed (the server's prefix
  // cache) with the sequence's state. Called before any row is fed; the sequence must stay open
  // while the drafter uses it.
  virtual void bind_sequence(StatePool& pool, SequenceId sequence) { (void)pool, (void)sequence; }
  virtual Draft propose(const DraftRequest& request) = 0;
  // The target verified `drafted` of this drafter's tokens and accepted the first `accepted`.
  virtual void on_verified(int drafted, int accepted) { (void)drafted, (void)accepted; }

  // Drafting for many sequences in one pass (propose_together): drafters whose group() is the
  // same non-null key draft together through propose_group, reading their shared weights once.
  // grouped() is the drafter that joins a group (a wrapper returns the one it lends); null: this
  // drafter drafts alone.
  virtual Drafter* grouped() { return nullptr; }
  virtual const void* group() const { return nullptr; }
  // Drafts for every member (grouped() drafters of this one's group, this one among them), each
  // exactly what members[i]->propose(*requests[i]) returns.
  virtual void propose_group(std::span<Drafter* const> members,
                             std::span<const DraftRequest* const> requests,
                             std::span<Draft> drafts) {
    for (size_t i = 0; i < members.size(); ++i) drafts[i] = members[i]->propose(*requests[i]);
  }
  // on_target_rows(rows[i]) for every member (grouped() drafters of this one's group, this one
  // among them), each context exactly what its own on_target_rows would leave.
  virtual void feed_group(std::span<Drafter* const> members, std::span<const DrafterRows> rows) {
    for (size_t i = 0; i < members.size(); ++i) {
      if (rows[i].n > 0) members[i]->on_target_rows(rows[i].tokens, rows[i].n, rows[i].taps);
    }
  }
};

// One sequence's pending drafter call: the rows to feed the drafter first, then the request.
struct DraftCall {
  Drafter* drafter = nullptr;
  DraftRequest request;
  DrafterRows unfed;
};

struct DraftOutcome {
  Draft draft;
  std::exception_ptr error;  // set when drafting failed; the draft is then empty
};

// Answers every call, drafters of one group together (Drafter::feed_group, then
// Drafter::propose_group), the others alone. A failing call fails alone, and a failing group
// fails its members only.
std::vector<DraftOutcome> propose_together(std::span<const DraftCall> calls);

}  // namespace dspark
