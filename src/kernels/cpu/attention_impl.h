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
#include <bit>
#include <cmath>
#include <cstdint>

namespace dspark::kernels::cpu {

// Keys per block; a multiple of 16 so that the lanes of step 4 start at the block's first key.
constexpr int64_t kAttentionKeyBlock = 256;

struct AttentionBlock {
  const float* q = nullptr;       // [group][head_dim], the group's query heads
  const float* keys = nullptr;    // the block's first key; rows kv_stride floats apart
  const float* values = nullptr;  // likewise
  int64_t kv_stride = 0;
  int64_t count = 0;  // keys in the block, 1..kAttentionKeyBlock
  int64_t group = 0;
  int64_t head_dim = 0;
  float scale = 1.0f;
  float* scores = nullptr;   // scratch [group][kAttentionKeyBlock]
  float* partial = nullptr;  // out [group][2 + head_dim]: peak, sum, acc
};

void attend_block_ref(const AttentionBlock& block);
void attend_block_avx2(const AttentionBlock& block);
void attend_block_avx512(const AttentionBlock& block);

// exp(x) for x ≤ 0 as the SIMD kernels compute it: n = nearest(x·log2 e), r = x - n·ln2 in two
// fma steps, a degree-7 polynomial in r, times 2^n; 0 below -87 (and for -inf).
namespace exp_block_constants {
constexpr float kFloor = -87.0f;
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2High = 0.693359375f;
constexpr float kLn2Low = -2.12194440e-4f;
constexpr float kP0 = 1.9875691500e-4f;
constexpr float kP1 = 1.3981999507e-3f;
constexpr float kP2 = 8.3334519073e-3f;
constexpr float kP3 = 4.1665795894e-2f;
constexpr float kP4 = 1.6666665459e-1f;
constexpr float kP5 = 5.0000001201e-1f;
}  // namespace exp_block_constants

inline float exp_block(float x) {
  using namespace exp_block_constants;
  const float clamped = x > kFloor ? x : kFloor;  // as SIMD max: NaN gives kFloor
  const float n = std::nearbyint(clamped * kLog2e);
  float r = std::fma(n, -kLn2High, clamped);
  r = std::fma(n, -kLn2Low, r);
  float p = kP0;
  p = std::fma(p, r, kP1);
  p = std::fma(p, r, kP2);
  p = std::fma(p, r, kP3);
  p = std::fma(p, r, kP4);
  p = std::fma(p, r, kP5);
  p = std::fma(p, r * r, r);
  p = p + 1.0f;
  const float power =
      std::bit_cast<float>(static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23);
  return x < kFloor ? 0.0f : p * power;
}

// The reduce16 tree of 16 lanes.
inline float reduce16(const float* a) {
  float b[8], c[4];
  for (int l = 0; l < 8; ++l) b[l] = a[l] + a[l + 8];
  for (int l = 0; l < 4; ++l) c[l] = b[l] + b[l + 4];
  return (c[0] + c[2]) + (c[1] + c[3]);
}

}  // namespace dspark::kernels::cpu
