// causal_attention and a drafter's block_attention: every ISA equals the scalar reference bit for
// bit, each row is independent of the rows beside it in the call and of the thread count, and the
// result is attention (checked against a double-precision softmax).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "base/error.h"
#include "base/thread_pool.h"
#include "kernels/cpu/attention_impl.h"
#include "kernels/ops.h"
#include "kernels/quant.h"
#include "tensor/dtype.h"

namespace dspark::kernels {
namespace {

struct Shape {
  int64_t q_heads;
  int64_t kv_heads;
  int64_t head_dim;
};

struct Cache {
  Shape shape;
  std::vector<float> q, keys, values;
  float scale;

  // `rows` query rows over a cache of `positions` positions.
  Cache(Shape s, int64_t rows, int64_t positions, uint32_t seed) : shape(s) {
    std::mt19937 rng(seed);
    // Spread the scores so the softmax is neither flat nor one-hot.
    std::normal_distribution<float> normal(0.0f, 1.5f);
    auto fill = [&](std::vector<float>& v, int64_t n) {
      v.resize(n);
      for (float& x : v) x = normal(rng);
    };
    fill(q, rows * s.q_heads * s.head_dim);
    fill(keys, positions * s.kv_heads * s.head_dim);
    fill(values, positions * s.kv_heads * s.head_dim);
    scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  }

