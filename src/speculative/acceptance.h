#pragma once
// Acceptance of verify rows (docs/speculative.md §4–§5), as one stateless function over a ragged
// batch: each sequence brings the target's logits of its rows [pending, drafts], its drafts, its
// sampling settings and the context the rows continue (the counts for penalties, the answer
// constraint), and gets back how many leading drafts the target takes and the token that follows
// them. Nothing here depends on the other sequences of the batch, so a sequence's answer is the
// one it gets alone; the only state is each sequence's own random stream.
//
// Row i is biased and penalised with the counts of everything before it, and masked by the
// constraint advanced over the drafts before it, exactly as plain decoding would see it. Greedy:
// a draft is taken while it is the row's argmax, and the first row that disagrees (or the row
// after the last draft) gives the token. Sampling: lossless rejection sampling, accept with
// min(1, p/q), then a draw from the residual max(p − q, 0) or, after every draft, from the
// target's last row.
#include <cstdint>
#include <optional>
#include <span>

#include "engine/answer_constraint.h"
#include "engine/sampler.h"
#include "speculative/drafter.h"

namespace dspark {

// One sequence's rows of a verify forward.
struct VerifyRows {
  // [draft->tokens.size() + 1, vocab] raw target logits; row i scores the token after the pending
  // token and drafts 0 .. i-1.
  const float* logits = nullptr;
  int64_t vocab = 0;
  const Draft* draft = nullptr;
  const SamplingParams* sampling = nullptr;
  // The tokens committed before row 0 (penalties); read only when the sampling adjusts logits.
  const TokenCounts* counts = nullptr;
  // The answer constraint as it stands before row 0; null for none.
  const AnswerConstraint* constraint = nullptr;
  Rng* rng = nullptr;
};

struct RowsAccepted {
  int64_t accepted = 0;  // leading drafts the target takes
  // The token after them: the correction, or the bonus after every draft. Unset when the answer
  // constraint is complete after the accepted drafts, so nothing may follow them.
  std::optional<int32_t> next;
};

// out[s] = the acceptance of batch[s]; out.size() == batch.size().
void accept_rows(std::span<const VerifyRows> batch, std::span<RowsAccepted> out);

// Lossless acceptance of one draft token at T > 0: accept with probability min(1, p(x) / q(x)),
// q = δ(x) when `proposal` is empty. On rejection, `residual` receives norm(max(p − q, 0)).
bool accept_sampled(const TokenDistribution& target, const TokenDistribution* proposal,
                    int32_t token, double uniform, TokenDistribution& residual);

}  // namespace dspark
