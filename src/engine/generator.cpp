#include "engine/generator.h"

#include <algorithm>
#include <optional>

#include "base/error.h"

namespace dspark {

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::eos:
      return "eos";
    case FinishReason::length:
      return "length";
    case FinishReason::stop:
      return "stop";
    case FinishReason::cancelled:
      return "cancelled";
  }
  return "?";
}

double GenerationStats::prefill_tokens_per_second() const {
  const int64_t prefilled = prompt_tokens - cached_prompt_tokens;
  return prefill_seconds > 0 ? prefilled / prefill_seconds : 0.0;
}

double GenerationStats::decode_tokens_per_second() const {
  return decode_seconds > 0 && generated_tokens > 1 ? (generated_tokens - 1) / decode_seconds : 0.0;
}

void check_prompt(const Model& model, const std::vector<int32_t>& prompt, int64_t held_tokens) {
  if (prompt.empty()) fail("the prompt is empty: at least one token is needed");
  if (held_tokens >= static_cast<int64_t>(prompt.size())) {
    fail("the state already holds {} tokens of a {}-token prompt; at least one must be new",
         held_tokens, prompt.size());
  }
  const int64_t vocab = model.vocab_size();
  for (int32_t id : prompt) {
    if (id < 0 || id >= vocab)
      fail("prompt token id {} is outside the vocabulary [0, {})", id, vocab);
  }
}

std::optional<FinishReason> finish_after(const GenerationConfig& config, int32_t id,
                                         bool keep_going, int64_t generated) {
  if (std::find(config.eos_ids.begin(), config.eos_ids.end(), id) != config.eos_ids.end()) {
    return FinishReason::eos;
  }
  if (!keep_going) return FinishReason::stop;
  if (generated >= config.max_tokens) return FinishReason::length;
  return std::nullopt;
}

int64_t tokens_left(const GenerationConfig& config, const Model& model, int64_t prompt_tokens,
                    int64_t generated_tokens) {
  return std::min(config.max_tokens - generated_tokens,
                  model.max_context() - prompt_tokens - generated_tokens);
}

}  // namespace dspark
