// NaN, infinite and out-of-range sampling parameters are refused by name, and NaN or infinite
// logits never yield garbage tokens.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "base/error.h"
#include "engine/sampler.h"

namespace dspark {
namespace {

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

std::string error_of(const SamplingParams& params) {
  try {
    check_sampling_params(params);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(SamplingGuards, BadParametersAreRefusedByName) {
  SamplingParams p;
  EXPECT_EQ(error_of(p), "(no error)");
  p.temperature = kNan;
  EXPECT_EQ(error_of(p), "sampling parameter temperature is nan; it must be a finite number >= 0");
  p = {};
  p.temperature = kInf;
  EXPECT_EQ(error_of(p), "sampling parameter temperature is inf; it must be a finite number >= 0");
  p = {};
  p.top_p = kNan;
  EXPECT_EQ(error_of(p), "sampling parameter top_p is nan; it must be in [0, 1]");
  p = {};
  p.top_p = 1.5f;
  EXPECT_EQ(error_of(p), "sampling parameter top_p is 1.5; it must be in [0, 1]");
  p = {};
  p.top_k = -1;
  EXPECT_EQ(error_of(p), "sampling parameter top_k is -1; it must be >= 0");
  p = {};
  p.min_p = kNan;
  EXPECT_EQ(error_of(p), "sampling parameter min_p is nan; it must be in [0, 1]");
  p = {};
  p.repetition_penalty = 0.0f;
  EXPECT_EQ(error_of(p),
            "sampling parameter repetition_penalty is 0; it must be a finite number > 0");
  p = {};
  p.presence_penalty = -kInf;
  EXPECT_EQ(error_of(p), "sampling parameter presence_penalty is -inf; it must be finite");
  p = {};
  p.frequency_penalty = kNan;
  EXPECT_EQ(error_of(p), "sampling parameter frequency_penalty is nan; it must be finite");
  p = {};
  p.logit_bias = {{3, kNan}};
  EXPECT_EQ(error_of(p), "sampling parameter logit_bias for token 3 is NaN");
}

TEST(SamplingGuards, NanLogitsNeverWin) {
  std::vector<float> logits = {kNan, 1.0f, 3.0f, kNan, 2.0f};
  EXPECT_EQ(argmax(logits.data(), 5), 2);
  SamplingParams p;
  p.temperature = 1.0f;
  const TokenDistribution d = target_distribution(p, logits.data(), 5);
  EXPECT_EQ(d.ids, (std::vector<int32_t>{1, 2, 4}));
  double total = 0.0;
  for (float prob : d.probs) {
    EXPECT_TRUE(std::isfinite(prob));
    total += prob;
  }
  EXPECT_NEAR(total, 1.0, 1e-6);
  std::vector<float> all_nan(4, kNan);
  EXPECT_THROW(argmax(all_nan.data(), 4), Error);
  EXPECT_THROW(target_distribution(p, all_nan.data(), 4), Error);
}

TEST(SamplingGuards, InfiniteLogitsShareTheMass) {
  std::vector<float> logits = {1.0f, kInf, 0.0f, kInf};
  SamplingParams p;
  p.temperature = 0.7f;
  const TokenDistribution d = target_distribution(p, logits.data(), 4);
  ASSERT_EQ(d.ids.size(), 2u);
  EXPECT_EQ(d.ids[0], 1);
  EXPECT_EQ(d.ids[1], 3);
  EXPECT_FLOAT_EQ(d.probs[0], 0.5f);
  EXPECT_FLOAT_EQ(d.probs[1], 0.5f);
  Rng rng(5);
  TokenCounts counts;
  for (int i = 0; i < 20; ++i) {
    std::vector<float> row = logits;
    const int32_t id = sample_token(p, counts, row.data(), 4, rng);
    EXPECT_TRUE(id == 1 || id == 3) << id;
  }
}

}  // namespace
}  // namespace dspark
