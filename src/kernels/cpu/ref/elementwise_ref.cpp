// The scalar reference of the element-wise kernels (kernels/cpu/elementwise_impl.h).
#include "kernels/cpu/elementwise_impl.h"
#include "kernels/cpu/exp_block.h"

namespace dspark::kernels::cpu {

void silu_product_ref(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    out[i] = up == nullptr ? silu_block(gate[i]) : silu_block(gate[i]) * up[i];
  }
}

void softmax_weights_ref(const float* x, int64_t n, float peak, float scale, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] != x[i] ? 0.0f : exp_block((x[i] - peak) * scale);
}

}  // namespace dspark::kernels::cpu
