#pragma once
// The one verify loop (docs/speculative.md §4–§7): every round drafts up to `cap` tokens after the
// pending token, runs the target once over [pending, drafts], accepts the leading run the target
// agrees with (greedy exact match, or lossless rejection sampling at T > 0), commits one more
// target token (the correction, or the bonus after a full accept), and rolls the state back to the
// accept point (KV trimmed; Mamba layers rebuilt bit-exactly from the recorded inputs).
//
// Plain decoding is this loop with no drafts (generate_plain): every round runs the target on the
// pending token alone. Speculative output equals it token for token when greedy, and follows the
// same target distribution when sampling: penalties are applied per verify row with the counts of
// every token before that row, exactly as sequential decoding would. The reasoning budget is
// consulted after every committed token as in plain decoding: a round stops committing where it
// fires, and the forced ids take one forward of their own.
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "engine/answer_constraint.h"
#include "engine/forced_tokens.h"
#include "engine/generator.h"
#include "speculative/acceptance.h"
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
// One round of a model drafter, as its cap policy sees it.
struct RoundOutcome {
  int cap = 0;       // the cap the policy handed out: the drafts drafted
  int verified = 0;  // of them verified (fewer where drafts_to_verify kept fewer; 0 = plain step)
  int accepted = 0;  // of the verified taken
  double seconds = 0.0;  // drafting, verifying and committing
  int committed = 0;     // tokens committed
};

class CapPolicy {
 public:
  virtual ~CapPolicy() = default;
  // The cap of the next round; advances a controller's round count.
  virtual int cap_for_round() = 0;
  // The cap as it stands, without counting a round (for reports).
  virtual int current_cap() const = 0;
  // The sequence now holds `tokens` committed tokens (the context depth the next round runs at).
  virtual void on_context(int64_t tokens) { (void)tokens; }
  // `sequences` generations (this one included) now share each target step (decode_together,
  // the server's step loop).
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
  // A round of the drafter (not lookup drafts) ended, verified drafts or none.
  virtual void on_round(const RoundOutcome& round) { (void)round; }
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
  // Called after every round with the sequence's state rolled back to the accept point (tests
  // compare it with plain decoding's state at the same position).
  std::function<void(const ModelState&)> after_round;
};

class DrafterFeed;

// One generation as a sequence of target forwards, split so that a caller can run the forwards of
// many generations as one (decode_together): next_run() plans the next forward (the prompt's
// prefill; the forced ids; or the pending token and the round's drafts, after drafting them) and
// finish_run() takes its output: acceptance (acceptance.h), commits, stop and budget checks, and
// the rollback to the accept point. A round without drafts is plain decoding.
//
// The references passed in (model, drafter, policies, options, pool, config) must outlive the
// decoder, and the sequence must stay open; the callback is copied, and runs inside finish_run.
class SequenceDecoder {
 public:
  // Throws as check_prompt does.
  SequenceDecoder(const Model& model, Drafter& drafter, CapPolicy& caps,
                  const SpeculativeOptions& options, const std::vector<int32_t>& prompt,
                  StatePool& pool, SequenceId sequence, const GenerationConfig& config,
                  const TokenCallback& on_token);
  ~SequenceDecoder();
  SequenceDecoder(const SequenceDecoder&) = delete;
  SequenceDecoder& operator=(const SequenceDecoder&) = delete;

  // The next forward, or nothing once the generation has ended. Its buffers stay valid until
  // finish_run, which must follow once the forward has run.
  std::optional<SequenceRun> next_run();
  // next_run with the drafter's call lifted out, so that a caller can draft for many generations
  // at once (propose_together): plans up to the next forward and returns the drafter call it
  // waits on, if any, with the target rows its drafter has not been fed yet (DraftCall::unfed).
  // take_draft answers it, the unfed rows fed by whoever drafted (propose_together); without it,
  // next_run feeds them and makes the call itself.
  std::optional<DraftCall> draft_call();
  void take_draft(Draft draft);
  // After a verify forward: works out which drafts the target takes (accept_rows) and keeps the
  // answer, or what it threw, for finish_run, so that a caller can spread this work of many
  // decoders over threads (accept_together). Nothing before any other forward.
  void accept_ahead();
  void finish_run();
  // Runs the remaining forwards one by one, alone.
  void run_to_end();
  // `sequences` generations (this one included) share each step of the caller's batched forwards;
  // told to the cap policies (CapPolicy::on_load). Alone (0) nothing is told.
  void set_load(int sequences) { load_ = sequences; }

  bool finished() const { return phase_ == Phase::done; }
  // The result so far (complete once finished()).
  const GenerationResult& result() const { return result_; }
  const SpeculativeStats& stats() const { return stats_; }

 private:
  // drafting: a round waits on its drafter's call (draft_call).
  enum class Phase { prefill, forced, drafting, verify, idle, done };
  void commit(int32_t id, const float* raw_logits, bool forced);
  void end_generation();
  SequenceRun run_of(const std::vector<int32_t>& rows);
  void plan_forced();
  int64_t round_budget() const;
  void plan_round();
  // Keeps the drafts `caps` finds worth their verify rows by the drafter's survival estimates
  // (all of them without estimates); returns how many.
  int keep_drafts_worth_verifying(CapPolicy& caps);
  void plan_verify();
  void plan_until_forward();
  // accept_rows over the output's rows, `draft` after the pending token.
  RowsAccepted accept(const Draft& draft);
  void finish_prefill();
  void finish_forced();
  void finish_round();

