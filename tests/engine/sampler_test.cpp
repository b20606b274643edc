#include "engine/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <vector>

#include "base/error.h"
#include "kernels/ops.h"

namespace dspark {
namespace {

// Upper critical value of chi-square with `df` degrees of freedom at significance 0.001
// (Wilson-Hilferty approximation; z = 3.09).
double chi_square_critical(int df) {
  const double z = 3.090232;
  const double k = df;
  const double term = 1.0 - 2.0 / (9.0 * k) + z * std::sqrt(2.0 / (9.0 * k));
  return k * term * term * term;
}

// The truncated distribution written out from its definition, independently of the sampler:
// softmax(logits / T), keep the k most likely, then the smallest prefix reaching top_p, then
// those with p >= min_p * p_max, renormalised.
std::map<int, double> reference_distribution(const std::vector<float>& logits, float temperature,
                                             int top_k, float top_p, float min_p) {
  std::vector<std::pair<double, int>> ranked;
  double total = 0;
  for (size_t i = 0; i < logits.size(); ++i) total += std::exp(logits[i] / temperature);
  for (size_t i = 0; i < logits.size(); ++i) {
    ranked.push_back({std::exp(logits[i] / temperature) / total, static_cast<int>(i)});
  }
  std::sort(ranked.begin(), ranked.end(), [](auto a, auto b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  });
  if (top_k > 0 && top_k < static_cast<int>(ranked.size())) ranked.resize(top_k);
  double kept = 0;
  for (auto& r : ranked) kept += r.first;
  for (auto& r : ranked) r.first /= kept;
  if (top_p < 1.0f) {
    double cumulative = 0;
    size_t cut = ranked.size();
    for (size_t i = 0; i < ranked.size(); ++i) {
      cumulative += ranked[i].first;
      if (cumulative >= top_p) {
        cut = i + 1;
        break;
      }
    }
    ranked.resize(cut);
  }
  if (min_p > 0.0f) {
    const double threshold = min_p * ranked[0].first;
    size_t cut = 1;
    while (cut < ranked.size() && ranked[cut].first >= threshold) ++cut;
    ranked.resize(cut);
  }
  kept = 0;
  for (auto& r : ranked) kept += r.first;
  std::map<int, double> result;
  for (auto& r : ranked) result[r.second] = r.first / kept;
  return result;
}

struct SamplingCase {
  float temperature;
  int top_k;
  float top_p;
  float min_p;
};

TEST(Sampler, EmpiricalFrequenciesMatchTruncatedTarget) {
  const std::vector<float> logits = {2.0f, 1.5f, 1.4f, 0.3f, -0.2f, 0.9f, -1.0f, 1.0f, 0.0f, 0.5f};
  const SamplingCase cases[] = {
      {1.0f, 0, 1.0f, 0.0f}, {0.7f, 0, 1.0f, 0.0f}, {1.5f, 4, 1.0f, 0.0f},
      {1.0f, 0, 0.8f, 0.0f}, {1.0f, 0, 1.0f, 0.3f}, {0.8f, 6, 0.9f, 0.1f},
  };
  for (const auto& c : cases) {
    SamplingParams params;
    params.temperature = c.temperature;
    params.top_k = c.top_k;
    params.top_p = c.top_p;
    params.min_p = c.min_p;
    const auto expected = reference_distribution(logits, c.temperature, c.top_k, c.top_p, c.min_p);
    Rng rng(42);
    TokenCounts none;
    const int draws = 40000;
    std::map<int, int> observed;
    for (int i = 0; i < draws; ++i) {
      std::vector<float> row = logits;
      ++observed[sample_token(params, none, row.data(), row.size(), rng)];
    }
    double chi_square = 0;
    for (const auto& [id, p] : expected) {
      const double e = p * draws;
      const double o = observed.count(id) ? observed[id] : 0;
      chi_square += (o - e) * (o - e) / e;
    }
    for (const auto& [id, count] : observed) {
      EXPECT_TRUE(expected.count(id)) << "token " << id << " is outside the truncated support";
    }
    const int df = static_cast<int>(expected.size()) - 1;
    if (df > 0) {
      EXPECT_LT(chi_square, chi_square_critical(df))
          << "T=" << c.temperature << " k=" << c.top_k << " p=" << c.top_p << " min_p=" << c.min_p;
    }
  }
}

TEST(Sampler, SeedReproducesAndDiffers) {
  const std::vector<float> logits = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f};
  SamplingParams params;
  params.temperature = 1.0f;
  auto run = [&](uint64_t seed) {
    Rng rng(seed);
    TokenCounts none;
    std::vector<int32_t> ids;
    for (int i = 0; i < 64; ++i) {
      std::vector<float> row = logits;
      ids.push_back(sample_token(params, none, row.data(), row.size(), rng));
    }
    return ids;
  };
  EXPECT_EQ(run(7), run(7));
  EXPECT_NE(run(7), run(8));
}

TEST(Sampler, GreedyTakesLowestIdOnTies) {
  std::vector<float> logits = {1.0f, 3.0f, 3.0f, 2.0f};
  EXPECT_EQ(argmax(logits.data(), 4), 1);
}

// argmax reads vectors in two passes: at every length and with NaNs, infinities, signed zeros and
// ties anywhere (within a vector, across vectors, in the tail), it is the first of the largest
// values that are not NaN, as one scalar pass defines it.
TEST(Sampler, ArgmaxIsTheFirstLargestValueThatIsNotNan) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const auto first_largest = [](const std::vector<float>& x) {
    int64_t best = -1;
    for (int64_t i = 0; i < static_cast<int64_t>(x.size()); ++i) {
      if (std::isnan(x[i])) continue;
      if (best < 0 || x[i] > x[best]) best = i;
    }
    return best;
  };
  std::mt19937 rng(5);
  const std::vector<float> specials = {nan, inf, -inf, 0.0f, -0.0f, 7.0f};
  for (int64_t n : {1, 2, 3, 4, 5, 15, 16, 17, 31, 33, 64, 70, 49152}) {
    for (int trial = 0; trial < 40; ++trial) {
      std::vector<float> x(n);
      std::uniform_int_distribution<int> small(-4, 4);
      for (float& v : x) v = static_cast<float>(small(rng));
      std::uniform_int_distribution<int64_t> at(0, n - 1);
      std::uniform_int_distribution<size_t> which(0, specials.size() - 1);
      for (int k = 0; k < 3; ++k) x[at(rng)] = specials[which(rng)];
      if (trial % 5 == 0) {
        for (float& v : x) v = trial % 10 == 0 ? -inf : nan;
        x[at(rng)] = trial % 10 == 0 ? -inf : -3.0f;
      }
      const int64_t want = first_largest(x);
      if (want < 0) {
        EXPECT_THROW(argmax(x.data(), n), Error) << "n=" << n << " trial " << trial;
      } else {
        ASSERT_EQ(argmax(x.data(), n), want) << "n=" << n << " trial " << trial;
      }
    }
  }
  std::vector<float> all_nan(37, nan);
  EXPECT_THROW(argmax(all_nan.data(), 37), Error);
}

