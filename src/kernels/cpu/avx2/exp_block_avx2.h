#pragma once
// kernels/cpu/exp_block.h eight lanes at a time, with AVX2 + FMA: the same bits per lane.
#include <immintrin.h>

#include "kernels/cpu/exp_block.h"

namespace dspark::kernels::cpu {

inline __m256 exp_block8(__m256 x) {
  using namespace exp_block_constants;
  const __m256 clamped = _mm256_max_ps(x, _mm256_set1_ps(kFloor));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(clamped, _mm256_set1_ps(kLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-kLn2High), clamped);
  r = _mm256_fmadd_ps(n, _mm256_set1_ps(-kLn2Low), r);
  __m256 p = _mm256_set1_ps(kP0);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP1));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP2));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP3));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP4));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP5));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r);
  p = _mm256_add_ps(p, _mm256_set1_ps(1.0f));
  const __m256i exponent =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  const __m256 result = _mm256_mul_ps(p, _mm256_castsi256_ps(exponent));
  const __m256 not_below = _mm256_cmp_ps(x, _mm256_set1_ps(kFloor), _CMP_NLT_UQ);
  return _mm256_and_ps(result, not_below);
}

inline __m256 silu8(__m256 x) {
  const __m256 e = exp_block8(_mm256_or_ps(x, _mm256_set1_ps(-0.0f)));  // -|x|
  const __m256 non_negative = _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_GE_OQ);
  const __m256 numerator = _mm256_blendv_ps(_mm256_mul_ps(x, e), x, non_negative);
  return _mm256_div_ps(numerator, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

}  // namespace dspark::kernels::cpu
