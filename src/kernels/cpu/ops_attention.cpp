// Causal grouped-query attention over a token-major KV cache.
//
// Keys are processed in fixed blocks of kAttentionKeyBlock positions, each with its own maximum,
// exponent sum and weighted value sum (kernels/cpu/attention_impl.h), merged afterwards in block
// order ("split-K"). Blocks give a one-token decode step enough independent work for every
// thread; each block serves all query heads of its KV head, so the keys and values are read once
// per group. The blocking depends only on the key positions and each block's arithmetic is fixed,
// so a row's result is the same whatever the number of rows in the call, the thread count and
// the ISA.
#include <algorithm>
#include <cmath>
#include <vector>

#include "base/error.h"
#include "base/system_info.h"
#include "base/thread_pool.h"
#include "kernels/cpu/attention_impl.h"
#include "kernels/cpu/ops_common.h"
#include "kernels/ops.h"

namespace dspark::kernels {
namespace {

using cpu::kAttentionKeyBlock;
using BlockKernel = void (*)(const cpu::AttentionBlock&);

BlockKernel block_kernel(Isa isa) {
  const CpuFeatures& cpu = cpu_features();
  switch (isa) {
    case Isa::avx512vnni:
    case Isa::avx512:
      if (!(cpu.avx512f && cpu.avx512dq && cpu.fma)) break;
      return cpu::attend_block_avx512;
    case Isa::avxvnni:
    case Isa::avx2:
      if (!(cpu.avx2 && cpu.fma)) break;
      return cpu::attend_block_avx2;
    case Isa::scalar:
      return cpu::attend_block_ref;
  }
  fail("causal_attention: this CPU does not support the {} kernels", isa_name(isa));
}

}  // namespace

void causal_attention(const float* q, int64_t rows, int64_t q_heads, int64_t kv_heads,
                      int64_t head_dim, const float* keys, const float* values, int64_t past,
                      float scale, float* out) {
  causal_attention_isa(best_isa(), q, rows, q_heads, kv_heads, head_dim, keys, values, past, scale,
                       out);
}

void causal_attention_isa(Isa isa, const float* q, int64_t rows, int64_t q_heads, int64_t kv_heads,
                          int64_t head_dim, const float* keys, const float* values, int64_t past,
                          float scale, float* out) {
  const BlockKernel attend_block = block_kernel(isa);
  const int64_t group = q_heads / kv_heads;
  const int64_t max_blocks = (past + rows + kAttentionKeyBlock - 1) / kAttentionKeyBlock;
  const int64_t partial_size = group * (2 + head_dim);
  const int64_t row_partials = kv_heads * max_blocks * partial_size;
  // Rows are taken in batches so that the partial results stay within kPartialBudget floats.
  constexpr int64_t kPartialBudget = int64_t{4} << 20;
  const int64_t batch = std::clamp<int64_t>(kPartialBudget / row_partials, 1, rows);
  std::vector<float> partials(batch * row_partials);
  ThreadPool& pool = default_pool();
  for (int64_t first_row = 0; first_row < rows; first_row += batch) {
    const int64_t batch_rows = std::min(batch, rows - first_row);
    // Work item (row, kv head, block); rows see different key counts, so some items are empty.
    pool.parallel_for(batch_rows * kv_heads * max_blocks, 1, [&](int64_t first, int64_t last, int) {
      thread_local std::vector<float> scores;
      const size_t need = group * kAttentionKeyBlock;
      if (scores.size() < need) scores.resize(need);
      for (int64_t item = first; item < last; ++item) {
        const int64_t block = item % max_blocks;
        const int64_t kv = (item / max_blocks) % kv_heads;
        const int64_t r = first_row + item / (max_blocks * kv_heads);
        const int64_t n_keys = past + r + 1;
        const int64_t begin = block * kAttentionKeyBlock;
        if (begin >= n_keys) continue;
        const int64_t offset = begin * kv_heads * head_dim + kv * head_dim;
        cpu::AttentionBlock task;
        task.q = q + (r * q_heads + kv * group) * head_dim;
        task.keys = keys + offset;
        task.values = values + offset;
        task.kv_stride = kv_heads * head_dim;
        task.count = std::min(n_keys - begin, kAttentionKeyBlock);
        task.group = group;
        task.head_dim = head_dim;
        task.scale = scale;
        task.scores = scores.data();
        task.partial = partials.data() + item * partial_size;
        attend_block(task);
      }
    });
    // Merge the blocks of each (row, q head) in block order.
    pool.parallel_for(batch_rows * q_heads, 4, [&](int64_t first, int64_t last, int) {
      for (int64_t index = first; index < last; ++index) {
        const int64_t local_row = index / q_heads, h = index % q_heads;
        const int64_t r = first_row + local_row;
        const int64_t kv = h / group, g = h % group;
        const int64_t blocks = (past + r + 1 + kAttentionKeyBlock - 1) / kAttentionKeyBlock;
        const float* base = partials.data() +
                            (local_row * kv_heads + kv) * max_blocks * partial_size +
                            g * (2 + head_dim);
        float* o = out + (r * q_heads + h) * head_dim;
        if (blocks == 1) {
          const float inv = 1.0f / base[1];
          for (int64_t d = 0; d < head_dim; ++d) o[d] = base[2 + d] * inv;
          continue;
        }
        float peak = -INFINITY;
        for (int64_t b = 0; b < blocks; ++b) peak = std::max(peak, base[b * partial_size]);
        std::fill_n(o, head_dim, 0.0f);
        float sum = 0.0f;
        for (int64_t b = 0; b < blocks; ++b) {
          const float* p = base + b * partial_size;
          const float weight = cpu::exp_block(p[0] - peak);
          sum += weight * p[1];
          cpu::axpy(weight, p + 2, o, head_dim);
        }
        const float inv = 1.0f / sum;
        for (int64_t d = 0; d < head_dim; ++d) o[d] *= inv;
      }
    });
  }
}

}  // namespace dspark::kernels
