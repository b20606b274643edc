#include "engine/reasoning_budget.h"

#include <algorithm>

#include "base/error.h"
#include "text/reasoning_parser.h"
#include "text/tokenizer.h"

namespace dspark {

ReasoningBudgetConfig make_reasoning_budget(const Tokenizer& tokenizer, int64_t budget,
                                            const std::string& message, const std::string& opener,
                                            const std::string& closer, bool starts_in_reasoning,
                                            const std::vector<int32_t>& eos_ids) {
  if (budget < 0) fail("the reasoning budget must not be negative, got {}", budget);
  ReasoningBudgetConfig config;
  config.budget = budget;
  config.starts_in_reasoning = starts_in_reasoning;
  config.opener = opener;
  config.closer = closer;
  config.token_text = [&tokenizer](int32_t id) { return tokenizer.decode({id}, false); };
  if (budget == 0) return config;
  std::vector<int32_t> ids =
      tokenizer.encode(message.empty() ? "\n" : "\n\n" + message + "\n", false);
  if (const auto closer_id = tokenizer.token_to_id(closer)) {
    ids.push_back(*closer_id);
  } else {
    const std::vector<int32_t> spelled = tokenizer.encode(closer, false);
    ids.insert(ids.end(), spelled.begin(), spelled.end());
  }
  const std::vector<int32_t> tail = tokenizer.encode("\n\n", false);
  ids.insert(ids.end(), tail.begin(), tail.end());
  std::erase_if(ids, [&](int32_t id) {
    return std::find(eos_ids.begin(), eos_ids.end(), id) != eos_ids.end();
  });
  config.forced_ids = std::move(ids);
  return config;
}

ReasoningBudgetConfig reasoning_budget_for_prompt(const Tokenizer& tokenizer,
                                                  const std::string& chat_template,
                                                  const std::vector<int32_t>& prompt,
                                                  int64_t budget, const std::string& message,
                                                  const std::vector<int32_t>& eos_ids) {
  const std::optional<ReasoningSyntax> syntax = detect_reasoning_syntax(chat_template);
  if (!syntax || budget <= 0) return {};
  return make_reasoning_budget(tokenizer, budget, message, syntax->start, syntax->end,
                               prompt_tail_opens_reasoning(tokenizer, prompt, *syntax), eos_ids);
}

bool prompt_tail_opens_reasoning(const Tokenizer& tokenizer, const std::vector<int32_t>& prompt,
                                 const ReasoningSyntax& syntax) {
  const size_t tail = std::min<size_t>(prompt.size(), 8);
  const std::string text =
      tokenizer.decode(std::vector<int32_t>(prompt.end() - tail, prompt.end()), false);
  return prompt_opens_reasoning(text, syntax);
}

ReasoningBudget::ReasoningBudget(ReasoningBudgetConfig config)
    : config_(std::move(config)),
      phase_(!config_.enabled()            ? Phase::done
             : config_.starts_in_reasoning ? Phase::counting
                                           : Phase::before_opener) {
  if (phase_ != Phase::done && !config_.token_text) {
    fail("a reasoning budget needs the text of each token to find the thinking markers");
  }
  if (phase_ != Phase::done && (config_.opener.empty() || config_.closer.empty())) {
    fail("a reasoning budget needs non-empty thinking markers");
  }
}

void ReasoningBudget::on_token(int32_t id) {
  if (phase_ == Phase::done) return;
  const bool counted = phase_ == Phase::counting;
  tail_ += config_.token_text(id);
  if (phase_ == Phase::before_opener) {
    // Only a reply that opens with the opener reasons (leading whitespace aside).
    const size_t first = tail_.find_first_not_of(" \t\r\n");
    if (first == std::string::npos) return;
    const size_t have = std::min(config_.opener.size(), tail_.size() - first);
    if (tail_.compare(first, have, config_.opener, 0, have) != 0) {
      phase_ = Phase::done;
      return;
    }
    if (have < config_.opener.size()) return;
    tail_.erase(0, first + config_.opener.size());
    phase_ = Phase::counting;
  }
  if (counted) ++count_;
  if (tail_.find(config_.closer) != std::string::npos) {
    phase_ = Phase::done;  // the model closed the block itself
    return;
  }
  const size_t keep = config_.closer.size() - 1;
  if (tail_.size() > keep) tail_.erase(0, tail_.size() - keep);
}

bool ReasoningBudget::tail_may_start_closer() const {
  const size_t longest = std::min(tail_.size(), config_.closer.size() - 1);
  for (size_t n = longest; n > 0; --n) {
    if (tail_.compare(tail_.size() - n, n, config_.closer, 0, n) == 0) return true;
  }
  return false;
}

bool ReasoningBudget::due(int64_t room) {
  if (phase_ != Phase::counting || count_ < config_.budget || tail_may_start_closer()) {
    return false;
  }
  if (room < static_cast<int64_t>(config_.forced_ids.size())) {
    phase_ = Phase::done;
    return false;
  }
  return true;
}

void ReasoningBudget::on_forced() {
  phase_ = Phase::done;
  fired_ = true;
}

}  // namespace dspark
