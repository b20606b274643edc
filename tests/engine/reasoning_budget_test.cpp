#include "engine/reasoning_budget.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "base/error.h"
#include "text/tokenizer.h"

namespace dspark {
namespace {

// Token ids index this spelling table.
const std::vector<std::string> kPieces = {"a",    "b",    " c",       "<think>", "</think>",
                                          "<th",  "ink>", "</",       "think>",  "\n",
                                          "</th", "x",    "<think>\n"};
enum : int32_t {
  kA,
  kB,
  kC,
  kOpen,
  kClose,
  kOpenHead,
  kOpenTail,
  kCloseHead,
  kCloseTail,
  kNewline,
  kCloseHalf,
  kX,
  kOpenNewline
};
const std::vector<int32_t> kForced = {kNewline, kClose, kNewline};

ReasoningBudgetConfig config(int64_t budget, bool starts_in_reasoning) {
  ReasoningBudgetConfig c;
  c.budget = budget;
  c.forced_ids = kForced;
  c.starts_in_reasoning = starts_in_reasoning;
  c.token_text = [](int32_t id) { return kPieces.at(id); };
  return c;
}

constexpr int64_t kRoom = 100;

TEST(ReasoningBudget, FiresWhenTheCountReachesTheBudget) {
  ReasoningBudget budget(config(3, /*starts_in_reasoning=*/true));
  budget.on_token(kA);
  EXPECT_FALSE(budget.due(kRoom));
  budget.on_token(kB);
  EXPECT_FALSE(budget.due(kRoom));
  budget.on_token(kC);
  EXPECT_EQ(budget.count(), 3);
  ASSERT_TRUE(budget.due(kRoom));
  budget.on_forced();
  EXPECT_TRUE(budget.fired());
  // Fires once: the forced closer and whatever follows do not re-arm it.
  for (int32_t id : kForced) budget.on_token(id);
  budget.on_token(kOpen);
  for (int i = 0; i < 5; ++i) budget.on_token(kA);
  EXPECT_FALSE(budget.due(kRoom));
}

TEST(ReasoningBudget, CountsFromTheOpenerWhenTheModelOpensTheBlock) {
  ReasoningBudget budget(config(2, /*starts_in_reasoning=*/false));
  budget.on_token(kNewline);  // leading whitespace is allowed
  budget.on_token(kOpenHead);
  budget.on_token(kOpenTail);
  EXPECT_EQ(budget.count(), 0);
  budget.on_token(kA);
  EXPECT_FALSE(budget.due(kRoom));
  budget.on_token(kB);
  EXPECT_TRUE(budget.due(kRoom));

  ReasoningBudget one_token(config(1, false));
  one_token.on_token(kOpenNewline);
  EXPECT_FALSE(one_token.due(kRoom));
  one_token.on_token(kA);
  EXPECT_TRUE(one_token.due(kRoom));
}

TEST(ReasoningBudget, NeverFiresWithoutAThinkingBlock) {
  ReasoningBudget budget(config(1, /*starts_in_reasoning=*/false));
  budget.on_token(kA);
  budget.on_token(kOpen);  // an opener after content does not open reasoning
  for (int i = 0; i < 4; ++i) budget.on_token(kB);
  EXPECT_FALSE(budget.due(kRoom));
  EXPECT_EQ(budget.count(), 0);
}

TEST(ReasoningBudget, HoldsOffWhileTheTailMayStartTheCloser) {
  ReasoningBudget budget(config(2, /*starts_in_reasoning=*/true));
  budget.on_token(kA);
  budget.on_token(kCloseHead);  // "</": the model may be closing the block itself
  EXPECT_EQ(budget.count(), 2);
  EXPECT_FALSE(budget.due(kRoom));
  budget.on_token(kX);  // "</x" is no closer
  EXPECT_TRUE(budget.due(kRoom));

  ReasoningBudget longer(config(1, true));
  longer.on_token(kCloseHalf);  // "</th"
  EXPECT_FALSE(longer.due(kRoom));
  longer.on_token(kA);  // "</tha"
  EXPECT_TRUE(longer.due(kRoom));
}

TEST(ReasoningBudget, DisarmsWhenTheModelClosesTheBlock) {
  ReasoningBudget single(config(3, /*starts_in_reasoning=*/true));
  single.on_token(kA);
  single.on_token(kClose);
  for (int i = 0; i < 5; ++i) single.on_token(kA);
  EXPECT_FALSE(single.due(kRoom));
  EXPECT_FALSE(single.fired());

  // Closed in pieces while holding off past the budget.
  ReasoningBudget pieces(config(1, true));
  pieces.on_token(kCloseHead);
  EXPECT_FALSE(pieces.due(kRoom));
  pieces.on_token(kCloseTail);
  for (int i = 0; i < 5; ++i) pieces.on_token(kA);
  EXPECT_FALSE(pieces.due(kRoom));
}

TEST(ReasoningBudget, SkippedWhenTheForcedIdsDoNotFit) {
  ReasoningBudget budget(config(1, /*starts_in_reasoning=*/true));
  budget.on_token(kA);
  EXPECT_FALSE(budget.due(static_cast<int64_t>(kForced.size()) - 1));
  // Skipped for good, even if room were to appear.
  EXPECT_FALSE(budget.due(kRoom));

  ReasoningBudget exact(config(1, true));
  exact.on_token(kA);
  EXPECT_TRUE(exact.due(static_cast<int64_t>(kForced.size())));
}

TEST(ReasoningBudget, ZeroIsOff) {
  ReasoningBudget budget(config(0, /*starts_in_reasoning=*/true));
  for (int i = 0; i < 4; ++i) budget.on_token(kA);
  EXPECT_FALSE(budget.due(kRoom));
}

class ForcedIds : public ::testing::Test {
 protected:
  ForcedIds()
      : tokenizer_(Tokenizer::from_file(std::string(DSPARK_SOURCE_DIR) +
                                        "/tests/fixtures/nemotron-tiny/tokenizer.json")) {}
  std::string text(const ReasoningBudgetConfig& c) const {
    return tokenizer_.decode(c.forced_ids, false);
  }
  Tokenizer tokenizer_;
};

TEST_F(ForcedIds, MessageThenTheCloserAsItsSingleId) {
  const auto c =
      make_reasoning_budget(tokenizer_, 8, "Time to answer.", "<think>", "</think>", false, {});
  EXPECT_EQ(text(c), "\n\nTime to answer.\n</think>\n\n");
  const int32_t closer = *tokenizer_.token_to_id("</think>");
  EXPECT_EQ(std::count(c.forced_ids.begin(), c.forced_ids.end(), closer), 1);
  EXPECT_EQ(c.budget, 8);
  ASSERT_TRUE(c.token_text);
  EXPECT_EQ(c.token_text(closer), "</think>");
}

TEST_F(ForcedIds, EmptyMessageJustClosesTheBlock) {
  const auto c = make_reasoning_budget(tokenizer_, 1, "", "<think>", "</think>", true, {});
  EXPECT_EQ(text(c), "\n</think>\n\n");
  EXPECT_TRUE(c.starts_in_reasoning);
}

TEST_F(ForcedIds, EndOfSequenceIdsAreDropped) {
  const int32_t closer = *tokenizer_.token_to_id("</think>");
  const auto c = make_reasoning_budget(tokenizer_, 1, "", "<think>", "</think>", true, {closer});
  EXPECT_EQ(text(c), "\n\n\n");
}

TEST_F(ForcedIds, OffWithoutForcedIdsAndRejectsNegativeBudgets) {
  EXPECT_FALSE(
      make_reasoning_budget(tokenizer_, 0, "x", "<think>", "</think>", true, {}).enabled());
  EXPECT_THROW(make_reasoning_budget(tokenizer_, -1, "", "<think>", "</think>", true, {}), Error);
}

}  // namespace
}  // namespace dspark
