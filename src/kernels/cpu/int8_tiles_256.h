#pragma once
// The 256-bit kernels of the int8 numerics (quant_impl.h): quantized products as exact integer dot
// products, 8 output rows per tile in the 8 lanes of a ymm register, each lane running the
// canonical float sequence of one (activation row, output row). Included by avx2/ and avxvnni/,
// each compiled with its own flags: everything here has internal linkage, so that neither copy
// can stand in for the other. With AVX-VNNI (__AVXVNNI__) the products add straight into int32
// lanes: vpdpbusd for byte codes, vpdpwssd for word codes.
//
// Codes of 2 and 4 bits are multiplied as bytes with vpmaddubsw (unsigned codes times signed
// activations: two products per 16-bit sum, at most 2·15·127, no saturation); codes of 3, 5, 6
// and 8 bits as 16-bit words with vpmaddwd (8-bit codes would saturate vpmaddubsw:
// 2·255·127 > 32767), except 8-bit tile codes without VNNI, which meet vpmaddubsw as two nibbles
// each (byte_tile_code_sums). Every block of 32 inputs yields one exact int32 per row.
//
// Up to 8 activation rows (decode, a verify) multiply codes unpacked in registers (4 bits: two
// rows per vector), up to 4 rows side by side, and a transposing vphadd tree gathers the 8 rows'
// sums into one vector. Each tile's scales and biases come from the matrix's tile values when it
// has them (quant.h), else from an 8 x 8 transpose per chunk of 8 groups. More rows (prefill): a
// tile unpacks its 8 rows' codes one chunk of 8 groups at a time into an L1 buffer, interleaved so
// that each row's sums build up in its own lane with no horizontal sums, and reuses them for every
// activation row of a block of up to 64, 4 rows side by side, so an extra activation row costs the
// integer dot products and its float sequence alone. 4-bit tile codes (quant.h) are interleaved
// already: any number of rows reads them straight, up to 4 side by side per unpacking.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/int8_dispatch.h"
#include "kernels/cpu/quant_impl.h"
#include "kernels/cpu/unaligned_loads.h"
#include "tensor/dtype.h"

namespace dspark::kernels::cpu {
namespace {

#if defined(__AVXVNNI__)
constexpr bool kVnni = true;
#else
constexpr bool kVnni = false;
#endif

constexpr int kTileRows = 8;
// A tile works through its rows in chunks of 8 groups: one vector of 8 rows' scales per group,
// the 8 groups' scales loaded together (an 8 x 8 transpose).
constexpr int64_t kChunkGroups = 8;
// Activation rows whose accumulators a tile keeps while it passes over its weights once. A larger
// batch (prefill) passes over the weights once per block, with the block's activations in L2.
constexpr int64_t kActivationBlockRows = 64;
// At most this many activation rows multiply codes unpacked in registers, kRowsTogether at a time.
// The codes come from L1 after the first pass, so the unpacking is all an extra pass costs; the
// interleaved buffer costs its build and a store and load of every step. Zen 3,
// scripts/int8_tile_ab.sh, medians against the buffer: 4-bit 0.87x at 3 rows, 0.90-0.94x at 4
// and 1.00x at 8; the 8-bit head 0.74x at 3, 0.78x at 4, 0.89x at 8 (16 rows: 4-bit 1.05-1.14x).
constexpr int64_t kRegisterCodeRows = 8;
// Activation rows that share a pass over a chunk's codes (the remainder goes 3, 2 or 1 at a time).
constexpr int kRowsTogether = 4;

template <int Bits>
constexpr bool kByteCodes = Bits == 2 || Bits == 4;

// Tile codes that any number of rows multiplies straight from the tile (4 bits; 8 bits as nibble
// pairs without VNNI, byte_tile_code_sums), where other tile codes fill the interleaved buffer.
template <int Bits>
constexpr bool kRegisterTileCodes = Bits == 4 || (Bits == 8 && !kVnni);

// 16 codes of 3, 5 or 6 bits span 2·Bits bytes. Word e of the shuffle (both 128-bit lanes hold the
// same bytes; lane 1 serves codes 8-15) gathers the two bytes holding code e; multiplying by
// 2^(8 - offset) and shifting right by 8 leaves the code's bits at the bottom.
template <int Bits>
struct WordCodeTables {
  alignas(32) uint8_t pair_index[32];
  alignas(32) uint16_t multipliers[16];
};

template <int Bits>
constexpr WordCodeTables<Bits> make_word_code_tables() {
  WordCodeTables<Bits> tables{};
  for (int e = 0; e < 16; ++e) {
    const int byte = e * Bits / 8;
    tables.pair_index[2 * e] = static_cast<uint8_t>(byte);
    tables.pair_index[2 * e + 1] = static_cast<uint8_t>(byte + 1);
    tables.multipliers[e] = static_cast<uint16_t>(1u << (8 - e * Bits % 8));
  }
  return tables;
}

template <int Bits>
constexpr WordCodeTables<Bits> kWordCodes = make_word_code_tables<Bits>();

// Exactly 2·Bits bytes, zero-extended to 16, without reading past them.
template <int Bits>
__m128i load_exact(const uint8_t* p) {
  if constexpr (Bits == 3) {
    return _mm_insert_epi16(_mm_cvtsi32_si128(static_cast<int>(load_u32(p))), load_u16(p + 4), 2);
  } else if constexpr (Bits == 5) {
    return _mm_insert_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)), load_u16(p + 8),
                            4);
  } else {
    return _mm_insert_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)),
                            static_cast<int>(load_u32(p + 8)), 2);
  }
}

// 16 codes as 16-bit words, in element order.
template <int Bits>
__m256i unpack_words16(const uint8_t* p) {
  if constexpr (Bits == 8) {
    return _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  } else {
    const __m256i bytes = _mm256_broadcastsi128_si256(load_exact<Bits>(p));
    const __m256i pairs = _mm256_shuffle_epi8(
        bytes, _mm256_load_si256(reinterpret_cast<const __m256i*>(kWordCodes<Bits>.pair_index)));
    const __m256i shifted = _mm256_srli_epi16(
        _mm256_mullo_epi16(pairs, _mm256_load_si256(reinterpret_cast<const __m256i*>(
                                      kWordCodes<Bits>.multipliers))),
        8);
    return _mm256_and_si256(shifted, _mm256_set1_epi16((1 << Bits) - 1));
  }
}

// Vectors holding one row's unpacked block of 32 codes: 32 bytes, or 32 words in two vectors.
template <int Bits>
constexpr int kCodeVectors = kByteCodes<Bits> ? 1 : 2;

