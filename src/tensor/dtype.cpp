#include "tensor/dtype.h"

#include <array>
#include <cmath>
#include <utility>

namespace dspark {
namespace {

constexpr std::array<std::pair<DType, std::string_view>, 15> kNames = {{
    {DType::F64, "F64"},
    {DType::F32, "F32"},
    {DType::F16, "F16"},
    {DType::BF16, "BF16"},
    {DType::I64, "I64"},
    {DType::I32, "I32"},
    {DType::I16, "I16"},
    {DType::I8, "I8"},
    {DType::U64, "U64"},
    {DType::U32, "U32"},
    {DType::U16, "U16"},
    {DType::U8, "U8"},
    {DType::BOOL, "BOOL"},
    {DType::F8_E4M3, "F8_E4M3"},
    {DType::F8_E5M2, "F8_E5M2"},
}};

}  // namespace

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::F64:
    case DType::I64:
    case DType::U64:
      return 8;
    case DType::F32:
    case DType::I32:
    case DType::U32:
      return 4;
    case DType::F16:
    case DType::BF16:
    case DType::I16:
    case DType::U16:
      return 2;
    case DType::I8:
    case DType::U8:
    case DType::BOOL:
    case DType::F8_E4M3:
    case DType::F8_E5M2:
      return 1;
  }
  return 0;
}

std::string_view dtype_name(DType dtype) {
  for (const auto& [value, name] : kNames) {
    if (value == dtype) return name;
  }
  return "?";
}

std::optional<DType> parse_dtype(std::string_view name) {
  for (const auto& [value, spelled] : kNames) {
    if (spelled == name) return value;
  }
  return std::nullopt;
}

float f16_to_f32(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  uint32_t exponent = (bits >> 10) & 0x1fu;
  uint32_t mantissa = bits & 0x3ffu;
  uint32_t result;
  if (exponent == 0) {
    if (mantissa == 0) {
      result = sign;
    } else {
      // Subnormal: renormalise.
      exponent = 127 - 15 + 1;
      while ((mantissa & 0x400u) == 0) {
        mantissa <<= 1;
        --exponent;
      }
      mantissa &= 0x3ffu;
      result = sign | (exponent << 23) | (mantissa << 13);
    }
  } else if (exponent == 0x1f) {
    result = sign | 0x7f800000u | (mantissa << 13);
  } else {
    result = sign | ((exponent + 127 - 15) << 23) | (mantissa << 13);
  }
  float value;
  std::memcpy(&value, &result, sizeof(value));
  return value;
}

uint16_t f32_to_f16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs_bits = bits & 0x7fffffffu;
  if (abs_bits >= 0x7f800000u) {
    return sign | (abs_bits > 0x7f800000u ? 0x7e00u : 0x7c00u);
  }
  if (abs_bits >= 0x477ff000u) return sign | 0x7c00u;  // rounds past 65504: infinity
  if (abs_bits < 0x38800000u) {
    // Result is subnormal or zero: scale into the subnormal grid with round-to-nearest-even.
    float magnitude;
    std::memcpy(&magnitude, &abs_bits, sizeof(magnitude));
    const float scaled = magnitude * 16777216.0f;  // 2^24: one f16 subnormal ulp becomes 1.0
    return sign | static_cast<uint16_t>(std::nearbyint(scaled));
  }
  uint32_t rounded = abs_bits + 0xfffu + ((abs_bits >> 13) & 1u);
  return sign | static_cast<uint16_t>((rounded - (112u << 23)) >> 13);
}

}  // namespace dspark
