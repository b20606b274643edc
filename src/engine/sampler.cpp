#include "engine/sampler.h"

#include <emmintrin.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "base/error.h"
#include "kernels/ops.h"

namespace dspark {

float TokenDistribution::prob_of(int32_t id) const {
  // A distribution listed by id without gaps up to `id` holds it at index id (ids are distinct);
  // otherwise a scan.
  if (id >= 0 && static_cast<size_t>(id) < ids.size() && ids[id] == id) return probs[id];
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] == id) return probs[i];
  }
  return 0.0f;
}

void TokenCounts::remove(int32_t id) {
  auto found = counts_.find(id);
  if (found == counts_.end()) return;
  --total_;
  if (--found->second == 0) counts_.erase(found);
}

void check_sampling_params(const SamplingParams& params) {
  auto refuse = [](const char* name, double value, const char* range) {
    fail("sampling parameter {} is {}; it must be {}", name, value, range);
  };
  if (!std::isfinite(params.temperature) || params.temperature < 0.0f) {
    refuse("temperature", params.temperature, "a finite number >= 0");
  }
  if (!(params.top_p >= 0.0f && params.top_p <= 1.0f)) refuse("top_p", params.top_p, "in [0, 1]");
  if (params.top_k < 0) refuse("top_k", params.top_k, ">= 0");
  if (!(params.min_p >= 0.0f && params.min_p <= 1.0f)) refuse("min_p", params.min_p, "in [0, 1]");
  if (!std::isfinite(params.repetition_penalty) || params.repetition_penalty <= 0.0f) {
    refuse("repetition_penalty", params.repetition_penalty, "a finite number > 0");
  }
  if (!std::isfinite(params.presence_penalty)) {
    refuse("presence_penalty", params.presence_penalty, "finite");
  }
  if (!std::isfinite(params.frequency_penalty)) {
    refuse("frequency_penalty", params.frequency_penalty, "finite");
  }
  for (const auto& [id, bias] : params.logit_bias) {
    if (std::isnan(bias)) fail("sampling parameter logit_bias for token {} is NaN", id);
  }
  if (params.min_tokens < 0) refuse("min_tokens", static_cast<double>(params.min_tokens), ">= 0");
}

void adjust_logits(const SamplingParams& params, const TokenCounts& counts, float* logits,
                   int64_t vocab) {
  for (const auto& [id, bias] : params.logit_bias) {
    if (id >= 0 && id < vocab) logits[id] += bias;
  }
  if (counts.total() < params.min_tokens) {
    for (const int32_t id : params.end_ids) {
      if (id >= 0 && id < vocab) logits[id] = -std::numeric_limits<float>::infinity();
    }
  }
  const bool repetition = params.repetition_penalty != 1.0f;
  if (!repetition && params.presence_penalty == 0.0f && params.frequency_penalty == 0.0f) return;
  for (const auto& [id, count] : counts.counts()) {
    if (id < 0 || id >= vocab) continue;
    float& logit = logits[id];
    if (repetition) {
      logit = logit > 0 ? logit / params.repetition_penalty : logit * params.repetition_penalty;
    }
    logit -= params.presence_penalty + params.frequency_penalty * static_cast<float>(count);
  }
}

// Two passes over the logits in SSE2 vectors (every x86-64 CPU has them), 8x faster than one scalar
// pass with its chain of compares (37 us for the default model's 49,152 logits): the largest value
// that is not NaN (maxps keeps its second operand when the first is NaN), then the first index
// holding it. The same index as the scalar definition: the first of the largest values, NaN
// skipped.
int32_t argmax(const float* logits, int64_t vocab) {
  if (vocab <= 0) return 0;
  constexpr int kAccumulators = 4;
  __m128 peaks[kAccumulators];
  for (__m128& peak : peaks) peak = _mm_set1_ps(-std::numeric_limits<float>::infinity());
  int64_t i = 0;
  for (; i + 4 * kAccumulators <= vocab; i += 4 * kAccumulators) {
    for (int k = 0; k < kAccumulators; ++k) {
      peaks[k] = _mm_max_ps(_mm_loadu_ps(logits + i + 4 * k), peaks[k]);
    }
  }
  alignas(16) float lanes[4];
  _mm_store_ps(lanes, _mm_max_ps(_mm_max_ps(peaks[0], peaks[1]), _mm_max_ps(peaks[2], peaks[3])));
  float peak = lanes[0];
  for (int l = 1; l < 4; ++l) peak = lanes[l] > peak ? lanes[l] : peak;
  for (; i < vocab; ++i) peak = logits[i] > peak ? logits[i] : peak;
  const __m128 wanted = _mm_set1_ps(peak);
  int64_t j = 0;
  for (; j + 4 <= vocab; j += 4) {
    const int equal = _mm_movemask_ps(_mm_cmpeq_ps(_mm_loadu_ps(logits + j), wanted));
    if (equal != 0) return static_cast<int32_t>(j + __builtin_ctz(static_cast<unsigned>(equal)));
  }
  for (; j < vocab; ++j) {
    if (logits[j] == peak) return static_cast<int32_t>(j);
  }
  fail("sampling: every logit is NaN");
}

