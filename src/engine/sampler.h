#pragma once
// Turning logits into the next token: logit bias, penalties, temperature, top-k, top-p, min-p,
// and seeded sampling. The order is vLLM's and llama.cpp's: logit bias -> penalties ->
// temperature -> top-k -> top-p -> min-p. The
// speculative verifier uses the same `target_distribution` for its acceptance test, so the
// distribution sampled here is exactly the one speculative decoding must reproduce.
#include <cstdint>
#include <random>
#include <unordered_map>
#include <utility>
#include <vector>

namespace dspark {

struct SamplingParams {
  float temperature = 0.0f;  // 0 = greedy (argmax, lowest id on ties)
  float top_p = 1.0f;
  int top_k = 0;  // 0 = off
  float min_p = 0.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;
  uint64_t seed = 0;
  int top_logprobs = 0;  // how many alternatives to report with each token (0 = none)
  std::vector<std::pair<int32_t, float>> logit_bias;  // (token id, added to its logit)
  // vLLM's min_tokens: until the generation holds this many tokens, `end_ids` (the ids that
  // would end it) cannot be chosen.
  int64_t min_tokens = 0;
  std::vector<int32_t> end_ids;

  bool greedy() const { return temperature <= 0.0f; }
  // Whether adjust_logits changes anything.
  bool adjusts_logits() const {
    return repetition_penalty != 1.0f || presence_penalty != 0.0f || frequency_penalty != 0.0f ||
           !logit_bias.empty() || (min_tokens > 0 && !end_ids.empty());
  }
};

// Throws dspark::Error naming the first parameter that is NaN, infinite or out of range
// (temperature >= 0, top_p in [0, 1], top_k >= 0, min_p in [0, 1], repetition_penalty > 0,
// finite presence / frequency penalties and logit biases). The sampling entry points call it.
void check_sampling_params(const SamplingParams& params);

// A truncated, renormalised distribution: token ids with their probabilities. With top-k, top-p
// or min-p the kept tokens are sorted by probability (descending, ties by id); without them every
// token of positive probability is listed by id.
struct TokenDistribution {
  std::vector<int32_t> ids;
  std::vector<float> probs;

  float prob_of(int32_t id) const;
};

// Counts of the tokens generated so far, for presence / frequency / repetition penalties.
class TokenCounts {
 public:
  void add(int32_t id) {
    ++counts_[id];
    ++total_;
  }
  void remove(int32_t id);
  const std::unordered_map<int32_t, int>& counts() const { return counts_; }
  int64_t total() const { return total_; }

 private:
  std::unordered_map<int32_t, int> counts_;
  int64_t total_ = 0;
};

// Adds the logit bias, then applies presence, frequency and repetition penalties in place
// (repetition as in HF / llama.cpp: positive logits divided, negative multiplied); while
// `counts` holds fewer than min_tokens tokens, end_ids become -infinity.
void adjust_logits(const SamplingParams& params, const TokenCounts& counts, float* logits,
                   int64_t vocab);

// Index of the largest logit; the lowest index wins ties. NaN logits never win; all NaN is an
// error.
int32_t argmax(const float* logits, int64_t vocab);

// Reorders `ids` (ascending on entry) by descending weight, the lower id first among equal
// weights; weights are non-negative and not NaN: the candidates' order in target_distribution.
void order_by_weight(const float* weights, std::vector<int32_t>& ids);

// The distribution sampling draws from, after temperature and truncation (penalties already
// applied). Requires temperature > 0. The weights are exp((logit - max) / T) from
// kernels::softmax_weights (the same bits on every ISA), summed in double. NaN logits count as
// -infinity; when some logits are +infinity, those share the probability.
TokenDistribution target_distribution(const SamplingParams& params, const float* logits,
                                      int64_t vocab);
// The same into `distribution`, reusing its storage: a vocabulary's two vectors (384 KiB for
// 49,152 tokens) allocated afresh each call cost more in page faults than the rest together.
void target_distribution(const SamplingParams& params, const float* logits, int64_t vocab,
                         TokenDistribution& distribution);

struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0.0f;
};
// The log-softmax of one row of logits: its peak and normaliser are found once (a pass over the
// vocabulary each), then read for the chosen token and for the most likely ones. The logits must
// outlive it.
class LogSoftmax {
 public:
  LogSoftmax(const float* logits, int64_t vocab);
  float of(int32_t id) const { return logits_[id] - peak_ - log_total_; }
  // The `count` most likely tokens (ties to the lower id) with their log-probs.
  std::vector<TokenLogprob> top(int count) const;

 private:
  const float* logits_;
  int64_t vocab_;
  float peak_;
  float log_total_;
};

// A seeded source of uniform draws; one per generation.
class Rng {
 public:
  explicit Rng(uint64_t seed) : engine_(seed) {}
  // Uniform in [0, 1).
  double uniform() { return std::uniform_real_distribution<double>(0.0, 1.0)(engine_); }

 private:
  std::mt19937_64 engine_;
};

// Draws one id from the distribution with the given uniform draw in [0, 1).
int32_t sample_from(const TokenDistribution& distribution, double uniform);

// The whole step: penalties (in place), then greedy or a seeded draw.
int32_t sample_token(const SamplingParams& params, const TokenCounts& counts, float* logits,
                     int64_t vocab, Rng& rng);

}  // namespace dspark