// One block of 32 codes. Byte order of 2 bits: slot 8k + i holds element 4i + k; of 4 bits:
// slot j < 16 element 2j, slot 16 + j element 2j + 1 (the low nibbles, then the high ones).
// Words are in element order.
template <int Bits>
void unpack_block(const uint8_t* p, __m256i* out) {
  if constexpr (Bits == 2) {
    const __m256i shifted = _mm256_srlv_epi64(_mm256_set1_epi64x(static_cast<int64_t>(load_u64(p))),
                                              _mm256_setr_epi64x(0, 2, 4, 6));
    out[0] = _mm256_and_si256(shifted, _mm256_set1_epi8(3));
  } else if constexpr (Bits == 4) {
    const __m256i bytes =
        _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    const __m256i shifted = _mm256_srlv_epi64(bytes, _mm256_setr_epi64x(0, 0, 4, 4));
    out[0] = _mm256_and_si256(shifted, _mm256_set1_epi8(15));
  } else {
    out[0] = unpack_words16<Bits>(p);
    out[1] = unpack_words16<Bits>(p + 2 * Bits);
  }
}

// Lane r = the sum of the 8 int32 lanes of p[r].
__m256i reduce8(const __m256i* p) {
  const __m256i h01 = _mm256_hadd_epi32(p[0], p[1]);
  const __m256i h23 = _mm256_hadd_epi32(p[2], p[3]);
  const __m256i h45 = _mm256_hadd_epi32(p[4], p[5]);
  const __m256i h67 = _mm256_hadd_epi32(p[6], p[7]);
  // Each 128-bit lane: the sums of rows 0-3 (4-7) over that lane's half of the block.
  const __m256i h0123 = _mm256_hadd_epi32(h01, h23);
  const __m256i h4567 = _mm256_hadd_epi32(h45, h67);
  return _mm256_add_epi32(_mm256_permute2x128_si256(h0123, h4567, 0x20),
                          _mm256_permute2x128_si256(h0123, h4567, 0x31));
}

// The 8 rows' exact sums Σ q·x8 over one block; q[r * kCodeVectors ...] is row r's codes.
template <int Bits>
__attribute__((always_inline)) inline __m256i block_sums(const __m256i* q, const int8_t* x8) {
  if constexpr (kByteCodes<Bits>) {
    // vpmaddubsw leaves 16 words per row, each the sum of 2 products; a vphaddw tree adds them
    // to one word per row and 128-bit lane, the sum of 16 products: at most 16·15·127 < 2^15.
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x8));
    __m256i p[kTileRows];
#pragma GCC unroll 8
    for (int r = 0; r < kTileRows; ++r) p[r] = _mm256_maddubs_epi16(q[r], x);
    const __m256i h0123 =
        _mm256_hadd_epi16(_mm256_hadd_epi16(p[0], p[1]), _mm256_hadd_epi16(p[2], p[3]));
    const __m256i h4567 =
        _mm256_hadd_epi16(_mm256_hadd_epi16(p[4], p[5]), _mm256_hadd_epi16(p[6], p[7]));
    // Words 0-7 of each 128-bit lane: rows 0-7 over that lane's half of the block.
    const __m256i halves = _mm256_hadd_epi16(h0123, h4567);
    return _mm256_add_epi32(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(halves)),
                            _mm256_cvtepi16_epi32(_mm256_extracti128_si256(halves, 1)));
  } else {
    const __m256i x_low =
        _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x8)));
    const __m256i x_high =
        _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x8 + 16)));
    __m256i p[kTileRows];
#pragma GCC unroll 8
    for (int r = 0; r < kTileRows; ++r) {
#if defined(__AVXVNNI__)
      p[r] = _mm256_dpwssd_avx_epi32(_mm256_madd_epi16(q[2 * r], x_low), q[2 * r + 1], x_high);
#else
      p[r] = _mm256_add_epi32(_mm256_madd_epi16(q[2 * r], x_low),
                              _mm256_madd_epi16(q[2 * r + 1], x_high));
#endif
    }
    return reduce8(p);
  }
}

// Four-bit codes as row pairs. A block's 8 rows of 16 packed bytes become 8 vectors: pair k
// (rows k and k + 4 in 128-bit lanes 0 and 1) has its low nibbles (the even elements) in vector 2k
// and its high nibbles (the odd ones) in vector 2k + 1.
constexpr int kNibblePairVectors = 8;

__attribute__((always_inline)) inline void unpack_nibble_pairs(const uint8_t* const* packed,
                                                               int64_t offset, __m256i* pairs) {
  const __m256i mask = _mm256_set1_epi8(15);
#pragma GCC unroll 4
  for (int k = 0; k < 4; ++k) {
    const __m256i bytes = _mm256_inserti128_si256(
        _mm256_castsi128_si256(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(packed[k] + offset))),
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(packed[k + 4] + offset)), 1);
    pairs[2 * k] = _mm256_and_si256(bytes, mask);
    pairs[2 * k + 1] = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), mask);
  }
}

// The 8 rows' exact sums over one block from its row pairs, x8 the block's activations in slot
// order (the 16 even elements, then the 16 odd ones), each half duplicated into both lanes to meet
// the pairs' low and high nibbles. Three vphaddw and one vpmaddwd then leave one dword per row, in
// row order, where a row per vector took seven vphaddw (two cycles each on Zen 3's one pipe for
// them: the decode step's bottleneck). Word sums stay below 2^15: at most 16 products of 15·127.
__attribute__((always_inline)) inline __m256i nibble_pair_sums(const __m256i* pairs,
                                                               const int8_t* x8) {
  const __m256i even =
      _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x8)));
  const __m256i odd =
      _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x8 + 16)));
  __m256i v[4];
#pragma GCC unroll 4
  for (int k = 0; k < 4; ++k) {
    v[k] = _mm256_add_epi16(_mm256_maddubs_epi16(pairs[2 * k], even),
                            _mm256_maddubs_epi16(pairs[2 * k + 1], odd));
  }
  // Lane 0: rows 0-3, two words each; lane 1: rows 4-7.
  const __m256i words =
      _mm256_hadd_epi16(_mm256_hadd_epi16(v[0], v[1]), _mm256_hadd_epi16(v[2], v[3]));
  return _mm256_madd_epi16(words, _mm256_set1_epi16(1));
}

// More than one activation row: the tile's codes are stored interleaved, so that no horizontal sums
// are needed. Step s of a block is one vector whose dword r holds row r's codes of slots
// 4s .. 4s+3 (bytes) or 2s, 2s+1 (words); multiplied by the activations of those slots broadcast to
// every dword, it adds to each row's sum in that row's own lane.
template <int Bits>
constexpr int kSteps = kByteCodes<Bits> ? 8 : 16;

