// The element-wise kernels with AVX-512, sixteen values at a time; the tail runs the reference.
#include "kernels/cpu/avx512/exp_block_avx512.h"
#include "kernels/cpu/elementwise_impl.h"

namespace dspark::kernels::cpu {

void silu_product_avx512(const float* gate, const float* up, float* out, int64_t n) {
  int64_t i = 0;
  if (up == nullptr) {
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(out + i, silu16(_mm512_loadu_ps(gate + i)));
  } else {
    for (; i + 16 <= n; i += 16) {
      _mm512_storeu_ps(out + i,
                       _mm512_mul_ps(silu16(_mm512_loadu_ps(gate + i)), _mm512_loadu_ps(up + i)));
    }
  }
  silu_product_ref(gate + i, up == nullptr ? nullptr : up + i, out + i, n - i);
}

void softmax_weights_avx512(const float* x, int64_t n, float peak, float scale, float* out) {
  const __m512 peaks = _mm512_set1_ps(peak), scales = _mm512_set1_ps(scale);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 values = _mm512_loadu_ps(x + i);
    const __mmask16 numbers = _mm512_cmp_ps_mask(values, values, _CMP_ORD_Q);
    const __m512 weights = exp_block16(_mm512_mul_ps(_mm512_sub_ps(values, peaks), scales));
    _mm512_storeu_ps(out + i, _mm512_maskz_mov_ps(numbers, weights));
  }
  softmax_weights_ref(x + i, n - i, peak, scale, out + i);
}

}  // namespace dspark::kernels::cpu