// A least-significant-digit radix sort (stable passes, the four 8-bit digits' counts taken in one
// read): truncation may order up to the whole vocabulary, and std::sort with a comparison took
// 5-6 ms for the default model's 49,152 tokens, longer than a forward. Weights are non-negative
// and not NaN, so their bits order as unsigned integers.
void order_by_weight(const float* weights, std::vector<int32_t>& ids) {
  const int64_t n = static_cast<int64_t>(ids.size());
  constexpr int64_t kComparisonSortUpTo = 1024;  // below this the passes' counts cost more
  if (n <= kComparisonSortUpTo) {
    std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
      return weights[a] > weights[b] || (weights[a] == weights[b] && a < b);
    });
    return;
  }
  thread_local std::vector<uint32_t> keys, next_keys;
  thread_local std::vector<int32_t> next_ids;
  keys.resize(n);
  next_keys.resize(n);
  next_ids.resize(n);
  std::array<std::array<int64_t, 257>, 4> starts{};
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits = 0;
    std::memcpy(&bits, &weights[ids[i]], sizeof(bits));
    const uint32_t key = ~bits;  // descending
    keys[i] = key;
    for (int pass = 0; pass < 4; ++pass) ++starts[pass][((key >> (8 * pass)) & 0xFF) + 1];
  }
  for (int pass = 0; pass < 4; ++pass) {
    const int shift = 8 * pass;
    std::array<int64_t, 257>& start = starts[pass];
    if (start[((keys[0] >> shift) & 0xFF) + 1] == n) continue;  // one digit: order unchanged
    for (int d = 0; d < 256; ++d) start[d + 1] += start[d];
    for (int64_t i = 0; i < n; ++i) {
      const int64_t to = start[(keys[i] >> shift) & 0xFF]++;
      next_keys[to] = keys[i];
      next_ids[to] = ids[i];
    }
    keys.swap(next_keys);
    ids.swap(next_ids);
  }
}

namespace {

// Σ weights in double over 8 interleaved partial sums, added pairwise at the end: a fixed order
// whose additions do not each wait for the one before.
double sum_of_weights(const float* weights, int64_t n) {
  std::array<double, 8> partial{};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int k = 0; k < 8; ++k) partial[k] += weights[i + k];
  }
  for (; i < n; ++i) partial[i & 7] += weights[i];
  return ((partial[0] + partial[1]) + (partial[2] + partial[3])) +
         ((partial[4] + partial[5]) + (partial[6] + partial[7]));
}

// The passes below compare 4 weights at a time in SSE2 (every x86-64 CPU has it): a scalar loop
// with a branch per weight took most of a truncated distribution's time.
int64_t count_at_least(const float* weights, int64_t n, float floor) {
  const __m128 floors = _mm_set1_ps(floor);
  // Each lane subtracts its compare's all-ones (-1) when in; 2^31 - 1 per lane is far past a
  // vocabulary.
  __m128i lanes = _mm_setzero_si128();
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    lanes = _mm_sub_epi32(lanes, _mm_castps_si128(_mm_cmpge_ps(_mm_loadu_ps(weights + i), floors)));
  }
  alignas(16) int32_t counts[4];
  _mm_store_si128(reinterpret_cast<__m128i*>(counts), lanes);
  int64_t count = int64_t{counts[0]} + counts[1] + counts[2] + counts[3];
  for (; i < n; ++i) count += weights[i] >= floor ? 1 : 0;
  return count;
}

// The summed weight of those at least `floor`, in double lanes: an estimate, in no fixed order.
double mass_at_least(const float* weights, int64_t n, float floor) {
  const __m128 floors = _mm_set1_ps(floor);
  __m128d low = _mm_setzero_pd(), high = _mm_setzero_pd();
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const __m128 values = _mm_loadu_ps(weights + i);
    const __m128 kept = _mm_and_ps(values, _mm_cmpge_ps(values, floors));
    low = _mm_add_pd(low, _mm_cvtps_pd(kept));
    high = _mm_add_pd(high, _mm_cvtps_pd(_mm_movehl_ps(kept, kept)));
  }
  alignas(16) double lanes[2];
  _mm_store_pd(lanes, _mm_add_pd(low, high));
  double mass = lanes[0] + lanes[1];
  for (; i < n; ++i) mass += weights[i] >= floor ? weights[i] : 0.0f;
  return mass;
}

