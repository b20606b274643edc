// Decode attention: one query row against a KV cache of `context` positions, the per-layer,
// per-token cost of causal_attention; BM_RowsAttention: several rows after a context. Shapes:
// SmolLM2-135M (9 query heads, 3 KV heads, head_dim 64) and a wide-group one (16 query heads, 2 KV
// heads, head_dim 128).
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <vector>

#include "kernels/ops.h"

namespace {

std::vector<float> random_values(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(n);
  for (float& v : values) v = normal(rng);
  return values;
}

void BM_DecodeAttention(benchmark::State& state) {
  const int64_t context = state.range(0), q_heads = state.range(1), kv_heads = state.range(2),
                dim = state.range(3);
  const std::vector<float> q = random_values(q_heads * dim, 1);
  const std::vector<float> keys = random_values(context * kv_heads * dim, 2);
  const std::vector<float> values = random_values(context * kv_heads * dim, 3);
  std::vector<float> out(q_heads * dim);
  const float scale = 1.0f / 8.0f;
  for (auto _ : state) {
    dspark::kernels::causal_attention(q.data(), 1, q_heads, kv_heads, dim, keys.data(),
                                      values.data(), context - 1, scale, out.data());
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["cache_GBps"] = benchmark::Counter(2.0 * context * kv_heads * dim * sizeof(float),
                                                    benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_DecodeAttention)
    ->ArgNames({"context", "q_heads", "kv_heads", "dim"})
    ->Args({512, 9, 3, 64})
    ->Args({2048, 9, 3, 64})
    ->Args({8192, 9, 3, 64})
    ->Args({32768, 9, 3, 64})
    ->Args({2048, 16, 2, 128})
    ->Args({32768, 16, 2, 128})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// Rows after a context: a verify of a few rows, or a chunk of a long prompt's prefill (the rows of
// one call share the context's key blocks).
void BM_RowsAttention(benchmark::State& state) {
  const int64_t past = state.range(0), rows = state.range(1), q_heads = 9, kv_heads = 3, dim = 64;
  const std::vector<float> q = random_values(rows * q_heads * dim, 1);
  const std::vector<float> keys = random_values((past + rows) * kv_heads * dim, 2);
  const std::vector<float> values = random_values((past + rows) * kv_heads * dim, 3);
  std::vector<float> out(rows * q_heads * dim);
  for (auto _ : state) {
    dspark::kernels::causal_attention(q.data(), rows, q_heads, kv_heads, dim, keys.data(),
                                      values.data(), past, 1.0f / 8.0f, out.data());
    benchmark::DoNotOptimize(out.data());
  }
}
BENCHMARK(BM_RowsAttention)
    ->ArgNames({"past", "rows"})
    ->Args({512, 2})
    ->Args({512, 4})
    ->Args({512, 8})
    ->Args({4096, 8})
    ->Args({8192, 256})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
