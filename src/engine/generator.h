#pragma once
// One generation at the token level, as its callers see it: what it is asked (GenerationConfig),
// what it reports per committed token and at the end, and the rules plain and speculative decoding
// share (when a generation ends, how many tokens it may still commit). The one decoding loop, with
// or without drafts, is speculative/verify.h. Text concerns (detokenizing, stop strings) stay with
// the caller, which sees each token as it is committed and may end the generation there.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "engine/answer_constraint.h"
#include "engine/forced_tokens.h"
#include "engine/sampler.h"
#include "model/model.h"

namespace dspark {

struct GenerationConfig {
  SamplingParams sampling;
  int64_t max_tokens = 256;
  std::vector<int32_t> eos_ids;
  // Fill CommittedToken::logprob; off spares a log-softmax over the vocabulary per token.
  bool logprobs = false;
  ReasoningBudgetConfig reasoning_budget;
  AnswerPrefixConfig answer_prefix;  // tool_choice: the opening of a call, forced (forced_tokens.h)
  AnswerConstraintConfig answer_constraint;  // response_format (answer_constraint.h)
};

enum class FinishReason { eos, length, stop, cancelled };
const char* finish_reason_name(FinishReason reason);

struct GenerationStats {
  int64_t prompt_tokens = 0;
  int64_t cached_prompt_tokens = 0;
  int64_t generated_tokens = 0;
  double prefill_seconds = 0.0;
  double decode_seconds = 0.0;
  int64_t peak_rss_bytes = 0;

  double prefill_tokens_per_second() const;
  // Generated tokens after the first (which prefill produced) over decode time.
  double decode_tokens_per_second() const;
};

// What the caller is told about each committed token.
struct CommittedToken {
  int32_t id = 0;
  float logprob = 0.0f;                    // under the unmodified model distribution, when asked
  std::vector<TokenLogprob> alternatives;  // when sampling.top_logprobs > 0
};

struct GenerationResult {
  std::vector<int32_t> tokens;
  FinishReason finish_reason = FinishReason::length;
  GenerationStats stats;
  bool budget_forced = false;  // the reasoning budget closed the thinking block
};

// Return false to end the generation after this token (e.g. a stop string completed).
using TokenCallback = std::function<bool(const CommittedToken&)>;

// Throws unless the prompt is non-empty, inside the vocabulary, and has at least one token more
// than the `held_tokens` its sequence already holds.
void check_prompt(const Model& model, const std::vector<int32_t>& prompt, int64_t held_tokens);

// Why a generation ends at the token it just committed (the `generated`-th), if it does: an
// end-of-sequence id, the caller's callback saying stop, or max_tokens. Plain and speculative
// decoding decide it here alike.
std::optional<FinishReason> finish_after(const GenerationConfig& config, int32_t id,
                                         bool keep_going, int64_t generated);

// How many more tokens a generation may commit under max_tokens and the context; plain and
// speculative decoding hand the same figure to the reasoning budget.
int64_t tokens_left(const GenerationConfig& config, const Model& model, int64_t prompt_tokens,
                    int64_t generated_tokens);

}  // namespace dspark