// The ids of the weights at least `floor`, ascending.
void ids_at_least(const float* weights, int64_t n, float floor, std::vector<int32_t>& ids) {
  ids.clear();
  const __m128 floors = _mm_set1_ps(floor);
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    for (int in = _mm_movemask_ps(_mm_cmpge_ps(_mm_loadu_ps(weights + i), floors)); in != 0;
         in &= in - 1) {
      ids.push_back(static_cast<int32_t>(i + __builtin_ctz(static_cast<unsigned>(in))));
    }
  }
  for (; i < n; ++i) {
    if (weights[i] >= floor) ids.push_back(static_cast<int32_t>(i));
  }
}

// ids[i] = the i-th token of positive weight and probs[i] its weight over `total`, in id order.
void whole_distribution(const float* weights, int64_t vocab, double total,
                        TokenDistribution& distribution) {
  const double inverse_total = 1.0 / total;
  if (count_at_least(weights, vocab, std::numeric_limits<float>::denorm_min()) == vocab) {
    // Every weight positive, the usual case: loops the compiler vectorises.
    distribution.ids.resize(vocab);
    std::iota(distribution.ids.begin(), distribution.ids.end(), 0);
    distribution.probs.resize(vocab);
    for (int64_t i = 0; i < vocab; ++i) {
      distribution.probs[i] = static_cast<float>(weights[i] * inverse_total);
    }
    return;
  }
  ids_at_least(weights, vocab, std::numeric_limits<float>::denorm_min(), distribution.ids);
  distribution.probs.resize(distribution.ids.size());
  for (size_t i = 0; i < distribution.ids.size(); ++i) {
    distribution.probs[i] = static_cast<float>(weights[distribution.ids[i]] * inverse_total);
  }
}

// weights[i] = exp((logits[i] - peak) · scale) (0 for NaN) from kernels::softmax_weights; with
// +infinity logits, or a scale so large that it overflowed, the largest logits share the mass.
// peak is the largest logit, not -infinity.
const float* softmax_weights_of(const float* logits, int64_t vocab, float peak, float scale) {
  thread_local std::vector<float> weights;
  weights.resize(vocab);
  if (std::isinf(peak) || std::isinf(scale)) {
    for (int64_t i = 0; i < vocab; ++i) weights[i] = logits[i] == peak ? 1.0f : 0.0f;
  } else {
    kernels::softmax_weights(logits, vocab, peak, scale, weights.data());
  }
  return weights.data();
}

// The largest logit; fails when there is none that is not NaN.
float peak_logit(const float* logits, int64_t vocab) {
  if (vocab <= 0) fail("sampling: there are no logits");
  return logits[argmax(logits, vocab)];  // fails when every logit is NaN
}

}  // namespace

TokenDistribution target_distribution(const SamplingParams& params, const float* logits,
                                      int64_t vocab) {
  TokenDistribution distribution;
  target_distribution(params, logits, vocab, distribution);
  return distribution;
}

