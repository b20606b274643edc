// The cost model and derived cap on synthetic curves whose optimum is worked out by hand, and the
// per-round controller on synthetic acceptance streams.
#include "speculative/cap.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "test_curves.h"

namespace dspark {
namespace {

using testing::curves_of;

TEST(CostCurves, InterpolatesAndExtrapolatesTheLastSegment) {
  const CostCurves curves = curves_of({10, 12, 20}, {1, 3});
  EXPECT_DOUBLE_EQ(curves.verify(1), 10);
  EXPECT_DOUBLE_EQ(curves.verify(3), 20);
  EXPECT_DOUBLE_EQ(curves.verify(5), 36);  // slope 8 past width 3
  EXPECT_DOUBLE_EQ(curves.verify(0), 10);
  EXPECT_DOUBLE_EQ(curves.drafter(0), 0);
  EXPECT_DOUBLE_EQ(curves.drafter(4), 7);
  EXPECT_DOUBLE_EQ(curves.round_ms(0, 512), 10);
  EXPECT_DOUBLE_EQ(curves.round_ms(2, 512), 3 + 20);
}

// Past the measured widths the curve rises with the least-squares slope of its upper half, so one
// noisy last point cannot make wide verifies look free.
TEST(CostCurves, ExtrapolatesWithTheUpperHalfsLeastSquaresSlope) {
  const CostCurves curves = curves_of({1, 2, 3, 4, 5, 6, 8, 8});
  // Widths 5..8 hold 5, 6, 8, 8: slope (−1.5·5 − 0.5·6 + 0.5·8 + 1.5·8) / 5 = 1.1.
  EXPECT_DOUBLE_EQ(curves.verify(10), 8 + 2 * 1.1);
}

TEST(CostCurves, FitMakesTheSeriesNonDecreasingByLeastSquares) {
  std::vector<double> values = {1, 3, 2, 4, 6, 5, 5, 9};
  fit_non_decreasing(values);
  EXPECT_EQ(values, (std::vector<double>{1, 2.5, 2.5, 4, 16.0 / 3, 16.0 / 3, 16.0 / 3, 9}));
  std::vector<double> sorted = {1, 2, 2, 7};
  fit_non_decreasing(sorted);
  EXPECT_EQ(sorted, (std::vector<double>{1, 2, 2, 7}));
  CostCurves curves = curves_of({0.15, 0.22, 0.27, 0.31, 0.38, 0.31, 0.35, 0.39}, {0.8, 0.78});
  curves.fit();
  EXPECT_TRUE(std::is_sorted(curves.verify_ms.begin(), curves.verify_ms.end()));
  EXPECT_DOUBLE_EQ(curves.drafter_ms[0], 0.79);
  EXPECT_DOUBLE_EQ(curves.drafter_ms[1], 0.79);
}

// Deeper than the reference context rows cost more, shallower less, by the slope interpolated at
// their width (beyond the widest, continued along the last segment, never falling); never less
// than half of the measured verify.
TEST(CostCurves, DepthSlopeAroundTheReferenceContext) {
  CostCurves curves = curves_of({10, 10, 10, 10, 10});
  curves.slope_widths = {1, 3, 5};
  curves.slope_ms_per_token = {0.001, 0.002, 0.004};
  EXPECT_DOUBLE_EQ(curves.depth(1, 512), 0.0);
  EXPECT_DOUBLE_EQ(curves.depth(1, 412), -0.1);
  EXPECT_DOUBLE_EQ(curves.depth(3, 12), -1.0);
  EXPECT_DOUBLE_EQ(curves.depth(1, 1512), 1.0);
  EXPECT_DOUBLE_EQ(curves.depth(2, 1512), 1.5);
  EXPECT_DOUBLE_EQ(curves.depth(4, 1512), 3.0);
  EXPECT_DOUBLE_EQ(curves.depth(5, 1512), 4.0);
  EXPECT_DOUBLE_EQ(curves.depth(9, 1512), 8.0);
  curves.slope_ms_per_token = {0.001, 0.004, 0.003};
  EXPECT_DOUBLE_EQ(curves.depth(9, 1512), 3.0);
  curves.slope_ms_per_token = {0.1, 0.1, 0.1};
  EXPECT_DOUBLE_EQ(curves.depth(1, 0), -5.0);
}

// A drafter's block attends over its whole context: drafting costs its slope per token away from
// the reference context, never less than half the measured cost, and nothing at cap 0.
TEST(CostCurves, DrafterDepthAroundTheReferenceContext) {
  CostCurves curves = curves_of({10, 10, 10}, {2, 3});
  curves.drafter_slope_ms_per_token = 0.001;
  EXPECT_DOUBLE_EQ(curves.drafter(1, 512), 2.0);
  EXPECT_DOUBLE_EQ(curves.drafter(2, 3512), 6.0);
  EXPECT_DOUBLE_EQ(curves.drafter(1, 12), 1.5);
  EXPECT_DOUBLE_EQ(curves.drafter(0, 3512), 0.0);
  EXPECT_DOUBLE_EQ(curves.round_ms(1, 3512), 2.0 + 3.0 + 10.0);
  curves.drafter_slope_ms_per_token = 0.01;
  EXPECT_DOUBLE_EQ(curves.drafter(1, 0), 1.0);
}

TEST(ExpectedCommitted, GeometricAndFromSurvival) {
  EXPECT_DOUBLE_EQ(expected_committed(0.5, 0), 1.0);
  EXPECT_DOUBLE_EQ(expected_committed(0.5, 3), 1.875);
  EXPECT_DOUBLE_EQ(expected_committed({0.9, 0.5}, 0.5, 3), 1 + 0.9 + 0.5 + 0.25);
}

TEST(MeasuredSurvival, StopsAtThinlyObservedSlots) {
  SpeculativeStats stats;
  stats.position_verified = {100, 80, 3};
  stats.position_accepted = {90, 40, 1};
  EXPECT_EQ(measured_survival(stats), (std::vector<double>{0.9, 0.5}));
}

// A flat verify curve and a free drafter (the wide-GPU case): every extra draft is free, so the
// largest cap wins.
TEST(DeriveCap, FlatCurveSelectsTheFullBlock) {
  EXPECT_EQ(derive_cap(curves_of({10, 10, 10, 10, 10, 10, 10, 10}), 7), 7);
}

// A knee: widths up to 4 cost 10 ms, wider ones 30 ms. With p = 0.7,
// rate(3) = 2.533 / 10 beats rate(4) = 2.773 / 30 and every smaller cap.
TEST(DeriveCap, KneeSelectsTheWidestCheapWidth) {
  EXPECT_EQ(derive_cap(curves_of({10, 10, 10, 10, 30, 30, 30, 30}), 7), 3);
}

// Linear verify cost 10 + 4 (w - 1) and a drafter of 1 ms per draft: rate(C) = E(C) / (10 + 5C).
// With p = 0.7: C=1 0.1133, C=2 0.1095, so 1; with p = 0.9: C=3 0.1374, C=4 0.1366, C=2 0.1355.
TEST(DeriveCap, LinearCostOptimumMovesWithAcceptance) {
  const CostCurves curves = curves_of({10, 14, 18, 22, 26, 30, 34, 38}, {1, 2, 3, 4, 5, 6, 7});
  EXPECT_EQ(derive_cap(curves, 7, 0.7), 1);
  EXPECT_EQ(derive_cap(curves, 7, 0.9), 3);
}

// Measured survival replaces the prior: a drafter that is right twice and then almost never
// makes cap 2 the optimum of a flat curve, where the prior would take the full block.
TEST(DeriveCap, MeasuredSurvivalOverridesThePrior) {
  const CostCurves curves = curves_of({10, 10.1, 10.2, 10.3, 10.4, 10.5, 10.6, 10.7});
  EXPECT_EQ(derive_cap(curves, 7), 7);
  EXPECT_EQ(derive_cap(curves, 7, std::vector<double>{0.95, 0.9, 0.01, 0.0, 0.0, 0.0, 0.0}), 2);
}

// A verify of two rows costing twice one row and a drafter costing half a row: at p = 0.7 a cap-1
// round commits 1.7 tokens in 2.5 rows' time, a plain step 1 in 1, and longer caps do worse.
TEST(DeriveCap, PlainDecodingWhenNoCapPays) {
  const CostCurves curves = curves_of({10, 20, 30, 40}, {5, 10, 15});
  EXPECT_EQ(derive_cap(curves, 3), 0);
  EXPECT_EQ(derive_cap(curves, 3, 0.99), 0);  // 1.99 / 25 < 1 / 10 even so
  EXPECT_EQ(make_cap_policy_factory(curves, 3, true)(DecodeOptions{})->cap_for_round(), 0);
}

// A step's verify cost is flat up to 8 rows, then 0.5 ms per row: one generation drafts deep, eight
// sharing each step draft less (their rows fill the cheap widths), and the cap is the brute-force
// argmax of the step's rate. One sequence's derivation is the plain one.
TEST(DeriveCap, LoadLowersTheCapToTheStepsOptimum) {
  std::vector<double> verify;
  for (int w = 1; w <= 32; ++w) verify.push_back(10.0 + 0.5 * std::max(0, w - 8));
  const CostCurves curves = curves_of(verify, {0.2, 0.4, 0.6, 0.8, 1.0, 1.2, 1.4, 1.6});
  EXPECT_EQ(curves.batch_round_ms(3, 512, 1), curves.round_ms(3, 512));
  EXPECT_EQ(derive_cap(curves, 8, 0.7, 512, 1), derive_cap(curves, 8, 0.7));
  int previous = derive_cap(curves, 8, 0.7, 512, 1);
  EXPECT_GE(previous, 5);
  for (int sequences : {2, 4, 8, 16}) {
    int best = 0;
    double best_rate = -1;
    for (int cap = 0; cap <= 8; ++cap) {
      const double rate = sequences * expected_committed(0.7, cap) /
                          (sequences * curves.drafter(cap) + curves.verify(sequences * (cap + 1)) +
                           (cap > 0 ? curves.overhead_ms : 0));
      if (rate > best_rate) best_rate = rate, best = cap;
    }
    const int cap = derive_cap(curves, 8, 0.7, 512, sequences);
    EXPECT_EQ(cap, best) << sequences << " sequences";
    EXPECT_LE(cap, previous) << sequences << " sequences";
    previous = cap;
  }
  EXPECT_LE(derive_cap(curves, 8, 0.7, 512, 16), 2);
  // Where every verify row costs what a plain step costs, no load makes drafting pay.
  const CostCurves linear = curves_of({10, 20, 30, 40});
  EXPECT_EQ(derive_cap(linear, 8, 0.7, 512, 4), 0);
}

TEST(AutoCapController, LoadCeilsTheCap) {
  std::vector<double> verify;
  for (int w = 1; w <= 32; ++w) verify.push_back(10.0 + 2.0 * std::max(0, w - 4));
  const CostCurves curves = curves_of(verify);
  AutoCapController::Params params;
  params.init_cap = 6;
  AutoCapController alone(curves, 8, params), loaded(curves, 8, params);
  loaded.on_load(8);
  const int ceiling = derive_cap(curves, 8, loaded.acceptance(), 0, 8);
  ASSERT_LT(ceiling, 6);
  EXPECT_EQ(alone.cap_for_round(), 6);
  EXPECT_EQ(loaded.cap_for_round(), ceiling);
}

// Standalone lookup proposes up to its ceiling and verifies the prefix of each proposal that
// pays on the verify costs at its survival estimates: all of a likely run, none of an unlikely
// one, fewer under load.
TEST(LookupLoadCap, VerifiesThePrefixTheSurvivalPaysFor) {
  std::vector<double> verify;
  for (int w = 1; w <= 32; ++w) verify.push_back(10.0 + 1.0 * (w - 1));
  const CostCurves curves = curves_of(verify);
  LookupLoadCap policy(curves, 32);
  EXPECT_EQ(policy.cap_for_round(), 32);
  const std::vector<double> likely = {0.9, 0.85, 0.8, 0.75, 0.7, 0.65};
  EXPECT_EQ(policy.drafts_to_verify(likely, 6), 6);
  // A first draft accepted 5 % of the time does not pay for its row (10 % more than a plain step).
  EXPECT_EQ(policy.drafts_to_verify({0.05, 0.045, 0.04, 0.036, 0.032, 0.029}, 6), 0);
  // A run that fades: the rate peaks where one more row costs more than its survival brings.
  const std::vector<double> fading = {0.8, 0.5, 0.2, 0.05, 0.01, 0.001};
  int best = 0;
  double best_rate = 0;
  for (int cap = 0; cap <= 6; ++cap) {
    const double rate = expected_committed(fading, 0.0, cap) / curves.round_ms(cap, 0);
    if (rate > best_rate) best_rate = rate, best = cap;
  }
  EXPECT_EQ(policy.drafts_to_verify(fading, 6), best);
  EXPECT_GT(best, 0);
  EXPECT_LT(best, 6);
  EXPECT_EQ(policy.drafts_to_verify(likely, 0), 0);
  // Under load the step's rows cost more than they commit sooner.
  policy.on_load(8);
  EXPECT_EQ(policy.drafts_to_verify(likely, 6), derive_cap(curves, 6, likely, 0, 8));
  EXPECT_LT(policy.drafts_to_verify(likely, 6), 6);
  // Without measured costs, with a pinned --max-draft in lookup mode or with the schedule off,
  // every proposed draft is verified.
  DecodeOptions options;
  options.mode = DecodeMode::lookup;
  EXPECT_EQ(make_lookup_cap_policy_factory(CostCurves{})(options)->current_cap(),
            lookup_cap_ceiling(options));
  EXPECT_NE(dynamic_cast<LookupLoadCap*>(make_lookup_cap_policy_factory(curves)(options).get()),
            nullptr);
  DecodeOptions pinned = options;
  pinned.max_draft = 4;
  EXPECT_EQ(make_lookup_cap_policy_factory(curves)(pinned)->drafts_to_verify({0.01}, 1), 1);
  DecodeOptions unscheduled = options;
  unscheduled.confidence_schedule = false;
  EXPECT_EQ(make_lookup_cap_policy_factory(curves)(unscheduled)->drafts_to_verify({0.01}, 1), 1);
}

TEST(DeriveCap, DepthShrinksTheCap) {
  CostCurves curves = curves_of({10, 10, 10, 10, 10, 10, 10, 10});
  curves.slope_widths = {1, 8};
  curves.slope_ms_per_token = {0.0, 0.01};  // wide verifies pay for long contexts
  EXPECT_EQ(derive_cap(curves, 7, 0.7, 512), 7);
  EXPECT_LT(derive_cap(curves, 7, 0.7, 8192), 4);
}

// Drives a controller the way the verify loop does: a cap per round, plain steps at cap 0 (not
// reported), drafts accepted independently with probability p(round), and round times taken from
// the same cost curves.
struct Simulation {
  Simulation(AutoCapController& controller, const CostCurves& curves)
      : controller(controller), curves(curves) {}

