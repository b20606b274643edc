#include "engine/answer_constraint.h"

#include "engine/reasoning_budget.h"
#include "text/reasoning_parser.h"
#include "text/tokenizer.h"

namespace dspark {

AnswerConstraint::AnswerConstraint(const AnswerConstraintConfig& config)
    : grammar_(config.grammar),
      start_(config.grammar.has_value() && config.starts_in_reasoning, config.closer,
             config.token_text) {}

AnswerConstraintConfig answer_constraint_for_prompt(constrain::TokenConstraint grammar,
                                                    const Tokenizer& tokenizer,
                                                    const std::string& chat_template,
                                                    const std::vector<int32_t>& prompt) {
  AnswerConstraintConfig config;
  config.grammar.emplace(std::move(grammar));
  const std::optional<ReasoningSyntax> syntax = detect_reasoning_syntax(chat_template);
  if (syntax && prompt_tail_opens_reasoning(tokenizer, prompt, *syntax)) {
    config.starts_in_reasoning = true;
    config.closer = syntax->end;
    config.token_text = [&tokenizer](int32_t id) { return tokenizer.decode({id}, false); };
  }
  return config;
}

void AnswerConstraint::on_token(int32_t id, bool forced) {
  if (!grammar_) return;
  if (!start_.answer_started() || forced) {
    start_.on_token(id);
    return;
  }
  grammar_->accept(id);
  finished_ = grammar_->finished();
}

}  // namespace dspark
