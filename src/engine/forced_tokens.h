#pragma once
// Tokens committed without sampling. Two sources: the reasoning budget (reasoning_budget.h) and
// an answer prefix, the opening of a tool call that tool_choice "required" or a named function
// asks for, forced where the answer starts: at the first token when the prompt does not leave a
// thinking block open, else right after the block's closer (the model's or the budget's). Plain
// and speculative decoding consult one ForcedTokens after every committed token, and once before
// the first, so both force the same ids at the same place.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/reasoning_budget.h"

namespace dspark {

// Watches committed tokens for the closer of a thinking block the prompt left open: the answer
// starts after it. Markers are found in the text, so a closer spelled in several tokens counts.
class AnswerStartWatch {
 public:
  // With `starts_in_reasoning` false the answer starts at once.
  AnswerStartWatch(bool starts_in_reasoning, std::string closer,
                   std::function<std::string(int32_t)> token_text);
  // Feeds one committed token.
  void on_token(int32_t id);
  bool answer_started() const { return started_; }

 private:
  bool started_;
  std::string closer_;
  std::function<std::string(int32_t)> token_text_;
  std::string tail_;  // output text that may still hold the closer
};

struct AnswerPrefixConfig {
  std::vector<int32_t> ids;          // empty = off
  bool starts_in_reasoning = false;  // wait for `closer` before forcing
  std::string closer = "</think>";
  std::function<std::string(int32_t)> token_text;  // needed when starts_in_reasoning
};

class AnswerPrefix {
 public:
  explicit AnswerPrefix(AnswerPrefixConfig config);

  void on_token(int32_t id);
  // Whether the prefix goes next; `room` as for ReasoningBudget::due. A prefix that does not fit
  // is dropped.
  bool due(int64_t room);
  void on_forced() { phase_ = Phase::done; }
  const std::vector<int32_t>& ids() const { return config_.ids; }

 private:
  enum class Phase { waiting_for_closer, ready, done };
  AnswerPrefixConfig config_;
  Phase phase_;
  AnswerStartWatch start_;
};

class ForcedTokens {
 public:
  ForcedTokens(const ReasoningBudgetConfig& budget, const AnswerPrefixConfig& prefix)
      : budget_(budget), prefix_(prefix) {}

  void on_token(int32_t id) {
    budget_.on_token(id);
    prefix_.on_token(id);
  }
  // The ids to commit next without sampling, or null; the budget goes before the prefix.
  const std::vector<int32_t>* due(int64_t room);
  // The ids due() returned are about to be committed.
  void on_forced();
  bool budget_fired() const { return budget_.fired(); }

 private:
  ReasoningBudget budget_;
  AnswerPrefix prefix_;
  enum class Source { none, budget, prefix } due_ = Source::none;
};

}  // namespace dspark
