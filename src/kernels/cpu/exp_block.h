#pragma once
// Internal to the kernels module: exp and SiLU in one fixed arithmetic that the scalar reference
// and the SIMD kernels (avx2/exp_block_avx2.h, avx512/exp_block_avx512.h) share, so every ISA
// gives the same bits, and a device backend can reproduce them (libm's exp is not specified to
// the bit and differs between libraries).
#include <bit>
#include <cmath>
#include <cstdint>

namespace dspark::kernels::cpu {

// exp(x) for x ≤ 0: n = nearest(x·log2 e), r = x - n·ln2 in two fma steps, a degree-7 polynomial
// in r, times 2^n; 0 below -87 (and for -inf). Within 2 ulp of exp over [-87, 0].
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

// silu(x) = x · sigmoid(x) from e = exp(-|x|), which never overflows: x / (1 + e) for x ≥ 0,
// x·e / (1 + e) below (and for NaN). One division, correctly rounded on every ISA.
inline float silu_block(float x) {
  const float e = exp_block(-std::fabs(x));
  return (x >= 0.0f ? x : x * e) / (1.0f + e);
}

}  // namespace dspark::kernels::cpu
