#include "engine/forced_tokens.h"

#include <gtest/gtest.h>

#include <map>

#include "base/error.h"

namespace dspark {
namespace {

std::function<std::string(int32_t)> spelled(std::map<int32_t, std::string> names) {
  return [names](int32_t id) {
    auto found = names.find(id);
    return found != names.end() ? found->second : std::string("x");
  };
}

TEST(AnswerPrefix, DueAtTheStartWhenNoThinkingBlockIsOpen) {
  AnswerPrefix prefix({{1, 2}, false, "</think>", nullptr});
  EXPECT_FALSE(prefix.due(1));  // no room for both ids: dropped for good
  EXPECT_FALSE(prefix.due(5));
  AnswerPrefix roomy({{1, 2}, false, "</think>", nullptr});
  EXPECT_TRUE(roomy.due(2));
  roomy.on_forced();
  EXPECT_FALSE(roomy.due(10));
}

TEST(AnswerPrefix, WaitsForTheCloserEvenInPieces) {
  AnswerPrefix prefix({{1}, true, "</think>", spelled({{7, "</th"}, {8, "ink>"}})});
  EXPECT_FALSE(prefix.due(10));
  prefix.on_token(5);
  prefix.on_token(7);
  EXPECT_FALSE(prefix.due(10));
  prefix.on_token(8);
  EXPECT_TRUE(prefix.due(10));
  prefix.on_token(9);  // the rest of a forced batch: the prefix still waits for due()
  EXPECT_TRUE(prefix.due(10));
}

TEST(AnswerPrefix, AfterAThinkingBlockNeedsTheTokenText) {
  EXPECT_THROW(AnswerPrefix({{1}, true, "</think>", nullptr}), Error);
}

TEST(ForcedTokens, TheBudgetGoesFirstThenThePrefix) {
  ReasoningBudgetConfig budget;
  budget.budget = 1;
  budget.forced_ids = {6, 7};
  budget.starts_in_reasoning = true;
  budget.token_text = spelled({{7, "</think>"}});
  ForcedTokens forcing(budget, {{3}, true, "</think>", budget.token_text});
  forcing.on_token(5);
  const std::vector<int32_t>* due = forcing.due(10);
  ASSERT_NE(due, nullptr);
  EXPECT_EQ(*due, (std::vector<int32_t>{6, 7}));
  forcing.on_forced();
  EXPECT_TRUE(forcing.budget_fired());
  forcing.on_token(6);
  forcing.on_token(7);
  due = forcing.due(10);
  ASSERT_NE(due, nullptr);
  EXPECT_EQ(*due, (std::vector<int32_t>{3}));
  forcing.on_forced();
  forcing.on_token(3);
  EXPECT_EQ(forcing.due(10), nullptr);
}

}  // namespace
}  // namespace dspark
