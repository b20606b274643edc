// AVX2 kernels of the int8 numerics (quant_impl.h): activations quantized with vector code, and
// the quantized products of int8_tiles_256.h with vpmaddubsw / vpmaddwd.
#include <immintrin.h>

#include "kernels/cpu/int8_tiles_256.h"

namespace dspark::kernels::cpu {
namespace {

// Per 128-bit lane, the shuffles from element order into the byte order of unpack_block.
alignas(32) constexpr uint8_t kFourBitOrder[32] = {0,  2,  4,  6,  8,  10, 12, 14, 1,  3, 5,
                                                   7,  9,  11, 13, 15, 0,  2,  4,  6,  8, 10,
                                                   12, 14, 1,  3,  5,  7,  9,  11, 13, 15};
alignas(32) constexpr uint8_t kTwoBitOrder[32] = {0,  4,  8, 12, 1,  5,  9, 13, 2,  6, 10,
                                                  14, 3,  7, 11, 15, 0,  4, 8,  12, 1, 5,
                                                  9,  13, 2, 6,  10, 14, 3, 7,  11, 15};

}  // namespace

void int8_rows_avx2(const Int8Task& task, int64_t row_begin, int64_t row_end) {
  int8_rows_any(task, row_begin, row_end);
}

void spread_activations_avx2(const int8_t* x8, int64_t cols, SpreadVector* out) {
  for (int64_t j = 0; j < cols / 4; ++j) {
    _mm256_store_si256(reinterpret_cast<__m256i*>(out[j].bytes),
                       _mm256_set1_epi32(static_cast<int>(
                           load_u32(reinterpret_cast<const uint8_t*>(x8) + 4 * j))));
  }
}

void quantize_activations_avx2(const float* x, int64_t cols, int bits, int8_t* x8,
                               float* block_scales) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256 high = _mm256_set1_ps(127.0f), low = _mm256_set1_ps(-127.0f);
  // After the two packs each 128-bit lane holds dwords of 4 elements in the order 0, 2, 4, 6 /
  // 1, 3, 5, 7 (in units of 4 elements): this permutation restores element order.
  const __m256i element_order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t first = 0; first < cols; first += kInt8Block) {
    __m256 v[4];
    for (int k = 0; k < 4; ++k) v[k] = _mm256_loadu_ps(x + first + 8 * k);
    const __m256 amax8 =
        _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                      _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
    const __m128 amax4 = _mm_max_ps(_mm256_castps256_ps128(amax8), _mm256_extractf128_ps(amax8, 1));
    const __m128 amax2 = _mm_max_ps(amax4, _mm_movehl_ps(amax4, amax4));
    const float amax = _mm_cvtss_f32(_mm_max_ss(amax2, _mm_movehdup_ps(amax2)));
    const float d = amax / 127.0f;
    block_scales[first / kInt8Block] = d;
    auto* out = reinterpret_cast<__m256i*>(x8 + first);
    if (d == 0.0f) {
      _mm256_storeu_si256(out, _mm256_setzero_si256());
      continue;
    }
    const __m256 divisor = _mm256_set1_ps(d);
    __m256i q[4];
    for (int k = 0; k < 4; ++k) {
      const __m256 c = _mm256_max_ps(_mm256_min_ps(_mm256_div_ps(v[k], divisor), high), low);
      q[k] = _mm256_cvtps_epi32(c);
    }
    const __m256i bytes =
        _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    __m256i ordered = _mm256_permutevar8x32_epi32(bytes, element_order);
    if (bits == 4) {
      ordered = _mm256_permute4x64_epi64(
          _mm256_shuffle_epi8(ordered,
                              _mm256_load_si256(reinterpret_cast<const __m256i*>(kFourBitOrder))),
          0xD8);
    } else if (bits == 2) {
      ordered = _mm256_permutevar8x32_epi32(
          _mm256_shuffle_epi8(ordered,
                              _mm256_load_si256(reinterpret_cast<const __m256i*>(kTwoBitOrder))),
          element_order);
    }
    _mm256_storeu_si256(out, ordered);
  }
}

}  // namespace dspark::kernels::cpu
