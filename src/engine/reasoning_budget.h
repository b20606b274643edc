#pragma once
// The reasoning budget (docs/server-api.md §3.5): once the model has spent `budget` tokens
// inside its thinking block, the block is closed for it by committing the forced ids (the tokens
// of "\n\n" + message + "\n</think>\n\n") without sampling. Plain and speculative decoding consult
// the same state machine after every committed token, so both fire at the same token.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace dspark {

class Tokenizer;
struct ReasoningSyntax;

struct ReasoningBudgetConfig {
  int64_t budget = 0;  // thinking tokens before the block is forced closed; 0 = off
  std::vector<int32_t> forced_ids;
  bool starts_in_reasoning = false;  // the prompt tail opened the block
  std::string opener = "<think>";
  std::string closer = "</think>";
  // The text of one token, special tokens spelled out: markers are found in the text, so a closer
  // the model spells in several tokens counts as well as its single special token.
  std::function<std::string(int32_t)> token_text;

  bool enabled() const { return budget > 0 && !forced_ids.empty(); }
};

// The budget for a prompt whose template reasons between `opener` and `closer`: forced ids are
// the tokens of "\n\n" + message + "\n" + closer + "\n\n" ("\n" + closer + "\n\n" for an empty
// message), the closer as its single id when the vocabulary has one, end-of-sequence ids dropped.
ReasoningBudgetConfig make_reasoning_budget(const Tokenizer& tokenizer, int64_t budget,
                                            const std::string& message, const std::string& opener,
                                            const std::string& closer, bool starts_in_reasoning,
                                            const std::vector<int32_t>& eos_ids);

// Whether the decoded tail of `prompt` (last 8 ids) leaves a thinking block of `syntax` open
// (docs/server-api.md §3.2).
bool prompt_tail_opens_reasoning(const Tokenizer& tokenizer, const std::vector<int32_t>& prompt,
                                 const ReasoningSyntax& syntax);

// The budget of a prompt rendered with `chat_template`: its thinking markers, the block open when
// the decoded tail of the prompt (last 8 ids) leaves it open (docs/server-api.md §3.2). Off when
// the template has no thinking markers.
ReasoningBudgetConfig reasoning_budget_for_prompt(const Tokenizer& tokenizer,
                                                  const std::string& chat_template,
                                                  const std::vector<int32_t>& prompt,
                                                  int64_t budget, const std::string& message,
                                                  const std::vector<int32_t>& eos_ids);

class ReasoningBudget {
 public:
  explicit ReasoningBudget(ReasoningBudgetConfig config);

  // A token was committed (sampled or forced).
  void on_token(int32_t id);
  // Whether the forced ids go next, `room` being how many tokens the generation may still
  // commit. Fires once the count reaches the budget, unless the text so far ends in what may be
  // the start of the closer (then it waits a token). A budget due without room for all forced ids
  // is skipped for good.
  bool due(int64_t room);
  // The caller is about to commit forced_ids(); the budget is spent.
  void on_forced();

  const std::vector<int32_t>& forced_ids() const { return config_.forced_ids; }
  bool fired() const { return fired_; }
  int64_t count() const { return count_; }

 private:
  enum class Phase { before_opener, counting, done };
  bool tail_may_start_closer() const;

  ReasoningBudgetConfig config_;
  Phase phase_;
  int64_t count_ = 0;
  bool fired_ = false;
  std::string tail_;  // output text not yet ruled out as part of a marker
};

}  // namespace dspark
