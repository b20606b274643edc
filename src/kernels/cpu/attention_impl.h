#pragma once
// Internal to the kernels module: one key block of causal attention, implemented three times
// (scalar reference, AVX2, AVX-512) with the same arithmetic, so every ISA gives the same bits.
//
// The fixed order, per query head g of the block (count keys, head_dim D):
//   1. dot_j: 16 lanes, lane l = fma chain over d ≡ l (mod 16) ascending from 0, then
//      reduce16; score_j = dot_j · scale.
//   2. peak = max_j score_j.
//   3. e_j = exp_block(score_j - peak).
//   4. sum: 16 lanes, lane l adds e_j for j ≡ l (mod 16) ascending from 0, then reduce16.
//   5. acc[d] = fma chain over j ascending from 0: acc[d] ← fma(e_j, v_j[d], acc[d]).
// reduce16(a): b_l = a_l + a_{l+8}, c_l = b_l + b_{l+4}, d_l = c_l + c_{l+2}, result d_0 + d_1.
// The caller (ops_attention.cpp) merges the blocks of a row in block order. The SIMD kernels take
// head_dim in multiples of 16 and leave other sizes to the reference. Bit equality holds for finite
// inputs. Keep every product in the SIMD kernels away from a following add: GCC's default
// -ffp-contract=fast would fuse the pair into an fma the reference does not make.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cpu/exp_block.h"
#include "kernels/ops.h"

