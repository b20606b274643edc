// Bulk bf16 / f16 <-> f32 conversions: every ISA against the scalar conversions of tensor/dtype.h,
// on every 16-bit pattern, special floats and lengths that leave SIMD tails, at odd addresses.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/quant_impl.h"
#include "kernels/quant.h"
#include "test_matrices.h"

namespace dspark::kernels {
namespace {

uint32_t bits_of(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  return bits;
}

std::vector<uint8_t> all_16bit_patterns_at_odd_address() {
  std::vector<uint8_t> bytes(2 * 65536 + 1);
  for (uint32_t k = 0; k < 65536; ++k) {
    const auto pattern = static_cast<uint16_t>(k);
    std::memcpy(bytes.data() + 1 + 2 * k, &pattern, 2);
  }
  return bytes;
}

TEST(Convert, Bf16ToF32EveryPatternEveryIsa) {
  const auto source = all_16bit_patterns_at_odd_address();
  for (Isa isa : testing::supported_isas()) {
    std::vector<float> out(65536 + 1);
    cpu::kernel_table(isa).bf16_to_f32(source.data() + 1, 65536, out.data() + 1);
    for (uint32_t k = 0; k < 65536; ++k) {
      ASSERT_EQ(bits_of(out[k + 1]), bits_of(dspark::bf16_to_f32(static_cast<uint16_t>(k))))
          << isa_name(isa) << " pattern " << k;
    }
  }
}

TEST(Convert, F16ToF32EveryPatternEveryIsa) {
  const auto source = all_16bit_patterns_at_odd_address();
  for (Isa isa : testing::supported_isas()) {
    std::vector<float> out(65536 + 1);
    cpu::kernel_table(isa).f16_to_f32(source.data() + 1, 65536, out.data() + 1);
    for (uint32_t k = 0; k < 65536; ++k) {
      const float expected = dspark::f16_to_f32(static_cast<uint16_t>(k));
      if (std::isnan(expected)) {
        ASSERT_TRUE(std::isnan(out[k + 1])) << isa_name(isa) << " pattern " << k;
      } else {
        ASSERT_EQ(bits_of(out[k + 1]), bits_of(expected)) << isa_name(isa) << " pattern " << k;
      }
    }
  }
}

// Floats from `bits` (random draws), then each of `specials`.
std::vector<float> floats_of(const std::function<uint32_t()>& bits, int count,
                             std::initializer_list<uint32_t> specials) {
  std::vector<float> values;
  auto add = [&](uint32_t pattern) {
    float value;
    std::memcpy(&value, &pattern, 4);
    values.push_back(value);
  };
  for (int k = 0; k < count; ++k) add(bits());
  for (uint32_t pattern : specials) add(pattern);
  return values;
}

using Narrowing = void (*)(const float* src, int64_t n, uint8_t* dst);

// Every ISA's `narrowing` (a kernel table entry) on the last n values, for lengths that leave SIMD
// tails, written at an odd address: `check(value, result)` for each.
void check_narrowing(Narrowing cpu::KernelTable::*narrowing, const std::vector<float>& values,
                     const std::function<void(float, uint16_t, const std::string&)>& check) {
  for (Isa isa : testing::supported_isas()) {
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{17}, static_cast<int64_t>(values.size())}) {
      std::vector<uint8_t> out(2 * n + 1);
      const float* source = values.data() + values.size() - n;
      (cpu::kernel_table(isa).*narrowing)(source, n, out.data() + 1);
      for (int64_t k = 0; k < n; ++k) {
        uint16_t got;
        std::memcpy(&got, out.data() + 1 + 2 * k, 2);
        check(source[k], got, fmt::format("{} n {} k {}", isa_name(isa), n, k));
        if (::testing::Test::HasFatalFailure()) return;
      }
    }
  }
}

TEST(Convert, F32ToBf16RoundsToNearestEvenEveryIsa) {
  std::mt19937 rng(5);
  // Exact ties (round to even both ways), infinities, NaNs of both signs, zeros, subnormals.
  const std::vector<float> values =
      floats_of(rng, 200000,
                {0x3f808000u, 0x3f818000u, 0x7f800000u, 0xff800000u, 0x7fc00001u, 0xffffffffu,
                 0x7f800001u, 0x00000000u, 0x80000000u, 0x00000001u, 0x7f7fffffu, 0x807fffffu});
  check_narrowing(&cpu::KernelTable::f32_to_bf16, values,
                  [](float value, uint16_t got, const std::string& where) {
                    ASSERT_EQ(got, dspark::f32_to_bf16(value)) << where;
                  });
}

TEST(Convert, F32ToF16RoundsToNearestEvenAndSaturatesEveryIsa) {
  std::mt19937 rng(6);
  // Exponents around f16's range, where rounding, subnormals and saturation happen; then ties
  // (round to even both ways), the largest f16 and what rounds past it, infinities, NaNs, zeros,
  // the f16 subnormal grid's ends, fp32 subnormals.
  const std::vector<float> values = floats_of(
      [&] { return (rng() & 0x807fffffu) | ((100u + rng() % 60u) << 23); }, 200000,
      {0x3f801000u, 0x3f803000u, 0x477fe000u, 0x477ff000u, 0x477fffffu, 0xc77ff000u, 0x7f800000u,
       0xff800000u, 0x7fc00001u, 0xffffffffu, 0x00000000u, 0x80000000u, 0x33800000u, 0x33000000u,
       0x33000001u, 0x387fc000u, 0x38800000u, 0x00000001u, 0x807fffffu});
  check_narrowing(&cpu::KernelTable::f32_to_f16, values,
                  [](float value, uint16_t got, const std::string& where) {
                    if (std::isnan(value)) {
                      ASSERT_TRUE(std::isnan(dspark::f16_to_f32(got))) << where;
                      return;
                    }
                    const float clamped = std::clamp(value, -cpu::kF16Max, cpu::kF16Max);
                    ASSERT_EQ(got, dspark::f32_to_f16(clamped)) << where << " value " << value;
                  });
}

TEST(Convert, PublicBulkFunctionsRoundTrip) {
  std::vector<float> values(1000003);
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (auto& v : values) v = normal(rng);
  std::vector<uint16_t> halves(values.size());
  f32_to_bf16(values.data(), static_cast<int64_t>(values.size()), halves.data());
  std::vector<float> back(values.size());
  bf16_to_f32(halves.data(), static_cast<int64_t>(halves.size()), back.data());
  for (size_t k = 0; k < values.size(); ++k) ASSERT_EQ(back[k], dspark::round_to_bf16(values[k]));
  for (size_t k = 0; k < values.size(); ++k) halves[k] = dspark::f32_to_f16(values[k]);
  f16_to_f32(halves.data(), static_cast<int64_t>(halves.size()), back.data());
  for (size_t k = 0; k < values.size(); ++k) ASSERT_EQ(back[k], dspark::f16_to_f32(halves[k]));
}

}  // namespace
}  // namespace dspark::kernels