// The candidates' order: descending weight, the lower id first among equals.
auto heavier_first(const std::vector<float>& w) {
  return [&w](int32_t a, int32_t b) { return w[a] > w[b] || (w[a] == w[b] && a < b); };
}

// target_distribution orders its candidates with a radix sort above 1,024 of them: the same order
// as sorting by descending weight with ties to the lower id, for every length, subset of the ids
// and mix of weights (zeros, denormals, ties, infinity).
TEST(Sampler, OrderByWeightIsTheComparisonSortsOrder) {
  const float inf = std::numeric_limits<float>::infinity();
  std::mt19937 rng(11);
  const std::vector<float> specials = {inf, 0.0f, 1e-40f, 1e-30f, 1.0f, 3e38f};
  for (int64_t n : {1, 2, 7, 1024, 1025, 4097, 49152}) {
    for (int trial = 0; trial < 6; ++trial) {
      std::vector<float> w(n);
      std::exponential_distribution<float> wide(0.1f);
      std::uniform_int_distribution<int> few(0, 3);
      for (float& v : w) v = trial % 2 == 0 ? std::exp(-wide(rng)) : static_cast<float>(few(rng));
      std::uniform_int_distribution<int64_t> at(0, n - 1);
      std::uniform_int_distribution<size_t> which(0, specials.size() - 1);
      for (int k = 0; k < 1 + n / 50; ++k) w[at(rng)] = specials[which(rng)];
      // Every id, or (odd trials past the first two) every third one.
      std::vector<int32_t> ids;
      for (int32_t id = 0; id < n; id += trial >= 2 && trial % 2 == 1 ? 3 : 1) ids.push_back(id);
      std::vector<int32_t> want = ids;
      std::sort(want.begin(), want.end(), heavier_first(w));
      order_by_weight(w.data(), ids);
      ASSERT_EQ(ids, want) << "n=" << n << " trial " << trial;
    }
  }
  std::vector<int32_t> none;
  order_by_weight(nullptr, none);
  EXPECT_TRUE(none.empty());
}

