#pragma once
// ggml block formats that map exactly onto MLX affine quantization with group size 32.
//
// Why the mapping is lossless: each ggml block of 32 weights has one f16 scale d (and for Q4_1 an
// f16 minimum m), and its weights are w = d·(q − 8) (Q4_0), w = d·q + m (Q4_1) or w = d·q (Q8_0,
// q signed). MLX affine stores w = s·q' + b per group of 32 with unsigned q'. So:
//   Q4_0: q' = q,       s = d, b = −8·d
//   Q4_1: q' = q,       s = d, b = m
//   Q8_0: q' = q + 128, s = d, b = −128·d
// −8·d and −128·d are d times a power of two, hence exact in f16 (unless they overflow, which is
// checked). With an f16 d of 11 significant bits and q' of at most 8 bits, s·q' is exact in fp32,
// and so is s·q' + b, which equals ggml's own d·(q − 8), d·q + m or d·q bit for bit.
#include <cstdint>

namespace dspark::gguf_blocks {

constexpr int64_t kBlock = 32;

// Unpacks one ggml block into 32 unsigned MLX codes plus the f16 scale and bias bits. Returns
// false when the bias overflows f16.
bool q4_0_block(const uint8_t* block, uint8_t codes[32], uint16_t& scale, uint16_t& bias);
bool q4_1_block(const uint8_t* block, uint8_t codes[32], uint16_t& scale, uint16_t& bias);
bool q8_0_block(const uint8_t* block, uint8_t codes[32], uint16_t& scale, uint16_t& bias);

// Bytes per ggml block.
constexpr int64_t kQ4_0Bytes = 18;
constexpr int64_t kQ4_1Bytes = 20;
constexpr int64_t kQ8_0Bytes = 34;

// Packs 32 codes of `bits` (4 or 8) into MLX's little-endian bit stream (bits U32 words).
void pack_codes(const uint8_t codes[32], int bits, uint32_t* words);

}  // namespace dspark::gguf_blocks
