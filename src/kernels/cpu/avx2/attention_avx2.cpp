// The attention block with AVX2 + FMA: the 16 lanes of kernels/cpu/attention_impl.h as two
// registers (lanes 0-7, 8-15); 8 keys' dot products reduced together by a transposing tree.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "kernels/cpu/attention_impl.h"
#include "kernels/cpu/avx2/exp_block_avx2.h"

namespace dspark::kernels::cpu {
namespace {

// The last three levels of reduce16 for 8 keys, given b = lanes 0-7 + lanes 8-15 of each key;
// lane i of the result is key i.
inline __m256 reduce8_keys(__m256 (&b)[8]) {
  __m256 c[4], d[2];
  for (int p = 0; p < 4; ++p) {
    c[p] = _mm256_add_ps(_mm256_permute2f128_ps(b[2 * p], b[2 * p + 1], 0x20),
                         _mm256_permute2f128_ps(b[2 * p], b[2 * p + 1], 0x31));
  }
  for (int p = 0; p < 2; ++p) {
    const __m256d x = _mm256_castps_pd(c[2 * p]), y = _mm256_castps_pd(c[2 * p + 1]);
    d[p] = _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(x, y)),
                         _mm256_castpd_ps(_mm256_unpackhi_pd(x, y)));
  }
  // Lane 4k + m now holds key k + 2m.
  const __m256 e = _mm256_add_ps(_mm256_shuffle_ps(d[0], d[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm256_shuffle_ps(d[0], d[1], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm256_permutevar8x32_ps(e, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

inline float reduce16_lanes(__m256 low, __m256 high) {
  const __m256 b = _mm256_add_ps(low, high);
  const __m128 c = _mm_add_ps(_mm256_castps256_ps128(b), _mm256_extractf128_ps(b, 1));
  const __m128 d = _mm_add_ps(c, _mm_movehl_ps(c, c));
  return _mm_cvtss_f32(_mm_add_ss(d, _mm_movehdup_ps(d)));
}

// b = (lanes 0-7) + (lanes 8-15) of the 16-lane dot products of q with four keys.
inline void dot_lanes4(const float* q, const float* const* key, int64_t dim, __m256* b) {
  __m256 low[4], high[4];
  for (int i = 0; i < 4; ++i) low[i] = high[i] = _mm256_setzero_ps();
  for (int64_t d = 0; d < dim; d += 16) {
    const __m256 q_low = _mm256_loadu_ps(q + d), q_high = _mm256_loadu_ps(q + d + 8);
    for (int i = 0; i < 4; ++i) {
      low[i] = _mm256_fmadd_ps(q_low, _mm256_loadu_ps(key[i] + d), low[i]);
      high[i] = _mm256_fmadd_ps(q_high, _mm256_loadu_ps(key[i] + d + 8), high[i]);
    }
  }
  for (int i = 0; i < 4; ++i) b[i] = _mm256_add_ps(low[i], high[i]);
}

// 8 values of a key or value row as fp32.
inline __m256 load8(const float* p) {
  return _mm256_loadu_ps(p);
}
inline __m256 load8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// Scores of every head of the group, a tile of 8 keys at a time (the tile stays in L1 while
// each head reads it; an f16 tile is widened once into `tile`, not once per head); keys past the
// block's end score -inf, up to a whole 16-key tile.
template <typename T>
void block_scores(const AttentionBlock& block) {
  const int64_t dim = block.head_dim, count = block.count;
  const __m256 scale = _mm256_set1_ps(block.scale), minus_infinity = _mm256_set1_ps(-INFINITY);
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const T* keys = static_cast<const T*>(block.keys);
  const std::vector<const float*>& queries = head_queries(block);
  thread_local std::vector<float> tile;
  if constexpr (std::is_same_v<T, uint16_t>) {
    if (tile.size() < static_cast<size_t>(8 * dim)) tile.resize(8 * dim);
  }
  for (int64_t first = 0; first < count; first += 8) {
    if (block.fetch_ahead) {
      prefetch_rows(keys, first + kKvRowsAhead, std::min(count, first + kKvRowsAhead + 8),
                    block.kv_stride, dim);
    }
    const float* key[8];
    const int64_t in_tile = std::min<int64_t>(8, count - first);
    if constexpr (std::is_same_v<T, float>) {
      for (int i = 0; i < 8; ++i)
        key[i] = keys + (first + std::min<int64_t>(i, in_tile - 1)) * block.kv_stride;
    } else {
      widen_f16_rows_avx2(keys + first * block.kv_stride, block.kv_stride, in_tile, dim,
                          tile.data());
      for (int i = 0; i < 8; ++i) key[i] = tile.data() + std::min<int64_t>(i, in_tile - 1) * dim;
    }
    const __m256 valid = _mm256_castsi256_ps(
        _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(count - first)), lane));
    for (int64_t g = 0; g < block_heads(block); ++g) {
      const float* q = queries[g];
      __m256 b[8];
      dot_lanes4(q, key, dim, b);
      dot_lanes4(q, key + 4, dim, b + 4);
      const __m256 dots = _mm256_mul_ps(reduce8_keys(b), scale);
      _mm256_storeu_ps(block.scores + g * kAttentionKeyBlock + first,
                       _mm256_blendv_ps(minus_infinity, dots, valid));
    }
  }
  if ((count + 7) / 8 % 2 == 1) {
    for (int64_t g = 0; g < block_heads(block); ++g) {
      _mm256_storeu_ps(block.scores + g * kAttentionKeyBlock + (count + 7) / 8 * 8, minus_infinity);
    }
  }
}

// acc[g][c] for NG heads and NC 8-float chunks starting at d0.
template <typename T, int NG, int NC>
void accumulate_values(const AttentionBlock& block, int64_t g0, int64_t d0, int64_t j0,
                       int64_t j1) {
  __m256 acc[NG][NC];
  for (int g = 0; g < NG; ++g) {
    const float* partial = head_partial(block, g0 + g) + 2 + d0;
    for (int c = 0; c < NC; ++c) {
      acc[g][c] = j0 == 0 ? _mm256_setzero_ps() : _mm256_loadu_ps(partial + 8 * c);
    }
  }
  const float* p = block.scores + g0 * kAttentionKeyBlock;
  for (int64_t j = j0; j < j1; ++j) {
    const T* value = static_cast<const T*>(block.values) + j * block.kv_stride + d0;
    if (block.fetch_ahead) {
      prefetch_rows(static_cast<const T*>(block.values) + d0, j + kKvRowsAhead,
                    std::min(j + kKvRowsAhead + 1, block.count), block.kv_stride, 8 * NC);
    }
    __m256 w[NG];
    for (int g = 0; g < NG; ++g) w[g] = _mm256_set1_ps(p[g * kAttentionKeyBlock + j]);
    for (int c = 0; c < NC; ++c) {
      const __m256 v = load8(value + 8 * c);
      for (int g = 0; g < NG; ++g) acc[g][c] = _mm256_fmadd_ps(w[g], v, acc[g][c]);
    }
  }
  for (int g = 0; g < NG; ++g) {
    float* out = head_partial(block, g0 + g) + 2 + d0;
    for (int c = 0; c < NC; ++c) _mm256_storeu_ps(out + 8 * c, acc[g][c]);
  }
}

template <typename T, int NG>
void accumulate_heads(const AttentionBlock& block, int64_t g0, int64_t j0, int64_t j1) {
  const int64_t chunks = block.head_dim / 8;  // even: head_dim is a multiple of 16
  int64_t c = 0;
  for (; c + 4 <= chunks; c += 4) accumulate_values<T, NG, 4>(block, g0, 8 * c, j0, j1);
  if (c < chunks) accumulate_values<T, NG, 2>(block, g0, 8 * c, j0, j1);
}

template <typename T>
void attend_block(const AttentionBlock& block) {
  const int64_t padded = (block.count + 15) / 16 * 16;
  block_scores<T>(block);
  for (int64_t g = 0; g < block_heads(block); ++g) {
    float* scores = block.scores + g * kAttentionKeyBlock;
    __m256 peak = _mm256_set1_ps(-INFINITY);
    for (int64_t j = 0; j < padded; j += 8) peak = _mm256_max_ps(peak, _mm256_loadu_ps(scores + j));
    __m128 peak4 = _mm_max_ps(_mm256_castps256_ps128(peak), _mm256_extractf128_ps(peak, 1));
    peak4 = _mm_max_ps(peak4, _mm_movehl_ps(peak4, peak4));
    peak4 = _mm_max_ss(peak4, _mm_movehdup_ps(peak4));
    const __m256 peak_all = _mm256_broadcastss_ps(peak4);
    __m256 sum_low = _mm256_setzero_ps(), sum_high = _mm256_setzero_ps();
    for (int64_t j = 0; j < padded; j += 16) {
      const __m256 e_low = exp_block8(_mm256_sub_ps(_mm256_loadu_ps(scores + j), peak_all));
      const __m256 e_high = exp_block8(_mm256_sub_ps(_mm256_loadu_ps(scores + j + 8), peak_all));
      _mm256_storeu_ps(scores + j, e_low);
      _mm256_storeu_ps(scores + j + 8, e_high);
      sum_low = _mm256_add_ps(sum_low, e_low);
      sum_high = _mm256_add_ps(sum_high, e_high);
    }
    float* partial = head_partial(block, g);
    partial[0] = _mm_cvtss_f32(peak4);
    partial[1] = reduce16_lanes(sum_low, sum_high);
  }
  accumulate_in_runs<3>(block, [&]<int NH>(int64_t g, int64_t j0, int64_t j1) {
    accumulate_heads<T, NH>(block, g, j0, j1);
  });
}

}  // namespace

void attend_block_avx2(const AttentionBlock& block) {
  if (block.head_dim % 16 != 0) return attend_block_ref(block);
  if (block.kv_type == KvType::f16) return attend_block<uint16_t>(block);
  attend_block<float>(block);
}

void widen_f16_rows_avx2(const uint16_t* src, int64_t stride, int64_t rows, int64_t dim,
                         float* dst) {
  if (dim % 8 != 0) return widen_f16_rows_ref(src, stride, rows, dim, dst);
  for (int64_t r = 0; r < rows; ++r) {
    const uint16_t* row = src + r * stride;
    for (int64_t d = 0; d < dim; d += 8) {
      _mm256_storeu_ps(dst + r * dim + d,
                       _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + d))));
    }
  }
}

}  // namespace dspark::kernels::cpu