// On a vocabulary-sized row, every truncation keeps the prefix of the tokens by descending
// probability that its definition names, whatever floor the candidates were cut at: the
// distribution equals one built from a full sort of the same weights.
TEST(Sampler, TruncationOfALargeVocabularyKeepsTheDefinedPrefix) {
  const int64_t vocab = 49152;
  std::mt19937 rng(5);
  for (int trial = 0; trial < 4; ++trial) {
    std::vector<float> logits(vocab);
    std::normal_distribution<float> spread(0.0f, trial < 2 ? 2.0f : 6.0f);
    for (float& v : logits) v = spread(rng);
    for (int k = 0; k < 10; ++k) logits[rng() % vocab] += 10.0f;
    for (const SamplingCase c : {SamplingCase{0.7f, 40, 1.0f, 0.0f},
                                 {1.0f, 0, 0.95f, 0.0f},
                                 {1.0f, 0, 0.5f, 0.0f},
                                 {0.8f, 0, 1.0f, 0.05f},
                                 {1.2f, 2000, 0.99f, 0.01f},
                                 {1.0f, 0, 0.99999f, 0.0f}}) {
      SamplingParams params;
      params.temperature = c.temperature;
      params.top_k = c.top_k;
      params.top_p = c.top_p;
      params.min_p = c.min_p;
      const TokenDistribution d = target_distribution(params, logits.data(), vocab);
      // The same weights, every positive one sorted.
      std::vector<float> w(vocab);
      const float peak = *std::max_element(logits.begin(), logits.end());
      kernels::softmax_weights(logits.data(), vocab, peak, 1.0f / c.temperature, w.data());
      std::vector<int32_t> order;
      for (int32_t id = 0; id < vocab; ++id) {
        if (w[id] > 0.0f) order.push_back(id);
      }
      std::sort(order.begin(), order.end(), heavier_first(w));
      size_t keep = order.size();
      if (c.top_k > 0) keep = std::min<size_t>(keep, c.top_k);
      double total = 0.0;
      if (c.top_k > 0) {
        for (size_t i = 0; i < keep; ++i) total += w[order[i]];
      } else {
        for (int32_t id : order) total += w[id];
      }
      if (c.top_p < 1.0f) {
        double cumulative = 0.0;
        for (size_t i = 0; i < keep; ++i) {
          cumulative += w[order[i]] / total;
          if (cumulative >= c.top_p) {
            keep = i + 1;
            break;
          }
        }
      }
      if (c.min_p > 0.0f) {
        size_t cut = 1;
        while (cut < keep && w[order[cut]] >= c.min_p * static_cast<double>(w[order[0]])) ++cut;
        keep = cut;
      }
      order.resize(keep);
      EXPECT_EQ(d.ids, order) << "trial " << trial << " T=" << c.temperature << " k=" << c.top_k
                              << " p=" << c.top_p << " min_p=" << c.min_p;
      double sum = 0.0;
      for (float p : d.probs) sum += p;
      EXPECT_NEAR(sum, 1.0, 1e-5);
    }
  }
}

// prob_of finds an id wherever the list holds it: listed by id (its index when no id below it is
// missing), after a gap, in probability order, or absent (0).
TEST(Sampler, ProbOfFindsEveryListedId) {
  TokenDistribution by_id{{0, 1, 2, 4, 5}, {0.1f, 0.2f, 0.3f, 0.25f, 0.15f}};
  EXPECT_EQ(by_id.prob_of(1), 0.2f);
  EXPECT_EQ(by_id.prob_of(4), 0.25f);  // index 3: ids[4] is 5
  EXPECT_EQ(by_id.prob_of(5), 0.15f);
  EXPECT_EQ(by_id.prob_of(3), 0.0f);
  EXPECT_EQ(by_id.prob_of(9), 0.0f);
  EXPECT_EQ(by_id.prob_of(-1), 0.0f);
  TokenDistribution by_probability{{2, 0, 1}, {0.5f, 0.3f, 0.2f}};
  EXPECT_EQ(by_probability.prob_of(1), 0.2f);  // index 1 holds id 0
  EXPECT_EQ(by_probability.prob_of(2), 0.5f);
  EXPECT_EQ(by_probability.prob_of(0), 0.3f);
}

TEST(Sampler, Penalties) {
  SamplingParams params;
  params.repetition_penalty = 2.0f;
  params.presence_penalty = 0.5f;
  params.frequency_penalty = 0.25f;
  TokenCounts counts;
  counts.add(0);
  counts.add(1);
  counts.add(1);
  std::vector<float> logits = {4.0f, -2.0f, 1.0f};
  adjust_logits(params, counts, logits.data(), 3);
  EXPECT_FLOAT_EQ(logits[0], 4.0f / 2 - 0.5f - 0.25f);
  EXPECT_FLOAT_EQ(logits[1], -2.0f * 2 - 0.5f - 0.5f);
  EXPECT_FLOAT_EQ(logits[2], 1.0f);
}

