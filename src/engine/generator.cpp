#include "engine/generator.h"

#include <algorithm>
#include <optional>

#include "base/error.h"
#include "base/system_info.h"
#include "engine/forced_tokens.h"

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

GenerationResult Generator::generate(const std::vector<int32_t>& prompt, ModelState& state,
                                     const GenerationConfig& config,
                                     const TokenCallback& on_token) const {
  check_prompt(model_, prompt, state);
  const int64_t vocab = model_.vocab_size();
  const int64_t prompt_tokens = static_cast<int64_t>(prompt.size());
  GenerationResult result;
  result.stats.prompt_tokens = prompt_tokens;
  result.stats.cached_prompt_tokens = state.length();
  if (config.max_tokens <= 0) {
    result.finish_reason = FinishReason::length;
    return result;
  }
  const SamplingParams& sampling = config.sampling;
  // Sampling adjusts the logits in place (bias, penalties); the logprob needs them as the model
  // gave.
  const bool copy_raw =
      config.logprobs && (sampling.adjusts_logits() || config.answer_constraint.enabled());
  Rng rng(sampling.seed);
  TokenCounts counts;
  ForcedTokens forcing(config.reasoning_budget, config.answer_prefix);
  AnswerConstraint constraint(config.answer_constraint);
  ForwardOutput output;
  std::vector<float> raw;
  const double prefill_start = now_seconds();
  const int64_t new_tokens = prompt_tokens - state.length();
  target_forward(model_, batcher_, prompt.data() + state.length(), new_tokens, state,
                 {new_tokens - 1}, {}, output);
  result.stats.prefill_seconds = now_seconds() - prefill_start;
  const double decode_start = now_seconds();

  bool finished = false;
  // Reports one token and decides whether generation ends there.
  auto commit = [&](CommittedToken& token, bool forced) {
    counts.add(token.id);
    result.tokens.push_back(token.id);
    ++result.stats.generated_tokens;
    constraint.on_token(token.id, forced);
    const bool keep_going = on_token(token) && !constraint.finished();
    forcing.on_token(token.id);
    if (auto reason = finish_after(config, token.id, keep_going, result.stats.generated_tokens)) {
      result.finish_reason = *reason;
      finished = true;
    }
  };

  const bool wants_rows = config.logprobs || sampling.top_logprobs > 0;
  auto describe = [&](CommittedToken& token, const float* row) {
    if (config.logprobs) token.logprob = logprob_of(row, vocab, token.id);
    if (sampling.top_logprobs > 0)
      token.alternatives = top_logprobs(row, vocab, sampling.top_logprobs);
  };
  std::vector<int32_t> rows;
  std::vector<int64_t> logit_rows;
  std::vector<CommittedToken> forced_tokens;
  // The last committed token, not yet fed to the model; unset at the start, where `output`
  // holds the prompt's last row.
  std::optional<int32_t> pending;
  for (;;) {
    if (const std::vector<int32_t>* forced = forcing.due(
            tokens_left(config, model_, prompt_tokens, result.stats.generated_tokens))) {
      // The forced ids go through one forward of [pending, forced[0 : n-1]], as in speculative
      // decoding (docs/speculative.md §8), so both decode the same rows. At the start the prompt's
      // last row already gives forced[0]'s logits.
      forcing.on_forced();
      result.budget_forced = forcing.budget_fired();
      const int64_t n = static_cast<int64_t>(forced->size());
      forced_tokens.assign(n, CommittedToken{});
      for (int64_t i = 0; i < n; ++i) forced_tokens[i].id = (*forced)[i];
      const int64_t first_row = pending ? 0 : 1;
      if (!pending && wants_rows) describe(forced_tokens[0], output.logits.data());
      rows.clear();
      if (pending) rows.push_back(*pending);
      rows.insert(rows.end(), forced->begin(), forced->end() - 1);
      if (!rows.empty()) {
        logit_rows.clear();
        for (int64_t i = 0; wants_rows && i < static_cast<int64_t>(rows.size()); ++i) {
          logit_rows.push_back(i);
        }
        target_forward(model_, batcher_, rows.data(), static_cast<int64_t>(rows.size()), state,
                       logit_rows, {}, output);
        for (int64_t i = first_row; wants_rows && i < n; ++i) {
          describe(forced_tokens[i], output.logits.data() + (i - first_row) * vocab);
        }
      }
      for (int64_t i = 0; i < n && !finished; ++i) commit(forced_tokens[i], true);
      if (finished) break;
      if (state.length() >= model_.max_context()) {
        result.finish_reason = FinishReason::length;
        break;
      }
      pending = forced->back();
      continue;
    }
    if (pending) target_forward(model_, batcher_, &*pending, 1, state, {0}, {}, output);
    float* logits = output.logits.data();
    CommittedToken token;
    if (sampling.top_logprobs > 0) {
      token.alternatives = top_logprobs(logits, vocab, sampling.top_logprobs);
    }
    if (copy_raw) raw.assign(logits, logits + vocab);
    if (constraint.active()) constraint.mask(logits, vocab);
    token.id = sample_token(sampling, counts, logits, vocab, rng);
    if (config.logprobs)
      token.logprob = logprob_of(copy_raw ? raw.data() : logits, vocab, token.id);
    commit(token, false);
    if (finished) break;
    if (state.length() >= model_.max_context()) {
      result.finish_reason = FinishReason::length;
      break;
    }
    pending = token.id;
  }
  result.stats.decode_seconds = now_seconds() - decode_start;
  result.stats.peak_rss_bytes = peak_rss_bytes();
  return result;
}

}  // namespace dspark
