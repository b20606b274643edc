#include "speculative/verify.h"

#include <algorithm>
#include <numeric>
#include <optional>

#include "base/error.h"
#include "base/system_info.h"
#include "engine/forced_tokens.h"

namespace dspark {

double SpeculativeStats::tokens_per_round(int64_t generated_tokens) const {
  const int64_t forwards = rounds + plain_steps + forced_forwards;
  // The first generated token comes from prefill, not from a round.
  return forwards > 0 ? double(generated_tokens - 1) / forwards : 0.0;
}

bool accept_sampled(const TokenDistribution& target, const TokenDistribution* proposal,
                    int32_t token, double uniform, TokenDistribution& residual) {
  const double p = target.prob_of(token);
  const double q = proposal != nullptr ? proposal->prob_of(token) : 1.0;
  if (uniform < std::min(1.0, p / std::max(q, 1e-9))) return true;
  // Residual max(p − q, 0), renormalised; q is zero outside its support.
  std::unordered_map<int32_t, float> q_of;
  if (proposal != nullptr) {
    for (size_t i = 0; i < proposal->ids.size(); ++i) q_of[proposal->ids[i]] = proposal->probs[i];
  } else {
    q_of[token] = 1.0f;
  }
  residual.ids.clear();
  residual.probs.clear();
  double total = 0.0;
  for (size_t i = 0; i < target.ids.size(); ++i) {
    auto found = q_of.find(target.ids[i]);
    const double mass = target.probs[i] - (found != q_of.end() ? found->second : 0.0);
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

SpeculativeGenerator::SpeculativeGenerator(const Model& model, Drafter& drafter, CapPolicy& caps,
                                           SpeculativeOptions options)
    : model_(model), drafter_(drafter), caps_(caps), options_(std::move(options)) {}

namespace {

// Target rows for the drafter, held until it next drafts (or kMaxHeldRows pile up): a drafter
// given no drafts to make (cap 0, lookup rounds) then costs nothing between the steps it shares
// with other generations, and its context is fed in one wider, cheaper call. One call or several
// give the same context: the drafters' per-row math is row invariant.
class DrafterFeed {
 public:
  DrafterFeed(Drafter& drafter, int64_t row_floats) : drafter_(drafter), row_floats_(row_floats) {}
  void add(const int32_t* tokens, int64_t n, const float* taps) {
    tokens_.insert(tokens_.end(), tokens, tokens + n);
    taps_.insert(taps_.end(), taps, taps + n * row_floats_);
    if (static_cast<int64_t>(tokens_.size()) >= kMaxHeldRows) flush();
  }
  void flush() {
    if (tokens_.empty()) return;
    drafter_.on_target_rows(tokens_.data(), static_cast<int64_t>(tokens_.size()), taps_.data());
    tokens_.clear();
    taps_.clear();
  }

 private:
  static constexpr int64_t kMaxHeldRows = 256;
  Drafter& drafter_;
  int64_t row_floats_;
  std::vector<int32_t> tokens_;
  std::vector<float> taps_;
};

// One verify row's decision.
struct RowChoice {
  int32_t token = 0;
  bool accepted_draft = false;
};

}  // namespace

GenerationResult SpeculativeGenerator::generate(const std::vector<int32_t>& prompt,
                                                ModelState& state, const GenerationConfig& config,
                                                const TokenCallback& on_token) {
  stats_ = SpeculativeStats{};
  check_prompt(model_, prompt, state);
  const int64_t vocab = model_.vocab_size();
  GenerationResult result;
  result.stats.prompt_tokens = static_cast<int64_t>(prompt.size());
  result.stats.cached_prompt_tokens = state.length();
  if (config.max_tokens <= 0) return result;

  const SamplingParams& sampling = config.sampling;
  const std::vector<int> taps = drafter_.tap_layers();
  const int64_t prompt_tokens = static_cast<int64_t>(prompt.size());
  Rng rng(sampling.seed);
  TokenCounts counts;
  ForcedTokens forcing(config.reasoning_budget, config.answer_prefix);
  AnswerConstraint constraint(config.answer_constraint);
  std::vector<int32_t> committed = prompt;
  ForwardOutput output;

  const double prefill_start = now_seconds();
  const int64_t start = state.length();
  const int64_t new_tokens = static_cast<int64_t>(prompt.size()) - start;
  target_forward(model_, options_.batcher, prompt.data() + start, new_tokens, state,
                 {new_tokens - 1}, taps, output);
  ++stats_.target_forwards;
  DrafterFeed feed(drafter_, static_cast<int64_t>(taps.size()) * model_.hidden_size());
  feed.add(prompt.data() + start, new_tokens, output.taps.data());
  result.stats.prefill_seconds = now_seconds() - prefill_start;
  const double decode_start = now_seconds();

  bool finished = false;
  // Forced tokens (reasoning budget, answer prefix) are consulted after every commit, as plain
  // decoding does, so a round stops committing at the token where plain decoding would force.
  const std::vector<int32_t>* forced_due = nullptr;
  // Commits one token: reports it and decides whether generation ends here. `raw_logits` is the
  // row the token was chosen from; null when neither logprobs nor alternatives are wanted.
  auto commit = [&](int32_t id, const float* raw_logits, bool forced) {
    CommittedToken token;
    token.id = id;
    if (config.logprobs) token.logprob = logprob_of(raw_logits, vocab, id);
    if (sampling.top_logprobs > 0)
      token.alternatives = top_logprobs(raw_logits, vocab, sampling.top_logprobs);
    counts.add(id);
    committed.push_back(id);
    result.tokens.push_back(id);
    ++result.stats.generated_tokens;
    constraint.on_token(id, forced);
    const bool keep_going = on_token(token) && !constraint.finished();
    forcing.on_token(id);
    if (auto reason = finish_after(config, id, keep_going, result.stats.generated_tokens)) {
      result.finish_reason = *reason;
      finished = true;
    }
    if (!finished) {
      forced_due =
          forcing.due(tokens_left(config, model_, prompt_tokens, result.stats.generated_tokens));
    }
  };
  const bool wants_rows = config.logprobs || sampling.top_logprobs > 0;

  // The first token: forced where the answer starts right away, else sampled from the prompt's
  // last row.
  forced_due = forcing.due(tokens_left(config, model_, prompt_tokens, 0));
  if (!forced_due) {
    std::vector<float> row = output.logits;
    if (constraint.active()) constraint.mask(row.data(), vocab);
    const int32_t first = sample_token(sampling, counts, row.data(), vocab, rng);
    commit(first, output.logits.data(), false);
  }

  std::vector<int32_t> rows;
  std::vector<int64_t> logit_rows;
  std::vector<float> adjusted;
  TokenDistribution residual;
  while (!finished) {
    if (state.length() + 1 >= model_.max_context()) {
      result.finish_reason = FinishReason::length;
      break;
    }
    if (forced_due) {
      // docs/speculative.md §8: one forward of [pending, forced[0 : n-1]], accepted
      // unconditionally. At the start nothing is pending: the prompt's last row gives forced[0],
      // committed first.
      const std::vector<int32_t>& forced = *forced_due;
      forced_due = nullptr;
      forcing.on_forced();
      result.budget_forced = forcing.budget_fired();
      const bool at_start = result.tokens.empty();
      const int64_t n = static_cast<int64_t>(forced.size());
      if (at_start) commit(forced[0], wants_rows ? output.logits.data() : nullptr, true);
      rows.clear();
      if (!at_start) rows.push_back(committed.back());
      rows.insert(rows.end(), forced.begin(), forced.end() - 1);
      const int64_t fed = static_cast<int64_t>(rows.size());
      if (fed > 0 && !finished) {
        logit_rows.clear();
        if (wants_rows) {
          logit_rows.resize(fed);
          std::iota(logit_rows.begin(), logit_rows.end(), 0);
        }
        const double verify_start = now_seconds();
        state.set_recording(false);
        target_forward(model_, options_.batcher, rows.data(), fed, state, logit_rows, taps, output);
        ++stats_.target_forwards;
        ++stats_.forced_forwards;
        stats_.verify_seconds += now_seconds() - verify_start;
        feed.add(rows.data(), fed, output.taps.data());
        const int64_t skip = at_start ? 1 : 0;
        for (int64_t i = skip; i < n && !finished; ++i) {
          commit(forced[i], wants_rows ? output.logits.data() + (i - skip) * vocab : nullptr, true);
        }
      }
      if (options_.after_round) options_.after_round(state);
      continue;
    }
    const int64_t remaining = config.max_tokens - result.stats.generated_tokens;
    // Drafts that can still be committed (plus the correction/bonus) and still fit the context.
    const int64_t budget =
        std::min({remaining - 1, model_.max_context() - state.length() - 1, kMaxDraftsPerRound});
    Draft draft;
    Drafter* source = nullptr;
    const double draft_start = now_seconds();
    int64_t lookup_cap =
        options_.lookup != nullptr ? std::min<int64_t>(budget, options_.lookup_cap) : 0;
    if (lookup_cap > 0 && options_.lookup_caps != nullptr) {
      options_.lookup_caps->on_context(static_cast<int64_t>(committed.size()));
      if (options_.batcher != nullptr) options_.lookup_caps->on_load(options_.batcher->members());
      lookup_cap = std::min<int64_t>(lookup_cap, options_.lookup_caps->cap_for_round());
    }
    if (lookup_cap > 0) {
      source = options_.lookup;
      DraftRequest request{committed, static_cast<int>(lookup_cap), sampling, rng};
      draft = options_.lookup->propose(request);
    }
    int cap_used = 0;
    if (budget > 0 && draft.tokens.empty()) {
      caps_.on_context(static_cast<int64_t>(committed.size()));
      if (options_.batcher != nullptr) caps_.on_load(options_.batcher->members());
      cap_used = static_cast<int>(std::min<int64_t>(caps_.cap_for_round(), budget));
      if (cap_used > 0) {
        DraftRequest request{committed, cap_used, sampling, rng};
        source = &drafter_;
        feed.flush();
        draft = drafter_.propose(request);
        if (!draft.survival.empty()) {
          const int offered = static_cast<int>(draft.tokens.size());
          const int keep = std::clamp(caps_.drafts_to_verify(draft.survival, offered), 0, offered);
          stats_.unverified += offered - keep;
          draft.keep_first(keep);
          cap_used = keep;
        }
      }
    }
    draft.keep_first(static_cast<size_t>(std::max<int64_t>(budget, 0)));
    for (int32_t id : draft.tokens) {
      if (id < 0 || id >= vocab)
        fail("drafter '{}' proposed token {} outside the vocabulary", drafter_.name(), id);
    }
    stats_.drafter_seconds += now_seconds() - draft_start;

    const int64_t drafts = static_cast<int64_t>(draft.tokens.size());
    const int64_t pending = committed.back();
    rows.assign(1, static_cast<int32_t>(pending));
    rows.insert(rows.end(), draft.tokens.begin(), draft.tokens.end());
    logit_rows.resize(drafts + 1);
    std::iota(logit_rows.begin(), logit_rows.end(), 0);
    const int64_t length_before = state.length();
    const double verify_start = now_seconds();
    state.set_recording(drafts > 0);
    target_forward(model_, options_.batcher, rows.data(), drafts + 1, state, logit_rows, taps,
                   output);
    ++stats_.target_forwards;
    stats_.verify_seconds += now_seconds() - verify_start;

    // Acceptance, row by row; row i is biased and penalised with the counts of everything before
    // it, and masked by the constraint advanced over the drafts before it. A draft the constraint
    // rejects has probability 0 in its row, so acceptance stops there.
    std::vector<int32_t> to_commit;
    int64_t accepted = 0;
    TokenCounts row_counts;
    const bool adjust = sampling.adjusts_logits();
    if (adjust) row_counts = counts;
    std::optional<AnswerConstraint> row_constraint;
    if (config.answer_constraint.enabled()) row_constraint = constraint;
    for (int64_t i = 0; i <= drafts; ++i) {
      if (row_constraint && i > 0) {
        row_constraint->on_token(draft.tokens[i - 1], false);
        // Plain decoding ends at that draft: committing the accepted drafts ends this one too.
        if (row_constraint->finished()) break;
      }
      const float* raw = output.logits.data() + i * vocab;
      const bool masked = row_constraint && row_constraint->active();
      // Rows are only copied when bias, penalties or the constraint change them.
      const float* row = raw;
      if (adjust || masked) {
        adjusted.assign(raw, raw + vocab);
        if (adjust) {
          if (i > 0) row_counts.add(draft.tokens[i - 1]);
          adjust_logits(sampling, row_counts, adjusted.data(), vocab);
        }
        if (masked) row_constraint->mask(adjusted.data(), vocab);
        row = adjusted.data();
      }
      if (sampling.greedy()) {
        const int32_t choice = argmax(row, vocab);
        if (i < drafts && choice == draft.tokens[i]) {
          ++accepted;
          continue;
        }
        to_commit.push_back(choice);
        break;
      }
      const TokenDistribution target = target_distribution(sampling, row, vocab);
      if (i == drafts) {
        to_commit.push_back(sample_from(target, rng.uniform()));
        break;
      }
      const TokenDistribution* proposal =
          draft.proposals.empty() ? nullptr : &draft.proposals[static_cast<size_t>(i)];
      if (accept_sampled(target, proposal, draft.tokens[i], rng.uniform(), residual)) {
        ++accepted;
        continue;
      }
      to_commit.push_back(sample_from(residual, rng.uniform()));
      break;
    }

    // Statistics of the round.
    if (drafts > 0) {
      ++stats_.rounds;
      if (draft.from_lookup) ++stats_.lookup_rounds;
      stats_.drafted += drafts;
      stats_.accepted += accepted;
      if (static_cast<int64_t>(stats_.position_verified.size()) < drafts) {
        stats_.position_verified.resize(drafts, 0);
        stats_.position_accepted.resize(drafts, 0);
      }
      for (int64_t i = 0; i < drafts; ++i) ++stats_.position_verified[i];
      for (int64_t i = 0; i < accepted; ++i) ++stats_.position_accepted[i];
    } else {
      ++stats_.plain_steps;
    }
    const int64_t committed_now = accepted + 1;
    if (static_cast<int64_t>(stats_.committed_histogram.size()) <= committed_now) {
      stats_.committed_histogram.resize(committed_now + 1, 0);
    }
    ++stats_.committed_histogram[committed_now];

    // Commit the accepted drafts, then the correction or bonus, stopping where generation ends
    // or the reasoning budget fires.
    int64_t committed_round = 0;
    for (int64_t i = 0; i < accepted && !finished && !forced_due; ++i, ++committed_round) {
      commit(draft.tokens[i], output.logits.data() + i * vocab, false);
    }
    if (!finished && !forced_due) {
      commit(to_commit.back(), output.logits.data() + accepted * vocab, false);
      ++committed_round;
    }

    // Roll back to the accept point: pending plus the accepted drafts stay in the state (fewer
    // when the budget cut the round: the last committed token is then the pending one).
    const int64_t keep = forced_due ? committed_round : accepted + 1;
    if (keep < drafts + 1) state.trim(length_before + keep);
    feed.add(rows.data(), keep, output.taps.data());
    if (drafts > 0) source->on_verified(static_cast<int>(drafts), static_cast<int>(accepted));
    if (drafts > 0 && source == &drafter_) {
      caps_.on_verified(static_cast<int>(drafts), static_cast<int>(accepted));
    }
    if (drafts > 0 && source == options_.lookup && options_.lookup_caps != nullptr) {
      options_.lookup_caps->on_verified(static_cast<int>(drafts), static_cast<int>(accepted));
    }
    if (drafts > 0 && source == &drafter_ && !draft.from_lookup) {
      caps_.on_round(cap_used, static_cast<int>(accepted), now_seconds() - draft_start,
                     static_cast<int>(committed_now));
    }
    if (options_.after_round) options_.after_round(state);
  }
  feed.flush();  // the caller (the server's prefix cache) reads the drafter's context
  result.stats.decode_seconds = now_seconds() - decode_start;
  result.stats.peak_rss_bytes = peak_rss_bytes();
  return result;
}

}  // namespace dspark