  std::vector<float> attend(Isa isa, int64_t first_row, int64_t rows, int64_t past) const {
    std::vector<float> out(rows * shape.q_heads * shape.head_dim);
    causal_attention_isa(isa, q.data() + first_row * shape.q_heads * shape.head_dim, rows,
                         shape.q_heads, shape.kv_heads, shape.head_dim, keys.data(), values.data(),
                         past, scale, out.data());
    return out;
  }
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// Shapes: 1-8 query heads per KV head, head_dim 64 and 128, plus sizes the SIMD kernels leave to
// the reference (40) or take in odd multiples of 16 (80).
const Shape kShapes[] = {{3, 3, 64},  {6, 3, 64},   {9, 3, 64}, {4, 1, 128}, {10, 2, 128},
                         {12, 2, 64}, {16, 2, 128}, {8, 1, 64}, {2, 2, 40},  {6, 2, 80}};

TEST(CausalAttention, EveryIsaEqualsTheReferenceAtContexts1To300) {
  for (const Shape& shape : kShapes) {
    // A prefill of 300 rows from position 0: row r sees r + 1 keys.
    const Cache cache(shape, 300, 300, 7);
    const std::vector<float> reference = cache.attend(Isa::scalar, 0, 300, 0);
    for (Isa isa : {Isa::avx2, Isa::avx512}) {
      if (!isa_supported(isa)) continue;
      EXPECT_TRUE(same_bits(cache.attend(isa, 0, 300, 0), reference))
          << isa_name(isa) << " q_heads " << shape.q_heads << " kv_heads " << shape.kv_heads
          << " head_dim " << shape.head_dim;
    }
  }
}

TEST(CausalAttention, EveryIsaEqualsTheReferenceAtLongContexts) {
  for (const Shape& shape : {Shape{9, 3, 64}, Shape{5, 1, 128}, Shape{16, 2, 128}}) {
    // Rows at contexts 2047..2049 and 4095..4097 straddle key-block boundaries.
    for (int64_t past : {2046, 4094}) {
      const Cache cache(shape, 3, past + 3, 11);
      const std::vector<float> reference = cache.attend(Isa::scalar, 0, 3, past);
      for (Isa isa : {Isa::avx2, Isa::avx512}) {
        if (!isa_supported(isa)) continue;
        EXPECT_TRUE(same_bits(cache.attend(isa, 0, 3, past), reference))
            << isa_name(isa) << " past " << past << " q_heads " << shape.q_heads;
      }
    }
  }
}

TEST(CausalAttention, ABatchOfSequencesEqualsEachSequenceAlone) {
  // A decode step of several sequences (one row each, contexts on both sides of a key block), a
  // verify round, a prefill chunk and an empty sequence, each with its own cache.
  struct Part {
    int64_t rows, past;
  };
  const Part parts[] = {{1, 0}, {1, 40}, {1, 255}, {1, 256}, {1, 700}, {5, 300}, {0, 9}, {37, 0}};
  for (const Shape& shape : {Shape{9, 3, 64}, Shape{8, 1, 128}, Shape{6, 2, 80}}) {
    std::vector<Cache> caches;
    for (size_t i = 0; i < std::size(parts); ++i) {
      caches.emplace_back(shape, parts[i].rows, parts[i].past + parts[i].rows,
                          static_cast<uint32_t>(20 + i));
    }
    const int64_t row_size = shape.q_heads * shape.head_dim;
    for (Isa isa : {Isa::scalar, Isa::avx2, Isa::avx512}) {
      if (!isa_supported(isa)) continue;
      std::vector<std::vector<float>> outputs;
      std::vector<AttentionSequence> sequences;
      for (size_t i = 0; i < std::size(parts); ++i) {
        outputs.emplace_back(parts[i].rows * row_size);
        sequences.push_back({caches[i].q.data(), parts[i].rows, caches[i].keys.data(),
                             caches[i].values.data(), parts[i].past, outputs[i].data()});
      }
      causal_attention_batch_isa(isa, sequences.data(), static_cast<int64_t>(sequences.size()),
                                 shape.q_heads, shape.kv_heads, shape.head_dim, caches[0].scale);
      for (size_t i = 0; i < std::size(parts); ++i) {
        EXPECT_TRUE(same_bits(outputs[i], caches[i].attend(isa, 0, parts[i].rows, parts[i].past)))
            << isa_name(isa) << " sequence " << i << " head_dim " << shape.head_dim;
      }
    }
  }
}

TEST(CausalAttention, RowsDoNotDependOnTheBatchOrTheThreadCount) {
  const int64_t past = 517, rows = 37;
  for (const Shape& shape : {Shape{9, 3, 64}, Shape{7, 1, 128}, Shape{4, 4, 64}}) {
    const Cache cache(shape, rows, past + rows, 3);
    const int64_t row_size = shape.q_heads * shape.head_dim;
    for (Isa isa : {Isa::scalar, Isa::avx2, Isa::avx512}) {
      if (!isa_supported(isa)) continue;
      set_default_threads(2);
      const std::vector<float> batch = cache.attend(isa, 0, rows, past);
      for (int threads : {1, 3}) {
        set_default_threads(threads);
        EXPECT_TRUE(same_bits(cache.attend(isa, 0, rows, past), batch))
            << isa_name(isa) << " threads " << threads;
      }
      set_default_threads(2);
      // Row r alone, and rows [r, r + 5) as a smaller batch, at the same positions.
      for (int64_t r = 0; r < rows; r += 6) {
        const std::vector<float> alone = cache.attend(isa, r, 1, past + r);
        EXPECT_TRUE(same_bits(alone, std::vector<float>(batch.begin() + r * row_size,
                                                        batch.begin() + (r + 1) * row_size)))
            << isa_name(isa) << " row " << r;
        const int64_t width = std::min<int64_t>(5, rows - r);
        const std::vector<float> part = cache.attend(isa, r, width, past + r);
        EXPECT_TRUE(same_bits(part, std::vector<float>(batch.begin() + r * row_size,
                                                       batch.begin() + (r + width) * row_size)))
            << isa_name(isa) << " rows from " << r;
      }
    }
  }
}

// A cache of f16 values: the keys and values as stored, and the same values widened to fp32.
struct F16Cache {
  std::vector<uint16_t> keys, values;
  std::vector<float> keys_f32, values_f32;