  AutoCapController& controller;
  const CostCurves& curves;
  std::mt19937 rng{1234};
  std::vector<int> caps;

  void run(int rounds, double p) {
    std::bernoulli_distribution accept(p);
    for (int r = 0; r < rounds; ++r) {
      const int cap = controller.cap_for_round();
      caps.push_back(cap);
      if (cap == 0) continue;
      int accepted = 0;
      while (accepted < cap && accept(rng)) ++accepted;
      controller.on_round({cap, cap, accepted, curves.round_ms(cap, 512) / 1000.0, accepted + 1});
    }
  }
  // The cap used most often in the last `n` rounds.
  int recent_mode(size_t n) const {
    std::vector<int> count(64, 0);
    for (size_t i = caps.size() - std::min(n, caps.size()); i < caps.size(); ++i) ++count[caps[i]];
    return static_cast<int>(std::max_element(count.begin(), count.end()) - count.begin());
  }
};

// A verify curve that rises gently and a drafter costing 0.5 ms per draft: high acceptance wants
// long drafts, low acceptance short ones, and near-zero acceptance loses to plain steps.
CostCurves controller_curves() {
  return curves_of({10, 11, 12, 13, 14, 15, 16, 17}, {0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5}, 0.5);
}

TEST(AutoCapController, RisingAcceptanceRaisesTheCap) {
  const CostCurves curves = controller_curves();
  AutoCapController controller(curves, 7);
  Simulation sim{controller, curves};
  sim.run(200, 0.3);
  const int low = sim.recent_mode(40);
  sim.run(400, 0.95);
  const int high = sim.recent_mode(40);
  EXPECT_LE(low, 2);
  EXPECT_GE(high, 6);
  EXPECT_FALSE(controller.parked());
  EXPECT_GT(controller.acceptance(), 0.85);
}

// At p = 0.5 caps 1 to 3 are within 4 % of each other (1.5 / 12, 1.75 / 13.5, 1.875 / 15) and
// 25 % ahead of plain steps (1 / 10): the cap must come down from the long drafts of p = 0.95 and
// stay clear of parking.
TEST(AutoCapController, FallingAcceptanceLowersTheCap) {
  const CostCurves curves = controller_curves();
  AutoCapController controller(curves, 7);
  Simulation sim{controller, curves};
  sim.run(300, 0.95);
  EXPECT_GE(sim.recent_mode(40), 6);
  sim.run(400, 0.5);
  const int low = sim.recent_mode(100);
  EXPECT_GE(low, 1);
  EXPECT_LE(low, 3);
  EXPECT_EQ(std::count(sim.caps.end() - 100, sim.caps.end(), 0), 0);
}

// Runs plain steps up to the parked controller's next probe and reports that probe with
// `accepted` of its one draft accepted.
void answer_next_probe(AutoCapController& controller, const CostCurves& curves, int accepted) {
  for (int round = 0; round < 200; ++round) {
    const int cap = controller.cap_for_round();
    if (cap == 0) continue;
    controller.on_round({cap, cap, accepted, curves.round_ms(cap, 512) / 1000.0, accepted + 1});
    return;
  }
  FAIL() << "no probe within 200 rounds";
}

TEST(AutoCapController, ParksWhenSpeculationLosesAndProbesLessAndLess) {
  const CostCurves curves = controller_curves();
  AutoCapController controller(curves, 7);
  Simulation sim{controller, curves};
  sim.run(400, 0.0);
  EXPECT_TRUE(controller.parked());
  // While parked: plain steps and cap-1 probes, 8 plain steps apart at first, twice as far after
  // each rejected probe, at most 64.
  const auto parked_at = std::find(sim.caps.begin(), sim.caps.end(), 0);
  ASSERT_NE(parked_at, sim.caps.end());
  std::vector<int64_t> gaps;
  int64_t plain = 0;
  for (auto it = parked_at; it != sim.caps.end(); ++it) {
    ASSERT_LE(*it, 1);
    if (*it == 0) {
      ++plain;
    } else {
      gaps.push_back(plain);
      plain = 0;
    }
  }
  ASSERT_GE(gaps.size(), 5u);
  EXPECT_EQ(std::vector<int64_t>(gaps.begin(), gaps.begin() + 5),
            (std::vector<int64_t>{8, 16, 32, 64, 64}));
  EXPECT_EQ(controller.probe_gap(), 64);
}

// An accepted probe brings the probes back to every 8 plain steps only while cap 1's rate is
// unmeasured. Here cap 1 was measured before and while parking, at a loss: an accepted probe
// that leaves the park in place leaves the probes 64 plain steps apart.
TEST(AutoCapController, AnAcceptedProbeResetsTheProbeGapOnlyWhileCapOneIsUnmeasured) {
  const CostCurves curves = controller_curves();
  AutoCapController controller(curves, 7);
  Simulation sim{controller, curves};
  sim.run(400, 0.0);
  ASSERT_EQ(controller.probe_gap(), 64);
  answer_next_probe(controller, curves, 1);
  EXPECT_TRUE(controller.parked());
  EXPECT_EQ(controller.probe_gap(), 64);

  // Parked from the start (no cap measured yet), an accepted probe resets the gap.
  const CostCurves losing = curves_of({10, 11, 12, 13}, {7, 14, 21});
  AutoCapController fresh(losing, 3);
  ASSERT_TRUE(fresh.parked());
  answer_next_probe(fresh, losing, 0);
  ASSERT_EQ(fresh.probe_gap(), 16);
  answer_next_probe(fresh, losing, 1);
  EXPECT_TRUE(fresh.parked());
  EXPECT_EQ(fresh.probe_gap(), 8);
}

// A drafter right about half the time on costs where cap 1 loses even so (1.45 tokens in 18 ms
// against 1 in 10): parked from the start, its probes back off to every 64 plain steps once four
// of them have measured cap 1, accepted or not, instead of returning to every 8 after each
// accepted one.
TEST(AutoCapController, ProbesOfAHalfRightDrafterGrowRare) {
  const CostCurves curves = curves_of({10, 11, 12, 13}, {7, 14, 21});
  AutoCapController controller(curves, 3);
  Simulation sim{controller, curves};
  sim.run(3000, 0.45);
  EXPECT_TRUE(controller.parked());
  const auto probes = std::count(sim.caps.begin(), sim.caps.end(), 1);
  EXPECT_EQ(std::count_if(sim.caps.begin(), sim.caps.end(), [](int cap) { return cap > 1; }), 0);
  EXPECT_LT(probes, 3000 / 50);
  EXPECT_EQ(controller.probe_gap(), 64);
}

TEST(AutoCapController, NeverParksWithoutPermissionOrEnoughObservations) {
  const CostCurves curves = controller_curves();
  AutoCapController::Params params;
  params.allow_parking = false;
  AutoCapController controller(curves, 7, params);
  Simulation sim{controller, curves};
  sim.run(300, 0.0);
  EXPECT_EQ(*std::min_element(sim.caps.begin(), sim.caps.end()), 1);

  AutoCapController fresh(curves, 7);
  Simulation early{fresh, curves};
  early.run(10, 0.0);  // 10 rounds give 10 failures: fewer than the 12 parking needs
  EXPECT_EQ(*std::min_element(early.caps.begin(), early.caps.end()), 1);
}

// Costs on which no cap pays even at the prior (as in DeriveCap.PlainDecodingWhenNoCapPays): the
// controller starts parked, probing after 8 plain steps, with the prior worth the 12 observations
// parking needs. One accepted probe does not end the park; a run of them does, once cap 1 has
// been observed for the 4 rounds after which its own measured rate prices it.
TEST(AutoCapController, StartsParkedWhereNoCapPaysAtThePrior) {
  const CostCurves curves = curves_of({10, 11, 12, 13}, {7, 14, 21});
  ASSERT_EQ(derive_cap(curves, 3, AutoCapController::Params{}.prior_p), 0);
  ASSERT_GT(derive_cap(curves, 3, 0.99), 0);
  AutoCapController controller(curves, 3);
  EXPECT_TRUE(controller.parked());
  EXPECT_EQ(controller.observations(), 12);
  std::vector<int> caps;
  for (int round = 0; round < 9; ++round) caps.push_back(controller.cap_for_round());
  EXPECT_EQ(caps, (std::vector<int>{0, 0, 0, 0, 0, 0, 0, 0, 1}));
  controller.on_round({1, 1, 1, curves.round_ms(1, 512) / 1000.0, 2});
  EXPECT_TRUE(controller.parked());
  EXPECT_EQ(controller.probe_gap(), 8);
  EXPECT_NEAR(controller.acceptance(), 0.65 + 0.35 / 13, 1e-9);
  int probes = 1;
  for (int round = 0; round < 1000 && controller.parked(); ++round) {
    const int cap = controller.cap_for_round();
    if (cap == 0) continue;
    ++probes;
    controller.on_round({cap, cap, cap, curves.round_ms(cap, 512) / 1000.0, cap + 1});
  }
  EXPECT_FALSE(controller.parked());
  EXPECT_EQ(probes, 4);

  AutoCapController::Params no_parking;
  no_parking.allow_parking = false;
  AutoCapController unparked(curves, 3, no_parking);
  EXPECT_FALSE(unparked.parked());
  EXPECT_EQ(unparked.cap_for_round(), 2);
}

TEST(AutoCapController, RecoversFromParkingWhenAcceptanceReturns) {
  const CostCurves curves = controller_curves();
  AutoCapController controller(curves, 7);
  Simulation sim{controller, curves};
  sim.run(300, 0.02);
  ASSERT_TRUE(controller.parked());
  sim.run(1500, 0.97);
  EXPECT_FALSE(controller.parked());
  EXPECT_GE(sim.recent_mode(60), 5);
}

// With no observations the controller prices caps with the prior p = 0.65: E(2) = 2.0725 and
// E(3) = 2.347125. Verify costs of 10 ms up to width 3 and `width4_ms` at width 4 make cap 3 better
// than the starting cap 2 by the factor 1.132513 * 10 / width4_ms.
int cap_after_repicks(double width4_ms) {
  const CostCurves curves = curves_of({10, 10, 10, width4_ms, 100, 100, 100, 100});
  AutoCapController controller(curves, 7);
  int cap = 0;
  for (int round = 0; round < 8; ++round) cap = controller.cap_for_round();
  return cap;
}

TEST(AutoCapController, HysteresisKeepsTheCapWithinThreePercent) {
  EXPECT_EQ(cap_after_repicks(10 * 1.132513 / 1.02), 2);  // 2 % better: stay
  EXPECT_EQ(cap_after_repicks(10 * 1.132513 / 1.05), 3);  // 5 % better: switch
}

TEST(CapPolicyFactory, AutoPinnedAndDerived) {
  const CostCurves curves = curves_of({10, 10, 10, 10, 30, 30, 30, 30});
  const CapPolicyFactory factory = make_cap_policy_factory(curves, 7, true);
  DecodeOptions options;
  EXPECT_EQ(factory(options)->cap_for_round(), 3);
  options.max_draft = 5;
  EXPECT_EQ(factory(options)->cap_for_round(), 5);
  options.auto_cap = true;
  auto policy = factory(options);
  EXPECT_NE(dynamic_cast<AutoCapController*>(policy.get()), nullptr);
  EXPECT_EQ(policy->cap_for_round(), 2);
  EXPECT_EQ(make_cap_policy_factory(CostCurves{}, 7, true)(DecodeOptions{})->cap_for_round(), 2);
}

}  // namespace
}  // namespace dspark
