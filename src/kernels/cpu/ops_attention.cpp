// Causal grouped-query attention over a token-major KV cache.
//
// Keys are processed in fixed blocks of kKeyBlock positions, each with its own running maximum,
// exponent sum and weighted value sum, merged afterwards in block order ("split-K"). Blocks give
// a one-token decode step enough independent work for every thread, and because the blocking
// depends only on the key positions, a row's result is the same whatever the number of rows in
// the call and the number of threads.
#include <algorithm>
#include <cmath>
#include <vector>

#include "base/thread_pool.h"
#include "kernels/cpu/ops_common.h"
#include "kernels/ops.h"

namespace dspark::kernels {
namespace {

constexpr int64_t kKeyBlock = 256;

struct BlockShape {
  int64_t group;  // q heads per kv head
  int64_t head_dim;
  int64_t kv_stride;  // floats per cached position
  float scale;
};

// Per head: the block maximum and the sum of exp(score - maximum) into partial[g * (2 + dim)];
// the scores become their exponentials and the value sums start at zero.
inline void softmax_partials(int64_t group, int64_t dim, int64_t count, float* scores,
                             float* partial) {
  for (int64_t g = 0; g < group; ++g) {
    float* s = scores + g * kKeyBlock;
    float* out = partial + g * (2 + dim);
    float peak = -INFINITY;
    for (int64_t j = 0; j < count; ++j) peak = std::max(peak, s[j]);
    float sum = 0.0f;
    for (int64_t j = 0; j < count; ++j) {
      s[j] = std::exp(s[j] - peak);
      sum += s[j];
    }
    out[0] = peak;
    out[1] = sum;
    std::fill_n(out + 2, dim, 0.0f);
  }
}

// Scores of the block's keys for G heads: scores[g * kKeyBlock + j] = scale · Σ_d q[g][d] k_j[d],
// each sum taken over d in order. Keys go in tiles of four (the last tile repeats the last key)
// so that 4 × G accumulators stay in registers.
template <int G>
[[gnu::always_inline]] inline void tile_scores(const float* q_t, const float* keys, int64_t stride,
                                               int64_t count, int64_t dim, float scale,
                                               float* scores) {
  for (int64_t j = 0; j < count; j += 4) {
    const float* key[4];
    for (int i = 0; i < 4; ++i) key[i] = keys + std::min(j + i, count - 1) * stride;
    float acc[4][G] = {};
    for (int64_t d = 0; d < dim; ++d) {
      const float* q_d = q_t + d * G;
      for (int i = 0; i < 4; ++i) {
        const float k = key[i][d];
        for (int g = 0; g < G; ++g) acc[i][g] += q_d[g] * k;
      }
    }
    for (int i = 0; i < 4 && j + i < count; ++i) {
      for (int g = 0; g < G; ++g) scores[g * kKeyBlock + j + i] = acc[i][g] * scale;
    }
  }
}

// out_g += Σ_j p[g][j] · v_j over the block, each element summed over j in order, four keys per
// pass (padding keys carry weight 0).
template <int G>
[[gnu::always_inline]] inline void tile_values(const float* p, const float* values, int64_t stride,
                                               int64_t count, int64_t dim, float* partial) {
  for (int64_t j = 0; j < count; j += 4) {
    const float* value[4];
    for (int i = 0; i < 4; ++i) value[i] = values + std::min(j + i, count - 1) * stride;
    for (int g = 0; g < G; ++g) {
      float w[4];
      for (int i = 0; i < 4; ++i) w[i] = j + i < count ? p[g * kKeyBlock + j + i] : 0.0f;
      float* out = partial + g * (2 + dim) + 2;
      for (int64_t d = 0; d < dim; ++d) {
        float o = out[d];
        for (int i = 0; i < 4; ++i) o += w[i] * value[i][d];
        out[d] = o;
      }
    }
  }
}

template <int G>
[[gnu::always_inline]] inline void tiled_block(const BlockShape& shape, const float* q_t,
                                               const float* keys, const float* values,
                                               int64_t count, float* scores, float* partial) {
  tile_scores<G>(q_t, keys, shape.kv_stride, count, shape.head_dim, shape.scale, scores);
  softmax_partials(G, shape.head_dim, count, scores, partial);
  tile_values<G>(scores, values, shape.kv_stride, count, shape.head_dim, partial);
}

// The partial result of `group` q heads over keys [begin, end): per head the block maximum, the
// sum of exp(score - maximum) and the exp-weighted value sum, written to partial[g * (2 + dim)].
// q_t holds the group's queries transposed, [dim][group]. Compiled for x86-64-v3 (AVX2, FMA) and
// for the baseline; the loader picks one for the whole process.
__attribute__((target_clones("arch=x86-64-v3", "default"))) void attend_block(
    const BlockShape& shape, const float* q_t, const float* keys, const float* values,
    int64_t begin, int64_t end, float* scores, float* partial) {
  const int64_t count = end - begin;
  keys += begin * shape.kv_stride;
  values += begin * shape.kv_stride;
  switch (shape.group) {
    case 1:
      return tiled_block<1>(shape, q_t, keys, values, count, scores, partial);
    case 2:
      return tiled_block<2>(shape, q_t, keys, values, count, scores, partial);
    case 3:
      return tiled_block<3>(shape, q_t, keys, values, count, scores, partial);
    case 4:
      return tiled_block<4>(shape, q_t, keys, values, count, scores, partial);
    case 8:
      return tiled_block<8>(shape, q_t, keys, values, count, scores, partial);
    case 16:
      return tiled_block<16>(shape, q_t, keys, values, count, scores, partial);
  }
  const int64_t group = shape.group, dim = shape.head_dim;
  for (int64_t j = 0; j < count; ++j) {
    const float* key = keys + j * shape.kv_stride;
    for (int64_t g = 0; g < group; ++g) {
      float acc = 0.0f;
      for (int64_t d = 0; d < dim; ++d) acc += q_t[d * group + g] * key[d];
      scores[g * kKeyBlock + j] = acc * shape.scale;
    }
  }
  softmax_partials(group, dim, count, scores, partial);
  for (int64_t j = 0; j < count; ++j) {
    const float* value = values + j * shape.kv_stride;
    for (int64_t g = 0; g < group; ++g) {
      cpu::axpy(scores[g * kKeyBlock + j], value, partial + g * (2 + dim) + 2, dim);
    }
  }
}

}  // namespace

void causal_attention(const float* q, int64_t rows, int64_t q_heads, int64_t kv_heads,
                      int64_t head_dim, const float* keys, const float* values, int64_t past,
                      float scale, float* out) {
  const BlockShape shape{q_heads / kv_heads, head_dim, kv_heads * head_dim, scale};
  const int64_t group = shape.group;
  const int64_t max_blocks = (past + rows + kKeyBlock - 1) / kKeyBlock;
  const int64_t partial_size = group * (2 + head_dim);
  const int64_t row_partials = kv_heads * max_blocks * partial_size;
  // Rows are taken in batches so that the partial results stay within kPartialBudget floats.
  constexpr int64_t kPartialBudget = int64_t{4} << 20;
  const int64_t batch = std::clamp<int64_t>(kPartialBudget / row_partials, 1, rows);
  std::vector<float> partials(batch * row_partials);
  ThreadPool& pool = default_pool();
  for (int64_t first_row = 0; first_row < rows; first_row += batch) {
    const int64_t batch_rows = std::min(batch, rows - first_row);
    // Work item (row, kv head, block); rows see different key counts, so some items are empty.
    pool.parallel_for(batch_rows * kv_heads * max_blocks, 1, [&](int64_t first, int64_t last, int) {
      // Per thread: the block's scores [group][kKeyBlock], an accumulator [group] and the
      // transposed queries [head_dim][group].
      thread_local std::vector<float> scratch;
      const size_t need = group * (kKeyBlock + 1 + head_dim);
      if (scratch.size() < need) scratch.resize(need);
      float* scores = scratch.data();
      float* q_t = scores + group * (kKeyBlock + 1);
      int64_t transposed_for = -1;  // the (row, kv head) q_t holds
      for (int64_t item = first; item < last; ++item) {
        const int64_t block = item % max_blocks;
        const int64_t kv = (item / max_blocks) % kv_heads;
        const int64_t r = first_row + item / (max_blocks * kv_heads);
        const int64_t n_keys = past + r + 1;
        const int64_t begin = block * kKeyBlock;
        if (begin >= n_keys) continue;
        if (transposed_for != r * kv_heads + kv) {
          const float* q_group = q + (r * q_heads + kv * group) * head_dim;
          for (int64_t g = 0; g < group; ++g) {
            for (int64_t d = 0; d < head_dim; ++d) q_t[d * group + g] = q_group[g * head_dim + d];
          }
          transposed_for = r * kv_heads + kv;
        }
        attend_block(shape, q_t, keys + kv * head_dim, values + kv * head_dim, begin,
                     std::min(n_keys, begin + kKeyBlock), scores,
                     partials.data() + item * partial_size);
      }
    });
    // Merge the blocks of each (row, q head) in block order.
    pool.parallel_for(batch_rows * q_heads, 4, [&](int64_t first, int64_t last, int) {
      for (int64_t index = first; index < last; ++index) {
        const int64_t local_row = index / q_heads, h = index % q_heads;
        const int64_t r = first_row + local_row;
        const int64_t kv = h / group, g = h % group;
        const int64_t blocks = (past + r + 1 + kKeyBlock - 1) / kKeyBlock;
        const float* base = partials.data() +
                            (local_row * kv_heads + kv) * max_blocks * partial_size +
                            g * (2 + head_dim);
        float peak = -INFINITY;
        for (int64_t b = 0; b < blocks; ++b) peak = std::max(peak, base[b * partial_size]);
        float* o = out + (r * q_heads + h) * head_dim;
        std::fill_n(o, head_dim, 0.0f);
        float sum = 0.0f;
        for (int64_t b = 0; b < blocks; ++b) {
          const float* p = base + b * partial_size;
          const float weight = std::exp(p[0] - peak);
          sum += weight * p[1];
          cpu::axpy(weight, p + 2, o, head_dim);
        }
        const float inv = 1.0f / sum;
        for (int64_t d = 0; d < head_dim; ++d) o[d] *= inv;
      }
    });
  }
}

}  // namespace dspark::kernels
