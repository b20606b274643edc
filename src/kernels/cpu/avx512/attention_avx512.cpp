// The attention block with AVX-512: 16 keys' dot products at a time, one register of 16 lanes
// per key, reduced together by a transposing reduce16 tree.

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "kernels/cpu/attention_impl.h"
#include "kernels/cpu/avx512/exp_block_avx512.h"
#include "kernels/cpu/avx512/intrinsics.h"

namespace dspark::kernels::cpu {
namespace {

// reduce16 of a[i] for 16 keys at once; lane i of the result is key i.
inline __m512 reduce16_keys(__m512 (&a)[16]) {
  __m512 b[8], c[4], d[2];
  for (int p = 0; p < 8; ++p) {
    b[p] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * p], a[2 * p + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_f32x4(a[2 * p], a[2 * p + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  }
  for (int p = 0; p < 4; ++p) {
    c[p] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * p], b[2 * p + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(b[2 * p], b[2 * p + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  }
  for (int p = 0; p < 2; ++p) {
    const __m512d x = _mm512_castps_pd(c[2 * p]), y = _mm512_castps_pd(c[2 * p + 1]);
    d[p] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)),
                         _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
  // Lane 4k + m now holds key k + 4m.
  const __m512 e = _mm512_add_ps(_mm512_shuffle_ps(d[0], d[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm512_shuffle_ps(d[0], d[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  return _mm512_permutexvar_ps(order, e);
}

inline float reduce16_lanes(__m512 a) {
  const __m256 b = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
  const __m128 c = _mm_add_ps(_mm256_castps256_ps128(b), _mm256_extractf128_ps(b, 1));
  const __m128 d = _mm_add_ps(c, _mm_movehl_ps(c, c));
  return _mm_cvtss_f32(_mm_add_ss(d, _mm_movehdup_ps(d)));
}

// 16 values of a key or value row as fp32.
inline __m512 load16(const float* p) {
  return _mm512_loadu_ps(p);
}
inline __m512 load16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// Scores of every head of the group, a tile of 16 keys at a time (the tile stays in L1 while
// each head reads it; an f16 tile is widened once into `tile`, not once per head); keys past the
// block's end score -inf.
template <typename T>
void block_scores(const AttentionBlock& block) {
  const int64_t dim = block.head_dim, count = block.count;
  const __m512 scale = _mm512_set1_ps(block.scale), minus_infinity = _mm512_set1_ps(-INFINITY);
  const T* keys = static_cast<const T*>(block.keys);
  const std::vector<const float*>& queries = head_queries(block);
  thread_local std::vector<float> tile;
  if constexpr (std::is_same_v<T, uint16_t>) {
    if (tile.size() < static_cast<size_t>(16 * dim)) tile.resize(16 * dim);
  }
  for (int64_t first = 0; first < count; first += 16) {
    if (block.fetch_ahead) {
      prefetch_rows(keys, first + kKvRowsAhead, std::min(count, first + kKvRowsAhead + 16),
                    block.kv_stride, dim);
    }
    const float* key[16];
    const int64_t in_tile = std::min<int64_t>(16, count - first);
    if constexpr (std::is_same_v<T, float>) {
      for (int i = 0; i < 16; ++i)
        key[i] = keys + (first + std::min<int64_t>(i, in_tile - 1)) * block.kv_stride;
    } else {
      widen_f16_rows_avx512(keys + first * block.kv_stride, block.kv_stride, in_tile, dim,
                            tile.data());
      for (int i = 0; i < 16; ++i) key[i] = tile.data() + std::min<int64_t>(i, in_tile - 1) * dim;
    }
    const __mmask16 valid =
        static_cast<__mmask16>(count - first >= 16 ? 0xffff : (1u << (count - first)) - 1);
    for (int64_t g = 0; g < block_heads(block); ++g) {
      const float* q = queries[g];
      __m512 acc[16];
      for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_ps();
      for (int64_t d = 0; d < dim; d += 16) {
        const __m512 qv = _mm512_loadu_ps(q + d);
        for (int i = 0; i < 16; ++i) {
          acc[i] = _mm512_fmadd_ps(qv, _mm512_loadu_ps(key[i] + d), acc[i]);
        }
      }
      _mm512_storeu_ps(block.scores + g * kAttentionKeyBlock + first,
                       _mm512_mask_mul_ps(minus_infinity, valid, reduce16_keys(acc), scale));
    }
  }
}

// acc[g][c] for NG heads and NC 16-float chunks starting at d0.
template <typename T, int NG, int NC>
void accumulate_values(const AttentionBlock& block, int64_t g0, int64_t d0, int64_t j0,
                       int64_t j1) {
  __m512 acc[NG][NC];
  for (int g = 0; g < NG; ++g) {
    const float* partial = head_partial(block, g0 + g) + 2 + d0;
    for (int c = 0; c < NC; ++c) {
      acc[g][c] = j0 == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(partial + 16 * c);
    }
  }
  const float* p = block.scores + g0 * kAttentionKeyBlock;
  for (int64_t j = j0; j < j1; ++j) {
    const T* value = static_cast<const T*>(block.values) + j * block.kv_stride + d0;
    if (block.fetch_ahead) {
      prefetch_rows(static_cast<const T*>(block.values) + d0, j + kKvRowsAhead,
                    std::min(j + kKvRowsAhead + 1, block.count), block.kv_stride, 16 * NC);
    }
    __m512 v[NC];
    for (int c = 0; c < NC; ++c) v[c] = load16(value + 16 * c);
    for (int g = 0; g < NG; ++g) {
      const __m512 w = _mm512_set1_ps(p[g * kAttentionKeyBlock + j]);
      for (int c = 0; c < NC; ++c) acc[g][c] = _mm512_fmadd_ps(w, v[c], acc[g][c]);
    }
  }
  for (int g = 0; g < NG; ++g) {
    float* out = head_partial(block, g0 + g) + 2 + d0;
    for (int c = 0; c < NC; ++c) _mm512_storeu_ps(out + 16 * c, acc[g][c]);
  }
}

template <typename T, int NG>
void accumulate_heads(const AttentionBlock& block, int64_t g0, int64_t j0, int64_t j1) {
  const int64_t chunks = block.head_dim / 16;
  int64_t c = 0;
  for (; c + 4 <= chunks; c += 4) accumulate_values<T, NG, 4>(block, g0, 16 * c, j0, j1);
  switch (chunks - c) {
    case 3:
      return accumulate_values<T, NG, 3>(block, g0, 16 * c, j0, j1);
    case 2:
      return accumulate_values<T, NG, 2>(block, g0, 16 * c, j0, j1);
    case 1:
      return accumulate_values<T, NG, 1>(block, g0, 16 * c, j0, j1);
  }
}

template <typename T>
void attend_block(const AttentionBlock& block) {
  const int64_t padded = (block.count + 15) / 16 * 16;
  block_scores<T>(block);
  for (int64_t g = 0; g < block_heads(block); ++g) {
    float* scores = block.scores + g * kAttentionKeyBlock;
    __m512 peak = _mm512_set1_ps(-INFINITY);
    for (int64_t j = 0; j < padded; j += 16)
      peak = _mm512_max_ps(peak, _mm512_loadu_ps(scores + j));
    const __m512 peak_all = _mm512_set1_ps(_mm512_reduce_max_ps(peak));
    __m512 sum = _mm512_setzero_ps();
    for (int64_t j = 0; j < padded; j += 16) {
      const __m512 e = exp_block16(_mm512_sub_ps(_mm512_loadu_ps(scores + j), peak_all));
      _mm512_storeu_ps(scores + j, e);
      sum = _mm512_add_ps(sum, e);
    }
    float* partial = head_partial(block, g);
    partial[0] = _mm512_cvtss_f32(peak_all);
    partial[1] = reduce16_lanes(sum);
  }
  accumulate_in_runs<4>(block, [&]<int NH>(int64_t g, int64_t j0, int64_t j1) {
    accumulate_heads<T, NH>(block, g, j0, j1);
  });
}

}  // namespace

void attend_block_avx512(const AttentionBlock& block) {
  if (block.head_dim % 16 != 0) return attend_block_ref(block);
  if (block.kv_type == KvType::f16) return attend_block<uint16_t>(block);
  attend_block<float>(block);
}

void widen_f16_rows_avx512(const uint16_t* src, int64_t stride, int64_t rows, int64_t dim,
                           float* dst) {
  if (dim % 16 != 0) return widen_f16_rows_avx2(src, stride, rows, dim, dst);
  for (int64_t r = 0; r < rows; ++r) {
    const uint16_t* row = src + r * stride;
    for (int64_t d = 0; d < dim; d += 16) {
      _mm512_storeu_ps(
          dst + r * dim + d,
          _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + d))));
    }
  }
}

}  // namespace dspark::kernels::cpu