// v[s] dword r = a[r] dword s, for an 8 x 8 matrix of dwords.
__attribute__((always_inline)) inline void transpose8x8(const __m256i* a, __m256i* v) {
  __m256i t[8], u[8];
  for (int k = 0; k < 4; ++k) {
    t[2 * k] = _mm256_unpacklo_epi32(a[2 * k], a[2 * k + 1]);
    t[2 * k + 1] = _mm256_unpackhi_epi32(a[2 * k], a[2 * k + 1]);
  }
  // u[4h + c]: rows 4h .. 4h+3 of columns c (low 128-bit lane) and c + 4 (high lane).
  for (int h = 0; h < 2; ++h) {
    u[4 * h] = _mm256_unpacklo_epi64(t[4 * h], t[4 * h + 2]);
    u[4 * h + 1] = _mm256_unpackhi_epi64(t[4 * h], t[4 * h + 2]);
    u[4 * h + 2] = _mm256_unpacklo_epi64(t[4 * h + 1], t[4 * h + 3]);
    u[4 * h + 3] = _mm256_unpackhi_epi64(t[4 * h + 1], t[4 * h + 3]);
  }
  for (int c = 0; c < 4; ++c) {
    v[c] = _mm256_permute2x128_si256(u[c], u[4 + c], 0x20);
    v[c + 4] = _mm256_permute2x128_si256(u[c], u[4 + c], 0x31);
  }
}

// Byte shuffles zero-extending bytes 0, 1 (2, 3) of every dword into its two words.
constexpr uint8_t kZeroByte = 0x80;
alignas(32) constexpr uint8_t kLowPairWords[32] = {
    0,  kZeroByte, 1,  kZeroByte, 4,  kZeroByte, 5,  kZeroByte, 8, kZeroByte, 9, kZeroByte,
    12, kZeroByte, 13, kZeroByte, 0,  kZeroByte, 1,  kZeroByte, 4, kZeroByte, 5, kZeroByte,
    8,  kZeroByte, 9,  kZeroByte, 12, kZeroByte, 13, kZeroByte};
alignas(32) constexpr uint8_t kHighPairWords[32] = {
    2,  kZeroByte, 3,  kZeroByte, 6,  kZeroByte, 7,  kZeroByte, 10, kZeroByte, 11, kZeroByte,
    14, kZeroByte, 15, kZeroByte, 2,  kZeroByte, 3,  kZeroByte, 6,  kZeroByte, 7,  kZeroByte,
    10, kZeroByte, 11, kZeroByte, 14, kZeroByte, 15, kZeroByte};

// Word steps 2k (codes 4k, 4k+1) and 2k + 1 (codes 4k+2, 4k+3) of every row from vector k = its
// codes 4k .. 4k+3, for the 8 vectors of a block of 8-bit codes.
__attribute__((always_inline)) inline void widen_byte_steps(const __m256i* dwords, __m256i* steps) {
  const __m256i low_pair = _mm256_load_si256(reinterpret_cast<const __m256i*>(kLowPairWords));
  const __m256i high_pair = _mm256_load_si256(reinterpret_cast<const __m256i*>(kHighPairWords));
#pragma GCC unroll 8
  for (int k = 0; k < kTileRows; ++k) {
    steps[2 * k] = _mm256_shuffle_epi8(dwords[k], low_pair);
    steps[2 * k + 1] = _mm256_shuffle_epi8(dwords[k], high_pair);
  }
}

// The word steps of one block of 8-bit tile codes (quant.h), whose vector k is already what the
// transpose of unpack_interleaved<8> leaves.
__attribute__((always_inline)) inline void byte_steps_to_words(const uint8_t* block,
                                                               __m256i* steps) {
  __m256i dwords[kTileRows];
#pragma GCC unroll 8
  for (int k = 0; k < kTileRows; ++k) {
    dwords[k] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 32 * k));
  }
  widen_byte_steps(dwords, steps);
}

// The 8 rows' block starting at packed[r] + offset, unpacked and interleaved into steps[kSteps].
template <int Bits>
void unpack_interleaved(const uint8_t* const* packed, int64_t offset, __m256i* steps) {
  if constexpr (Bits == 4) {
    // Straight from the packed bytes: step s < 4 is dword s of each row's 16 bytes, low nibbles;
    // step s + 4 the high nibbles. Rows k and k + 4 share a vector (128-bit lanes 0 and 1), and a
    // 4 x 4 dword transpose per lane puts dword s of rows 0-3 (4-7) into vector s.
    __m256i r[4];
    for (int k = 0; k < 4; ++k) {
      r[k] = _mm256_inserti128_si256(
          _mm256_castsi128_si256(
              _mm_loadu_si128(reinterpret_cast<const __m128i*>(packed[k] + offset))),
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(packed[k + 4] + offset)), 1);
    }
    const __m256i t0 = _mm256_unpacklo_epi32(r[0], r[1]), t1 = _mm256_unpackhi_epi32(r[0], r[1]);
    const __m256i t2 = _mm256_unpacklo_epi32(r[2], r[3]), t3 = _mm256_unpackhi_epi32(r[2], r[3]);
    const __m256i dwords[4] = {_mm256_unpacklo_epi64(t0, t2), _mm256_unpackhi_epi64(t0, t2),
                               _mm256_unpacklo_epi64(t1, t3), _mm256_unpackhi_epi64(t1, t3)};
    const __m256i mask = _mm256_set1_epi8(15);
    for (int k = 0; k < 4; ++k) {
      steps[k] = _mm256_and_si256(dwords[k], mask);
      steps[k + 4] = _mm256_and_si256(_mm256_srli_epi16(dwords[k], 4), mask);
    }
    return;
  } else if constexpr (Bits == 8) {
    // Straight from the packed bytes: an 8 x 8 transpose of each row's 8 dwords (4 codes each)
    // gives vector k = codes 4k .. 4k+3 of every row, which a byte shuffle widens into steps 2k
    // (codes 4k, 4k+1) and 2k + 1 (codes 4k+2, 4k+3).
    __m256i rows[kTileRows], dwords[kTileRows];
#pragma GCC unroll 8
    for (int r = 0; r < kTileRows; ++r) {
      rows[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(packed[r] + offset));
    }
    transpose8x8(rows, dwords);
    widen_byte_steps(dwords, steps);
    return;
  }
  __m256i rows[kTileRows * kCodeVectors<Bits>];
#pragma GCC unroll 8
  for (int r = 0; r < kTileRows; ++r) {
    unpack_block<Bits>(packed[r] + offset, rows + r * kCodeVectors<Bits>);
  }
  if constexpr (kByteCodes<Bits>) {
    transpose8x8(rows, steps);
  } else {
    __m256i half[kTileRows];
    for (int h = 0; h < 2; ++h) {
      for (int r = 0; r < kTileRows; ++r) half[r] = rows[2 * r + h];
      transpose8x8(half, steps + 8 * h);
    }
  }
}

