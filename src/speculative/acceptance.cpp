#include "speculative/acceptance.h"

#include <algorithm>
#include <vector>

#include "base/error.h"

namespace dspark {

bool accept_sampled(const TokenDistribution& target, const TokenDistribution* proposal,
                    int32_t token, double uniform, TokenDistribution& residual) {
  const double p = target.prob_of(token);
  const double q = proposal != nullptr ? proposal->prob_of(token) : 1.0;
  if (uniform < std::min(1.0, p / std::max(q, 1e-9))) return true;
  // Residual max(p − q, 0), renormalised; q is zero outside its support. q is looked up by id in a
  // dense table: both distributions can hold the whole vocabulary.
  int32_t largest_id = 0;
  for (int32_t id : target.ids) largest_id = std::max(largest_id, id);
  thread_local std::vector<float> q_of;
  q_of.assign(static_cast<size_t>(largest_id) + 1, 0.0f);
  if (proposal != nullptr) {
    for (size_t i = 0; i < proposal->ids.size(); ++i) {
      const int32_t id = proposal->ids[i];
      if (id >= 0 && id <= largest_id) q_of[static_cast<size_t>(id)] = proposal->probs[i];
    }
  } else if (token >= 0 && token <= largest_id) {
    q_of[static_cast<size_t>(token)] = 1.0f;
  }
  residual.ids.clear();
  residual.probs.clear();
  double total = 0.0;
  for (size_t i = 0; i < target.ids.size(); ++i) {
    const double mass = target.probs[i] - q_of[static_cast<size_t>(target.ids[i])];
    if (mass > 0.0) {
      residual.ids.push_back(target.ids[i]);
      residual.probs.push_back(static_cast<float>(mass));
      total += mass;
    }
  }
  if (total <= 1e-12) {
    residual = target;
    return false;
  }
  for (float& prob : residual.probs) prob = static_cast<float>(prob / total);
  return false;
}

namespace {

RowsAccepted accept_one(const VerifyRows& rows) {
  const Draft& draft = *rows.draft;
  const SamplingParams& sampling = *rows.sampling;
  check_sampling_params(sampling);
  const int64_t vocab = rows.vocab;
  const int64_t drafts = static_cast<int64_t>(draft.tokens.size());
  // Rows after the first advance their own copies of the counts and the constraint; a sequence
  // without drafts (plain decoding) reads its own and copies nothing.
  const bool adjust = sampling.adjusts_logits();
  std::optional<TokenCounts> draft_counts;
  if (adjust && drafts > 0) draft_counts = *rows.counts;
  const TokenCounts* row_counts = draft_counts ? &*draft_counts : rows.counts;
  std::optional<AnswerConstraint> draft_constraint;
  const AnswerConstraint* row_constraint = rows.constraint;
  if (row_constraint != nullptr && drafts > 0) {
    row_constraint = &draft_constraint.emplace(*rows.constraint);
  }
  // Reused from row to row and call to call: fresh vocabulary-sized vectors cost page faults.
  thread_local std::vector<float> adjusted;
  thread_local TokenDistribution target, residual;
  RowsAccepted result;
  for (int64_t i = 0; i <= drafts; ++i) {
    if (row_constraint != nullptr && i > 0) {
      draft_constraint->on_token(draft.tokens[i - 1], false);
      // Plain decoding ends at that draft: committing the accepted drafts ends this one too.
      if (draft_constraint->finished()) return result;
    }
    const float* raw = rows.logits + i * vocab;
    const bool masked = row_constraint != nullptr && row_constraint->active();
    // Rows are only copied when bias, penalties or the constraint change them.
    const float* row = raw;
    if (adjust || masked) {
      adjusted.assign(raw, raw + vocab);
      if (adjust) {
        if (i > 0) draft_counts->add(draft.tokens[i - 1]);
        adjust_logits(sampling, *row_counts, adjusted.data(), vocab);
      }
      if (masked) row_constraint->mask(adjusted.data(), vocab);
      row = adjusted.data();
    }
    if (sampling.greedy()) {
      const int32_t choice = argmax(row, vocab);
      if (i < drafts && choice == draft.tokens[i]) {
        ++result.accepted;
        continue;
      }
      result.next = choice;
      return result;
    }
    target_distribution(sampling, row, vocab, target);
    if (i == drafts) {
      result.next = sample_from(target, rows.rng->uniform());
      return result;
    }
    const TokenDistribution* proposal =
        draft.proposals.empty() ? nullptr : &draft.proposals[static_cast<size_t>(i)];
    if (accept_sampled(target, proposal, draft.tokens[i], rows.rng->uniform(), residual)) {
      ++result.accepted;
      continue;
    }
    result.next = sample_from(residual, rows.rng->uniform());
    return result;
  }
  return result;
}

}  // namespace

void accept_rows(std::span<const VerifyRows> batch, std::span<RowsAccepted> out) {
  if (out.size() != batch.size()) {
    fail("accept_rows: {} results for {} sequences", out.size(), batch.size());
  }
  for (size_t s = 0; s < batch.size(); ++s) out[s] = accept_one(batch[s]);
}

}  // namespace dspark
