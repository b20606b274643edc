// Decode attention: one query row against a KV cache of `context` positions, the per-layer,
// per-token cost of causal_attention; BM_RowsAttention: several rows after a context. Shapes:
// SmolLM2-135M (9 query heads, 3 KV heads, head_dim 64) and a wide-group one (16 query heads, 2 KV
// heads, head_dim 128). kv_bits: an fp32 or an f16 cache. BM_DecodeAttention reads one cache over
// and over, from L2 or L3; BM_DecodeAttentionFromMemory reads many in turn, as a model's decode
// step reads its layers' caches, each pushed out of the CPU caches by the others (and by the
// weights) since the step before; BM_RowsAttentionFromMemory does the same for a verify's rows;
// BM_DraftBlockAttention times a drafter's block over its context (block_attention).
#include <benchmark/benchmark.h>

#include <algorithm>
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

// kv_bits 16: an f16 cache, else fp32.
dspark::kernels::KvType kv_type_of(int64_t bits) {
  return bits == 16 ? dspark::kernels::KvType::f16 : dspark::kernels::KvType::f32;
}

// The cache as the model stores it: fp32, or f16 (kernels::store_kv).
struct BenchCache {
  dspark::kernels::KvType type;
  std::vector<uint8_t> keys, values;

  BenchCache(dspark::kernels::KvType kv_type, int64_t n) : type(kv_type) {
    const int64_t bytes = n * dspark::kernels::kv_type_bytes(kv_type);
    keys.resize(bytes);
    values.resize(bytes);
    dspark::kernels::store_kv(kv_type, random_values(n, 2).data(), n, keys.data());
    dspark::kernels::store_kv(kv_type, random_values(n, 3).data(), n, values.data());
  }
};