// The 8 rows' exact block sums from interleaved codes, step s multiplied by step_activations(s)
// (its activations in every dword). Bytes: each step's vpmaddubsw words (2 products each) add up
// over the 8 steps to 16 products, at most 16·15·127 < 2^15, before one vpmaddwd.
template <int Bits, typename StepActivations>
__attribute__((always_inline)) inline __m256i step_sums(const __m256i* steps,
                                                        const StepActivations& step_activations) {
  if constexpr (kByteCodes<Bits> && !kVnni) {
    __m256i words = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int s = 0; s < kSteps<Bits>; ++s) {
      words = _mm256_add_epi16(words, _mm256_maddubs_epi16(steps[s], step_activations(s)));
    }
    return _mm256_madd_epi16(words, _mm256_set1_epi16(1));
  } else {
    __m256i sums[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
#pragma GCC unroll 16
    for (int s = 0; s < kSteps<Bits>; ++s) {
      const __m256i x = step_activations(s);
#if defined(__AVXVNNI__)
      if constexpr (kByteCodes<Bits>) {
        sums[s % 2] = _mm256_dpbusd_avx_epi32(sums[s % 2], steps[s], x);
      } else {
        sums[s % 2] = _mm256_dpwssd_avx_epi32(sums[s % 2], steps[s], x);
      }
#else
      sums[s % 2] = _mm256_add_epi32(sums[s % 2], _mm256_madd_epi16(steps[s], x));
#endif
    }
    return _mm256_add_epi32(sums[0], sums[1]);
  }
}

// step_sums with each step's activations broadcast from `activations`: the block's bytes (byte
// codes) or its activations widened to int16 (word codes).
template <int Bits>
__m256i interleaved_sums(const __m256i* steps, const void* activations) {
  const auto* bytes = static_cast<const uint8_t*>(activations);
  return step_sums<Bits>(
      steps, [&](int s) __attribute__((always_inline)) {
        return _mm256_set1_epi32(static_cast<int>(load_u32(bytes + 4 * s)));
      });
}

// A vector of tile codes' bytes as its low nibbles and its high ones, each a byte.
struct Nibbles {
  __m256i low, high;
};
__attribute__((always_inline)) inline Nibbles split_nibbles(const uint8_t* p) {
  const __m256i mask = _mm256_set1_epi8(15);
  const __m256i codes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return {_mm256_and_si256(codes, mask), _mm256_and_si256(_mm256_srli_epi16(codes, 4), mask)};
}

// Word sums of R rows' products. For several rows, saturating adds (equal to wrapping ones here,
// since no partial sum reaches 2^15): GCC reassociates vpaddw into a tree that kept every product
// of a block live and spilled, but not vpaddsw. A lone row keeps vpaddw: its tree fits the
// registers.
template <int R>
__attribute__((always_inline)) inline __m256i add_words(__m256i a, __m256i b) {
  if constexpr (R == 1) {
    return _mm256_add_epi16(a, b);
  } else {
    return _mm256_adds_epi16(a, b);
  }
}

// The exact sums of R activation rows over one block of 4-bit tile codes, step_activations(r, s)
// giving row r's activations of step s in every dword. The rows meet a code vector's two steps
// (s and s + 4) before the next vector is loaded, so two steps and the R rows' sums are live where
// all 8 steps were: with 4 rows those and the rows' float accumulators did not fit the 16 vector
// registers. Spread activations (quant_impl.h) are read straight from memory by vpmaddubsw, where a
// broadcast per step cost a slot of the vector pipes of its own. Word sums stay below 2^15 as in
// step_sums.
template <int R, typename StepActivations>
__attribute__((always_inline)) inline void tile_code_sums(const uint8_t* block,
                                                          const StepActivations& step_activations,
                                                          __m256i* exact) {
  // With AVX-VNNI one row's sums are two chains (low and high nibbles), so that a lone row does
  // not wait on vpdpbusd's latency at every step.
  __m256i sums[kVnni ? 2 * R : R];
#pragma GCC unroll 4
  for (int s = 0; s < kTileCodeVectors; ++s) {
    const auto [low, high] = split_nibbles(block + 32 * s);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
#if defined(__AVXVNNI__)
      const __m256i zero = _mm256_setzero_si256();
      sums[2 * r] =
          _mm256_dpbusd_avx_epi32(s == 0 ? zero : sums[2 * r], low, step_activations(r, s));
      sums[2 * r + 1] = _mm256_dpbusd_avx_epi32(s == 0 ? zero : sums[2 * r + 1], high,
                                                step_activations(r, s + kTileCodeVectors));
#else
      const __m256i low_words = _mm256_maddubs_epi16(low, step_activations(r, s));
      const __m256i high_words =
          _mm256_maddubs_epi16(high, step_activations(r, s + kTileCodeVectors));
      sums[r] = s == 0 ? add_words<R>(low_words, high_words)
                       : add_words<R>(add_words<R>(sums[r], low_words), high_words);
#endif
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    if constexpr (kVnni) {
      exact[r] = _mm256_add_epi32(sums[2 * r], sums[2 * r + 1]);
    } else {
      exact[r] = _mm256_madd_epi16(sums[r], _mm256_set1_epi16(1));
    }
  }
}

// The exact sums of R activation rows over one block of 8-bit tile codes (AVX2 without VNNI),
// step_activations(r, k) giving row r's activations of step k in every dword. Vector k of the
// block holds codes 4k .. 4k+3 of every row, a dword each. vpmaddubsw would saturate on whole
// codes (2·255·127 > 2^15), so each code q = 16·high + low meets its activation twice, once per
// nibble: the two nibbles' word sums stay apart (each at most 16 products of 15·127 < 2^15) and
// join exactly in int32. Against widening the codes to words for vpmaddwd, a step needs no
// broadcast (spread activations) and the rows' sums no vphaddd tree (Zen 3 runs it on one shuffle
// pipe): 16 multiplies a block either way, and more instructions in all, yet 0.72-0.96x the time
// at 1-8 rows and 0.70x at 16 (the 8-bit head from caches, quant_bench code_layout, session 48).
template <int R, typename StepActivations>
__attribute__((always_inline)) inline void byte_tile_code_sums(
    const uint8_t* block, const StepActivations& step_activations, __m256i* exact) {
  constexpr int kVectors = static_cast<int>(tile_code_vectors(8));
  __m256i low_sums[R], high_sums[R];
#pragma GCC unroll 8
  for (int k = 0; k < kVectors; ++k) {
    const auto [low, high] = split_nibbles(block + 32 * k);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m256i x = step_activations(r, k);
      const __m256i low_words = _mm256_maddubs_epi16(low, x);
      const __m256i high_words = _mm256_maddubs_epi16(high, x);
      low_sums[r] = k == 0 ? low_words : add_words<R>(low_sums[r], low_words);
      high_sums[r] = k == 0 ? high_words : add_words<R>(high_sums[r], high_words);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    exact[r] = _mm256_add_epi32(_mm256_madd_epi16(high_sums[r], _mm256_set1_epi16(16)),
                                _mm256_madd_epi16(low_sums[r], _mm256_set1_epi16(1)));
  }
}

