#pragma once
// Little-endian loads from unaligned bytes (MLX does not pad tensors), shared by the kernel units.
// `static` so that a copy compiled with AVX flags is never linked into portable code.
#include <cstdint>
#include <cstring>

namespace dspark::kernels::cpu {

static inline uint32_t load_u32(const uint8_t* p) {
  uint32_t value;
  std::memcpy(&value, p, 4);
  return value;
}

static inline uint64_t load_u64(const uint8_t* p) {
  uint64_t value;
  std::memcpy(&value, p, 8);
  return value;
}

static inline uint16_t load_u16(const uint8_t* p) {
  uint16_t value;
  std::memcpy(&value, p, 2);
  return value;
}

}  // namespace dspark::kernels::cpu
