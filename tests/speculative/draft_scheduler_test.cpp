// The batch's draft allocation on synthetic curves and acceptances worked out by hand, and the
// derived-cap policy that feeds it each generation's acceptance.
#include "speculative/draft_scheduler.h"

#include <gtest/gtest.h>

#include <set>

#include "base/error.h"
#include "test_curves.h"

namespace dspark {
namespace {

using testing::curves_of;

DraftCandidate geometric(double p, int max_cap, int64_t context = 512) {
  DraftCandidate candidate;
  candidate.context = context;
  double survival = 1.0;
  for (int k = 0; k < max_cap; ++k) candidate.survival.push_back(survival *= p);
  return candidate;
}

// With one generation the allocation is the derived cap, on every curve shape derive_cap's tests
// use and every acceptance.
TEST(AllocateDrafts, OneGenerationIsTheDerivedCap) {
  const std::vector<CostCurves> shapes = {
      curves_of({10, 10, 10, 10, 10, 10, 10, 10}),
      curves_of({10, 10, 10, 10, 30, 30, 30, 30}),
      curves_of({10, 14, 18, 22, 26, 30, 34, 38}, {1, 2, 3, 4, 5, 6, 7}),
      curves_of({10, 20, 30, 40}, {}, 0.5),
  };
  for (const CostCurves& curves : shapes) {
    for (double p : {0.0, 0.3, 0.7, 0.9, 1.0}) {
      const DraftAllocation allocation = allocate_drafts(curves, {geometric(p, 7)});
      EXPECT_EQ(allocation.caps, std::vector<int>{derive_cap(curves, 7, p)}) << p;
      EXPECT_EQ(allocation.drafts, allocation.caps[0]);
    }
  }
}

// Widths up to 4 cost 10 ms, then 5 ms a row. A confident generation (p = 0.9) and a doubtful
// one (p = 0.2) share the step; by survival the pairs go .9, .81 (both the confident one's), then
// .729 needs width 5:
//   0 drafts 2 / 10 = .200;  1: 2.9 / 10 = .290;  2: 3.71 / 10 = .371;  3: 4.439 / 15 = .296.
// The uniform derived cap at the prior (C = 1 each) would commit (2 + .9 + .2) / 10 = .31.
TEST(AllocateDrafts, TheBudgetGoesToTheDraftsLikeliestToSurvive) {
  const CostCurves curves = curves_of({10, 10, 10, 10, 15, 20, 25, 30, 35, 40});
  const DraftAllocation allocation =
      allocate_drafts(curves, {geometric(0.9, 4), geometric(0.2, 4)});
  EXPECT_EQ(allocation.caps, (std::vector<int>{2, 0}));
  EXPECT_EQ(allocation.drafts, 2);
  EXPECT_NEAR(allocation.tokens_per_ms, 0.371, 1e-12);
  EXPECT_EQ(derive_cap(curves, 4, kDerivedCapPrior, 512, 2), 1);
}

// Width 4 costs double and wider ones no more: the rate falls at the third draft and rises past
// its value at the seventh, (1 + Σ .9^k, k = 1..7) / 20 = .2848 > 2.71 / 10. A search that stopped
// at the first fall would keep 2.
TEST(AllocateDrafts, SearchesEveryBudgetWhereTheRateIsNotUnimodal) {
  const CostCurves curves = curves_of({10, 10, 10, 20, 20, 20, 20, 20});
  const DraftAllocation allocation = allocate_drafts(curves, {geometric(0.9, 7)});
  EXPECT_EQ(allocation.caps, std::vector<int>{7});
}

// Plain decoders in the step take verify rows too: past the cheap widths a draft must pay for a
// row that costs what a plain step commits, so the drafts stop.
TEST(AllocateDrafts, PlainSequencesCrowdOutDrafts) {
  const CostCurves curves = curves_of({10, 10, 10, 10, 20, 30, 40, 50});
  EXPECT_EQ(allocate_drafts(curves, {geometric(0.8, 4)}, 0).drafts, 3);
  EXPECT_EQ(allocate_drafts(curves, {geometric(0.8, 4)}, 2).drafts, 1);
  EXPECT_EQ(allocate_drafts(curves, {geometric(0.8, 4)}, 4).drafts, 0);
}

// Survival is read as non-increasing, and the drafter's cost per draft is charged to the one
// drafting: an expensive drafter moves the budget to nobody.
TEST(AllocateDrafts, DrafterCostAndSurvivalOrderAreRespected) {
  const CostCurves flat = curves_of({10, 10, 10, 10, 10, 10, 10, 10});
  DraftCandidate rising;
  rising.survival = {0.1, 0.9, 0.9};  // the second draft cannot outlive the first
  EXPECT_EQ(allocate_drafts(flat, {rising}).caps, std::vector<int>{3});
  const CostCurves costly = curves_of({10, 10, 10, 10, 10, 10, 10, 10}, {20, 40, 60});
  EXPECT_EQ(allocate_drafts(costly, {geometric(0.9, 3), geometric(0.9, 3)}).drafts, 0);
  EXPECT_THROW(allocate_drafts(CostCurves{}, {geometric(0.9, 3)}), Error);
}

// Drafts that exist are priced without their drafting: a drafter too costly to run for one draft
// (20 ms against a 10 ms step) still has its drafts verified once they are made, while verify
// rows are free. Worked by hand on flat verify curves of 10 ms: (1 + .9 + .81) / 10 is the best.
TEST(AllocateDrafts, DraftsThatExistAreNotChargedTheirDrafting) {
  const CostCurves costly = curves_of({10, 10, 10, 10}, {20, 40, 60});
  EXPECT_EQ(allocate_drafts(costly, {geometric(0.9, 3)}).drafts, 0);
  DraftCandidate drafted = geometric(0.9, 2);
  drafted.drafted = true;
  const DraftAllocation allocation = allocate_drafts(costly, {drafted});
  EXPECT_EQ(allocation.caps, std::vector<int>{2});
  EXPECT_NEAR(allocation.tokens_per_ms, 0.271, 1e-12);
}

// Confidence-scheduled verification: once the round's drafts exist, their own survival estimates
// decide how many the step verifies. Width 1 and 2 cost 10 ms, each further row 1 ms: confident
// drafts are all kept (4.90 / 13 beats every shorter prefix), a block whose survival collapses
// after the first is cut there (1.9 / 10 > 1.95 / 11), and a hopeless one is not verified at all
// (ties go to fewer drafts). Without the schedule every offered draft is verified.
TEST(DerivedCap, VerifiesTheDraftsTheirSurvivalPaysFor) {
  const CostCurves curves = curves_of({10, 10, 11, 12, 13, 14, 15, 16});
  auto scheduler = std::make_shared<DraftScheduler>(curves, 7);
  DerivedCap policy(scheduler);
  EXPECT_EQ(policy.drafts_to_verify({0.99, 0.98, 0.97, 0.96}, 4), 4);
  EXPECT_EQ(policy.drafts_to_verify({0.9, 0.05, 0.01}, 3), 1);
  EXPECT_EQ(policy.drafts_to_verify({0.0, 0.0}, 2), 0);
  // Never more than offered, even where survival would pay for more.
  EXPECT_EQ(policy.drafts_to_verify({0.99, 0.98, 0.97, 0.96}, 2), 2);
  {
    DerivedCap every_draft(scheduler, false);  // leaves the scheduler at the end of the block
    EXPECT_EQ(every_draft.drafts_to_verify({0.0, 0.0}, 2), 2);
  }
  // A draft is admitted on what is known up to it, the rest continued at the posted acceptance
  // (the prior, 0.7, here): on the knee curve of SearchesEveryBudgetWhereTheRateIsNotUnimodal
  // drafts at survival .9^k would take the cap 7 if all were known, but the third is judged with
  // its successors at .729 * .7^k, and those do not pay for width 8, so 2 are verified.
  {
    const CostCurves knee = curves_of({10, 10, 10, 20, 20, 20, 20, 20});
    auto knee_scheduler = std::make_shared<DraftScheduler>(knee, 7);
    DerivedCap alone(knee_scheduler);
    EXPECT_EQ(allocate_drafts(knee, {geometric(0.9, 7)}).drafts, 7);
    EXPECT_EQ(alone.drafts_to_verify(geometric(0.9, 7).survival, 7), 2);
  }
  // A fixed cost per drafting round (5 ms on a flat 10 ms step) makes one draft at survival .5
  // exactly break even, yet spread over the drafts that follow it pays: all 7 are verified, where
  // a walk stopping at the first budget that does not raise the rate would verify none.
  {
    auto flat =
        std::make_shared<DraftScheduler>(curves_of({10, 10, 10, 10, 10, 10, 10, 10}, {}, 5), 7);
    DerivedCap alone(flat);
    EXPECT_EQ(alone.drafts_to_verify(geometric(0.5, 7).survival, 7), 7);
  }
  // Rounds none of whose drafts is verified count in expectation (Σ survival accepted, a
  // rejection unless all survive): a drafter whose confidences keep saying no stops being asked.
  {
    DerivedCap doubtful(
        std::make_shared<DraftScheduler>(curves_of({10, 12, 14, 16, 18, 20, 22, 24}), 7));
    EXPECT_GT(doubtful.cap_for_round(), 0);
    for (int round = 0; round < 20; ++round) {
      EXPECT_EQ(doubtful.drafts_to_verify({0.02, 0.001}, 2), 0);
    }
    EXPECT_LT(doubtful.acceptance(), 0.2);
    EXPECT_EQ(doubtful.cap_for_round(), 0);
  }
  // Under load a draft must beat the rate of the step's plain rows: with one more generation
  // decoding, (2 + s) / 11 > 2 / 10 needs s > 0.2.
  policy.on_load(2);
  EXPECT_EQ(policy.drafts_to_verify({0.15}, 1), 0);
  EXPECT_EQ(policy.drafts_to_verify({0.3}, 1), 1);
}

// The policy: alone it starts at the calibrated derived cap; under load each generation's cap
// comes from the allocation over every member, fed its own rounds' acceptance, so a generation
// whose drafts keep failing gives its rows to one whose drafts land. Members that leave are
// forgotten.
TEST(DerivedCap, SharesTheBudgetByEachGenerationsAcceptance) {
  std::vector<double> verify;
  for (int w = 1; w <= 32; ++w) verify.push_back(10.0 + 1.0 * std::max(0, w - 6));
  const CostCurves curves = curves_of(verify);
  auto scheduler = std::make_shared<DraftScheduler>(curves, 7);
  DerivedCap good(scheduler);
  EXPECT_EQ(good.cap_for_round(), derive_cap(curves, 7));
  DerivedCap bad(scheduler);
  good.on_load(2);
  bad.on_load(2);
  // The same prior: the allocation over two equal members.
  const DraftAllocation even =
      allocate_drafts(curves, {geometric(kDerivedCapPrior, 7), geometric(kDerivedCapPrior, 7)});
  EXPECT_EQ(good.cap_for_round() + bad.cap_for_round(), even.drafts);
  for (int round = 0; round < 40; ++round) {
    good.on_round({3, 3, 3, 0.01, 4});
    bad.on_round({3, 3, 0, 0.01, 1});
  }
  EXPECT_GT(good.acceptance(), 0.95);
  EXPECT_LT(bad.acceptance(), 0.1);
  EXPECT_GT(good.cap_for_round(), bad.cap_for_round());
  EXPECT_EQ(bad.cap_for_round(), 0);
  // Plain steps relax the doubtful one's estimate back toward the prior until it drafts again.
  const double doubted = bad.acceptance();
  int plain_steps = 1;
  while (bad.cap_for_round() == 0 && plain_steps < 10000) ++plain_steps;
  EXPECT_GT(bad.acceptance(), doubted);
  EXPECT_LT(plain_steps, 10000);
  EXPECT_LT(bad.acceptance(), kDerivedCapPrior);
  for (int round = 0; round < 40; ++round) bad.on_round({3, 3, 0, 0.01, 1});
  {
    DerivedCap third(scheduler);
    third.on_load(3);
    EXPECT_EQ(third.cap_for_round(), allocate_drafts(curves, {geometric(good.acceptance(), 7),
                                                              geometric(bad.acceptance(), 7),
                                                              geometric(kDerivedCapPrior, 7)})
                                         .caps[2]);
  }
  // The third left: the load the loop reports now counts it as a plain decoder.
  good.on_load(3);
  EXPECT_EQ(
      good.cap_for_round(),
      allocate_drafts(curves, {geometric(good.acceptance(), 7), geometric(bad.acceptance(), 7)}, 1)
          .caps[0]);
}

// Alone, a drafter that keeps missing stops being run and is tried again now and then: on
// these costs a draft pays above 20 % acceptance, and an always-wrong drafter is run on fewer
// than 3 % of 4000 steps. One that then keeps landing gets more than the calibrated cap.
TEST(DerivedCap, AloneFollowsItsOwnAcceptance) {
  const CostCurves curves = curves_of({10, 12, 14, 16, 18, 20, 22, 24});
  DerivedCap policy(std::make_shared<DraftScheduler>(curves, 7));
  const int calibrated = policy.current_cap();
  EXPECT_EQ(calibrated, derive_cap(curves, 7));
  EXPECT_GT(calibrated, 0);
  int probes = 0;
  for (int step = 0; step < 4000; ++step) {
    const int cap = policy.cap_for_round();
    if (cap > 0) {
      policy.on_round({cap, cap, 0, 0.01, 1});
      ++probes;
    }
  }
  EXPECT_GT(probes, 10);
  EXPECT_LT(probes, 120);
  EXPECT_LT(policy.acceptance(), 0.25);
  for (int round = 0; round < 200; ++round) {
    const int cap = policy.cap_for_round();
    if (cap > 0) policy.on_round({cap, cap, cap, 0.01, cap + 1});
  }
  EXPECT_EQ(policy.current_cap(), derive_cap(curves, 7, policy.acceptance()));
  EXPECT_GT(policy.current_cap(), calibrated);
}

// The controller behind --max-draft auto prunes its drafts by the derived cap's stopping rule,
// continued at its own acceptance estimate: alone and under load, on every survival shape, it
// keeps what a scheduler member posting the same acceptance keeps. Without the schedule it keeps
// every draft.
TEST(AutoCapController, PrunesDraftsByTheDerivedCapsStoppingRule) {
  const CostCurves curves =
      curves_of({10, 10.5, 11.5, 13, 15, 17.5, 20.5, 24}, {0.4, 0.8, 1.2, 1.6, 2.0, 2.4, 2.8}, 0.5);
  const std::vector<std::vector<double>> survivals = {{0.99, 0.98, 0.97, 0.96, 0.95, 0.94, 0.93},
                                                      {0.9, 0.05, 0.01},
                                                      {0.6, 0.5, 0.4, 0.1},
                                                      {0.3, 0.25},
                                                      {0.02, 0.001},
                                                      geometric(0.8, 7).survival,
                                                      geometric(0.5, 5).survival};
  std::set<int> kept_counts;
  for (double acceptance : {0.3, 0.65, 0.9}) {
    for (int load : {1, 4}) {
      DraftScheduler scheduler(curves, 7);
      const int member = scheduler.join();
      scheduler.post(member, acceptance, curves.reference_context);
      for (const std::vector<double>& survival : survivals) {
        AutoCapController::Params params;
        params.prior_p = acceptance;
        AutoCapController controller(curves, 7, params);
        controller.on_load(load);
        const int offered = static_cast<int>(survival.size());
        const int kept = controller.drafts_to_verify(survival, offered);
        EXPECT_EQ(kept, scheduler.drafts_for(member, load, survival))
            << "acceptance " << acceptance << " load " << load << " first survival " << survival[0];
        kept_counts.insert(kept);
        params.confidence_schedule = false;
        AutoCapController every_draft(curves, 7, params);
        EXPECT_EQ(every_draft.drafts_to_verify(survival, offered), offered);
      }
    }
  }
  EXPECT_GE(kept_counts.size(), 4u) << "the cases do not exercise the rule";
}

// A head whose confidences always say no: none of its drafts is verified, so every round commits
// one token after paying for the drafting. Those rounds are timed under the cap that was drafted
// and the first draft's survival stands in for the outcome, so the controller parks (a plain step
// beats drafting for nothing), where counting only verified rounds would leave it drafting.
TEST(AutoCapController, ParksAHeadWhoseConfidencesSayNo) {
  const CostCurves curves =
      curves_of({10, 11, 12, 13, 14, 15, 16, 17}, {0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5}, 0.5);
  AutoCapController controller(curves, 7);
  int drafting_rounds_late = 0;
  for (int round = 0; round < 300; ++round) {
    const int cap = controller.cap_for_round();
    if (cap == 0) continue;
    if (round >= 200) ++drafting_rounds_late;
    const std::vector<double> survival = geometric(0.02, cap).survival;
    ASSERT_EQ(controller.drafts_to_verify(survival, cap), 0) << "round " << round;
    const double ms = curves.drafter(cap) + curves.verify(1) + curves.overhead_ms;
    controller.on_round({cap, 0, 0, ms / 1000.0, 1});
  }
  EXPECT_TRUE(controller.parked());
  EXPECT_LT(controller.acceptance(), 0.1);
  EXPECT_LE(drafting_rounds_late, 3) << "only probes once parked";
}

// The drafted cap's measured rate is what it commits per millisecond under the schedule: rounds
// of cap 6 that verify only two drafts are priced at their two-row verify, so the timing
// correction for unobserved caps stays at 1 when the curves are right.
TEST(AutoCapController, TimesTheDraftedCapWhateverWasVerified) {
  const CostCurves curves =
      curves_of({10, 11, 12, 13, 14, 15, 16, 17}, {0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5}, 0.5);
  AutoCapController::Params params;
  params.init_cap = 6;
  params.allow_parking = false;
  params.repick_every = 1000;  // hold the cap: only the timing is under test
  AutoCapController controller(curves, 7, params);
  const double ms = curves.drafter(6) + curves.verify(3) + curves.overhead_ms;
  for (int round = 0; round < 20; ++round) {
    ASSERT_EQ(controller.cap_for_round(), 6);
    controller.on_round({6, 2, 2, ms / 1000.0, 3});
  }
  EXPECT_DOUBLE_EQ(controller.effective_rate(6), 3.0 / ms);
  // Cap 3 is unobserved: its rate is the model's, uncorrected.
  const double model3 = expected_committed(controller.acceptance(), 3) / curves.round_ms(3, 512);
  EXPECT_NEAR(controller.effective_rate(3), model3, 1e-12);
}

}  // namespace
}  // namespace dspark