// v[g] 16-bit word r = a[r] word g, in each 128-bit lane, for 8 x 8 matrices of words.
__attribute__((always_inline)) inline void transpose8x8_words(const __m256i* a, __m256i* v) {
  // pairs[k] (pairs[4 + k]): rows 2k, 2k + 1 interleaved over words 0-3 (4-7).
  __m256i pairs[8], quads[8];
#pragma GCC unroll 4
  for (int k = 0; k < 4; ++k) {
    pairs[k] = _mm256_unpacklo_epi16(a[2 * k], a[2 * k + 1]);
    pairs[4 + k] = _mm256_unpackhi_epi16(a[2 * k], a[2 * k + 1]);
  }
  // quads[4h + j]: rows 4h .. 4h+3 of words 2j, 2j + 1.
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h) {
#pragma GCC unroll 2
    for (int half = 0; half < 2; ++half) {
      const __m256i first = pairs[4 * half + 2 * h], second = pairs[4 * half + 2 * h + 1];
      quads[4 * h + 2 * half] = _mm256_unpacklo_epi32(first, second);
      quads[4 * h + 2 * half + 1] = _mm256_unpackhi_epi32(first, second);
    }
  }
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {
    v[2 * j] = _mm256_unpacklo_epi64(quads[j], quads[4 + j]);
    v[2 * j + 1] = _mm256_unpackhi_epi64(quads[j], quads[4 + j]);
  }
}

// scales[g][r] (biases[g][r]) = the 8 values at scale_base (bias_base) + index[r] values, row r's
// group g, as fp32. 16-bit values are transposed before they are widened, scales and biases
// sharing one word transpose: the widening and the transpose of fp32 values cost more than the
// products on a single activation row with 32-element groups.
template <DType D>
void transpose_tile_values(const uint8_t* scale_base, const uint8_t* bias_base,
                           const int64_t* index, float (*scales)[kTileRows],
                           float (*biases)[kTileRows]) {
  constexpr int64_t kSize = D == DType::F32 ? 4 : 2;
  if constexpr (D == DType::F32) {
    __m256i rows[kTileRows];
#pragma GCC unroll 8
    for (int r = 0; r < kTileRows; ++r) {
      rows[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(scale_base + index[r] * kSize));
    }
    transpose8x8(rows, reinterpret_cast<__m256i*>(scales));
#pragma GCC unroll 8
    for (int r = 0; r < kTileRows; ++r) {
      rows[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bias_base + index[r] * kSize));
    }
    transpose8x8(rows, reinterpret_cast<__m256i*>(biases));
  } else if constexpr (D == DType::F16) {
    __m256i rows[kTileRows], groups[kChunkGroups];
#pragma GCC unroll 8
    for (int r = 0; r < kTileRows; ++r) {
      rows[r] = _mm256_inserti128_si256(
          _mm256_castsi128_si256(
              _mm_loadu_si128(reinterpret_cast<const __m128i*>(scale_base + index[r] * kSize))),
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(bias_base + index[r] * kSize)), 1);
    }
    transpose8x8_words(rows, groups);
#pragma GCC unroll 8
    for (int g = 0; g < kChunkGroups; ++g) {
      _mm256_store_ps(scales[g], _mm256_cvtph_ps(_mm256_castsi256_si128(groups[g])));
      _mm256_store_ps(biases[g], _mm256_cvtph_ps(_mm256_extracti128_si256(groups[g], 1)));
    }
  } else {
    // Arranged so that group g's words come out as [scales of rows 0-3, their biases | scales of
    // rows 4-7, their biases]: interleaving zero words below (a bf16 value is the high half of its
    // fp32 value) then widens the low four words of each 128-bit lane into the scale vector and
    // the high four into the bias vector, in row order, with no lane crossing.
    __m256i rows[kTileRows], groups[kChunkGroups];
    const auto load = [&](const uint8_t* base, int r) {
      return _mm_loadu_si128(reinterpret_cast<const __m128i*>(base + index[r] * kSize));
    };
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      rows[k] = _mm256_inserti128_si256(_mm256_castsi128_si256(load(scale_base, k)),
                                        load(scale_base, k + 4), 1);
      rows[k + 4] = _mm256_inserti128_si256(_mm256_castsi128_si256(load(bias_base, k)),
                                            load(bias_base, k + 4), 1);
    }
    transpose8x8_words(rows, groups);
#pragma GCC unroll 8
    for (int g = 0; g < kChunkGroups; ++g) {
      _mm256_store_ps(
          scales[g], _mm256_castsi256_ps(_mm256_unpacklo_epi16(_mm256_setzero_si256(), groups[g])));
      _mm256_store_ps(
          biases[g], _mm256_castsi256_ps(_mm256_unpackhi_epi16(_mm256_setzero_si256(), groups[g])));
    }
  }
}

// transpose_tile_values near the end of the tensor of `total` values: the values that exist are
// copied to a zeroed buffer first. Out of line, so that the common path does not clear the buffer.
template <DType D>
__attribute__((noinline)) void transpose_tile_values_near_end(const QuantMatrix& w,
                                                              const int64_t* first_group,
                                                              int64_t total,
                                                              float (*scales)[kTileRows],
                                                              float (*biases)[kTileRows]) {
  constexpr int64_t kSize = D == DType::F32 ? 4 : 2;
  alignas(32) uint8_t near_end[2][kTileRows * 8 * kSize] = {};
  int64_t index[kTileRows];
  for (int r = 0; r < kTileRows; ++r) {
    const auto bytes = static_cast<size_t>(std::min<int64_t>(8, total - first_group[r]) * kSize);
    std::memcpy(near_end[0] + r * 8 * kSize, w.scales + first_group[r] * kSize, bytes);
    std::memcpy(near_end[1] + r * 8 * kSize, w.biases + first_group[r] * kSize, bytes);
    index[r] = r * 8;
  }
  transpose_tile_values<D>(near_end[0], near_end[1], index, scales, biases);
}

// f.template operator()<D>() with D the scale dtype `dtype` (F32, F16, else BF16).
template <typename F>
__attribute__((always_inline)) inline void with_scale_dtype(DType dtype, const F& f) {
  switch (dtype) {
    case DType::F32:
      return f.template operator()<DType::F32>();
    case DType::F16:
      return f.template operator()<DType::F16>();
    default:
      return f.template operator()<DType::BF16>();
  }
}

// The tile's scales and biases of groups first_group[r] + g, g < 8 (values past a row's end are
// whatever follows and never used); `in_bounds`: all of them lie inside the tensor.
template <DType D>
void load_tile_values_typed(const QuantMatrix& w, const int64_t* first_group, int64_t total,
                            bool in_bounds, float (*scales)[kTileRows],
                            float (*biases)[kTileRows]) {
  if (in_bounds) return transpose_tile_values<D>(w.scales, w.biases, first_group, scales, biases);
  transpose_tile_values_near_end<D>(w, first_group, total, scales, biases);
}

void load_tile_values(const QuantMatrix& w, const int64_t* first_group, int64_t total,
                      bool in_bounds, float (*scales)[kTileRows], float (*biases)[kTileRows]) {
  with_scale_dtype(w.scale_dtype, [&]<DType D>() {
    load_tile_values_typed<D>(w, first_group, total, in_bounds, scales, biases);
  });
}