  explicit F16Cache(const Cache& cache) { set(cache); }
  void set(const Cache& cache) {
    for (auto [from, to, wide] : {std::tuple{&cache.keys, &keys, &keys_f32},
                                  std::tuple{&cache.values, &values, &values_f32}}) {
      const auto n = static_cast<int64_t>(from->size());
      to->resize(n);
      store_kv(KvType::f16, from->data(), n, to->data());
      wide->resize(n);
      for (int64_t i = 0; i < n; ++i) (*wide)[i] = dspark::f16_to_f32((*to)[i]);
    }
  }
};

TEST(CausalAttention, AnF16CacheGivesTheBitsOfAnF32CacheOfTheSameValues) {
  // Decode rows on both sides of a key block, verifies that read the cache as it lies (2, 3 and 5
  // rows, across a key block's end), a wider one that widens the blocks (12 rows, two runs of
  // rows), a prefill chunk across blocks and an empty sequence, each over its own f16 cache, in
  // one batch and at 1, 2 and 3 threads.
  struct Part {
    int64_t rows, past;
  };
  const Part parts[] = {{1, 0},   {1, 255},  {1, 700}, {2, 255}, {3, 510},
                        {5, 300}, {12, 260}, {0, 9},   {300, 10}};
  for (const Shape& shape : {Shape{9, 3, 64}, Shape{8, 1, 128}, Shape{6, 2, 80}}) {
    std::vector<Cache> caches;
    std::vector<F16Cache> halves;
    for (size_t i = 0; i < std::size(parts); ++i) {
      caches.emplace_back(shape, parts[i].rows, parts[i].past + parts[i].rows,
                          static_cast<uint32_t>(40 + i));
      halves.emplace_back(caches.back());
    }
    const int64_t row_size = shape.q_heads * shape.head_dim;
    for (Isa isa : {Isa::scalar, Isa::avx2, Isa::avx512}) {
      if (!isa_supported(isa)) continue;
      for (int threads : {1, 2, 3}) {
        set_default_threads(threads);
        std::vector<std::vector<float>> outputs;
        std::vector<AttentionSequence> sequences;
        for (size_t i = 0; i < std::size(parts); ++i) {
          outputs.emplace_back(parts[i].rows * row_size);
          sequences.push_back({caches[i].q.data(), parts[i].rows, halves[i].keys.data(),
                               halves[i].values.data(), parts[i].past, outputs[i].data(),
                               KvType::f16});
        }
        causal_attention_batch_isa(isa, sequences.data(), static_cast<int64_t>(sequences.size()),
                                   shape.q_heads, shape.kv_heads, shape.head_dim, caches[0].scale);
        for (size_t i = 0; i < std::size(parts); ++i) {
          std::vector<float> expected(parts[i].rows * row_size);
          causal_attention_isa(isa, caches[i].q.data(), parts[i].rows, shape.q_heads,
                               shape.kv_heads, shape.head_dim, halves[i].keys_f32.data(),
                               halves[i].values_f32.data(), parts[i].past, caches[i].scale,
                               expected.data());
          EXPECT_TRUE(same_bits(outputs[i], expected))
              << isa_name(isa) << " threads " << threads << " sequence " << i << " head_dim "
              << shape.head_dim;
        }
      }
      set_default_threads(2);
    }
  }
}

TEST(CausalAttention, AnF16CacheRewrittenInPlaceIsReadAfresh) {
  // The same cache buffer with new contents (the next layer, or a rolled-back sequence): the
  // second call must not reuse what the first widened. One kv head and one key block, so a thread
  // ends the first call and starts the second on the same block.
  const Shape shape{8, 1, 64};
  const Cache first(shape, 4, 100, 1), second(shape, 4, 100, 2);
  F16Cache half(first);
  const int64_t row_size = shape.q_heads * shape.head_dim;
  for (Isa isa : {Isa::scalar, Isa::avx2, Isa::avx512}) {
    if (!isa_supported(isa)) continue;
    for (int threads : {1, 2}) {
      set_default_threads(threads);
      half.set(first);
      std::vector<float> out(4 * row_size), expected(4 * row_size);
      const AttentionSequence sequence{
          first.q.data(), 4, half.keys.data(), half.values.data(), 96, out.data(), KvType::f16};
      causal_attention_batch_isa(isa, &sequence, 1, shape.q_heads, shape.kv_heads, shape.head_dim,
                                 first.scale);
      half.set(second);
      causal_attention_batch_isa(isa, &sequence, 1, shape.q_heads, shape.kv_heads, shape.head_dim,
                                 first.scale);
      causal_attention_isa(isa, first.q.data(), 4, shape.q_heads, shape.kv_heads, shape.head_dim,
                           half.keys_f32.data(), half.values_f32.data(), 96, first.scale,
                           expected.data());
      EXPECT_TRUE(same_bits(out, expected)) << isa_name(isa) << " threads " << threads;
    }
    set_default_threads(2);
  }
}

TEST(KvCacheType, FollowsTheNumericsUnlessSetAndNamesABadValue) {
  const Numerics numerics_before = numerics();
  EXPECT_EQ(parse_kv_type("f16", "--kv-cache"), KvType::f16);
  EXPECT_EQ(kv_type_bytes(KvType::f16), 2);
  EXPECT_EQ(kv_type_bytes(KvType::f32), 4);
  try {
    parse_kv_type("q8_0", "--kv-cache");
    FAIL() << "q8_0 was accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("--kv-cache: KV cache type 'q8_0'"), std::string::npos)
        << error.what();
  }
  if (std::getenv("DSPARK_KV_CACHE") == nullptr) {
    set_numerics(Numerics::fp32);
    EXPECT_EQ(kv_cache_type(), KvType::f32);
    set_numerics(Numerics::int8);
    EXPECT_EQ(kv_cache_type(), KvType::f16);
  }
  set_kv_cache_type(KvType::f32);
  set_numerics(Numerics::int8);
  EXPECT_EQ(kv_cache_type(), KvType::f32);
  set_kv_cache_type(std::nullopt);
  EXPECT_EQ(kv_cache_type(), KvType::f16);
  if (const char* chosen = std::getenv("DSPARK_KV_CACHE")) {
    set_kv_cache_type(parse_kv_type(chosen, "DSPARK_KV_CACHE"));
  }
  set_numerics(numerics_before);
}

TEST(CausalAttention, MatchesADoublePrecisionSoftmax) {
  const Shape shape{6, 2, 64};
  const int64_t past = 700, rows = 2;
  const Cache cache(shape, rows, past + rows, 5);
  const int64_t dim = shape.head_dim, group = shape.q_heads / shape.kv_heads;
  const std::vector<float> out = cache.attend(Isa::scalar, 0, rows, past);
  double worst = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t n_keys = past + r + 1;
    for (int64_t h = 0; h < shape.q_heads; ++h) {
      const float* q = cache.q.data() + (r * shape.q_heads + h) * dim;
      const int64_t kv = h / group;
      std::vector<double> weights(n_keys);
      double peak = -INFINITY, sum = 0.0;
      for (int64_t j = 0; j < n_keys; ++j) {
        const float* key = cache.keys.data() + (j * shape.kv_heads + kv) * dim;
        double dot = 0.0;
        for (int64_t d = 0; d < dim; ++d) dot += static_cast<double>(q[d]) * key[d];
        weights[j] = dot * cache.scale;
        peak = std::max(peak, weights[j]);
      }
      for (double& w : weights) sum += w = std::exp(w - peak);
      for (int64_t d = 0; d < dim; ++d) {
        double expected = 0.0;
        for (int64_t j = 0; j < n_keys; ++j) {
          expected += weights[j] * cache.values[(j * shape.kv_heads + kv) * dim + d];
        }
        expected /= sum;
        worst = std::max(worst, std::abs(out[(r * shape.q_heads + h) * dim + d] - expected));
      }
    }
  }
  EXPECT_LT(worst, 2e-5);
}

// A drafter block over a context: `rows` block rows after `past` context positions.
struct DrafterBlock {
  Shape shape;
  int64_t rows, past;
  std::vector<float> q, context_keys, context_values, block_keys, block_values, sinks;
  float scale;

