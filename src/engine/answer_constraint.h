#pragma once
// response_format: the answer must be a sentence of a grammar (constrain/grammar.h). Once the
// answer starts (at once, or after the thinking block the prompt leaves open), every sampled token
// is drawn from the model's distribution restricted to the tokens the grammar allows next. Plain
// decoding masks each step's logits; speculative decoding masks verify row i with the constraint
// advanced over the drafts before it, so both follow the same restricted distribution.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "constrain/token_constraint.h"
#include "engine/forced_tokens.h"

namespace dspark {

class Tokenizer;

struct AnswerConstraintConfig {
  std::optional<constrain::TokenConstraint> grammar;  // unset = off
  bool starts_in_reasoning = false;                   // constrain only after `closer`
  std::string closer = "</think>";
  std::function<std::string(int32_t)> token_text;  // needed when starts_in_reasoning

  bool enabled() const { return grammar.has_value(); }
};

// The constraint for a prompt rendered with `chat_template`: it starts after the thinking block
// when the prompt leaves one open.
AnswerConstraintConfig answer_constraint_for_prompt(constrain::TokenConstraint grammar,
                                                    const Tokenizer& tokenizer,
                                                    const std::string& chat_template,
                                                    const std::vector<int32_t>& prompt);

// A value type: speculative decoding copies it to advance one copy per verify row.
class AnswerConstraint {
 public:
  explicit AnswerConstraint(const AnswerConstraintConfig& config);

  // Whether the next sampled token is constrained.
  bool active() const { return grammar_.has_value() && start_.answer_started(); }
  // Sets every logit the grammar does not allow next to -infinity (active() only).
  void mask(float* logits, int64_t vocab) const { grammar_->mask_logits(logits, vocab); }
  // Feeds one committed token. Forced tokens (the reasoning budget's) are not the answer's and
  // only move the watch for the closer.
  void on_token(int32_t id, bool forced);
  // The answer is a whole sentence and nothing may follow it: generation ends there.
  bool finished() const { return finished_; }

 private:
  std::optional<constrain::TokenConstraint> grammar_;
  AnswerStartWatch start_;
  bool finished_ = false;
};

}  // namespace dspark