  const Model& model_;
  Drafter& drafter_;
  CapPolicy& caps_;
  const SpeculativeOptions& options_;
  StatePool& pool_;
  const SequenceId sequence_;
  const GenerationConfig& config_;
  const TokenCallback on_token_;
  const std::vector<int> taps_;
  const int64_t vocab_;
  const int64_t prompt_tokens_;
  const bool wants_rows_;
  Rng rng_;
  TokenCounts counts_;
  ForcedTokens forcing_;
  AnswerConstraint constraint_;
  std::vector<int32_t> committed_;
  std::unique_ptr<DrafterFeed> feed_;
  ForwardOutput output_;
  GenerationResult result_;
  SpeculativeStats stats_;
  Phase phase_ = Phase::prefill;
  // Forced ids due after the last commit (ForcedTokens::due); copied when their forward is planned.
  const std::vector<int32_t>* forced_due_ = nullptr;
  double decode_start_ = 0.0;
  // The planned forward.
  std::vector<int32_t> rows_;
  std::vector<int64_t> logit_rows_;
  std::vector<int32_t> forced_;
  Draft draft_;
  Drafter* source_ = nullptr;
  int cap_planned_ = 0;  // the drafter's cap this round
  int cap_used_ = 0;     // its drafts kept for verification
  int64_t length_before_ = 0;
  double round_start_ = 0.0;
  double forward_start_ = 0.0;
  int load_ = 0;
  // accept_ahead's answer for the verify forward that just ran, or what it threw.
  std::optional<RowsAccepted> accepted_ahead_;
  std::exception_ptr acceptance_error_;
};

// What batched steps (Model::forward_batch) have carried.
struct StepCounters {
  int64_t steps = 0;                    // batched forwards run
  int64_t sequence_forwards = 0;        // forwards the steps served (> steps once requests overlap)
  int64_t rows = 0;                     // token rows the steps ran
  int64_t widest = 0;                   // most sequences in one step
  std::vector<int64_t> steps_by_width;  // [w - 1]: steps that carried w sequences
  double busy_seconds = 0.0;            // inside the steps' forwards
  // The steps in which every generation was decoding (past its prompt, none finished): their wall
  // time, drafting and acceptance included, and the tokens they committed. The steady rate of a
  // constant load, without the start (prompts) and the tail (generations that ended early
  // leave narrower steps), which a closed batch of generations also has.
  double full_seconds = 0.0;
  int64_t full_tokens = 0;

  // One step over `runs` that took `seconds`.
  void add_step(const std::vector<SequenceRun>& runs, double seconds);
};

// The drafting half of one shared step: every decoder's pending drafter call (draft_call),
// answered together (propose_together) and handed back (take_draft), so that drafters of one
// head read its weights once. errors[i] is what decoders[i] threw while planning or what its
// drafter threw (null: none); a decoder that failed must not be stepped further.
std::vector<std::exception_ptr> draft_together(std::span<SequenceDecoder* const> decoders);

// The accepting half of one shared step, after its forward: every decoder's accept_ahead, spread
// over the default pool (a sampled row scores the whole vocabulary, the serial work of a step),
// before the callers' finish_run calls, one by one, commit what each accepted.
void accept_together(std::span<SequenceDecoder* const> decoders);

// One shared step: one Model::forward_batch over the next forward of each unfinished generation
// of `sequences` (sequences of `pool`), each told the load (set_load: the unfinished ones).
// Returns false, running nothing, once none has a forward left. Each generation's output and
// states are the ones it gets alone: the forward's rows are row invariant and everything else is
// per sequence. `counters`, when given, receives the step; it counts towards the steady rate when
// `slots` generations are unfinished and every one of them is past its prompt.
bool step_together(const Model& model, StatePool& pool, std::span<SequenceDecoder* const> sequences,
                   StepCounters* counters, size_t slots);

// Runs the generations to their ends, step_together after step_together, the steady rate taken
// while all of them decode.
void decode_together(const Model& model, StatePool& pool,
                     const std::vector<SequenceDecoder*>& sequences,
                     StepCounters* counters = nullptr);

class SpeculativeGenerator {
 public:
  SpeculativeGenerator(const Model& model, Drafter& drafter, CapPolicy& caps,
                       SpeculativeOptions options = {});

  GenerationResult generate(const std::vector<int32_t>& prompt, StatePool& pool,
                            SequenceId sequence, const GenerationConfig& config,
                            const TokenCallback& on_token);
  const SpeculativeStats& stats() const { return stats_; }

 private:
  const Model& model_;
  Drafter& drafter_;
  CapPolicy& caps_;
  SpeculativeOptions options_;
  SpeculativeStats stats_;
};

// Plain decoding's drafter, beside a cap of 0: it is never asked for drafts and needs no taps.
class NoDrafts : public Drafter {
 public:
  std::string name() const override { return "none"; }
  Draft propose(const DraftRequest& /*request*/) override { return {}; }
};

// Plain decoding: prefill the part of the prompt the sequence does not hold yet (check_prompt),
// then one target row per token, sampled with config.sampling, until an end token, max_tokens, the
// context's end, or on_token returning false.
GenerationResult generate_plain(const Model& model, const std::vector<int32_t>& prompt,
                                StatePool& pool, SequenceId sequence,
                                const GenerationConfig& config, const TokenCallback& on_token);

}  // namespace dspark
