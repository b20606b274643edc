#pragma once
// How many drafts a round should offer (docs/speculative.md §16): the measured cost model, the
// derived cap (the argmax over C of expected committed tokens per unit time), and the per-round
// controller behind --max-draft auto.
#include <cstdint>
#include <memory>
#include <vector>

#include "speculative/decode.h"
#include "speculative/verify.h"

namespace dspark {

// Measured costs in milliseconds (calibration.h fills them). Widths and caps between the measured
// points are priced piecewise-linearly; beyond them the curve rises with the least-squares slope
// of its upper half.
struct CostCurves {
  std::vector<double> verify_ms;    // [w - 1]: one tapped target forward of width w = 1, 2, ...
  std::vector<double> drafter_ms;   // [C - 1]: drafting C tokens; empty = free (lookup drafts)
  double overhead_ms = 0.0;         // per round, beyond drafting and verifying
  int64_t reference_context = 512;  // context depth the curves were measured at
  // Verify milliseconds per context token away from reference_context (fewer below it), at a few
  // widths.
  std::vector<int> slope_widths;
  std::vector<double> slope_ms_per_token;
  // Drafting milliseconds per context token away from reference_context: a DSpark or DFlash
  // block attends over the drafter's whole context, whatever the cap.
  double drafter_slope_ms_per_token = 0.0;

  bool empty() const { return verify_ms.empty(); }
  // Replaces the verify and drafter series by their non-decreasing least-squares fits: more rows
  // or drafts never cost less, and a sub-millisecond measurement's noise otherwise moves the cap.
  void fit();
  double verify(int width) const;
  // Drafting `cap` tokens at the reference context, and at `context` (0 for cap 0).
  double drafter(int cap) const;
  double drafter(int cap, int64_t context) const;
  double depth(int width, int64_t context) const;
  // Milliseconds of a round offering `cap` drafts at `context` (cap 0: a plain step).
  double round_ms(int cap, int64_t context) const;
  // Milliseconds of one shared step in which each of `sequences` generations offers `cap` drafts:
  // their drafting, one verify forward of all their rows, each one's attention at `context`.
  // round_ms for one sequence.
  double batch_round_ms(int cap, int64_t context, int sequences) const;
};

// The non-decreasing least-squares fit of `values`, in place (pool adjacent violators).
void fit_non_decreasing(std::vector<double>& values);

// Expected committed tokens of a round offering `cap` drafts: 1 + Σ_{i=1..cap} p^i.
double expected_committed(double p, int cap);
// The same from per-slot survival: survival[i] = P(drafts 0..i all accepted); slots beyond the
// vector continue geometrically with `tail_p`.
double expected_committed(const std::vector<double>& survival, double tail_p, int cap);

// Survival per slot from a run's statistics (slots verified fewer than `min_rounds` times are
// left out, so the vector may be shorter than the slots seen).
std::vector<double> measured_survival(const SpeculativeStats& stats, int64_t min_rounds = 8);

// Committed tokens per millisecond of a round offering `cap` drafts.
double round_rate(const CostCurves& curves, int cap, double p, int64_t context);

// The prior acceptance the derived cap assumes without measurements (§16.3).
constexpr double kDerivedCapPrior = 0.70;

// The continuation probability p of a geometric run of accepted drafts, from a round's evidence:
// accepted drafts over accepted drafts plus rejections (a fully accepted round is censored: no
// rejection), starting from `prior` worth four rounds.
class ContinuationEstimate {
 public:
  explicit ContinuationEstimate(double prior)
      : prior_(prior), accepted_(kPriorRounds * prior), rejected_(kPriorRounds * (1 - prior)) {}
  void observe(int drafted, int accepted) {
    accepted_ += accepted;
    if (accepted < drafted) rejected_ += 1.0;
  }
  // A round that was not verified, observed in expectation under the drafter's own survival
  // estimates (survival[i]: drafts 0..i all accepted): Σ survival accepted drafts, and a rejection
  // unless all survive.
  void observe_expected(const std::vector<double>& survival) {
    for (double s : survival) accepted_ += s;
    if (!survival.empty()) rejected_ += 1.0 - survival.back();
  }
  // Moves the evidence the fraction `rate` of the way back to the prior's.
  void relax(double rate) {
    accepted_ += rate * (kPriorRounds * prior_ - accepted_);
    rejected_ += rate * (kPriorRounds * (1 - prior_) - rejected_);
  }
  double value() const { return accepted_ / (accepted_ + rejected_); }

 private:
  static constexpr double kPriorRounds = 4.0;
  double prior_;
  double accepted_;
  double rejected_;
};

// argmax over C in 0..max_cap of round_rate (ties go to the smaller cap). 0 means plain decoding:
// on these costs no cap pays at the assumed acceptance. Under load (`sequences` generations
// sharing each step, all offering C drafts) the rate is the step's: sequences · E[committed] over
// batch_round_ms, so the cap falls as load rises, to 0 where verify rows cost what they commit.
int derive_cap(const CostCurves& curves, int max_cap, double p = kDerivedCapPrior,
               int64_t context = 512, int sequences = 1);
// The same with measured per-slot survival, continued with the prior beyond it.
int derive_cap(const CostCurves& curves, int max_cap, const std::vector<double>& survival,
               int64_t context = 512, int sequences = 1);

// The per-round controller (--max-draft auto, §16.4): a running-mean-then-EWMA estimate of the
// per-slot acceptance p, per-cap timing, a re-pick every few rounds with hysteresis, and parking
// at cap 0 (plain steps with a cap-1 probe, every probe_every rounds at first; the gap doubles
// after each probe that does not end the park, up to max_probe_every, except that an accepted
// probe resets it while cap 1's rate is not yet measured) when speculation loses. It starts parked
// where, on the measured costs, no cap pays even at prior_p (derive_cap gives 0); otherwise at
// init_cap. Two readings of the spec's sketch, both forced by tests on synthetic streams: a cap's
// observed rate is EWMA(committed) / EWMA(round time), not an EWMA of per-round ratios (which
// overstates the cost of noisy rounds); and the global correction scales modelled round *times*
// only, so a lucky acceptance streak cannot make every unobserved cap, parking included, look
// better. With a confidence head the drafts of a round are then pruned by the same stopping rule
// as the derived cap's (drafts_to_verify).
class AutoCapController : public CapPolicy {
 public:
  struct Params {
    int init_cap = 2;
    double prior_p = 0.65;
    double alpha = 0.02;
    double hysteresis = 1.03;
    int repick_every = 4;
    bool allow_parking = true;  // DSpark only
    int min_obs_to_park = 12;
    int probe_every = 8;
    int max_probe_every = 64;
    double t_alpha = 0.1;
    int min_rounds_observed = 4;
    int obs_max_age = 32;
    double correction_rate = 0.05;
    // Verify only the drafts whose survival estimates pay for their rows (drafts_to_verify).
    bool confidence_schedule = true;
  };

