// The element-wise kernels with AVX2 + FMA, eight values at a time; the tail runs the reference.
#include "kernels/cpu/avx2/exp_block_avx2.h"
#include "kernels/cpu/elementwise_impl.h"

namespace dspark::kernels::cpu {

void silu_product_avx2(const float* gate, const float* up, float* out, int64_t n) {
  int64_t i = 0;
  if (up == nullptr) {
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, silu8(_mm256_loadu_ps(gate + i)));
  } else {
    for (; i + 8 <= n; i += 8) {
      _mm256_storeu_ps(out + i,
                       _mm256_mul_ps(silu8(_mm256_loadu_ps(gate + i)), _mm256_loadu_ps(up + i)));
    }
  }
  silu_product_ref(gate + i, up == nullptr ? nullptr : up + i, out + i, n - i);
}

void softmax_weights_avx2(const float* x, int64_t n, float peak, float scale, float* out) {
  const __m256 peaks = _mm256_set1_ps(peak), scales = _mm256_set1_ps(scale);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 values = _mm256_loadu_ps(x + i);
    const __m256 numbers = _mm256_cmp_ps(values, values, _CMP_ORD_Q);
    const __m256 weights = exp_block8(_mm256_mul_ps(_mm256_sub_ps(values, peaks), scales));
    _mm256_storeu_ps(out + i, _mm256_and_ps(numbers, weights));
  }
  softmax_weights_ref(x + i, n - i, peak, scale, out + i);
}

}  // namespace dspark::kernels::cpu