  DrafterBlock(Shape s, int64_t rows, int64_t past, uint32_t seed)
      : shape(s), rows(rows), past(past) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.5f);
    auto fill = [&](std::vector<float>& v, int64_t n) {
      v.resize(n);
      for (float& x : v) x = normal(rng);
    };
    const int64_t kv = s.kv_heads * s.head_dim;
    fill(q, rows * s.q_heads * s.head_dim);
    fill(context_keys, past * kv);
    fill(context_values, past * kv);
    fill(block_keys, rows * kv);
    fill(block_values, rows * kv);
    fill(sinks, s.q_heads);
    scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  }

  BlockAttentionSpec spec(bool causal, int64_t window, bool with_sinks) const {
    return {shape.q_heads,
            shape.kv_heads,
            shape.head_dim,
            causal,
            window,
            scale,
            with_sinks ? sinks.data() : nullptr};
  }

  // The attention of the block rows in `queries`.
  std::vector<float> attend(Isa isa, const BlockAttentionSpec& spec, BlockQueries queries) const {
    const int64_t row_size = shape.q_heads * shape.head_dim;
    std::vector<float> out(queries.count * row_size);
    block_attention_isa(isa, spec, q.data() + queries.first * row_size, queries,
                        context_keys.data(), context_values.data(), past, block_keys.data(),
                        block_values.data(), rows, out.data());
    return out;
  }
  std::vector<float> attend(Isa isa, const BlockAttentionSpec& spec) const {
    return attend(isa, spec, {0, rows});
  }

