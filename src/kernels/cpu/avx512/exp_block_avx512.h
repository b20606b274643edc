#pragma once
// kernels/cpu/exp_block.h sixteen lanes at a time, with AVX-512: the same bits per lane.
#include "kernels/cpu/avx512/intrinsics.h"
#include "kernels/cpu/exp_block.h"

namespace dspark::kernels::cpu {

inline __m512 exp_block16(__m512 x) {
  using namespace exp_block_constants;
  const __m512 clamped = _mm512_max_ps(x, _mm512_set1_ps(kFloor));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(clamped, _mm512_set1_ps(kLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-kLn2High), clamped);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(-kLn2Low), r);
  __m512 p = _mm512_set1_ps(kP0);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP1));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP2));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP3));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP4));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP5));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r);
  p = _mm512_add_ps(p, _mm512_set1_ps(1.0f));
  const __m512i exponent =
      _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  const __m512 result = _mm512_mul_ps(p, _mm512_castsi512_ps(exponent));
  const __mmask16 below = _mm512_cmp_ps_mask(x, _mm512_set1_ps(kFloor), _CMP_LT_OQ);
  return _mm512_maskz_mov_ps(static_cast<__mmask16>(~below), result);
}

inline __m512 silu16(__m512 x) {
  const __m512 e = exp_block16(_mm512_or_ps(x, _mm512_set1_ps(-0.0f)));  // -|x|
  const __mmask16 non_negative = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_GE_OQ);
  const __m512 numerator = _mm512_mask_mov_ps(_mm512_mul_ps(x, e), non_negative, x);
  return _mm512_div_ps(numerator, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}

}  // namespace dspark::kernels::cpu
