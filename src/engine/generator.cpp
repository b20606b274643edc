#include "engine/generator.h"

#include <algorithm>

#include "base/error.h"
#include "base/system_info.h"

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

void check_prompt(const Model& model, const std::vector<int32_t>& prompt, const ModelState& state) {
  if (prompt.empty()) fail("the prompt is empty: at least one token is needed");
  if (state.length() >= static_cast<int64_t>(prompt.size())) {
    fail("the state already holds {} tokens of a {}-token prompt; at least one must be new",
         state.length(), prompt.size());
  }
  const int64_t vocab = model.vocab_size();
  for (int32_t id : prompt) {
    if (id < 0 || id >= vocab)
      fail("prompt token id {} is outside the vocabulary [0, {})", id, vocab);
  }
}

GenerationResult Generator::generate(const std::vector<int32_t>& prompt, ModelState& state,
                                     const GenerationConfig& config,
                                     const TokenCallback& on_token) const {
  check_prompt(model_, prompt, state);
  const int64_t vocab = model_.vocab_size();
  GenerationResult result;
  result.stats.prompt_tokens = static_cast<int64_t>(prompt.size());
  result.stats.cached_prompt_tokens = state.length();
  if (config.max_tokens <= 0) {
    result.finish_reason = FinishReason::length;
    return result;
  }
  Rng rng(config.sampling.seed);
  TokenCounts counts;
  ForwardOutput output;
  const double prefill_start = now_seconds();
  const int64_t new_tokens = static_cast<int64_t>(prompt.size()) - state.length();
  model_.forward(prompt.data() + state.length(), new_tokens, state, {new_tokens - 1}, {}, output);
  result.stats.prefill_seconds = now_seconds() - prefill_start;
  const double decode_start = now_seconds();
  for (;;) {
    float* logits = output.logits.data();
    CommittedToken token;
    if (config.sampling.top_logprobs > 0) {
      token.alternatives = top_logprobs(logits, vocab, config.sampling.top_logprobs);
    }
    const std::vector<float> raw(logits, logits + vocab);
    token.id = sample_token(config.sampling, counts, logits, vocab, rng);
    token.logprob = logprob_of(raw.data(), vocab, token.id);
    counts.add(token.id);
    result.tokens.push_back(token.id);
    ++result.stats.generated_tokens;
    const bool keep_going = on_token(token);
    if (std::find(config.eos_ids.begin(), config.eos_ids.end(), token.id) != config.eos_ids.end()) {
      result.finish_reason = FinishReason::eos;
      break;
    }
    if (!keep_going) {
      result.finish_reason = FinishReason::stop;
      break;
    }
    if (result.stats.generated_tokens >= config.max_tokens) {
      result.finish_reason = FinishReason::length;
      break;
    }
    if (state.length() >= model_.max_context()) {
      result.finish_reason = FinishReason::length;
      break;
    }
    model_.forward(&token.id, 1, state, {0}, {}, output);
  }
  result.stats.decode_seconds = now_seconds() - decode_start;
  result.stats.peak_rss_bytes = peak_rss_bytes();
  return result;
}

}  // namespace dspark