namespace dspark::kernels::cpu {

// Keys per block; a multiple of 16 so that the lanes of step 4 start at the block's first key.
constexpr int64_t kAttentionKeyBlock = 256;
// Keys whose value rows the SIMD kernels' step 5 takes for every head before the next run: 64
// rows of head_dim 64 in fp32 are 16 KiB, which stay in L1 for all the passes over the heads.
constexpr int64_t kValueRun = 64;

struct AttentionBlock {
  // The group's query heads [group][head_dim] of the first row; the other rows' (see `rows`)
  // follow q_row_stride floats apart.
  const float* q = nullptr;
  const void* keys = nullptr;    // the block's first key; rows kv_stride elements apart
  const void* values = nullptr;  // likewise
  // The element type of keys and values. An f16 block is widened (exactly) as the kernel reads it,
  // a tile of keys and a value row at a time, so its bits are those of the same values in fp32.
  KvType kv_type = KvType::f32;
  int64_t kv_stride = 0;
  // The rows come from a cache out of L2 (a decode row, or the first row of a short verify):
  // fetch them kKvRowsAhead keys ahead. The rows after the first of a verify or prefill find the
  // block in L2, or read a widened copy there, and the prefetches would only cost them (prefill
  // 1.04x slower).
  bool fetch_ahead = false;
  int64_t count = 0;  // keys in the block, 1..kAttentionKeyBlock
  int64_t group = 0;
  int64_t head_dim = 0;
  float scale = 1.0f;
  // Query rows that read the block's `count` keys each: a verify's or prefill's rows share one
  // pass over the block (each key tile and value row read once for all of them). Every head of
  // every row is computed as it would be alone.
  int64_t rows = 1;
  int64_t q_row_stride = 0;        // floats from one row's q to the next's
  int64_t partial_row_stride = 0;  // floats from one row's partial to the next's
  float* scores = nullptr;         // scratch [rows * group][kAttentionKeyBlock]
  float* partial = nullptr;        // out, per row [group][2 + head_dim]: peak, sum, acc
};

// The block's query heads, row after row: head h is head h % group of row h / group.
inline int64_t block_heads(const AttentionBlock& block) {
  return block.rows * block.group;
}
inline const float* head_q(const AttentionBlock& block, int64_t h) {
  return block.q + h / block.group * block.q_row_stride + h % block.group * block.head_dim;
}
// head_q of every head, for the loops that visit every head once per key tile (no division per
// head and tile).
inline const std::vector<const float*>& head_queries(const AttentionBlock& block) {
  thread_local std::vector<const float*> queries;
  queries.resize(static_cast<size_t>(block_heads(block)));
  for (int64_t h = 0; h < block_heads(block); ++h) queries[h] = head_q(block, h);
  return queries;
}
inline float* head_partial(const AttentionBlock& block, int64_t h) {
  return block.partial + h / block.group * block.partial_row_stride +
         h % block.group * (2 + block.head_dim);
}

void attend_block_ref(const AttentionBlock& block);
void attend_block_avx2(const AttentionBlock& block);
void attend_block_avx512(const AttentionBlock& block);

// Step 5 over every head of the block, kValueRun keys at a time, so that a run's value rows stay
// in L1 while each pass of heads reads them (the passes carry their sums from run to run through
// the partials): pass.template operator()<n>(first_head, j0, j1) accumulates keys [j0, j1) for n
// heads, in passes of NG heads and one of the rest.
template <int N, typename Pass>
void pass_of_the_rest(int64_t rest, int64_t g, int64_t j0, int64_t j1, Pass& pass) {
  if constexpr (N > 0) {
    if (rest == N) return pass.template operator()<N>(g, j0, j1);
    pass_of_the_rest<N - 1>(rest, g, j0, j1, pass);
  }
}
template <int NG, typename Pass>
void accumulate_in_runs(const AttentionBlock& block, Pass&& pass) {
  const int64_t heads = block_heads(block);
  for (int64_t j0 = 0; j0 < block.count; j0 += kValueRun) {
    const int64_t j1 = std::min(block.count, j0 + kValueRun);
    int64_t g = 0;
    for (; g + NG <= heads; g += NG) pass.template operator()<NG>(g, j0, j1);
    pass_of_the_rest<NG - 1>(heads - g, g, j0, j1, pass);
  }
}

// dst[r · dim + d] = the f16 value src[r · stride + d] widened to fp32 (exactly), for `rows` rows:
// one kv head's keys or values of an f16 cache, packed for the block kernels.
void widen_f16_rows_ref(const uint16_t* src, int64_t stride, int64_t rows, int64_t dim, float* dst);
void widen_f16_rows_avx2(const uint16_t* src, int64_t stride, int64_t rows, int64_t dim,
                         float* dst);
void widen_f16_rows_avx512(const uint16_t* src, int64_t stride, int64_t rows, int64_t dim,
                           float* dst);

// A decode row's keys and values come from a cache that the layers since its last step have pushed
// out of L2, and the kernels read them a row at a time, too slowly for the hardware prefetcher to
// run far enough ahead. With AttentionBlock::fetch_ahead each kernel fetches the rows kKvRowsAhead
// keys ahead of its reads: on a Zen 3 VM (AVX2), decoding at 2k tokens of context ran 1.25-1.35x
// faster with keys and values both fetched 16 rows ahead than with neither (8 or 32 rows: in
// between).
constexpr int64_t kKvRowsAhead = 16;

// Prefetches rows [first, end) of `base` (rows `stride` values apart, `elements` values each) into
// every cache level; nothing when the range is empty.
template <typename T>
inline void prefetch_rows(const T* base, int64_t first, int64_t end, int64_t stride,
                          int64_t elements) {
  const int64_t bytes = elements * static_cast<int64_t>(sizeof(T));
  for (int64_t r = first; r < end; ++r) {
    const char* row = reinterpret_cast<const char*>(base + r * stride);
    for (int64_t line = 0; line < bytes; line += 64) __builtin_prefetch(row + line, 0, 3);
  }
}

// The reduce16 tree of 16 lanes.
inline float reduce16(const float* a) {
  float b[8], c[4];
  for (int l = 0; l < 8; ++l) b[l] = a[l] + a[l + 8];
  for (int l = 0; l < 4; ++l) c[l] = b[l] + b[l + 4];
  return (c[0] + c[2]) + (c[1] + c[3]);
}

}  // namespace dspark::kernels::cpu
