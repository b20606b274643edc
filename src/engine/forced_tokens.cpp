#include "engine/forced_tokens.h"

#include "base/error.h"

namespace dspark {

AnswerPrefix::AnswerPrefix(AnswerPrefixConfig config)
    : config_(std::move(config)),
      phase_(config_.ids.empty()           ? Phase::done
             : config_.starts_in_reasoning ? Phase::waiting_for_closer
                                           : Phase::ready) {
  if (phase_ == Phase::waiting_for_closer && (!config_.token_text || config_.closer.empty())) {
    fail("an answer prefix after a thinking block needs the closer and the text of each token");
  }
}

void AnswerPrefix::on_token(int32_t id) {
  // Once ready the prefix waits for the next due(): the rest of a forced batch (the budget's
  // "\n\n" after its closer) still goes first.
  if (phase_ != Phase::waiting_for_closer) return;
  tail_ += config_.token_text(id);
  if (tail_.find(config_.closer) != std::string::npos) {
    phase_ = Phase::ready;
    return;
  }
  const size_t keep = config_.closer.size() - 1;
  if (tail_.size() > keep) tail_.erase(0, tail_.size() - keep);
}

bool AnswerPrefix::due(int64_t room) {
  if (phase_ != Phase::ready) return false;
  if (room < static_cast<int64_t>(config_.ids.size())) {
    phase_ = Phase::done;
    return false;
  }
  return true;
}

const std::vector<int32_t>* ForcedTokens::due(int64_t room) {
  due_ = Source::none;
  if (budget_.due(room)) {
    due_ = Source::budget;
    return &budget_.forced_ids();
  }
  if (prefix_.due(room)) {
    due_ = Source::prefix;
    return &prefix_.ids();
  }
  return nullptr;
}

void ForcedTokens::on_forced() {
  if (due_ == Source::budget) budget_.on_forced();
  if (due_ == Source::prefix) prefix_.on_forced();
  due_ = Source::none;
}

}  // namespace dspark
