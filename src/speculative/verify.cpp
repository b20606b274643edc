#include "speculative/verify.h"

#include <algorithm>
#include <numeric>
#include <optional>
#include <utility>

#include "base/error.h"
#include "base/system_info.h"
#include "base/thread_pool.h"
#include "speculative/acceptance.h"

namespace dspark {

double SpeculativeStats::tokens_per_round(int64_t generated_tokens) const {
  const int64_t forwards = rounds + plain_steps + forced_forwards;
  // The first generated token comes from prefill, not from a round.
  return forwards > 0 ? double(generated_tokens - 1) / forwards : 0.0;
}

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
    clear();
  }
  // The rows held, for a caller that feeds them itself (propose_together); clear() once fed.
  DrafterRows held() const {
    return {tokens_.data(), static_cast<int64_t>(tokens_.size()), taps_.data()};
  }
  void clear() {
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

SequenceDecoder::SequenceDecoder(const Model& model, Drafter& drafter, CapPolicy& caps,
                                 const SpeculativeOptions& options,
                                 const std::vector<int32_t>& prompt, StatePool& pool,
                                 SequenceId sequence, const GenerationConfig& config,
                                 const TokenCallback& on_token)
    : model_(model),
      drafter_(drafter),
      caps_(caps),
      options_(options),
      pool_(pool),
      sequence_(sequence),
      config_(config),
      on_token_(on_token),
      taps_(drafter.tap_layers()),
      vocab_(model.vocab_size()),
      prompt_tokens_(static_cast<int64_t>(prompt.size())),
      wants_rows_(config.logprobs || config.sampling.top_logprobs > 0),
      rng_(config.sampling.seed),
      forcing_(config.reasoning_budget, config.answer_prefix),
      constraint_(config.answer_constraint),
      committed_(prompt),
      feed_(std::make_unique<DrafterFeed>(
          drafter, static_cast<int64_t>(taps_.size()) * model.hidden_size())) {
  check_prompt(model, prompt, pool.length(sequence));
  drafter.bind_sequence(pool, sequence);
  result_.stats.prompt_tokens = prompt_tokens_;
  result_.stats.cached_prompt_tokens = pool.length(sequence);
  if (config.max_tokens <= 0) phase_ = Phase::done;
}

SequenceDecoder::~SequenceDecoder() = default;

SequenceRun SequenceDecoder::run_of(const std::vector<int32_t>& rows) {
  forward_start_ = now_seconds();
  return SequenceRun{rows.data(), static_cast<int64_t>(rows.size()), sequence_, logit_rows_, taps_,
                     &output_};
}

std::optional<SequenceRun> SequenceDecoder::next_run() {
  if (phase_ == Phase::prefill) {
    const int64_t start = pool_.length(sequence_);
    rows_.assign(committed_.begin() + start, committed_.end());
    logit_rows_.assign(1, prompt_tokens_ - start - 1);
    return run_of(rows_);
  }
  plan_until_forward();
  if (phase_ == Phase::drafting) {
    feed_->flush();
    take_draft(drafter_.propose(DraftRequest{committed_, cap_used_, config_.sampling, rng_}));
  }
  if (phase_ == Phase::done) return std::nullopt;
  return run_of(rows_);
}

void SequenceDecoder::plan_until_forward() {
  // A forced round whose ids all come from rows already run needs no forward; loop until a
  // forward or a drafter call is due, or the generation ends.
  while (phase_ == Phase::idle) {
    if (pool_.length(sequence_) >= model_.max_context()) {
      // The pending token no longer fits.
      result_.finish_reason = FinishReason::length;
      end_generation();
      break;
    }
    if (forced_due_) {
      plan_forced();
    } else {
      plan_round();
    }
  }
}

std::optional<DraftCall> SequenceDecoder::draft_call() {
  if (phase_ == Phase::prefill) return std::nullopt;
  plan_until_forward();
  if (phase_ != Phase::drafting) return std::nullopt;
  return DraftCall{&drafter_, DraftRequest{committed_, cap_used_, config_.sampling, rng_},
                   feed_->held()};
}

void SequenceDecoder::take_draft(Draft draft) {
  if (phase_ != Phase::drafting) fail("take_draft: no drafter call is pending");
  feed_->clear();  // the call's unfed rows went to the drafter with it
  draft_ = std::move(draft);
  if (!draft_.survival.empty()) cap_used_ = keep_drafts_worth_verifying(caps_);
  plan_verify();
}

int SequenceDecoder::keep_drafts_worth_verifying(CapPolicy& caps) {
  const int offered = static_cast<int>(draft_.tokens.size());
  if (draft_.survival.empty()) return offered;
  const int keep = std::clamp(caps.drafts_to_verify(draft_.survival, offered), 0, offered);
  stats_.unverified += offered - keep;
  draft_.keep_first(keep);
  return keep;
}

void SequenceDecoder::finish_run() {
  stats_.verify_seconds += phase_ == Phase::prefill ? 0.0 : now_seconds() - forward_start_;
  ++stats_.target_forwards;
  switch (phase_) {
    case Phase::prefill:
      return finish_prefill();
    case Phase::forced:
      return finish_forced();
    case Phase::verify:
      return finish_round();
    case Phase::drafting:
    case Phase::idle:
    case Phase::done:
      fail("finish_run: no forward was planned");
  }
}

void SequenceDecoder::commit(int32_t id, const float* raw_logits, bool forced) {
  const SamplingParams& sampling = config_.sampling;
  CommittedToken token;
  token.id = id;
  if (config_.logprobs || sampling.top_logprobs > 0) {
    const LogSoftmax log_softmax(raw_logits, vocab_);
    if (config_.logprobs) token.logprob = log_softmax.of(id);
    if (sampling.top_logprobs > 0) token.alternatives = log_softmax.top(sampling.top_logprobs);
  }
  counts_.add(id);
  committed_.push_back(id);
  result_.tokens.push_back(id);
  ++result_.stats.generated_tokens;
  constraint_.on_token(id, forced);
  const bool keep_going = on_token_(token) && !constraint_.finished();
  forcing_.on_token(id);
  if (auto reason = finish_after(config_, id, keep_going, result_.stats.generated_tokens)) {
    result_.finish_reason = *reason;
    end_generation();
    return;
  }
  // Forced tokens (reasoning budget, answer prefix) are consulted after every commit, as plain
  // decoding does, so a round stops committing at the token where plain decoding would force.
  forced_due_ =
      forcing_.due(tokens_left(config_, model_, prompt_tokens_, result_.stats.generated_tokens));
}

void SequenceDecoder::end_generation() {
  phase_ = Phase::done;
  feed_->flush();  // the caller (the server's prefix cache) reads the drafter's context
  result_.stats.decode_seconds = now_seconds() - decode_start_;
  result_.stats.peak_rss_bytes = peak_rss_bytes();
}

void SequenceDecoder::finish_prefill() {
  const int64_t start = result_.stats.cached_prompt_tokens;
  feed_->add(committed_.data() + start, prompt_tokens_ - start, output_.taps.data());
  result_.stats.prefill_seconds = now_seconds() - forward_start_;
  decode_start_ = now_seconds();
  phase_ = Phase::idle;
  // The first token: forced where the answer starts right away, else sampled from the prompt's
  // last row.
  forced_due_ = forcing_.due(tokens_left(config_, model_, prompt_tokens_, 0));
  if (!forced_due_) {
    // The prompt's last row is a round without drafts.
    const RowsAccepted first = accept(Draft{});
    commit(*first.next, output_.logits.data(), false);
  }
}

// docs/speculative.md §8: one forward of [pending, forced[0 : n-1]], accepted unconditionally. At
// the start nothing is pending: the prompt's last row gives forced[0], committed first.
void SequenceDecoder::plan_forced() {
  forced_ = *forced_due_;
  forced_due_ = nullptr;
  forcing_.on_forced();
  result_.budget_forced = forcing_.budget_fired();
  const bool at_start = result_.tokens.empty();
  if (at_start) commit(forced_[0], wants_rows_ ? output_.logits.data() : nullptr, true);
  rows_.clear();
  if (!at_start) rows_.push_back(committed_.back());
  rows_.insert(rows_.end(), forced_.begin(), forced_.end() - 1);
  const int64_t fed = static_cast<int64_t>(rows_.size());
  if (fed == 0 || finished()) {
    if (options_.after_round) options_.after_round(pool_.state(sequence_));
    return;
  }
  logit_rows_.clear();
  if (wants_rows_) {
    logit_rows_.resize(fed);
    std::iota(logit_rows_.begin(), logit_rows_.end(), 0);
  }
  pool_.set_recording(sequence_, false);
  phase_ = Phase::forced;
}

void SequenceDecoder::finish_forced() {
  ++stats_.forced_forwards;
  phase_ = Phase::idle;
  const int64_t fed = static_cast<int64_t>(rows_.size());
  feed_->add(rows_.data(), fed, output_.taps.data());
  const int64_t skip = static_cast<int64_t>(forced_.size()) - fed;  // 1 when forced at the start
  for (int64_t i = skip; i < static_cast<int64_t>(forced_.size()) && !finished(); ++i) {
    commit(forced_[i], wants_rows_ ? output_.logits.data() + (i - skip) * vocab_ : nullptr, true);
  }
  if (options_.after_round) options_.after_round(pool_.state(sequence_));
}

// Drafts that can still be committed (plus the correction/bonus) and still fit the context.
int64_t SequenceDecoder::round_budget() const {
  const int64_t remaining = config_.max_tokens - result_.stats.generated_tokens;
  return std::min(
      {remaining - 1, model_.max_context() - pool_.length(sequence_) - 1, kMaxDraftsPerRound});
}

void SequenceDecoder::plan_round() {
  const SamplingParams& sampling = config_.sampling;
  const int64_t budget = round_budget();
  draft_ = Draft{};
  source_ = nullptr;
  round_start_ = now_seconds();
  int64_t lookup_cap =
      options_.lookup != nullptr ? std::min<int64_t>(budget, options_.lookup_cap) : 0;
  if (lookup_cap > 0 && options_.lookup_caps != nullptr) {
    options_.lookup_caps->on_context(static_cast<int64_t>(committed_.size()));
    if (load_ > 0) options_.lookup_caps->on_load(load_);
    lookup_cap = std::min<int64_t>(lookup_cap, options_.lookup_caps->cap_for_round());
  }
  if (lookup_cap > 0) {
    source_ = options_.lookup;
    DraftRequest request{committed_, static_cast<int>(lookup_cap), sampling, rng_};
    draft_ = options_.lookup->propose(request);
    if (options_.lookup_caps != nullptr) keep_drafts_worth_verifying(*options_.lookup_caps);
  }
  cap_planned_ = cap_used_ = 0;
  if (budget > 0 && draft_.tokens.empty()) {
    caps_.on_context(static_cast<int64_t>(committed_.size()));
    if (load_ > 0) caps_.on_load(load_);
    cap_used_ = cap_planned_ = static_cast<int>(std::min<int64_t>(caps_.cap_for_round(), budget));
    if (cap_used_ > 0) {
      source_ = &drafter_;
      phase_ = Phase::drafting;
      return;
    }
  }
  plan_verify();
}

// The round's drafts are known: bounded by the budget, checked, and planned as the verify forward.
void SequenceDecoder::plan_verify() {
  draft_.keep_first(static_cast<size_t>(std::max<int64_t>(round_budget(), 0)));
  for (int32_t id : draft_.tokens) {
    if (id < 0 || id >= vocab_)
      fail("drafter '{}' proposed token {} outside the vocabulary", drafter_.name(), id);
  }
  stats_.drafter_seconds += now_seconds() - round_start_;

  const int64_t drafts = static_cast<int64_t>(draft_.tokens.size());
  rows_.assign(1, committed_.back());
  rows_.insert(rows_.end(), draft_.tokens.begin(), draft_.tokens.end());
  logit_rows_.resize(drafts + 1);
  std::iota(logit_rows_.begin(), logit_rows_.end(), 0);
  length_before_ = pool_.length(sequence_);
  pool_.set_recording(sequence_, drafts > 0);
  phase_ = Phase::verify;
}

RowsAccepted SequenceDecoder::accept(const Draft& draft) {
  const VerifyRows rows{output_.logits.data(),
                        vocab_,
                        &draft,
                        &config_.sampling,
                        &counts_,
                        config_.answer_constraint.enabled() ? &constraint_ : nullptr,
                        &rng_};
  RowsAccepted acceptance;
  accept_rows({&rows, 1}, {&acceptance, 1});
  return acceptance;
}

void SequenceDecoder::accept_ahead() {
  if (phase_ != Phase::verify) return;
  try {
    accepted_ahead_ = accept(draft_);
  } catch (...) {
    acceptance_error_ = std::current_exception();
  }
}

void SequenceDecoder::finish_round() {
  if (!accepted_ahead_ && !acceptance_error_) accept_ahead();
  if (acceptance_error_) std::rethrow_exception(std::exchange(acceptance_error_, nullptr));
  const RowsAccepted acceptance = *accepted_ahead_;
  accepted_ahead_.reset();
  phase_ = Phase::idle;
  const int64_t drafts = static_cast<int64_t>(draft_.tokens.size());
  const int64_t accepted = acceptance.accepted;

  // Statistics of the round.
  if (drafts > 0) {
    ++stats_.rounds;
    if (draft_.from_lookup) ++stats_.lookup_rounds;
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

  // Commit the accepted drafts, then the correction or bonus, stopping where generation ends or
  // the reasoning budget fires. A constraint completed by the accepted drafts leaves no next
  // token: committing them ends the generation.
  int64_t committed_round = 0;
  for (int64_t i = 0; i < accepted && !finished() && !forced_due_; ++i, ++committed_round) {
    commit(draft_.tokens[i], output_.logits.data() + i * vocab_, false);
  }
  if (!finished() && !forced_due_) {
    if (!acceptance.next) fail("verify: no token follows an unfinished answer");
    commit(*acceptance.next, output_.logits.data() + accepted * vocab_, false);
    ++committed_round;
  }

  // Roll back to the accept point: pending plus the accepted drafts stay in the state (fewer when
  // the budget cut the round: the last committed token is then the pending one).
  const int64_t keep = forced_due_ ? committed_round : accepted + 1;
  if (keep < drafts + 1) pool_.trim(sequence_, length_before_ + keep);
  feed_->add(rows_.data(), keep, output_.taps.data());
  if (drafts > 0) source_->on_verified(static_cast<int>(drafts), static_cast<int>(accepted));
  if (drafts > 0 && source_ == &drafter_) {
    caps_.on_verified(static_cast<int>(drafts), static_cast<int>(accepted));
  }
  if (drafts > 0 && source_ == options_.lookup && options_.lookup_caps != nullptr) {
    options_.lookup_caps->on_verified(static_cast<int>(drafts), static_cast<int>(accepted));
  }
  // Rounds whose drafts were all left unverified count too: their drafting was paid.
  if (cap_planned_ > 0 && source_ == &drafter_ && !draft_.from_lookup) {
    caps_.on_round(RoundOutcome{cap_planned_, static_cast<int>(drafts), static_cast<int>(accepted),
                                now_seconds() - round_start_, static_cast<int>(committed_now)});
  }
  if (options_.after_round) options_.after_round(pool_.state(sequence_));
}

void SequenceDecoder::run_to_end() {
  while (std::optional<SequenceRun> run = next_run()) {
    model_.forward_batch({*run}, pool_);
    finish_run();
  }
}

void StepCounters::add_step(const std::vector<SequenceRun>& runs, double seconds) {
  const auto width = static_cast<int64_t>(runs.size());
  busy_seconds += seconds;
  ++steps;
  sequence_forwards += width;
  for (const SequenceRun& run : runs) rows += run.n;
  widest = std::max(widest, width);
  if (static_cast<int64_t>(steps_by_width.size()) < width) steps_by_width.resize(width);
  ++steps_by_width[width - 1];
}

std::vector<std::exception_ptr> draft_together(std::span<SequenceDecoder* const> decoders) {
  std::vector<std::exception_ptr> errors(decoders.size());
  std::vector<DraftCall> calls;
  std::vector<size_t> callers;
  for (size_t i = 0; i < decoders.size(); ++i) {
    try {
      if (std::optional<DraftCall> call = decoders[i]->draft_call()) {
        calls.push_back(*call);
        callers.push_back(i);
      }
    } catch (...) {
      errors[i] = std::current_exception();
    }
  }
  std::vector<DraftOutcome> drafts = propose_together(calls);
  for (size_t k = 0; k < drafts.size(); ++k) {
    const size_t i = callers[k];
    try {
      if (drafts[k].error) std::rethrow_exception(drafts[k].error);
      decoders[i]->take_draft(std::move(drafts[k].draft));
    } catch (...) {
      errors[i] = std::current_exception();
    }
  }
  return errors;
}

void accept_together(std::span<SequenceDecoder* const> decoders) {
  default_pool().parallel_for(static_cast<int64_t>(decoders.size()), 1,
                              [&](int64_t begin, int64_t end, int) {
                                for (int64_t i = begin; i < end; ++i) decoders[i]->accept_ahead();
                              });
}

bool step_together(const Model& model, StatePool& pool, std::span<SequenceDecoder* const> sequences,
                   StepCounters* counters, size_t slots) {
  size_t unfinished = 0;
  bool decoding = true;
  int64_t tokens_before = 0;
  for (const SequenceDecoder* sequence : sequences) {
    tokens_before += sequence->result().stats.generated_tokens;
    if (sequence->finished()) continue;
    ++unfinished;
    decoding = decoding && sequence->result().stats.generated_tokens > 0;
  }
  const bool steady = decoding && unfinished == slots;
  const double step_start = now_seconds();
  for (SequenceDecoder* sequence : sequences) sequence->set_load(static_cast<int>(unfinished));
  for (const std::exception_ptr& error : draft_together(sequences)) {
    if (error) std::rethrow_exception(error);
  }
  std::vector<SequenceRun> runs;
  std::vector<SequenceDecoder*> running;
  for (SequenceDecoder* sequence : sequences) {
    if (std::optional<SequenceRun> run = sequence->next_run()) {
      runs.push_back(std::move(*run));
      running.push_back(sequence);
    }
  }
  if (runs.empty()) return false;
  const double start = now_seconds();
  model.forward_batch(runs, pool);
  if (counters != nullptr) counters->add_step(runs, now_seconds() - start);
  accept_together(running);
  for (SequenceDecoder* sequence : running) sequence->finish_run();
  if (counters != nullptr && steady) {
    int64_t tokens_after = 0;
    for (const SequenceDecoder* sequence : sequences) {
      tokens_after += sequence->result().stats.generated_tokens;
    }
    counters->full_seconds += now_seconds() - step_start;
    counters->full_tokens += tokens_after - tokens_before;
  }
  return true;
}

void decode_together(const Model& model, StatePool& pool,
                     const std::vector<SequenceDecoder*>& sequences, StepCounters* counters) {
  while (step_together(model, pool, sequences, counters, sequences.size())) {
  }
}

SpeculativeGenerator::SpeculativeGenerator(const Model& model, Drafter& drafter, CapPolicy& caps,
                                           SpeculativeOptions options)
    : model_(model), drafter_(drafter), caps_(caps), options_(std::move(options)) {}

GenerationResult SpeculativeGenerator::generate(const std::vector<int32_t>& prompt, StatePool& pool,
                                                SequenceId sequence, const GenerationConfig& config,
                                                const TokenCallback& on_token) {
  stats_ = SpeculativeStats{};
  SequenceDecoder decoder(model_, drafter_, caps_, options_, prompt, pool, sequence, config,
                          on_token);
  decoder.run_to_end();
  stats_ = decoder.stats();
  return decoder.result();
}

GenerationResult generate_plain(const Model& model, const std::vector<int32_t>& prompt,
                                StatePool& pool, SequenceId sequence,
                                const GenerationConfig& config, const TokenCallback& on_token) {
  NoDrafts none;
  FixedCap no_drafts(0);
  return SpeculativeGenerator(model, none, no_drafts)
      .generate(prompt, pool, sequence, config, on_token);
}

}  // namespace dspark