void BM_DecodeAttention(benchmark::State& state) {
  const int64_t context = state.range(0), q_heads = state.range(1), kv_heads = state.range(2),
                dim = state.range(3);
  const auto kv_type = kv_type_of(state.range(4));
  const std::vector<float> q = random_values(q_heads * dim, 1);
  const BenchCache cache(kv_type, context * kv_heads * dim);
  std::vector<float> out(q_heads * dim);
  const dspark::kernels::AttentionSequence sequence{
      q.data(), 1, cache.keys.data(), cache.values.data(), context - 1, out.data(), kv_type};
  for (auto _ : state) {
    dspark::kernels::causal_attention_batch(&sequence, 1, q_heads, kv_heads, dim, 1.0f / 8.0f);
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["cache_GBps"] = benchmark::Counter(
      2.0 * context * kv_heads * dim * static_cast<double>(dspark::kernels::kv_type_bytes(kv_type)),
      benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_DecodeAttention)
    ->ArgNames({"context", "q_heads", "kv_heads", "dim", "kv_bits"})
    ->ArgsProduct({{16, 128, 512, 2048, 8192, 32768}, {9}, {3}, {64}, {32, 16}})
    ->Args({2048, 16, 2, 128, 32})
    ->Args({32768, 16, 2, 128, 32})
    ->Args({32768, 16, 2, 128, 16})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// `rows` query rows (1: a decode step; more: a verify) after `context - rows` positions, reading
// enough caches in turn that together they are well past any L3 (at least 128 MiB).
void attention_from_memory(benchmark::State& state, int64_t context, int64_t rows,
                           dspark::kernels::KvType kv_type) {
  const int64_t q_heads = 9, kv_heads = 3, dim = 64;
  const int64_t n = context * kv_heads * dim;
  const int64_t cache_bytes = 2 * n * dspark::kernels::kv_type_bytes(kv_type);
  const int64_t layers = std::max<int64_t>(30, (int64_t{128} << 20) / cache_bytes + 1);
  const std::vector<float> q = random_values(rows * q_heads * dim, 1);
  std::vector<BenchCache> caches;
  for (int64_t l = 0; l < layers; ++l) caches.emplace_back(kv_type, n);
  std::vector<float> out(rows * q_heads * dim);
  int64_t layer = 0;
  for (auto _ : state) {
    const BenchCache& cache = caches[layer];
    const dspark::kernels::AttentionSequence sequence{
        q.data(),   rows,   cache.keys.data(), cache.values.data(), context - rows,
        out.data(), kv_type};
    dspark::kernels::causal_attention_batch(&sequence, 1, q_heads, kv_heads, dim, 1.0f / 8.0f);
    benchmark::DoNotOptimize(out.data());
    layer = (layer + 1) % layers;
  }
  state.counters["cache_GBps"] = benchmark::Counter(static_cast<double>(cache_bytes),
                                                    benchmark::Counter::kIsIterationInvariantRate);
}

void BM_DecodeAttentionFromMemory(benchmark::State& state) {
  attention_from_memory(state, state.range(0), 1, kv_type_of(state.range(1)));
}
BENCHMARK(BM_DecodeAttentionFromMemory)
    ->ArgNames({"context", "kv_bits"})
    ->ArgsProduct({{512, 2048, 8192}, {16, 32}})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// A verify's rows, each layer's cache read from memory as in a decoding model.
void BM_RowsAttentionFromMemory(benchmark::State& state) {
  attention_from_memory(state, state.range(0), state.range(1), kv_type_of(state.range(2)));
}
BENCHMARK(BM_RowsAttentionFromMemory)
    ->ArgNames({"context", "rows", "kv_bits"})
    ->ArgsProduct({{2048, 8192}, {2, 3, 4, 8, 16}, {16}})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// Rows after a context: a verify of a few rows, or a chunk of a long prompt's prefill (the rows of
// one call share the context's key blocks).
void BM_RowsAttention(benchmark::State& state) {
  const int64_t past = state.range(0), rows = state.range(1), q_heads = 9, kv_heads = 3, dim = 64;
  const auto kv_type = kv_type_of(state.range(2));
  const std::vector<float> q = random_values(rows * q_heads * dim, 1);
  const BenchCache cache(kv_type, (past + rows) * kv_heads * dim);
  std::vector<float> out(rows * q_heads * dim);
  const dspark::kernels::AttentionSequence sequence{
      q.data(), rows, cache.keys.data(), cache.values.data(), past, out.data(), kv_type};
  for (auto _ : state) {
    dspark::kernels::causal_attention_batch(&sequence, 1, q_heads, kv_heads, dim, 1.0f / 8.0f);
    benchmark::DoNotOptimize(out.data());
  }
}
BENCHMARK(BM_RowsAttention)
    ->ArgNames({"past", "rows", "kv_bits"})
    ->ArgsProduct({{512}, {2, 4, 8}, {32, 16}})
    ->Args({4096, 8, 32})
    ->Args({4096, 8, 16})
    ->Args({8192, 256, 32})
    ->Args({8192, 256, 16})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// A drafter's block (DSpark: 7 rows, bidirectional) over its fp32 context of `past` positions,
// the default model's head shape; the context's layers are read in turn from memory, as drafting
// after a target step finds them.
void BM_DraftBlockAttention(benchmark::State& state) {
  const int64_t past = state.range(0), rows = state.range(1), q_heads = 9, kv_heads = 3, dim = 64;
  const int64_t n = past * kv_heads * dim;
  const int64_t layers = std::max<int64_t>(4, (int64_t{128} << 20) / (8 * n) + 1);
  std::vector<std::vector<float>> keys, values;
  for (int64_t l = 0; l < layers; ++l) {
    keys.push_back(random_values(n, 2 + 2 * l));
    values.push_back(random_values(n, 3 + 2 * l));
  }
  const std::vector<float> q = random_values(rows * q_heads * dim, 1);
  const std::vector<float> block_keys = random_values(rows * kv_heads * dim, 4);
  const std::vector<float> block_values = random_values(rows * kv_heads * dim, 5);
  std::vector<float> out(rows * q_heads * dim);
  const dspark::kernels::BlockAttentionSpec spec{q_heads, kv_heads, dim, false, 0, 1.0f / 8.0f};
  int64_t layer = 0;
  for (auto _ : state) {
    dspark::kernels::block_attention(spec, q.data(), {0, rows}, keys[layer].data(),
                                     values[layer].data(), past, block_keys.data(),
                                     block_values.data(), rows, out.data());
    benchmark::DoNotOptimize(out.data());
    layer = (layer + 1) % layers;
  }
}
BENCHMARK(BM_DraftBlockAttention)
    ->ArgNames({"past", "rows"})
    ->ArgsProduct({{512, 3072, 8192}, {7}})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