// One group's tile values (quant.h) as fp32 vectors of the tile's 8 scales and 8 biases.
template <DType D>
__attribute__((always_inline)) inline void tile_group_values(const uint8_t* group, __m256& scale,
                                                             __m256& bias) {
  if constexpr (D == DType::F32) {
    scale = _mm256_loadu_ps(reinterpret_cast<const float*>(group));
    bias = _mm256_loadu_ps(reinterpret_cast<const float*>(group + 32));
  } else if constexpr (D == DType::F16) {
    scale = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(group)));
    bias = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(group + 16)));
  } else {
    const __m256i words = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(group));
    scale = _mm256_castsi256_ps(_mm256_unpacklo_epi16(_mm256_setzero_si256(), words));
    bias = _mm256_castsi256_ps(_mm256_unpackhi_epi16(_mm256_setzero_si256(), words));
  }
}

// Where a pass over a chunk reads each group's scales and biases: the chunk's arrays, or the tile
// values, of a dtype known in the loop (a test per group cost dispatch slots).
enum class ValueSource { chunk_arrays, tile };

// The tile values of `count` groups from `values` on, as load_tile_values leaves them.
void read_tile_values(DType dtype, const uint8_t* values, int64_t count, float (*scales)[kTileRows],
                      float (*biases)[kTileRows]) {
  const int64_t group_bytes = tile_value_group_bytes(dtype);
  with_scale_dtype(dtype, [&]<DType D>() {
    for (int64_t g = 0; g < count; ++g) {
      __m256 scale, bias;
      tile_group_values<D>(values + g * group_bytes, scale, bias);
      _mm256_store_ps(scales[g], scale);
      _mm256_store_ps(biases[g], bias);
    }
  });
}

// The next tile's codes are prefetched into L2 in step with the current tile's progress, in
// memory order: the tile's rows are contiguous, so the prefetches form one sequential stream,
// where fetching each row's next chunk (8 short interleaved streams) left the memory idle between
// them. Measured on Zen 3 (quant_bench, 2 threads): the 6-of-128 expert gather went from 5.7 to
// 8.9 GB/s and a 4096 x 4096 matrix from 9.3 to 10.4 GB/s; two tiles ahead, or further in bytes,
// was slower, and the L1 and non-temporal hints were within noise.
constexpr int kPrefetchTilesAhead = 1;

