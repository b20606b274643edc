#pragma once
// Element types as safetensors names them, and conversions of the 16-bit float formats.
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

namespace dspark {

enum class DType {
  F64,
  F32,
  F16,
  BF16,
  I64,
  I32,
  I16,
  I8,
  U64,
  U32,
  U16,
  U8,
  BOOL,
  F8_E4M3,
  F8_E5M2
};

// Bytes per element.
size_t dtype_size(DType dtype);
// The safetensors spelling ("BF16", "U32", ...).
std::string_view dtype_name(DType dtype);
// Parses a safetensors dtype string; nullopt for an unknown one.
std::optional<DType> parse_dtype(std::string_view name);

inline float bf16_to_f32(uint16_t bits) {
  uint32_t widened = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &widened, sizeof(value));
  return value;
}

// Round to nearest even, as MLX and PyTorch do; NaN stays NaN.
inline uint16_t f32_to_bf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

float f16_to_f32(uint16_t bits);
uint16_t f32_to_f16(float value);

// Rounds a float to the nearest bf16 value and back.
inline float round_to_bf16(float value) {
  return bf16_to_f32(f32_to_bf16(value));
}

}  // namespace dspark
