#include "convert/gguf_blocks.h"

#include <cmath>
#include <cstring>

#include "tensor/dtype.h"

namespace dspark::gguf_blocks {
namespace {

uint16_t read_u16(const uint8_t* bytes) {
  uint16_t value;
  std::memcpy(&value, bytes, 2);
  return value;
}

// The f16 of `multiple`·d; false when it overflows.
bool scaled_f16(uint16_t d_bits, float multiple, uint16_t& out) {
  const float value = f16_to_f32(d_bits) * multiple;
  out = f32_to_f16(value);
  return std::isfinite(f16_to_f32(out)) || !std::isfinite(value);
}

}  // namespace

bool q4_0_block(const uint8_t* block, uint8_t codes[32], uint16_t& scale, uint16_t& bias) {
  scale = read_u16(block);
  const uint8_t* nibbles = block + 2;
  for (int j = 0; j < 16; ++j) {
    codes[j] = nibbles[j] & 0x0f;
    codes[j + 16] = nibbles[j] >> 4;
  }
  return scaled_f16(scale, -8.0f, bias);
}

bool q4_1_block(const uint8_t* block, uint8_t codes[32], uint16_t& scale, uint16_t& bias) {
  scale = read_u16(block);
  bias = read_u16(block + 2);
  const uint8_t* nibbles = block + 4;
  for (int j = 0; j < 16; ++j) {
    codes[j] = nibbles[j] & 0x0f;
    codes[j + 16] = nibbles[j] >> 4;
  }
  return true;
}

bool q8_0_block(const uint8_t* block, uint8_t codes[32], uint16_t& scale, uint16_t& bias) {
  scale = read_u16(block);
  for (int j = 0; j < 32; ++j) {
    codes[j] = static_cast<uint8_t>(static_cast<int>(static_cast<int8_t>(block[2 + j])) + 128);
  }
  return scaled_f16(scale, -128.0f, bias);
}

void pack_codes(const uint8_t codes[32], int bits, uint32_t* words) {
  const int per_word = 32 / bits;
  for (int w = 0; w < bits; ++w) {
    uint32_t word = 0;
    for (int k = 0; k < per_word; ++k) {
      word |= static_cast<uint32_t>(codes[w * per_word + k]) << (bits * k);
    }
    words[w] = word;
  }
}

}  // namespace dspark::gguf_blocks