// Output rows [row0, row0 + rows) (rows <= 8) against activation rows [i0, i1) (at most
// kActivationBlockRows). Lanes past `rows` repeat row row0 and are not stored. PassRows: 0 for any
// number of rows, in passes of kRowsTogether; 2 for one or two rows; 3 or 4 for exactly that many,
// in one pass; 8 for exactly eight, in two (see int8_rows_any).
template <int Bits, int BlocksPerGroup, int PassRows>
void int8_tile(const Int8Task& task, int64_t row0, int rows, int64_t i0, int64_t i1) {
  constexpr int kVectors = kCodeVectors<Bits>;
  constexpr int64_t group = BlocksPerGroup * kInt8Block;
  const QuantMatrix& w = *task.w;
  const int64_t groups = w.cols / group;
  const int64_t total_groups = w.experts * w.rows * groups;
  const int64_t row_bytes = w.cols * Bits / 8;
  // Up to kRegisterCodeRows activation rows multiply codes unpacked in registers (the rows of a
  // pass share each unpacking); more share the codes through the interleaved L1 buffer, unless
  // the tiles have their own codes (below).
  bool single = PassRows != 0 || i1 - i0 <= kRegisterCodeRows;
  const uint8_t* packed[kTileRows];
  int64_t first_group[kTileRows];
  for (int r = 0; r < kTileRows; ++r) {
    const int64_t stored_row = task.expert * w.rows + row0 + (r < rows ? r : 0);
    packed[r] = w.packed + stored_row * row_bytes;
    first_group[r] = stored_row * groups;
  }
  // The tile's own codes when the matrix has them (4 and 8 bits) and the tile starts on a tile
  // boundary.
  const uint8_t* tile_codes = nullptr;
  if constexpr (has_tile_codes(Bits)) {
    if (w.tile_codes != nullptr && row0 % kTileRows == 0) {
      tile_codes = w.tile_codes + (task.expert * tiles_per_expert(w.rows) + row0 / kTileRows) *
                                      kTileRows * row_bytes;
    }
  }
  // 4-bit tile codes are unpacked with three instructions per vector, less than the buffer's build
  // and reloads cost: from caches 0.95-0.98x at 16 rows (scripts/int8_tile_ab.sh, Zen 3). So are
  // 8-bit ones without VNNI, as nibble pairs; with VNNI they fill the buffer, every row count:
  // they are its steps after a byte shuffle each.
  if constexpr (kRegisterTileCodes<Bits>) {
    single = single || tile_codes != nullptr;
  } else {
    single = single && tile_codes == nullptr;
  }
  // Spread activations (quant_impl.h) are read against the tile codes.
  const bool spread_codes = task.spread != nullptr && tile_codes != nullptr;
  // A tile's codes are kTileRows * row_bytes bytes in either layout, the next tile's right after.
  const uint8_t* ahead = (tile_codes != nullptr ? tile_codes : packed[0]) +
                         kPrefetchTilesAhead * kTileRows * row_bytes;
  static_assert(kTileRows == kTileValueRows);
  const int64_t group_value_bytes = tile_value_group_bytes(w.scale_dtype);
  // The tile's own values when the matrix has them and the tile starts on a tile boundary.
  const uint8_t* tile_values = nullptr;
  if (w.tile_values != nullptr && row0 % kTileRows == 0) {
    tile_values = w.tile_values + (task.expert * tiles_per_expert(w.rows) + row0 / kTileRows) *
                                      groups * group_value_bytes;
  }
  // The scales and biases of the tile as far ahead.
  const int64_t ahead_value_bytes = groups * group_value_bytes;
  if (tile_values != nullptr) {
    const uint8_t* values = tile_values + kPrefetchTilesAhead * ahead_value_bytes;
    for (int64_t line = 0; line < ahead_value_bytes; line += 64) {
      __builtin_prefetch(values + line, 0, 1);
    }
  } else {
    const int64_t offset =
        (first_group[0] + kPrefetchTilesAhead * kTileRows * groups) * group_value_bytes / 16;
    for (int64_t line = 0; line < ahead_value_bytes / 2; line += 64) {
      __builtin_prefetch(w.scales + offset + line, 0, 1);
      __builtin_prefetch(w.biases + offset + line, 0, 1);
    }
  }
  constexpr int64_t kChunkColumns = kChunkGroups * group;
  __m256i codes[kChunkGroups * BlocksPerGroup][kSteps<Bits>];
  // Word codes: one activation row's chunk widened to int16.
  alignas(32) int16_t widened[kRowsTogether][kByteCodes<Bits> ? 1 : kChunkColumns];
  alignas(32) float scales[kChunkGroups][kTileRows];
  alignas(32) float biases[kChunkGroups][kTileRows];
  alignas(32) float acc[kActivationBlockRows][kTileRows];
  alignas(32) float bias_acc[kActivationBlockRows][kTileRows];
  for (int64_t c0 = 0; c0 < w.cols; c0 += kChunkColumns) {
    const int64_t columns = std::min(kChunkColumns, w.cols - c0);
    const int64_t blocks = columns / kInt8Block;
    const int64_t chunk_groups = columns / group;
    const int64_t g0 = c0 / group;
    const uint8_t* ahead_chunk = ahead + kTileRows * c0 * Bits / 8;
    for (int64_t line = 0; line < kTileRows * columns * Bits / 8; line += 64) {
      __builtin_prefetch(ahead_chunk + line, 0, 1);
    }
    // Block b of the chunk in the tile codes.
    constexpr int64_t kTileBlockBytes = tile_code_block_bytes(Bits);
    const uint8_t* chunk_codes =
        tile_codes == nullptr ? nullptr : tile_codes + c0 / kInt8Block * kTileBlockBytes;
    if (!single) {
      for (int64_t b = 0; b < blocks; ++b) {
        // 8-bit tile codes come here only with VNNI: without it they are register tile codes.
        if constexpr (Bits == 8 && !kRegisterTileCodes<Bits>) {
          if (chunk_codes != nullptr) {
            byte_steps_to_words(chunk_codes + b * kTileBlockBytes, codes[b]);
            continue;
          }
        }
        unpack_interleaved<Bits>(packed, (c0 + b * kInt8Block) * Bits / 8, codes[b]);
      }
    }
    // The rows from registers read the tile values where the group loop uses them: storing them
    // to the chunk's arrays first cost a store and a load per vector (5 % of a decode step on Zen
    // 3); several rows share the arrays.
    const bool values_in_loop = tile_values != nullptr && single;
    if (tile_values != nullptr && !single) {
      read_tile_values(w.scale_dtype, tile_values + g0 * group_value_bytes, chunk_groups, scales,
                       biases);
    } else if (tile_values == nullptr) {
      int64_t chunk_first[kTileRows];
      for (int r = 0; r < kTileRows; ++r) chunk_first[r] = first_group[r] + g0;
      // Lanes past `rows` repeat row row0, so the last row's values are the furthest.
      const bool in_bounds = chunk_first[rows - 1] + kChunkGroups <= total_groups;
      load_tile_values(w, chunk_first, total_groups, in_bounds, scales, biases);
    }
    // The chunk's groups against activation rows [i, i + R): the rows share each step's code
    // vector and run R independent float sequences side by side, which the out-of-order core
    // overlaps (measured on Zen 3, scripts/int8_tile_ab.sh: 4 rows at a time 0.82-0.85x the time of
    // one at a time for 8 and 16 rows, 2 at a time 0.91x).
    auto rows_chunk = [&]<int R, ValueSource Values, DType ValueDType, bool Spread>(int64_t i)
        __attribute__((always_inline)) {
      const int8_t* x8[R];
      const float* d[R];
      const float* xsums[R];
      for (int r = 0; r < R; ++r) {
        x8[r] = task.x8[i + r] + c0;
        d[r] = task.block_scales[i + r] + c0 / kInt8Block;
        xsums[r] = task.xsums[i + r] + g0;
        if constexpr (!kByteCodes<Bits>) {
          if (!single) {
            for (int64_t k = 0; k < columns; k += 16) {
              _mm256_store_si256(reinterpret_cast<__m256i*>(widened[r] + k),
                                 _mm256_cvtepi8_epi16(
                                     _mm_loadu_si128(reinterpret_cast<const __m128i*>(x8[r] + k))));
            }
          }
        }
      }
      // The R rows' exact sums over block b, each a vector of the tile's 8 output rows: codes
      // unpacked here once for all R rows, or interleaved in the buffer.
      auto block_sums_of_rows = [&](int64_t b, __m256i * exact) __attribute__((always_inline)) {
        const int64_t column = b * kInt8Block;
        if (!single) {
          for (int r = 0; r < R; ++r) {
            if constexpr (kByteCodes<Bits>) {
              exact[r] = interleaved_sums<Bits>(codes[b], x8[r] + column);
            } else {
              exact[r] = interleaved_sums<Bits>(codes[b], widened[r] + column);
            }
          }
          return;
        }
        if constexpr (Bits == 4) {
          if constexpr (Spread) {
            const uint8_t* spread[R];
            for (int r = 0; r < R; ++r) {
              spread[r] = task.spread[i + r] + (c0 + column) * kSpreadBytesPerInput;
            }
            return tile_code_sums<R>(
                chunk_codes + b * kTileCodeBytes,
                [&](int r, int s) __attribute__((always_inline)) {
                  return _mm256_load_si256(reinterpret_cast<const __m256i*>(spread[r]) + s);
                },
                exact);
          }
          if (chunk_codes != nullptr) {
            return tile_code_sums<R>(
                chunk_codes + b * kTileCodeBytes,
                [&](int r, int s) __attribute__((always_inline)) {
                  const auto* bytes = reinterpret_cast<const uint8_t*>(x8[r] + column);
                  return _mm256_set1_epi32(static_cast<int>(load_u32(bytes + 4 * s)));
                },
                exact);
          }
          __m256i pairs[kNibblePairVectors];
          unpack_nibble_pairs(packed, (c0 + column) * Bits / 8, pairs);
          for (int r = 0; r < R; ++r) exact[r] = nibble_pair_sums(pairs, x8[r] + column);
          return;
        }
        if constexpr (Bits == 8 && kRegisterTileCodes<Bits>) {
          if (chunk_codes != nullptr) {
            const uint8_t* block = chunk_codes + b * kTileBlockBytes;
            if constexpr (Spread) {
              const uint8_t* spread[R];
              for (int r = 0; r < R; ++r) {
                spread[r] = task.spread[i + r] + (c0 + column) * kSpreadBytesPerInput;
              }
              return byte_tile_code_sums<R>(
                  block,
                  [&](int r, int s) __attribute__((always_inline)) {
                    return _mm256_load_si256(reinterpret_cast<const __m256i*>(spread[r]) + s);
                  },
                  exact);
            }
            return byte_tile_code_sums<R>(
                block,
                [&](int r, int s) __attribute__((always_inline)) {
                  const auto* bytes = reinterpret_cast<const uint8_t*>(x8[r] + column);
                  return _mm256_set1_epi32(static_cast<int>(load_u32(bytes + 4 * s)));
                },
                exact);
          }
        }
        __m256i q[kTileRows * kVectors];
#pragma GCC unroll 8
        for (int t = 0; t < kTileRows; ++t) {
          unpack_block<Bits>(packed[t] + (c0 + column) * Bits / 8, q + t * kVectors);
        }
        for (int r = 0; r < R; ++r) exact[r] = block_sums<Bits>(q, x8[r] + column);
      };
      // The group's scales and biases.
      auto group_values = [&](int64_t g, __m256 & scale, __m256 & group_bias)
          __attribute__((always_inline)) {
        if constexpr (Values != ValueSource::chunk_arrays) {
          tile_group_values<ValueDType>(tile_values + (g0 + g) * group_value_bytes, scale,
                                        group_bias);
        } else {
          scale = _mm256_load_ps(scales[g]);
          group_bias = _mm256_load_ps(biases[g]);
        }
      };
      // The first chunk starts the sums (a zeroing loop before it became a memset call per tile).
      auto start = [&](float(*from)[kTileRows], int r) __attribute__((always_inline)) {
        return c0 == 0 ? _mm256_setzero_ps() : _mm256_load_ps(from[i + r - i0]);
      };
      // Past two rows the bias terms run in a loop of their own after the products: with the
      // rows' bias accumulators live through the products as well, the float accumulators of 4
      // rows were spilled (a load and a store each per group).
      constexpr bool kBiasApart = R > 2;
      __m256 sum[R], bias[R];
      for (int r = 0; r < R; ++r) {
        sum[r] = start(acc, r);
        if constexpr (!kBiasApart) bias[r] = start(bias_acc, r);
      }
      for (int64_t g = 0; g < chunk_groups; ++g) {
        const int64_t b0 = g * BlocksPerGroup;
        __m256 t[R] = {};  // every lane is set by the group's first block
#pragma GCC unroll 4
        for (int64_t b = b0; b < b0 + BlocksPerGroup; ++b) {
          __m256i exact[R];
          block_sums_of_rows(b, exact);
#pragma GCC unroll 4
          for (int r = 0; r < R; ++r) {
            const __m256 block_scale = _mm256_set1_ps(d[r][b]);
            const __m256 block_sum = _mm256_cvtepi32_ps(exact[r]);
            t[r] = b == b0 ? _mm256_mul_ps(block_scale, block_sum)
                           : _mm256_fmadd_ps(block_scale, block_sum, t[r]);
          }
        }
        __m256 scale, group_bias;
        group_values(g, scale, group_bias);
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
          sum[r] = _mm256_fmadd_ps(scale, t[r], sum[r]);
          if constexpr (!kBiasApart) {
            bias[r] = _mm256_fmadd_ps(group_bias, _mm256_set1_ps(xsums[r][g]), bias[r]);
          }
        }
      }
      if constexpr (kBiasApart) {
        for (int r = 0; r < R; ++r) bias[r] = start(bias_acc, r);
        for (int64_t g = 0; g < chunk_groups; ++g) {
          __m256 scale, group_bias;
          group_values(g, scale, group_bias);
#pragma GCC unroll 4
          for (int r = 0; r < R; ++r) {
            bias[r] = _mm256_fmadd_ps(group_bias, _mm256_set1_ps(xsums[r][g]), bias[r]);
          }
        }
      }
      for (int r = 0; r < R; ++r) {
        _mm256_store_ps(acc[i + r - i0], sum[r]);
        _mm256_store_ps(bias_acc[i + r - i0], bias[r]);
      }
    };
    // A pass of R rows, with the tile values read in the group loop or from the chunk's arrays.
    auto pass = [&]<int R>(int64_t i) __attribute__((always_inline)) {
      if (!values_in_loop) {
        return rows_chunk.template operator()<R, ValueSource::chunk_arrays, DType::F32, false>(i);
      }
      with_scale_dtype(
          w.scale_dtype, [&]<DType D>() __attribute__((always_inline)) {
            if constexpr (kRegisterTileCodes<Bits>) {
              if (spread_codes) {
                return rows_chunk.template operator()<R, ValueSource::tile, D, true>(i);
              }
            }
            rows_chunk.template operator()<R, ValueSource::tile, D, false>(i);
          });
    };
    if constexpr (PassRows == 0) {
      int64_t i = i0;
      for (; i + kRowsTogether <= i1; i += kRowsTogether) {
        pass.template operator()<kRowsTogether>(i);
      }
      switch (i1 - i) {
        case 3:
          pass.template operator()<3>(i);
          break;
        case 2:
          pass.template operator()<2>(i);
          break;
        case 1:
          pass.template operator()<1>(i);
      }
    } else if constexpr (PassRows == 8) {
      pass.template operator()<4>(i0);
      pass.template operator()<4>(i0 + 4);
    } else if constexpr (PassRows > 2) {
      pass.template operator()<PassRows>(i0);
    } else if (i1 - i0 == 2) {
      pass.template operator()<2>(i0);
    } else {
      pass.template operator()<1>(i0);
    }
  }
  for (int64_t i = i0; i < i1; ++i) {
    const __m256 y = _mm256_add_ps(_mm256_load_ps(acc[i - i0]), _mm256_load_ps(bias_acc[i - i0]));
    if (rows == kTileRows) {
      // One store: a partial tile's copy loop became a memcpy call per tile and activation row.
      _mm256_storeu_ps(task.y[i] + row0, y);
    } else {
      alignas(32) float partial[kTileRows];
      _mm256_store_ps(partial, y);
      for (int r = 0; r < rows; ++r) task.y[i][row0 + r] = partial[r];
    }
  }
}

