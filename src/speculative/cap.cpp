#include "speculative/cap.h"

#include <algorithm>
#include <cmath>

#include "base/error.h"
#include "speculative/draft_scheduler.h"

namespace dspark {
namespace {

// The least-squares slope of the upper half of the points (at least the last two): wider than
// the measured widths, a curve rises with it rather than with its last, noisiest segment.
double upper_slope(const std::vector<double>& values) {
  const int64_t n = static_cast<int64_t>(values.size());
  const int64_t count = std::max<int64_t>(2, (n + 1) / 2);
  double mean_x = 0.0, mean_y = 0.0;
  for (int64_t i = n - count; i < n; ++i) {
    mean_x += static_cast<double>(i);
    mean_y += values[i];
  }
  mean_x /= static_cast<double>(count);
  mean_y /= static_cast<double>(count);
  double covariance = 0.0, variance = 0.0;
  for (int64_t i = n - count; i < n; ++i) {
    covariance += (static_cast<double>(i) - mean_x) * (values[i] - mean_y);
    variance += (static_cast<double>(i) - mean_x) * (static_cast<double>(i) - mean_x);
  }
  return covariance / variance;
}

// Piecewise-linear in points (1, values[0]), (2, values[1]), ...; beyond the last point the
// curve continues with upper_slope, below the first the first value holds.
double interpolate(const std::vector<double>& values, double x) {
  const int64_t n = static_cast<int64_t>(values.size());
  if (n == 0) return 0.0;
  if (x <= 1.0 || n == 1) return values[0];
  if (x >= static_cast<double>(n)) {
    return values[n - 1] + (x - static_cast<double>(n)) * upper_slope(values);
  }
  const int64_t low = static_cast<int64_t>(std::floor(x));
  const double t = x - static_cast<double>(low);
  return values[low - 1] + t * (values[low] - values[low - 1]);
}

}  // namespace

void fit_non_decreasing(std::vector<double>& values) {
  // Pool adjacent violators: blocks of (mean, size), merged while a block's mean falls below
  // the one before it.
  std::vector<std::pair<double, int64_t>> blocks;
  for (double value : values) {
    blocks.emplace_back(value, 1);
    while (blocks.size() > 1 && blocks[blocks.size() - 2].first > blocks.back().first) {
      const auto [mean, size] = blocks.back();
      blocks.pop_back();
      auto& [before_mean, before_size] = blocks.back();
      before_mean =
          (before_mean * static_cast<double>(before_size) + mean * static_cast<double>(size)) /
          static_cast<double>(before_size + size);
      before_size += size;
    }
  }
  size_t i = 0;
  for (const auto& [mean, size] : blocks) {
    for (int64_t k = 0; k < size; ++k) values[i++] = mean;
  }
}

void CostCurves::fit() {
  fit_non_decreasing(verify_ms);
  fit_non_decreasing(drafter_ms);
}

double CostCurves::verify(int width) const {
  return interpolate(verify_ms, std::max(width, 1));
}

double CostCurves::drafter(int cap) const {
  if (cap <= 0 || drafter_ms.empty()) return 0.0;
  return std::max(0.0, interpolate(drafter_ms, cap));
}

double CostCurves::drafter(int cap, int64_t context) const {
  const double at_reference = drafter(cap);
  if (at_reference <= 0.0) return at_reference;
  // Like the verify's depth term, shallower contexts take off at most half.
  const double term =
      std::max(0.0, drafter_slope_ms_per_token) * static_cast<double>(context - reference_context);
  return at_reference + std::max(term, -0.5 * at_reference);
}

double CostCurves::depth(int width, int64_t context) const {
  if (slope_widths.empty()) return 0.0;
  // Slopes between the measured widths are interpolated. Below the narrowest the narrowest holds;
  // beyond the widest they rise along the last segment, since every row attends over the whole
  // context (verify_bench, default model, 512 -> 2,048 tokens: 0.0013 ms a token at width 1,
  // 0.0064 at 8 and 0.0125 at 16, where 8's slope alone priced a 17-row lookup verify at 3,000
  // tokens of context at half its cost).
  double slope = slope_ms_per_token.front();
  if (width >= slope_widths.back()) {
    slope = slope_ms_per_token.back();
    const size_t last = slope_widths.size() - 1;
    if (last > 0 && width > slope_widths[last]) {
      const double per_width = (slope_ms_per_token[last] - slope_ms_per_token[last - 1]) /
                               double(slope_widths[last] - slope_widths[last - 1]);
      slope += std::max(0.0, per_width) * double(width - slope_widths[last]);
    }
  } else {
    for (size_t i = 1; i < slope_widths.size(); ++i) {
      if (width <= slope_widths[i]) {
        const double span = slope_widths[i] - slope_widths[i - 1];
        const double t = span > 0 ? (width - slope_widths[i - 1]) / span : 1.0;
        slope = slope_ms_per_token[i - 1] +
                std::clamp(t, 0.0, 1.0) * (slope_ms_per_token[i] - slope_ms_per_token[i - 1]);
        break;
      }
    }
  }
  // Shallower than the reference the term is negative: the rows attend over fewer keys. It takes
  // off at most half of the measured verify, so that a noisy slope cannot price rows at nothing.
  const double term = std::max(0.0, slope) * static_cast<double>(context - reference_context);
  return std::max(term, -0.5 * verify(width));
}

double CostCurves::batch_round_ms(int cap, int64_t context, int sequences) const {
  const double b = std::max(sequences, 1);
  if (cap <= 0) return verify(sequences) + b * depth(1, context);
  return b * drafter(cap, context) + verify(sequences * (cap + 1)) + b * depth(cap + 1, context) +
         overhead_ms;
}

double CostCurves::round_ms(int cap, int64_t context) const {
  if (cap <= 0) return verify(1) + depth(1, context);
  return drafter(cap, context) + verify(cap + 1) + depth(cap + 1, context) + overhead_ms;
}

double expected_committed(double p, int cap) {
  double total = 1.0;
  double term = 1.0;
  for (int i = 1; i <= cap; ++i) {
    term *= p;
    total += term;
  }
  return total;
}

double expected_committed(const std::vector<double>& survival, double tail_p, int cap) {
  double total = 1.0;
  double last = 1.0;
  for (int i = 0; i < cap; ++i) {
    last = i < static_cast<int>(survival.size()) ? survival[i] : last * tail_p;
    total += last;
  }
  return total;
}

std::vector<double> measured_survival(const SpeculativeStats& stats, int64_t min_rounds) {
  std::vector<double> survival;
  for (size_t i = 0; i < stats.position_verified.size(); ++i) {
    if (stats.position_verified[i] < min_rounds) break;
    survival.push_back(double(stats.position_accepted[i]) / double(stats.position_verified[i]));
  }
  return survival;
}

double round_rate(const CostCurves& curves, int cap, double p, int64_t context) {
  return expected_committed(p, cap) / curves.round_ms(cap, context);
}

namespace {

template <typename Expected>
int argmax_cap(const CostCurves& curves, int max_cap, int64_t context, int sequences,
               Expected expected) {
  if (curves.empty()) fail("the draft cap cannot be derived without measured verify costs");
  if (max_cap < 1) fail("the largest draft cap must be at least 1, not {}", max_cap);
  int best = 0;
  double best_rate = -1.0;
  for (int cap = 0; cap <= max_cap; ++cap) {
    const double rate =
        sequences == 1 ? expected(cap) / curves.round_ms(cap, context)
                       : sequences * expected(cap) / curves.batch_round_ms(cap, context, sequences);
    if (rate > best_rate) {
      best_rate = rate;
      best = cap;
    }
  }
  return best;
}

}  // namespace

int derive_cap(const CostCurves& curves, int max_cap, double p, int64_t context, int sequences) {
  return argmax_cap(curves, max_cap, context, std::max(sequences, 1),
                    [p](int cap) { return expected_committed(p, cap); });
}

int derive_cap(const CostCurves& curves, int max_cap, const std::vector<double>& survival,
               int64_t context, int sequences) {
  return argmax_cap(curves, max_cap, context, std::max(sequences, 1), [&survival](int cap) {
    return expected_committed(survival, kDerivedCapPrior, cap);
  });
}

AutoCapController::AutoCapController(CostCurves curves, int max_cap)
    : AutoCapController(std::move(curves), max_cap, Params{}) {}

AutoCapController::AutoCapController(CostCurves curves, int max_cap, Params params)
    : curves_(std::move(curves)),
      max_cap_(max_cap),
      params_(params),
      cap_(std::clamp(params.init_cap, 1, std::max(max_cap, 1))),
      p_(params.prior_p),
      context_(curves_.reference_context),
      probe_gap_(params.probe_every),
      timing_(static_cast<size_t>(std::max(max_cap, 1)) + 1) {
  if (curves_.empty()) fail("the draft-cap controller needs measured verify costs");
  if (max_cap < 1) fail("the largest draft cap must be at least 1, not {}", max_cap);
  // Where the measured costs say that no cap pays even at the prior, rounds at init_cap would
  // lose until enough observations allow parking: start parked, probing (§16.4), with the prior
  // worth the observations that parking needs, so that one accepted probe (which alone would
  // make the running mean 1) does not end a park the costs chose.
  if (params_.allow_parking && derive_cap(curves_, max_cap_, p_, context_) == 0) {
    cap_ = 0;
    observations_ = params_.min_obs_to_park;
  }
}

double AutoCapController::model_rate(int cap) const {
  return expected_committed(p_, cap) / curves_.round_ms(cap, context_);
}

double AutoCapController::effective_rate(int cap) const {
  if (cap >= 1) {
    const CapTiming& timing = timing_[cap];
    if (timing.rounds >= params_.min_rounds_observed &&
        round_ - timing.last_round <= params_.obs_max_age && timing.ms_per_round > 0.0) {
      return timing.tokens_per_round / timing.ms_per_round;
    }
  }
  return model_rate(cap) * correction_;
}

void AutoCapController::repick() {
  for (int cap = 1; cap <= max_cap_; ++cap) {
    if (round_ - timing_[cap].last_round > params_.obs_max_age) timing_[cap] = CapTiming{};
  }
  const bool may_park = params_.allow_parking && observations_ >= params_.min_obs_to_park;
  int best = cap_;
  double best_rate = effective_rate(cap_);
  for (int cap = may_park ? 0 : 1; cap <= max_cap_; ++cap) {
    const double rate = effective_rate(cap);
    if (rate > best_rate) {
      best_rate = rate;
      best = cap;
    }
  }
  if (best != cap_ && best_rate > params_.hysteresis * effective_rate(cap_)) {
    if (best == 0) {
      parked_rounds_ = 0;
      probe_gap_ = params_.probe_every;
    }
    cap_ = best;
  }
}

int AutoCapController::cap_for_round() {
  const int cap = controller_cap();
  if (load_ <= 1 || cap == 0) return cap;
  return std::min(cap, derive_cap(curves_, max_cap_, p_, context_, load_));
}

int AutoCapController::controller_cap() {
  ++round_;
  probing_ = false;
  if (cap_ == 0) {
    if (parked_rounds_ >= probe_gap_) {
      parked_rounds_ = 0;
      probing_ = true;
      return 1;
    }
    ++parked_rounds_;
    return 0;
  }
  if (round_ % params_.repick_every == 0) repick();
  if (cap_ == 0) {
    ++parked_rounds_;
    return 0;
  }
  return cap_;
}

void AutoCapController::observe(double outcome) {
  ++observations_;
  const double rate = std::max(params_.alpha, 1.0 / static_cast<double>(observations_));
  p_ += rate * (outcome - p_);
}

int AutoCapController::drafts_to_verify(const std::vector<double>& survival, int offered) {
  if (!params_.confidence_schedule) return offered;
  std::vector<DraftCandidate> alone(1);
  alone[0].context = context_;
  const int keep = std::min(
      offered, drafts_worth_verifying(curves_, std::move(alone), 0, p_, load_ - 1, survival));
  // A round with nothing verified shows no acceptance: the first draft's survival stands in for
  // its outcome, so that a head whose confidences keep saying no is measured, and parked.
  if (keep == 0 && offered > 0) observe(std::clamp(survival.front(), 0.0, 1.0));
  return keep;
}

void AutoCapController::on_round(const RoundOutcome& round) {
  const int cap_used = round.cap;
  if (cap_used < 1) return;
  for (int i = 0; i < round.accepted; ++i) observe(1.0);
  // A fully accepted round says nothing about the slot after it (censored): no failure.
  if (round.verified > 0 && round.accepted < round.verified) observe(0.0);

  const int committed = round.committed;
  const double seconds = round.seconds;
  if (cap_used <= max_cap_ && committed > 0 && seconds > 0.0) {
    CapTiming& timing = timing_[cap_used];
    ++timing.rounds;
    // A running mean at first, then an EWMA, as for the acceptance.
    const double rate = std::max(params_.t_alpha, 1.0 / static_cast<double>(timing.rounds));
    const double ms = seconds * 1000.0;
    timing.ms_per_round += rate * (ms - timing.ms_per_round);
    timing.tokens_per_round += rate * (committed - timing.tokens_per_round);
    // What the curves say this round cost: all its drafting, the rows it verified.
    const int rows = round.verified + 1;
    const double modelled = curves_.drafter(cap_used, context_) + curves_.verify(rows) +
                            curves_.depth(rows, context_) + curves_.overhead_ms;
    timing.modelled_ms_per_round += rate * (modelled - timing.modelled_ms_per_round);
    timing.last_round = round_;
    // The correction scales the modelled costs only: acceptance is the estimate p's business, and
    // folding its noise in here would make every unobserved cap (parking included) look better
    // after a lucky streak.
    const double timing_ratio = timing.modelled_ms_per_round / timing.ms_per_round;
    correction_ += params_.correction_rate * (timing_ratio - correction_);
  }
  // A probe decides at once whether to leave the parked state. Probes that do not end it, each
  // a round at a loss, grow rarer: at once when the draft was rejected, and also when it was
  // accepted but cap 1's own measured rate (probes count as cap-1 rounds) already prices it
  // below plain steps. Only an accepted probe while that rate is still unmeasured brings the
  // probes back to probe_every, so that a drafter which starts to pay is measured soon.
  if (cap_ == 0 && probing_) {
    repick();
    if (cap_ == 0) {
      const bool cap1_measured = timing_[1].rounds >= params_.min_rounds_observed;
      probe_gap_ = round.accepted > 0 && !cap1_measured
                       ? params_.probe_every
                       : std::min<int64_t>(2 * probe_gap_, params_.max_probe_every);
    }
  }
}

LookupLoadCap::LookupLoadCap(CostCurves curves, int ceiling)
    : curves_(std::move(curves)), ceiling_(ceiling) {}

int LookupLoadCap::drafts_to_verify(const std::vector<double>& survival, int offered) {
  if (offered <= 0) return 0;
  const int best = derive_cap(curves_, offered, survival, context_, load_);
  const auto rate = [&](int cap) {
    return expected_committed(survival, 0.0, cap) / curves_.batch_round_ms(cap, context_, load_);
  };
  return best > 0 && rate(best) >= kPlainMargin * rate(0) ? best : 0;
}

CapPolicyFactory make_lookup_cap_policy_factory(CostCurves curves) {
  // Lookup drafts cost nothing to make, whichever drafter's calibration the curves come from.
  curves.drafter_ms.clear();
  return [curves = std::move(curves)](const DecodeOptions& options) -> std::unique_ptr<CapPolicy> {
    const int ceiling = lookup_cap_ceiling(options);
    const bool pinned = options.mode == DecodeMode::lookup && options.max_draft;
    if (curves.empty() || pinned || !options.confidence_schedule) {
      return std::make_unique<FixedCap>(ceiling);
    }
    return std::make_unique<LookupLoadCap>(curves, ceiling);
  };
}

CapPolicyFactory make_cap_policy_factory(CostCurves curves, int max_cap, bool allow_parking) {
  std::shared_ptr<DraftScheduler> scheduler =
      curves.empty() ? nullptr : std::make_shared<DraftScheduler>(curves, max_cap);
  return [curves = std::move(curves), max_cap, allow_parking,
          scheduler](const DecodeOptions& options) -> std::unique_ptr<CapPolicy> {
    constexpr int kUncalibratedCap = 2;
    if (options.max_draft && !options.auto_cap)
      return std::make_unique<FixedCap>(*options.max_draft);
    if (curves.empty()) return std::make_unique<FixedCap>(kUncalibratedCap);
    if (options.auto_cap) {
      AutoCapController::Params params;
      params.allow_parking = allow_parking;
      params.confidence_schedule = options.confidence_schedule;
      return std::make_unique<AutoCapController>(curves, max_cap, params);
    }
    return std::make_unique<DerivedCap>(scheduler, options.confidence_schedule);
  };
}

}  // namespace dspark
