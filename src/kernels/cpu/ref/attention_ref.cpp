// The reference attention block: the order of kernels/cpu/attention_impl.h, one value at a time.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/attention_impl.h"
#include "tensor/dtype.h"

namespace dspark::kernels::cpu {

namespace {

// Row j of the block's keys or values as fp32: in place, or widened into `row`.
const float* kv_row(const AttentionBlock& block, const void* base, int64_t j,
                    std::vector<float>& row) {
  if (block.kv_type == KvType::f32) return static_cast<const float*>(base) + j * block.kv_stride;
  widen_f16_rows_ref(static_cast<const uint16_t*>(base) + j * block.kv_stride, 0, 1, block.head_dim,
                     row.data());
  return row.data();
}

}  // namespace

void attend_block_ref(const AttentionBlock& block) {
  const int64_t dim = block.head_dim, count = block.count;
  // One row widened at a time; kept per thread, as the SIMD kernels keep their key tile.
  thread_local std::vector<float> row;
  if (block.kv_type == KvType::f16 && row.size() < static_cast<size_t>(dim)) row.resize(dim);
  for (int64_t h = 0; h < block_heads(block); ++h) {
    const float* q = head_q(block, h);
    float* scores = block.scores + h * kAttentionKeyBlock;
    for (int64_t j = 0; j < count; ++j) {
      const float* key = kv_row(block, block.keys, j, row);
      float lanes[16] = {};
      for (int64_t d = 0; d < dim; ++d) lanes[d % 16] = std::fma(q[d], key[d], lanes[d % 16]);
      scores[j] = reduce16(lanes) * block.scale;
    }
    float peak = -INFINITY;
    for (int64_t j = 0; j < count; ++j) peak = std::max(peak, scores[j]);
    float lanes[16] = {};
    for (int64_t j = 0; j < count; ++j) {
      scores[j] = exp_block(scores[j] - peak);
      lanes[j % 16] += scores[j];
    }
    float* partial = head_partial(block, h);
    partial[0] = peak;
    partial[1] = reduce16(lanes);
    float* acc = partial + 2;
    std::fill_n(acc, dim, 0.0f);
    for (int64_t j = 0; j < count; ++j) {
      const float* value = kv_row(block, block.values, j, row);
      for (int64_t d = 0; d < dim; ++d) acc[d] = std::fma(scores[j], value[d], acc[d]);
    }
  }
}

void widen_f16_rows_ref(const uint16_t* src, int64_t stride, int64_t rows, int64_t dim,
                        float* dst) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t d = 0; d < dim; ++d) dst[r * dim + d] = dspark::f16_to_f32(src[r * stride + d]);
  }
}

}  // namespace dspark::kernels::cpu