void target_distribution(const SamplingParams& params, const float* logits, int64_t vocab,
                         TokenDistribution& distribution) {
  check_sampling_params(params);
  if (params.greedy()) fail("target_distribution needs a temperature above 0");
  const float peak = peak_logit(logits, vocab);
  if (peak == -std::numeric_limits<float>::infinity()) {
    fail("sampling: no token has a finite logit");
  }
  const float* w = softmax_weights_of(logits, vocab, peak, 1.0f / params.temperature);
  const bool top_k = params.top_k > 0 && params.top_k < vocab;
  const bool top_p = params.top_p < 1.0f;
  const bool min_p = params.min_p > 0.0f;
  // Without truncation nothing needs an order: sample_from walks the tokens by id.
  double total = top_k ? 0.0 : sum_of_weights(w, vocab);
  if (!top_k && !top_p && !min_p) return whole_distribution(w, vocab, total, distribution);
  // Truncation keeps a prefix of the tokens by descending weight, ties by id. Only the tokens of
  // weight at least a floor are sorted, the highest floor of 1, 2^-4, 2^-8, ... that holds the
  // prefix: the top k need k tokens; top-p needs its share of the mass, with a margin far above
  // the sums' rounding; min-p alone keeps weights of at least min_p times the largest, which is 1.
  // The last floor, 2^-128, is below every positive weight (exp_block's least is e^-87).
  const auto holds_prefix = [&](float floor) {
    if (top_k) return count_at_least(w, vocab, floor) >= params.top_k;
    if (top_p) return mass_at_least(w, vocab, floor) >= params.top_p * total * (1.0 + 1e-9);
    return floor <= params.min_p;
  };
  constexpr int kLastFloorExponent = 128;
  int floor_exponent = 0;
  while (floor_exponent < kLastFloorExponent && !holds_prefix(std::ldexp(1.0f, -floor_exponent))) {
    floor_exponent += 4;
  }
  std::vector<int32_t> order;
  int64_t keep = 0;
  for (;;) {
    const float floor = std::ldexp(1.0f, -floor_exponent);
    ids_at_least(w, vocab, floor, order);
    order_by_weight(w, order);
    keep = static_cast<int64_t>(order.size());
    if (top_k) {
      keep = std::min<int64_t>(keep, params.top_k);
      total = 0.0;
      for (int64_t i = 0; i < keep; ++i) total += w[order[i]];
    }
    if (!top_p) break;
    double cumulative = 0.0;
    int64_t cut = -1;
    for (int64_t i = 0; i < keep; ++i) {
      cumulative += w[order[i]] / total;
      if (cumulative >= params.top_p) {
        cut = i + 1;
        break;
      }
    }
    // Short of top_p: the whole support (or all k) is kept, once every positive weight is in.
    if (cut > 0 || top_k || floor_exponent == kLastFloorExponent) {
      if (cut > 0) keep = cut;
      break;
    }
    floor_exponent = kLastFloorExponent;
  }
  if (min_p) {
    const double threshold = params.min_p * static_cast<double>(w[order[0]]);
    int64_t cut = 1;
    while (cut < keep && w[order[cut]] >= threshold) ++cut;
    keep = cut;
  }
  double kept_total = 0.0;
  for (int64_t i = 0; i < keep; ++i) kept_total += w[order[i]];
  const double inverse_total = 1.0 / kept_total;
  distribution.ids.assign(order.begin(), order.begin() + keep);
  distribution.probs.resize(keep);
  for (int64_t i = 0; i < keep; ++i) {
    distribution.probs[i] = static_cast<float>(w[order[i]] * inverse_total);
  }
}

namespace {

// log Σ exp(logits - peak) over the vocabulary: the log-softmax's normaliser, from the sampling
// weights summed in double. 0 when no logit is finite.
float log_normaliser(const float* logits, int64_t vocab, float peak) {
  if (peak == -std::numeric_limits<float>::infinity()) return 0.0f;
  const float* weights = softmax_weights_of(logits, vocab, peak, 1.0f);
  return static_cast<float>(std::log(sum_of_weights(weights, vocab)));
}

}  // namespace

LogSoftmax::LogSoftmax(const float* logits, int64_t vocab)
    : logits_(logits),
      vocab_(vocab),
      peak_(peak_logit(logits, vocab)),
      log_total_(log_normaliser(logits, vocab, peak_)) {}

std::vector<TokenLogprob> LogSoftmax::top(int count) const {
  const float* logits = logits_;
  const int64_t vocab = vocab_;
  const float peak = peak_;
  count = static_cast<int>(std::min<int64_t>(count, vocab));
  if (count <= 0) return {};
  // The candidates: logits within 1, 2, 4, ... of the peak, until there are `count` of them (NaN
  // is never one), then every logit that is not NaN.
  float floor = -std::numeric_limits<float>::infinity();
  for (float below = 1.0f; below < 1e30f; below *= 2.0f) {
    if (count_at_least(logits, vocab, peak - below) >= count) {
      floor = peak - below;
      break;
    }
  }
  std::vector<int32_t> order;
  ids_at_least(logits, vocab, floor, order);
  const auto higher = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  const int kept = static_cast<int>(std::min<size_t>(count, order.size()));
  std::partial_sort(order.begin(), order.begin() + kept, order.end(), higher);
  std::vector<TokenLogprob> result(kept);
  for (int i = 0; i < kept; ++i) {
    result[i] = {order[i], of(order[i])};
  }
  return result;
}

int32_t sample_from(const TokenDistribution& distribution, double uniform) {
  double cumulative = 0.0;
  for (size_t i = 0; i < distribution.ids.size(); ++i) {
    cumulative += distribution.probs[i];
    if (uniform < cumulative) return distribution.ids[i];
  }
  return distribution.ids.back();
}

int32_t sample_token(const SamplingParams& params, const TokenCounts& counts, float* logits,
                     int64_t vocab, Rng& rng) {
  check_sampling_params(params);
  adjust_logits(params, counts, logits, vocab);
  if (params.greedy()) return argmax(logits, vocab);
  return sample_from(target_distribution(params, logits, vocab), rng.uniform());
}

}  // namespace dspark
