#include "engine/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <vector>

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

TEST(Sampler, Logprobs) {
  std::vector<float> logits = {0.0f, std::log(3.0f)};
  EXPECT_NEAR(logprob_of(logits.data(), 2, 1), std::log(0.75), 1e-6);
  auto top = top_logprobs(logits.data(), 2, 5);
  ASSERT_EQ(top.size(), 2u);
  EXPECT_EQ(top[0].id, 1);
  EXPECT_NEAR(top[1].logprob, std::log(0.25), 1e-6);
}

}  // namespace
}  // namespace dspark
