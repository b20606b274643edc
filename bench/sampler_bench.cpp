// What a sampled token costs outside the forward: the target distribution (temperature, top-k,
// top-p, min-p) that plain decoding draws from and a sampled verify builds for every row, and the
// log-probabilities the APIs report, over a vocabulary of the default model's size (49,152).
//
//   sampler_bench --benchmark_filter=TargetDistribution
//
// The logits are synthetic and seeded: normal with σ = 3 plus 20 tokens raised by 12 ("peaked",
// most of the mass on a few tokens, as after a confident step), or σ = 1 alone ("flat", the mass
// spread, where top-p keeps thousands of tokens).
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "engine/sampler.h"

namespace {

constexpr int64_t kVocab = 49152;

std::vector<float> logits(bool peaked) {
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, peaked ? 3.0f : 1.0f);
  std::vector<float> out(kVocab);
  for (float& v : out) v = normal(rng);
  if (peaked) {
    for (int k = 0; k < 20; ++k) out[rng() % kVocab] += 12.0f;
  }
  return out;
}

// Args: peaked (1) or flat (0), then top_k, top_p and min_p in thousandths; temperature 0.7.
void BM_TargetDistribution(benchmark::State& state) {
  const std::vector<float> row = logits(state.range(0) != 0);
  dspark::SamplingParams params;
  params.temperature = 0.7f;
  params.top_k = static_cast<int>(state.range(1));
  params.top_p = static_cast<float>(state.range(2)) / 1000.0f;
  params.min_p = static_cast<float>(state.range(3)) / 1000.0f;
  dspark::TokenDistribution distribution;
  for (auto _ : state) {
    dspark::target_distribution(params, row.data(), kVocab, distribution);
    benchmark::DoNotOptimize(distribution.probs.data());
  }
  state.counters["kept"] = static_cast<double>(distribution.ids.size());
}
BENCHMARK(BM_TargetDistribution)
    ->ArgNames({"peaked", "top_k", "top_p", "min_p"})
    ->Args({1, 0, 1000, 0})
    ->Args({0, 0, 1000, 0})
    ->Args({1, 40, 950, 0})
    ->Args({1, 0, 950, 0})
    ->Args({0, 0, 950, 0})
    ->Args({1, 0, 1000, 50})
    ->Unit(benchmark::kMicrosecond);

// A token's log-probability and its 5 most likely alternatives (logprobs=true, top_logprobs=5).
void BM_Logprobs(benchmark::State& state) {
  const std::vector<float> row = logits(true);
  int32_t id = 0;
  for (auto _ : state) {
    const dspark::LogSoftmax log_softmax(row.data(), kVocab);
    benchmark::DoNotOptimize(log_softmax.of(id));
    benchmark::DoNotOptimize(log_softmax.top(5));
    id = (id + 7919) % kVocab;
  }
}
BENCHMARK(BM_Logprobs)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
