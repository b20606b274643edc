#include "engine/forced_tokens.h"

#include "base/error.h"

namespace dspark {

AnswerStartWatch::AnswerStartWatch(bool starts_in_reasoning, std::string closer,
                                   std::function<std::string(int32_t)> token_text)
    : started_(!starts_in_reasoning),
      closer_(std::move(closer)),
      token_text_(std::move(token_text)) {
  if (!started_ && (!token_text_ || closer_.empty())) {
    fail("an answer after a thinking block needs the closer and the text of each token");
  }
}

void AnswerStartWatch::on_token(int32_t id) {
  if (started_) return;
  tail_ += token_text_(id);
  if (tail_.find(closer_) != std::string::npos) {
    started_ = true;
    return;
  }
  const size_t keep = closer_.size() - 1;
  if (tail_.size() > keep) tail_.erase(0, tail_.size() - keep);
}

AnswerPrefix::AnswerPrefix(AnswerPrefixConfig config)
    : config_(std::move(config)),
      phase_(config_.ids.empty()           ? Phase::done
             : config_.starts_in_reasoning ? Phase::waiting_for_closer
                                           : Phase::ready),
      start_(phase_ == Phase::waiting_for_closer, config_.closer, config_.token_text) {}

void AnswerPrefix::on_token(int32_t id) {
  // Once ready the prefix waits for the next due(): the rest of a forced batch (the budget's
  // "\n\n" after its closer) still goes first.
  if (phase_ != Phase::waiting_for_closer) return;
  start_.on_token(id);
  if (start_.answer_started()) phase_ = Phase::ready;
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
