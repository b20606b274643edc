#pragma once
// The one verify loop (docs/speculative.md §4–§7): every round drafts up to `cap` tokens after the
// pending token, runs the target once over [pending, drafts], accepts the leading run the target
// agrees with (greedy exact match, or lossless rejection sampling at T > 0), commits one more
// target token (the correction, or the bonus after a full accept), and rolls the state back to the
// accept point (KV trimmed; Mamba layers rebuilt bit-exactly from the recorded inputs).
//
// Output equals plain decoding's (engine/generator.h) token for token when greedy, and follows the
// same target distribution when sampling: penalties are applied per verify row with the counts of
// every token before that row, exactly as sequential decoding would. The reasoning budget is
// consulted after every committed token as in plain decoding: a round stops committing where it
// fires, and the forced ids take one forward of their own.
#include <cstdint>
#include <functional>
#include <vector>

#include "engine/generator.h"
#include "speculative/drafter.h"

namespace dspark {

// A ceiling on the work one round can waste: verify forwards of at most 32 rows. Rows are
// bit-identical to decoding at any width (every kernel fixes its order per row, and nemotron_h
// scans the SSM token by token at every length), so nothing but cost depends on this number.
constexpr int64_t kMaxDraftsPerRound = 31;

struct SpeculativeStats {
  int64_t rounds = 0;           // target forwards that verified at least one draft
  int64_t plain_steps = 0;      // width-1 target forwards (no draft this round)
  int64_t forced_forwards = 0;  // forwards that committed the reasoning budget's forced ids
  int64_t target_forwards = 0;  // including prefill chunks as one
  int64_t drafted = 0;
  int64_t accepted = 0;
  int64_t unverified = 0;  // drafts the cap policy dropped on the drafter's survival estimates
  int64_t lookup_rounds = 0;
  double drafter_seconds = 0.0;
  double verify_seconds = 0.0;
  // position_verified[i] / position_accepted[i]: rounds in which draft slot i was verified /
  // accepted (per-position acceptance).
  std::vector<int64_t> position_verified;
  std::vector<int64_t> position_accepted;
  // committed_histogram[k]: rounds that committed k tokens.
  std::vector<int64_t> committed_histogram;

  // Tokens committed per round, counting every target forward after prefill as a round.
  double tokens_per_round(int64_t generated_tokens) const;
  double acceptance_rate() const { return drafted > 0 ? double(accepted) / drafted : 0.0; }
};

// Chooses the cap of each round. The loop also clips it to the remaining token budget.
class CapPolicy {
 public:
  virtual ~CapPolicy() = default;
  // The cap of the next round; advances a controller's round count.
  virtual int cap_for_round() = 0;
  // The cap as it stands, without counting a round (for reports).
  virtual int current_cap() const = 0;
  // The sequence now holds `tokens` committed tokens (the context depth the next round runs at).
  virtual void on_context(int64_t tokens) { (void)tokens; }
  // `sequences` generations (this one included) now share each target step (forward_batcher.h).
  virtual void on_load(int sequences) { (void)sequences; }
  // A round of the generation's own drafter (lookup rounds of a standalone lookup included)
  // verified `drafted` drafts and accepted the first `accepted`.
  virtual void on_verified(int drafted, int accepted) { (void)drafted, (void)accepted; }
  // How many of `offered` drafts to verify, given the drafter's survival estimates
  // (Draft::survival, one per draft): the drafter has run, so only the verify rows are priced.
  virtual int drafts_to_verify(const std::vector<double>& survival, int offered) {
    (void)survival;
    return offered;
  }
  // A drafter (not lookup) round ended: `cap_used` drafts verified, `accepted` taken.
  virtual void on_round(int cap_used, int accepted, double seconds, int committed) {
    (void)cap_used, (void)accepted, (void)seconds, (void)committed;
  }
};

class FixedCap : public CapPolicy {
 public:
  explicit FixedCap(int cap) : cap_(cap) {}
  int cap_for_round() override { return cap_; }
  int current_cap() const override { return cap_; }

 private:
  int cap_;
};

struct SpeculativeOptions {
  // A lookup pre-step before the drafter (hybrid, --lookup-drafts); null for none. When set, a
  // lookup hit is verified instead of running the drafter.
  Drafter* lookup = nullptr;
  int lookup_cap = 32;
  // Caps the pre-step's drafts further (told the load and its own acceptance like the drafter's
  // policy); null: lookup_cap alone. A cap of 0 skips the pre-step that round.
  CapPolicy* lookup_caps = nullptr;
  // Batches the target forwards with other generations' (engine/forward_batcher.h); null for a
  // generation alone.
  ForwardBatcher* batcher = nullptr;
  // Called after every round with the state rolled back to the accept point (tests compare it
  // with plain decoding's state at the same position).
  std::function<void(const ModelState&)> after_round;
};

class SpeculativeGenerator {
 public:
  SpeculativeGenerator(const Model& model, Drafter& drafter, CapPolicy& caps,
                       SpeculativeOptions options = {});

  GenerationResult generate(const std::vector<int32_t>& prompt, ModelState& state,
                            const GenerationConfig& config, const TokenCallback& on_token);
  const SpeculativeStats& stats() const { return stats_; }

 private:
  const Model& model_;
  Drafter& drafter_;
  CapPolicy& caps_;
  SpeculativeOptions options_;
  SpeculativeStats stats_;
};

// Lossless acceptance of one draft token at T > 0: accept with probability min(1, p(x) / q(x)),
// q = δ(x) when `proposal` is empty. On rejection, `residual` receives norm(max(p − q, 0)).
bool accept_sampled(const TokenDistribution& target, const TokenDistribution* proposal,
                    int32_t token, double uniform, TokenDistribution& residual);

}  // namespace dspark