  // The largest difference from the attention written out in double precision: query row i at
  // position past + i, keys at positions 0 .. past + rows - 1, visible as the spec says.
  double error_against_double(const BlockAttentionSpec& spec, const std::vector<float>& out) const {
    const int64_t dim = shape.head_dim, group = shape.q_heads / shape.kv_heads;
    double worst = 0.0;
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t position = past + i;
      for (int64_t h = 0; h < shape.q_heads; ++h) {
        const int64_t kv = h / group;
        auto key = [&](const std::vector<float>& context, const std::vector<float>& block,
                       int64_t j) {
          return j < past ? context.data() + (j * shape.kv_heads + kv) * dim
                          : block.data() + ((j - past) * shape.kv_heads + kv) * dim;
        };
        std::vector<double> weights;
        std::vector<int64_t> visible;
        double peak = spec.sinks != nullptr ? spec.sinks[h] : -INFINITY;
        for (int64_t j = 0; j < past + rows; ++j) {
          if (spec.causal && j > position) continue;
          if (spec.window > 0 && j <= position - spec.window) continue;
          const float* k = key(context_keys, block_keys, j);
          double dot = 0.0;
          for (int64_t d = 0; d < dim; ++d) {
            dot += static_cast<double>(q[(i * shape.q_heads + h) * dim + d]) * k[d];
          }
          weights.push_back(dot * scale);
          visible.push_back(j);
          peak = std::max(peak, weights.back());
        }
        double sum = spec.sinks != nullptr ? std::exp(spec.sinks[h] - peak) : 0.0;
        for (double& w : weights) sum += w = std::exp(w - peak);
        for (int64_t d = 0; d < dim; ++d) {
          double expected = 0.0;
          for (size_t n = 0; n < visible.size(); ++n) {
            expected += weights[n] * key(context_values, block_values, visible[n])[d];
          }
          expected /= sum;
          worst = std::max(worst, std::abs(out[(i * shape.q_heads + h) * dim + d] - expected));
        }
      }
    }
    return worst;
  }
};

// Every pattern a drafter uses (bidirectional or causal blocks, sliding windows shorter and longer
// than the context, sinks), at contexts that end inside and on a key block: attention, the same
// bits on every ISA and at every thread count.
TEST(BlockAttention, IsTheAttentionItDescribesOnEveryIsaAndThreadCount) {
  for (const Shape& shape : {Shape{9, 3, 64}, Shape{8, 2, 128}, Shape{6, 2, 40}}) {
    for (int64_t past : {0, 5, 256, 300, 600}) {
      const DrafterBlock block(shape, 8, past, static_cast<uint32_t>(40 + past));
      for (bool causal : {false, true}) {
        for (int64_t window : {0, 4, 270}) {
          for (bool sinks : {false, true}) {
            const BlockAttentionSpec spec = block.spec(causal, window, sinks);
            set_default_threads(2);
            const std::vector<float> reference = block.attend(Isa::scalar, spec);
            EXPECT_LT(block.error_against_double(spec, reference), 2e-5)
                << "past " << past << " causal " << causal << " window " << window << " sinks "
                << sinks << " head_dim " << shape.head_dim;
            for (Isa isa : {Isa::avx2, Isa::avx512}) {
              if (!isa_supported(isa)) continue;
              EXPECT_TRUE(same_bits(block.attend(isa, spec), reference))
                  << isa_name(isa) << " past " << past << " causal " << causal;
            }
            set_default_threads(1);
            EXPECT_TRUE(same_bits(block.attend(best_isa(), spec), reference)) << "one thread";
            set_default_threads(2);
          }
        }
      }
    }
  }
}

