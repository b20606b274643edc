#include "convert/gguf_blocks.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "tensor/dtype.h"

namespace dspark {
namespace {

uint16_t random_f16(std::mt19937& rng, float magnitude) {
  std::uniform_real_distribution<float> dist(-magnitude, magnitude);
  return f32_to_f16(dist(rng));
}

// ggml's own dequantization formulas, written from the published block layouts.
float ggml_q4_0(const uint8_t* block, int j) {
  uint16_t d;
  std::memcpy(&d, block, 2);
  const uint8_t byte = block[2 + (j % 16)];
  const int q = j < 16 ? (byte & 0xf) : (byte >> 4);
  return static_cast<float>(q - 8) * f16_to_f32(d);
}
float ggml_q4_1(const uint8_t* block, int j) {
  uint16_t d, m;
  std::memcpy(&d, block, 2);
  std::memcpy(&m, block + 2, 2);
  const uint8_t byte = block[4 + (j % 16)];
  const int q = j < 16 ? (byte & 0xf) : (byte >> 4);
  return static_cast<float>(q) * f16_to_f32(d) + f16_to_f32(m);
}
float ggml_q8_0(const uint8_t* block, int j) {
  uint16_t d;
  std::memcpy(&d, block, 2);
  return static_cast<float>(static_cast<int8_t>(block[2 + j])) * f16_to_f32(d);
}

// MLX's dequantization of the packed codes: w = scale * q + bias, q read from the bit stream.
float mlx_value(const uint32_t* words, int bits, uint16_t scale, uint16_t bias, int j) {
  const int per_word = 32 / bits;
  const uint32_t q = (words[j / per_word] >> (bits * (j % per_word))) & ((1u << bits) - 1);
  return f16_to_f32(scale) * static_cast<float>(q) + f16_to_f32(bias);
}

struct Case {
  int64_t bytes;
  int bits;
  bool (*unpack)(const uint8_t*, uint8_t*, uint16_t&, uint16_t&);
  float (*reference)(const uint8_t*, int);
};

TEST(GgufBlocks, MapOntoMlxAffineWithoutLoss) {
  std::mt19937 rng(1234);
  const Case cases[] = {
      {gguf_blocks::kQ4_0Bytes, 4, gguf_blocks::q4_0_block, ggml_q4_0},
      {gguf_blocks::kQ4_1Bytes, 4, gguf_blocks::q4_1_block, ggml_q4_1},
      {gguf_blocks::kQ8_0Bytes, 8, gguf_blocks::q8_0_block, ggml_q8_0},
  };
  for (const Case& c : cases) {
    for (int trial = 0; trial < 2000; ++trial) {
      std::vector<uint8_t> block(c.bytes);
      for (auto& byte : block) byte = static_cast<uint8_t>(rng());
      // Scales across many magnitudes, including subnormal f16 values.
      const float magnitude = std::pow(10.0f, static_cast<float>(trial % 9) - 7.0f);
      const uint16_t d = random_f16(rng, magnitude);
      std::memcpy(block.data(), &d, 2);
      if (c.unpack == gguf_blocks::q4_1_block) {
        const uint16_t m = random_f16(rng, magnitude * 8);
        std::memcpy(block.data() + 2, &m, 2);
      }
      uint8_t codes[32];
      uint16_t scale, bias;
      ASSERT_TRUE(c.unpack(block.data(), codes, scale, bias));
      uint32_t words[8];
      gguf_blocks::pack_codes(codes, c.bits, words);
      for (int j = 0; j < 32; ++j) {
        const float expected = c.reference(block.data(), j);
        const float got = mlx_value(words, c.bits, scale, bias, j);
        // Equal values (a zero weight may be +0 on one side and -0 on the other).
        ASSERT_EQ(expected, got) << "bits " << c.bits << " element " << j << ": " << expected
                                 << " vs " << got;
      }
    }
  }
}

TEST(GgufBlocks, BiasOverflowIsReported) {
  uint8_t block[gguf_blocks::kQ8_0Bytes] = {};
  const uint16_t d = f32_to_f16(1000.0f);  // -128 * 1000 overflows f16
  std::memcpy(block, &d, 2);
  uint8_t codes[32];
  uint16_t scale, bias;
  EXPECT_FALSE(gguf_blocks::q8_0_block(block, codes, scale, bias));
}

}  // namespace
}  // namespace dspark
