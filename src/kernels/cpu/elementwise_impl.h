#pragma once
// Internal to the kernels module: the element-wise kernels with one implementation per ISA, each
// giving the reference's bits (kernels/cpu/exp_block.h).
#include <cstdint>

namespace dspark::kernels::cpu {

// out[i] = silu(gate[i]) · up[i], or silu(gate[i]) when up is null; out may alias gate or up.
void silu_product_ref(const float* gate, const float* up, float* out, int64_t n);
void silu_product_avx2(const float* gate, const float* up, float* out, int64_t n);
void silu_product_avx512(const float* gate, const float* up, float* out, int64_t n);

// out[i] = exp_block((x[i] - peak) · scale), and 0 where x[i] is NaN.
void softmax_weights_ref(const float* x, int64_t n, float peak, float scale, float* out);
void softmax_weights_avx2(const float* x, int64_t n, float peak, float scale, float* out);
void softmax_weights_avx512(const float* x, int64_t n, float peak, float scale, float* out);

}  // namespace dspark::kernels::cpu