// A causal block's row i sees nothing of the rows after it: each row equals the same row computed
// in a shorter block.
TEST(BlockAttention, CausalRowsIgnoreTheRowsAfterThem) {
  const Shape shape{9, 3, 64};
  const DrafterBlock block(shape, 8, 300, 77);
  const BlockAttentionSpec spec = block.spec(true, 1024, true);
  const std::vector<float> full = block.attend(best_isa(), spec);
  const int64_t row_size = shape.q_heads * shape.head_dim;
  for (int64_t width = 1; width < 8; ++width) {
    std::vector<float> out(width * row_size);
    block_attention(spec, block.q.data(), {0, width}, block.context_keys.data(),
                    block.context_values.data(), block.past, block.block_keys.data(),
                    block.block_values.data(), width, out.data());
    EXPECT_TRUE(same_bits(out, std::vector<float>(full.begin(), full.begin() + width * row_size)))
        << "width " << width;
  }
}

// Any run of the block's rows may ask alone (a drafter's last layer needs only its drafting rows):
// each asking row equals its row of the whole block's attention, on every ISA, bidirectional or
// causal, with a window that cuts into the block's own rows or not.
TEST(BlockAttention, RowsThatAskAloneGetTheWholeBlocksRows) {
  const Shape shape{9, 3, 64};
  const int64_t rows = 7, row_size = shape.q_heads * shape.head_dim;
  for (int64_t past : {0, 300}) {
    const DrafterBlock block(shape, rows, past, static_cast<uint32_t>(91 + past));
    for (bool causal : {false, true}) {
      for (int64_t window : {0, 3}) {
        const BlockAttentionSpec spec = block.spec(causal, window, true);
        for (Isa isa : {Isa::scalar, Isa::avx2, Isa::avx512}) {
          if (!isa_supported(isa)) continue;
          const std::vector<float> full = block.attend(isa, spec);
          for (int64_t first = 0; first < rows; ++first) {
            for (int64_t count = 0; first + count <= rows; ++count) {
              const std::vector<float> asked = block.attend(isa, spec, {first, count});
              EXPECT_TRUE(
                  same_bits(asked, std::vector<float>(full.begin() + first * row_size,
                                                      full.begin() + (first + count) * row_size)))
                  << isa_name(isa) << " past " << past << " causal " << causal << " window "
                  << window << " rows " << first << " + " << count;
            }
          }
        }
      }
    }
  }
}

TEST(BlockAttention, RowsOutsideTheBlockCannotAsk) {
  const DrafterBlock block(Shape{9, 3, 64}, 7, 10, 5);
  const BlockAttentionSpec spec = block.spec(false, 0, false);
  std::vector<float> out(block.q.size());
  for (BlockQueries queries : {BlockQueries{5, 3}, BlockQueries{-1, 2}, BlockQueries{0, -1}}) {
    EXPECT_THROW(block_attention(spec, block.q.data(), queries, block.context_keys.data(),
                                 block.context_values.data(), block.past, block.block_keys.data(),
                                 block.block_values.data(), block.rows, out.data()),
                 Error);
  }
}

TEST(CausalAttention, SoftmaxExponentIsWithinOneUlpOfExp) {
  double worst_ulps = 0.0;
  // Negative floats ordered by magnitude are consecutive bit patterns; a step of 4093 patterns
  // samples every exponent with varied mantissas.
  const uint32_t last = std::bit_cast<uint32_t>(-87.0f);
  for (uint32_t bits = std::bit_cast<uint32_t>(-0.0f); bits <= last; bits += 4093) {
    const float x = std::bit_cast<float>(bits);
    const double exact = std::exp(static_cast<double>(x));
    const float rounded = static_cast<float>(exact);
    const double ulp = std::nextafter(rounded, INFINITY) - rounded;
    worst_ulps = std::max(worst_ulps, std::abs(cpu::exp_block(x) - exact) / ulp);
  }
  EXPECT_LT(worst_ulps, 1.1);
  EXPECT_EQ(cpu::exp_block(0.0f), 1.0f);
  EXPECT_EQ(cpu::exp_block(-88.0f), 0.0f);
  EXPECT_EQ(cpu::exp_block(-INFINITY), 0.0f);
}

}  // namespace
}  // namespace dspark::kernels