  AutoCapController(CostCurves curves, int max_cap);
  AutoCapController(CostCurves curves, int max_cap, Params params);

  // The controller's cap; under load no more than the derived cap at its acceptance estimate for
  // that load.
  int cap_for_round() override;
  // Confidence-scheduled verification (drafts_worth_verifying) continued at the controller's
  // acceptance estimate. The controller's cap is what is drafted; its rounds are timed whatever
  // was verified, so the measured rate of a cap is the rate of drafting it under the schedule.
  int drafts_to_verify(const std::vector<double>& survival, int offered) override;
  void on_round(const RoundOutcome& round) override;
  void on_load(int sequences) override { load_ = std::max(sequences, 1); }

  // Context depth of the sequence (prompt + generated), for the depth term of the cost model.
  void set_context(int64_t tokens) { context_ = tokens; }
  void on_context(int64_t tokens) override { set_context(tokens); }

  int current_cap() const override { return cap_; }
  bool parked() const { return cap_ == 0; }
  // Plain steps between two probes while parked.
  int64_t probe_gap() const { return probe_gap_; }
  double acceptance() const { return p_; }
  int64_t observations() const { return observations_; }
  // Committed tokens per millisecond the controller expects of `cap` now.
  double effective_rate(int cap) const;

 private:
  // Round time and committed tokens are averaged separately: the average of per-round ratios
  // would overstate the cost, since rounds that commit little weigh in with a large ratio.
  struct CapTiming {
    double ms_per_round = 0.0;
    double tokens_per_round = 0.0;
    double modelled_ms_per_round = 0.0;  // the same rounds as the curves price them
    int64_t rounds = 0;
    int64_t last_round = 0;
  };

  int controller_cap();
  double model_rate(int cap) const;
  void repick();
  void observe(double outcome);

  CostCurves curves_;
  int max_cap_;
  Params params_;
  int cap_;
  double p_;
  int64_t observations_ = 0;
  int64_t context_ = 0;
  int load_ = 1;                   // generations sharing the steps
  int64_t round_ = 0;              // rounds the loop asked a cap for
  int64_t parked_rounds_ = 0;      // plain steps since parking or the last probe
  int64_t probe_gap_ = 0;          // plain steps between probes now
  bool probing_ = false;           // the round just handed out is a probe
  double correction_ = 1.0;        // observed / modelled rate, for caps without observations
  std::vector<CapTiming> timing_;  // [cap], cap 1..max_cap
};

// Standalone lookup's cap (§16.5): the lookup proposes up to its ceiling (drafting is free), and
// of each proposal the drafts verified are the prefix that maximises expected committed tokens per
// millisecond on the measured verify costs, at the drafter's survival estimates
// (LookupDrafter: its proposals' outcomes) and the load: under load, as if every sequence sharing
// the step offered as many. A proposal none of whose prefixes pays is not verified: the round is
// a plain step.
class LookupLoadCap : public CapPolicy {
 public:
  LookupLoadCap(CostCurves curves, int ceiling);
  int cap_for_round() override { return ceiling_; }
  int current_cap() const override { return ceiling_; }
  void on_context(int64_t tokens) override { context_ = tokens; }
  void on_load(int sequences) override { load_ = std::max(sequences, 1); }
  int drafts_to_verify(const std::vector<double>& survival, int offered) override;

  // Drafts are verified only where their expected rate beats a plain step's by this much. The
  // curves price one sequence's rows: in a step of 8 single-row sequences on the default model a
  // ninth row took 0.7 ms where they priced 0.5, so drafts the model put 5 % ahead broke even.
  static constexpr double kPlainMargin = 1.1;

 private:
  CostCurves curves_;
  int ceiling_;
  int load_ = 1;
  int64_t context_ = 0;
};
// LookupLoadCap for lookup generations and the --lookup-drafts pre-step (drafting free: any
// drafter costs in `curves` are dropped); a FixedCap of the lookup's ceiling, every proposed draft
// verified, without curves, with --confidence-schedule off or, in lookup mode, a pinned
// --max-draft.
CapPolicyFactory make_lookup_cap_policy_factory(CostCurves curves);

// The cap policy of dspark / dflash generations: --max-draft auto gets a fresh controller, a
// pinned --max-draft a fixed cap, otherwise the derived cap of `curves` (draft_scheduler.h), every
// generation the factory makes sharing one scheduler. Without curves
// (calibration failed) both auto and derived fall back to a fixed cap of 2.
CapPolicyFactory make_cap_policy_factory(CostCurves curves, int max_cap, bool allow_parking);

}  // namespace dspark