TEST(Sampler, LogitBiasComesBeforeThePenalties) {
  SamplingParams params;
  params.repetition_penalty = 2.0f;
  params.logit_bias = {{0, 1.0f}, {2, -3.0f}, {5, 9.0f}};  // id 5 is outside the vocabulary
  EXPECT_TRUE(params.adjusts_logits());
  TokenCounts counts;
  counts.add(0);
  std::vector<float> logits = {3.0f, 1.0f, 1.0f};
  adjust_logits(params, counts, logits.data(), 3);
  EXPECT_FLOAT_EQ(logits[0], (3.0f + 1.0f) / 2);
  EXPECT_FLOAT_EQ(logits[1], 1.0f);
  EXPECT_FLOAT_EQ(logits[2], -2.0f);
}

TEST(Sampler, MinTokensBansTheEndIdsUntilEnoughTokens) {
  SamplingParams params;
  params.min_tokens = 2;
  params.end_ids = {1, 7};  // id 7 is outside the vocabulary
  EXPECT_TRUE(params.adjusts_logits());
  TokenCounts counts;
  counts.add(4);
  std::vector<float> logits = {0.5f, 3.0f, 1.0f};
  adjust_logits(params, counts, logits.data(), 3);
  EXPECT_EQ(logits[1], -std::numeric_limits<float>::infinity());
  EXPECT_EQ(argmax(logits.data(), 3), 2);
  counts.add(4);
  logits = {0.5f, 3.0f, 1.0f};
  adjust_logits(params, counts, logits.data(), 3);
  EXPECT_EQ(logits[1], 3.0f);
  counts.remove(4);
  EXPECT_EQ(counts.total(), 1);
  params.end_ids.clear();
  EXPECT_FALSE(params.adjusts_logits());
}

TEST(Sampler, Logprobs) {
  std::vector<float> logits = {0.0f, std::log(3.0f)};
  const LogSoftmax log_softmax(logits.data(), 2);
  EXPECT_NEAR(log_softmax.of(1), std::log(0.75), 1e-6);
  auto top = log_softmax.top(5);
  ASSERT_EQ(top.size(), 2u);
  EXPECT_EQ(top[0].id, 1);
  EXPECT_NEAR(top[1].logprob, std::log(0.25), 1e-6);
}

// On a vocabulary-sized row with ties and NaNs: the most likely tokens in order (ties to the lower
// id, NaN never), with log-probabilities within float rounding of a double log-softmax.
TEST(Sampler, TopLogprobsOfALargeVocabularyAreTheLargestLogits) {
  const int64_t vocab = 49152;
  std::mt19937 rng(9);
  for (float spread : {0.5f, 4.0f, 40.0f}) {
    std::vector<float> logits(vocab);
    std::normal_distribution<float> normal(0.0f, spread);
    for (float& v : logits) v = std::round(normal(rng) * 8.0f) / 8.0f;  // many ties
    for (int k = 0; k < 50; ++k) logits[rng() % vocab] = std::numeric_limits<float>::quiet_NaN();
    double total = 0.0;
    const float peak = logits[argmax(logits.data(), vocab)];
    for (float v : logits) total += std::isnan(v) ? 0.0 : std::exp(static_cast<double>(v - peak));
    std::vector<int32_t> order;
    for (int32_t id = 0; id < vocab; ++id) {
      if (!std::isnan(logits[id])) order.push_back(id);
    }
    std::sort(order.begin(), order.end(), heavier_first(logits));
    const LogSoftmax log_softmax(logits.data(), vocab);
    for (int count : {1, 5, 20}) {
      const std::vector<TokenLogprob> top = log_softmax.top(count);
      ASSERT_EQ(top.size(), static_cast<size_t>(count));
      for (int i = 0; i < count; ++i) {
        EXPECT_EQ(top[i].id, order[i]) << "spread " << spread << " rank " << i;
        const double want = logits[order[i]] - peak - std::log(total);
        EXPECT_NEAR(top[i].logprob, want, 1e-5 * std::max(1.0, std::fabs(want)));
      }
    }
    const int32_t last = order.back();
    EXPECT_NEAR(log_softmax.of(last), logits[last] - peak - std::log(total),
                1e-4 * (peak - logits[last] + 1.0));
  }
}

}  // namespace
}  // namespace dspark