void int8_rows_any(const Int8Task& task, int64_t row_begin, int64_t row_end) {
  for_each_int8_tile<kTileRows, kActivationBlockRows>(
      task, row_begin, row_end,
      [&]<int Bits, int Blocks>(int64_t row, int rows, int64_t i0, int64_t i1) {
        // One or two rows (decode, a cap-1 verify) run in a function of their own: with the
        // wider passes in the same function, GCC's code for them took 1.4 % more instructions at
        // m = 1 (callgrind, the default model); apart, 3 % fewer. So do three, four and eight
        // rows (a small cap's verify, a batch of eight decodes) of 4- and 8-bit codes, the
        // default model's: a whole forward at m = 3, 4 and 8 took 10 %, 8 % and 4 % fewer
        // instructions (bench/forward_instructions) and 7 % less time at 3 and 4 (2 threads,
        // Zen 3). Other widths keep the general function: each such function is more of this
        // header's compile time, the build's longest. Five to seven rows as two calls (4 + the
        // rest) gained 2 % at most.
        if (i1 - i0 <= 2) return int8_tile<Bits, Blocks, 2>(task, row, rows, i0, i1);
        if constexpr (Bits == 4 || Bits == 8) {
          switch (i1 - i0) {
            case 3:
              return int8_tile<Bits, Blocks, 3>(task, row, rows, i0, i1);
            case 4:
              return int8_tile<Bits, Blocks, 4>(task, row, rows, i0, i1);
            case 8:
              return int8_tile<Bits, Blocks, 8>(task, row, rows, i0, i1);
          }
        }
        int8_tile<Bits, Blocks, 0>(task, row, rows, i0, i1);
      });
}

}  // namespace
}  // namespace dspark::kernels::cpu
