// AVX-512 VNNI kernels of the int8 numerics (quant_impl.h): quantized products as exact integer
// dot products with vpdpbusd, 16 output rows per tile in the 16 lanes of a zmm register, each lane
// running the canonical float sequence of one (activation row, output row).
//
// vpdpbusd multiplies unsigned bytes by signed bytes and adds each 4 products to an int32 lane
// without saturation (4·255·127 fits easily), so codes of every width, 8 bits included, are
// unpacked to bytes and multiplied the same way.
//
// Several activation rows (verify, prefill): a tile's codes are interleaved, step s of a block of
// 32 inputs being one vector whose dword r holds row r's codes of slots 4s .. 4s+3, so that
// vpdpbusd by those slots' activations (one dword broadcast to every lane) adds to each row's sum
// in the row's own lane, with no horizontal sums. A chunk of 8 groups is unpacked once into an L1
// buffer and reused for every activation row of a block of up to 64, 4 rows per pass, so that an
// extra activation row costs 8 vpdpbusd per 16 rows and 32 inputs. Up to 4 rows (a short verify)
// take a single pass with each block unpacked into registers as it is reached: there the buffer's
// stores and reloads cost more than they save (2 and 3 rows of 4-bit codes 0.76-0.79x the time,
// quant_bench qmatmul_cached). 4- and 8-bit tile codes (quant.h), packed at load, are interleaved
// already, for every number of rows, and each pass of 4 rows unpacks them into registers again,
// which costs less than the buffer's stores and reloads. A single activation row (decode) is bound
// by the weight stream, and interleaving would cost more than the products: 4- and 8-bit codes
// without tile codes multiply the activations as they lie in memory, 4 blocks per vector, and one
// reduction per 4 blocks gathers the 16 rows' sums; other widths interleave each block as they use
// it. The 8-bit tile codes are one stream where the rows were 16, and need neither the reduction
// nor the interleave: from memory, 8-bit products of one row took 0.81-0.89x the time and of 4 rows
// 0.82-0.85x (quant_bench, one thread, Emerald Rapids; docs/benchmarks, session 42).
#include <algorithm>
#include <cstring>

#include "kernels/cpu/avx512/intrinsics.h"
#include "kernels/cpu/int8_dispatch.h"
#include "kernels/cpu/quant_impl.h"
#include "kernels/cpu/unaligned_loads.h"
#include "tensor/dtype.h"

namespace dspark::kernels::cpu {
namespace {

constexpr int kTileRows = 16;
// A tile works through its rows in chunks of 8 groups: the chunk's scales and biases are loaded
// together (a 16 x 8 transpose) and, with several activation rows, its codes unpacked once.
constexpr int64_t kChunkGroups = 8;
// Activation rows whose accumulators a tile keeps while it passes over its weights once. A larger
// batch (prefill) passes over the weights once per block, with the block's activations in L2.
constexpr int64_t kActivationBlockRows = 64;
// Dwords of 4 codes in a block of 32.
constexpr int kSteps = 8;

// 3, 5 and 6 bits: codes 0-15 of a block span the 2·Bits bytes at p and codes 16-31 the 2·Bits
// bytes after them; each is broadcast to two 128-bit lanes, so that lane L serves codes
// 8L .. 8L+7. Word k of lane L gathers the two bytes holding its code, and a variable shift drops
// the code's bit offset.
template <int Bits>
struct WordCodeTables {
  alignas(64) uint8_t pair_index[64];
  alignas(64) uint16_t shifts[32];
};

template <int Bits>
constexpr WordCodeTables<Bits> make_word_code_tables() {
  WordCodeTables<Bits> tables{};
  for (int code = 0; code < 32; ++code) {
    const int in_half = code % 16;
    const int byte = in_half * Bits / 8;
    tables.pair_index[2 * code] = static_cast<uint8_t>(byte);
    tables.pair_index[2 * code + 1] = static_cast<uint8_t>(byte + 1);
    tables.shifts[code] = static_cast<uint16_t>(in_half * Bits % 8);
  }
  return tables;
}

template <int Bits>
constexpr WordCodeTables<Bits> kWordCodes = make_word_code_tables<Bits>();

// One row's block of 32 codes as 32 bytes in slot order, reading exactly the block's 4·Bits
// bytes. The slot order is the element order except: 2 bits, slot 8k + i holds element 4i + k;
// 4 bits, slot j < 16 holds element 2j and slot 16 + j element 2j + 1. It is the order of
// quantize_activations_avx2, which prepares this table's activations.
template <int Bits>
__m256i unpack_row_block(const uint8_t* p) {
  if constexpr (Bits == 2) {
    const __m256i word = _mm256_set1_epi64x(static_cast<int64_t>(load_u64(p)));
    return _mm256_and_si256(_mm256_srlv_epi64(word, _mm256_setr_epi64x(0, 2, 4, 6)),
                            _mm256_set1_epi8(3));
  } else if constexpr (Bits == 4) {
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(bytes, 4), bytes),
                            _mm256_set1_epi8(15));
  } else if constexpr (Bits == 8) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  } else {
    constexpr auto kHalfMask = static_cast<__mmask16>((1u << (2 * Bits)) - 1);
    const __m256i first = _mm256_broadcastsi128_si256(_mm_maskz_loadu_epi8(kHalfMask, p));
    const __m256i second =
        _mm256_broadcastsi128_si256(_mm_maskz_loadu_epi8(kHalfMask, p + 2 * Bits));
    const __m512i bytes = _mm512_inserti64x4(_mm512_castsi256_si512(first), second, 1);
    const __m512i pairs =
        _mm512_shuffle_epi8(bytes, _mm512_load_si512(kWordCodes<Bits>.pair_index));
    const __m512i words =
        _mm512_and_si512(_mm512_srlv_epi16(pairs, _mm512_load_si512(kWordCodes<Bits>.shifts)),
                         _mm512_set1_epi16((1 << Bits) - 1));
    return _mm512_cvtepi16_epi8(words);
  }
}

// A vector of 4 128-bit lanes, lane l from lane_l.
__attribute__((always_inline)) inline __m512i four_lanes(__m128i lane0, __m128i lane1,
                                                         __m128i lane2, __m128i lane3) {
  const __m512i low = _mm512_inserti32x4(_mm512_castsi128_si512(lane0), lane1, 1);
  return _mm512_inserti32x4(_mm512_inserti32x4(low, lane2, 2), lane3, 3);
}

// steps[s] dword r = rows[r] dword s, for 16 rows of 8 dwords: rows r and r + 8 share a vector,
// and each 256-bit half goes through an 8 x 8 transpose.
__attribute__((always_inline)) inline void interleave16(const __m256i* rows, __m512i* steps) {
  __m512i z[8], t[8], u[8];
#pragma GCC unroll 8
  for (int r = 0; r < 8; ++r) {
    z[r] = _mm512_inserti64x4(_mm512_castsi256_si512(rows[r]), rows[r + 8], 1);
  }
#pragma GCC unroll 4
  for (int k = 0; k < 4; ++k) {
    t[2 * k] = _mm512_unpacklo_epi32(z[2 * k], z[2 * k + 1]);
    t[2 * k + 1] = _mm512_unpackhi_epi32(z[2 * k], z[2 * k + 1]);
  }
  // u[4h + c], 128-bit lanes: rows 4h .. 4h+3 of dword c, the same rows of dword c + 4, rows
  // 8+4h .. 8+4h+3 of dword c, and of dword c + 4.
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h) {
    u[4 * h] = _mm512_unpacklo_epi64(t[4 * h], t[4 * h + 2]);
    u[4 * h + 1] = _mm512_unpackhi_epi64(t[4 * h], t[4 * h + 2]);
    u[4 * h + 2] = _mm512_unpacklo_epi64(t[4 * h + 1], t[4 * h + 3]);
    u[4 * h + 3] = _mm512_unpackhi_epi64(t[4 * h + 1], t[4 * h + 3]);
  }
  const __m512i low_lanes = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
  const __m512i high_lanes = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
#pragma GCC unroll 4
  for (int c = 0; c < 4; ++c) {
    steps[c] = _mm512_permutex2var_epi64(u[c], low_lanes, u[4 + c]);
    steps[c + 4] = _mm512_permutex2var_epi64(u[c], high_lanes, u[4 + c]);
  }
}

// The 16 rows' block at packed[r] + offset, unpacked and interleaved.
template <int Bits>
__attribute__((always_inline)) inline void unpack_interleaved(const uint8_t* const* packed,
                                                              int64_t offset, __m512i* steps) {
  if constexpr (Bits == 4) {
    // Straight from the packed bytes: a[k] holds rows k, k+4, k+8, k+12 (one 128-bit lane each,
    // 4 dwords of 8 codes), a 4 x 4 dword transpose per lane puts dword s of rows 4l .. 4l+3 into
    // lane l of vector s, and the low and high nibbles of vector s are steps s and s + 4.
    __m512i a[4];
    const auto row_bytes = [&](int r) {
      return _mm_loadu_si128(reinterpret_cast<const __m128i*>(packed[r] + offset));
    };
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      a[k] = four_lanes(row_bytes(k), row_bytes(k + 4), row_bytes(k + 8), row_bytes(k + 12));
    }
    const __m512i t0 = _mm512_unpacklo_epi32(a[0], a[1]), t1 = _mm512_unpackhi_epi32(a[0], a[1]);
    const __m512i t2 = _mm512_unpacklo_epi32(a[2], a[3]), t3 = _mm512_unpackhi_epi32(a[2], a[3]);
    const __m512i dwords[4] = {_mm512_unpacklo_epi64(t0, t2), _mm512_unpackhi_epi64(t0, t2),
                               _mm512_unpacklo_epi64(t1, t3), _mm512_unpackhi_epi64(t1, t3)};
    const __m512i nibble = _mm512_set1_epi8(15);
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      steps[k] = _mm512_and_si512(dwords[k], nibble);
      steps[k + 4] = _mm512_and_si512(_mm512_srli_epi16(dwords[k], 4), nibble);
    }
  } else {
    __m256i rows[kTileRows];
#pragma GCC unroll 16
    for (int r = 0; r < kTileRows; ++r) rows[r] = unpack_row_block<Bits>(packed[r] + offset);
    interleave16(rows, steps);
  }
}

// The 16 rows' exact sums Σ q·x8 over one block, from its interleaved steps.
__attribute__((always_inline)) inline __m512i block_sums(const __m512i* steps, const int8_t* x8) {
  const auto* bytes = reinterpret_cast<const uint8_t*>(x8);
  __m512i sums[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
#pragma GCC unroll 8
  for (int s = 0; s < kSteps; ++s) {
    const __m512i x = _mm512_set1_epi32(static_cast<int>(load_u32(bytes + 4 * s)));
    sums[s % 2] = _mm512_dpbusd_epi32(sums[s % 2], steps[s], x);
  }
  return _mm512_add_epi32(sums[0], sums[1]);
}

// Values of 16-bit type at p: 8 of them, or the first `count` (the rest zero) when the 8 would
// reach past the tensor.
template <bool InBounds>
__attribute__((always_inline)) inline __m128i load_words(__mmask8 mask, const uint8_t* p) {
  if constexpr (InBounds) return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm_maskz_loadu_epi16(mask, p);
}

// scales[g][r] (biases[g][r]) = row r's value of group chunk_first[r] + g as fp32, for g < count
// (count <= 8; values of later groups are not used). InBounds: all 8 values of every row lie
// inside the tensor, so they are loaded whole; otherwise masked loads read only the first count.
template <DType D, bool InBounds>
void load_tile_values(const uint8_t* scale_base, const uint8_t* bias_base,
                      const int64_t* chunk_first, int64_t count, float (*scales)[kTileRows],
                      float (*biases)[kTileRows]) {
  const uint8_t* bases[2] = {scale_base, bias_base};
  float(*outputs[2])[kTileRows] = {scales, biases};
  const auto mask = static_cast<__mmask8>((1u << count) - 1);
  for (int which = 0; which < 2; ++which) {
    const uint8_t* base = bases[which];
    float(*out)[kTileRows] = outputs[which];
    if constexpr (D == DType::F32) {
      __m256i rows[kTileRows];
      __m512i groups[kChunkGroups];
#pragma GCC unroll 16
      for (int r = 0; r < kTileRows; ++r) {
        const uint8_t* p = base + chunk_first[r] * 4;
        rows[r] = InBounds ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))
                           : _mm256_maskz_loadu_epi32(mask, p);
      }
      interleave16(rows, groups);
#pragma GCC unroll 8
      for (int g = 0; g < kChunkGroups; ++g) _mm512_store_si512(out[g], groups[g]);
    } else {
      // a[k], 128-bit lane l: the 8 values of row 4l + k.
      __m512i a[4];
      const auto row_values = [&](int r) {
        return load_words<InBounds>(mask, base + chunk_first[r] * 2);
      };
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) {
        a[k] = four_lanes(row_values(k), row_values(k + 4), row_values(k + 8), row_values(k + 12));
      }
      const __m512i low01 = _mm512_unpacklo_epi16(a[0], a[1]);
      const __m512i high01 = _mm512_unpackhi_epi16(a[0], a[1]);
      const __m512i low23 = _mm512_unpacklo_epi16(a[2], a[3]);
      const __m512i high23 = _mm512_unpackhi_epi16(a[2], a[3]);
      // pairs[j], lane l: groups 2j and 2j + 1 of rows 4l .. 4l+3, as 4 words each.
      const __m512i pairs[4] = {
          _mm512_unpacklo_epi32(low01, low23), _mm512_unpackhi_epi32(low01, low23),
          _mm512_unpacklo_epi32(high01, high23), _mm512_unpackhi_epi32(high01, high23)};
      const __m512i zero = _mm512_setzero_si512();
      // F16: the even qwords (group 2j of rows 0-15) to the low half, the odd ones to the high.
      const __m512i group_halves = _mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7);
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {
        if constexpr (D == DType::BF16) {
          // A bf16 value is the high half of its fp32 value: a zero word below widens it.
          _mm512_store_si512(out[2 * j], _mm512_unpacklo_epi16(zero, pairs[j]));
          _mm512_store_si512(out[2 * j + 1], _mm512_unpackhi_epi16(zero, pairs[j]));
        } else {
          const __m512i halves = _mm512_permutexvar_epi64(group_halves, pairs[j]);
          _mm512_store_ps(out[2 * j], _mm512_cvtph_ps(_mm512_castsi512_si256(halves)));
          _mm512_store_ps(out[2 * j + 1], _mm512_cvtph_ps(_mm512_extracti64x4_epi64(halves, 1)));
        }
      }
    }
  }
}

template <bool InBounds>
void load_chunk_values_in(const QuantMatrix& w, const int64_t* chunk_first, int64_t count,
                          float (*scales)[kTileRows], float (*biases)[kTileRows]) {
  switch (w.scale_dtype) {
    case DType::F32:
      return load_tile_values<DType::F32, InBounds>(w.scales, w.biases, chunk_first, count, scales,
                                                    biases);
    case DType::F16:
      return load_tile_values<DType::F16, InBounds>(w.scales, w.biases, chunk_first, count, scales,
                                                    biases);
    default:
      return load_tile_values<DType::BF16, InBounds>(w.scales, w.biases, chunk_first, count, scales,
                                                     biases);
  }
}

// The chunk's values of the tile's rows; `last_row_first`: the first group of the chunk in the
// tile's furthest row.
void load_chunk_values(const QuantMatrix& w, const int64_t* chunk_first, int64_t count,
                       int64_t last_row_first, float (*scales)[kTileRows],
                       float (*biases)[kTileRows]) {
  const int64_t total_groups = w.experts * w.rows * w.groups_per_row();
  if (last_row_first + kChunkGroups <= total_groups) {
    return load_chunk_values_in<true>(w, chunk_first, count, scales, biases);
  }
  load_chunk_values_in<false>(w, chunk_first, count, scales, biases);
}

// A 16-row tile of the packed layouts (quant.h: tile values, and tile codes at 4 bits) is two of
// their 8-row tiles: `first` and the one after it; a tile of at most 8 rows reads `first` twice,
// since the next 8-row tile may lie past the tensor, and its lanes past `rows` are not stored.
struct PackedTiles {
  const uint8_t* first = nullptr;
  const uint8_t* second = nullptr;
};

__attribute__((always_inline)) inline __m512i load_tile_pair(const uint8_t* first,
                                                             const uint8_t* second) {
  return _mm512_inserti64x4(
      _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(first))),
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(second)), 1);
}

// scales[g][r] (biases[g][r]) from the packed tile values of groups g0 .. g0 + count - 1, each
// tile pointer at group g0.
template <DType D>
void read_packed_values(PackedTiles values, int64_t count, float (*scales)[kTileRows],
                        float (*biases)[kTileRows]) {
  constexpr int64_t kGroupBytes = 2 * kTileValueRows * (D == DType::F32 ? 4 : 2);
  for (int64_t g = 0; g < count; ++g) {
    const uint8_t* first = values.first + g * kGroupBytes;
    const uint8_t* second = values.second + g * kGroupBytes;
    if constexpr (D == DType::F32) {
      // Each 8-row tile: [s0-s7 | b0-b7].
      _mm512_store_si512(scales[g], load_tile_pair(first, second));
      _mm512_store_si512(biases[g], load_tile_pair(first + 32, second + 32));
    } else if constexpr (D == DType::BF16) {
      // 128-bit lanes [s0-s3 b0-b3 | s4-s7 b4-b7 | s8-s11 b8-b11 | s12-s15 b12-b15]: a zero word
      // below each value widens it, the low halves to the scales and the high ones to the biases.
      const __m512i pair = load_tile_pair(first, second);
      const __m512i zero = _mm512_setzero_si512();
      _mm512_store_si512(scales[g], _mm512_unpacklo_epi16(zero, pair));
      _mm512_store_si512(biases[g], _mm512_unpackhi_epi16(zero, pair));
    } else {
      // Qwords [s0-s7 | b0-b7 | s8-s15 | b8-b15].
      const __m512i halves = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 1, 4, 5, 2, 3, 6, 7),
                                                      load_tile_pair(first, second));
      _mm512_store_ps(scales[g], _mm512_cvtph_ps(_mm512_castsi512_si256(halves)));
      _mm512_store_ps(biases[g], _mm512_cvtph_ps(_mm512_extracti64x4_epi64(halves, 1)));
    }
  }
}

void read_packed_chunk_values(DType dtype, PackedTiles values, int64_t count,
                              float (*scales)[kTileRows], float (*biases)[kTileRows]) {
  switch (dtype) {
    case DType::F32:
      return read_packed_values<DType::F32>(values, count, scales, biases);
    case DType::F16:
      return read_packed_values<DType::F16>(values, count, scales, biases);
    default:
      return read_packed_values<DType::BF16>(values, count, scales, biases);
  }
}

// The steps of one block of tile codes, each pointer at the block. 4 bits: vector s of an 8-row
// tile holds dword s of its rows' 16 packed bytes, whose low nibbles are slots 4s .. 4s+3 and high
// nibbles slots 16 + 4s .. 16 + 4s + 3, as unpack_interleaved<4> leaves them. 8 bits: vector s is
// step s as it is.
template <int Bits>
__attribute__((always_inline)) inline void unpack_tile_codes(PackedTiles codes, __m512i* steps) {
  if constexpr (Bits == 8) {
#pragma GCC unroll 8
    for (int s = 0; s < kSteps; ++s) {
      steps[s] = load_tile_pair(codes.first + 32 * s, codes.second + 32 * s);
    }
  } else {
    const __m512i nibble = _mm512_set1_epi8(15);
#pragma GCC unroll 4
    for (int k = 0; k < static_cast<int>(kTileCodeVectors); ++k) {
      const __m512i dwords = load_tile_pair(codes.first + 32 * k, codes.second + 32 * k);
      steps[k] = _mm512_and_si512(dwords, nibble);
      steps[k + 4] = _mm512_and_si512(_mm512_srli_epi16(dwords, 4), nibble);
    }
  }
}

// The next tile's codes are prefetched in step with the current tile's progress, in memory order
// (the tile's rows are contiguous, so the prefetches form one sequential stream), as in the AVX2
// kernel; a 16-row tile is twice as far ahead as an 8-row one. Each block issues its share as it
// is multiplied (in the first activation row's pass), not a chunk's all at once: on an Emerald
// Rapids Xeon the bursts stalled on the prefetches themselves, and spreading them made verify
// forwards 0.80-0.89x the time at widths 1, 8 and 16 (verify_bench, 5 paired runs). The hint is
// the AVX2 kernel's (prefetcht2). On Zen 5 the non-temporal hint read the 8-bit 576 x 49152 head
// 1.1-1.25x faster (quant_bench, one thread); on that Xeon 2.0x slower (5.1 against 2.5 ms), and
// 16 verify rows through it ran 1.9x slower (docs/benchmarks, session 35). Where the hint costs,
// the kernel plan can still pick the 256-bit kernel shape by shape.
constexpr int kPrefetchTilesAhead = 1;

// The activation rows that one pass over a block's steps serves: each adds 2 independent chains
// of vpdpbusd, enough together to cover its latency.
constexpr int kRowsAtOnce = 4;

// reduced[q] dword r = the sum of the 4 dwords in 128-bit lane q of rows[r], for 16 rows: vector q
// holds the 16 rows' sums of lane q.
__attribute__((always_inline)) inline void reduce_lanes16(const __m512i* rows, __m512i* reduced) {
  __m512i pairs[8], quads[4];
#pragma GCC unroll 8
  for (int p = 0; p < 8; ++p) {
    // Lane q: rows 2p and 2p + 1 interleaved, each over two of its dwords.
    pairs[p] = _mm512_add_epi32(_mm512_unpacklo_epi32(rows[2 * p], rows[2 * p + 1]),
                                _mm512_unpackhi_epi32(rows[2 * p], rows[2 * p + 1]));
  }
#pragma GCC unroll 4
  for (int k = 0; k < 4; ++k) {
    // Lane q: the whole-lane sums of rows 4k .. 4k+3.
    quads[k] = _mm512_add_epi32(_mm512_unpacklo_epi64(pairs[2 * k], pairs[2 * k + 1]),
                                _mm512_unpackhi_epi64(pairs[2 * k], pairs[2 * k + 1]));
  }
  // A 4 x 4 transpose of 128-bit lanes.
  const __m512i low01 = _mm512_shuffle_i64x2(quads[0], quads[1], _MM_SHUFFLE(1, 0, 1, 0));
  const __m512i high01 = _mm512_shuffle_i64x2(quads[0], quads[1], _MM_SHUFFLE(3, 2, 3, 2));
  const __m512i low23 = _mm512_shuffle_i64x2(quads[2], quads[3], _MM_SHUFFLE(1, 0, 1, 0));
  const __m512i high23 = _mm512_shuffle_i64x2(quads[2], quads[3], _MM_SHUFFLE(3, 2, 3, 2));
  reduced[0] = _mm512_shuffle_i64x2(low01, low23, _MM_SHUFFLE(2, 0, 2, 0));
  reduced[1] = _mm512_shuffle_i64x2(low01, low23, _MM_SHUFFLE(3, 1, 3, 1));
  reduced[2] = _mm512_shuffle_i64x2(high01, high23, _MM_SHUFFLE(2, 0, 2, 0));
  reduced[3] = _mm512_shuffle_i64x2(high01, high23, _MM_SHUFFLE(3, 1, 3, 1));
}

// Codes of 4 and 8 bits with a single activation row (decode) skip the interleaving: each row's
// codes of 4 blocks multiply the activations as they lie, one 128-bit lane per block, and one
// reduction gives the 16 rows' sums of the 4 blocks. isums[b] = the block sums of the chunk's
// blocks b < blocks; `offset`: bytes from a row's start to the chunk.
template <int Bits>
constexpr bool kDirectSingleRow = Bits == 4 || Bits == 8;

// The mask of the first `count` bytes of a vector (none when count <= 0).
__mmask64 first_bytes(int64_t count) {
  if (count <= 0) return 0;
  return count >= 64 ? ~__mmask64{0} : (__mmask64{1} << count) - 1;
}

// Bytes at p, up to `mask` (all 64 when Full): partial quads read only what exists.
template <bool Full>
__attribute__((always_inline)) inline __m512i load_bytes(__mmask64 mask, const void* p) {
  if constexpr (Full) return _mm512_loadu_si512(p);
  return _mm512_maskz_loadu_epi8(mask, p);
}

// The 16 rows' sums of `count` blocks (4 when Full) from block q of the chunk on.
template <int Bits, bool Full>
__attribute__((always_inline)) inline void quad_sums(const uint8_t* const* packed, int64_t offset,
                                                     const int8_t* x8, int64_t q, int64_t count,
                                                     __m512i* isums) {
  // The activations of the 4 blocks (zeros past the chunk), loaded only as far as they exist.
  const __m512i x01 = load_bytes<Full>(first_bytes(32 * count), x8 + 32 * q);
  const __m512i x23 = load_bytes<Full>(first_bytes(32 * count - 64), x8 + 32 * q + 64);
  __m512i rows[kTileRows];
  if constexpr (Bits == 4) {
    // Lane k: block k's 16 bytes; the low nibbles are its slots 0-15, the high ones 16-31.
    const __m512i low_x = _mm512_shuffle_i64x2(x01, x23, _MM_SHUFFLE(2, 0, 2, 0));
    const __m512i high_x = _mm512_shuffle_i64x2(x01, x23, _MM_SHUFFLE(3, 1, 3, 1));
    const __m512i nibble = _mm512_set1_epi8(15);
    const __mmask64 code_mask = first_bytes(count * 16);
#pragma GCC unroll 16
    for (int r = 0; r < kTileRows; ++r) {
      const __m512i bytes = load_bytes<Full>(code_mask, packed[r] + offset + 16 * q);
      rows[r] = _mm512_dpbusd_epi32(
          _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_and_si512(bytes, nibble), low_x),
          _mm512_and_si512(_mm512_srli_epi16(bytes, 4), nibble), high_x);
    }
  } else {
    // Blocks take two lanes each: the two halves of a block are added into one lane.
    const __mmask64 low_mask = first_bytes(count * 32), high_mask = first_bytes(count * 32 - 64);
#pragma GCC unroll 16
    for (int r = 0; r < kTileRows; ++r) {
      const uint8_t* codes = packed[r] + offset + 32 * q;
      const __m512i first =
          _mm512_dpbusd_epi32(_mm512_setzero_si512(), load_bytes<Full>(low_mask, codes), x01);
      const __m512i second =
          _mm512_dpbusd_epi32(_mm512_setzero_si512(), load_bytes<Full>(high_mask, codes + 64), x23);
      rows[r] = _mm512_add_epi32(_mm512_shuffle_i64x2(first, second, _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm512_shuffle_i64x2(first, second, _MM_SHUFFLE(3, 1, 3, 1)));
    }
  }
  __m512i reduced[4];
  reduce_lanes16(rows, reduced);
  for (int64_t k = 0; k < count; ++k) isums[q + k] = reduced[k];
}

template <int Bits>
void single_row_sums(const uint8_t* const* packed, int64_t offset, const int8_t* x8, int64_t blocks,
                     __m512i* isums) {
  int64_t q = 0;
  for (; q + 4 <= blocks; q += 4) quad_sums<Bits, true>(packed, offset, x8, q, 4, isums);
  if (q < blocks) quad_sums<Bits, false>(packed, offset, x8, q, blocks - q, isums);
}

// N activation rows of one chunk, in the canonical order: sums_of(b, k) is the exact block sums
// of the chunk's block b for row k, whose values are d[k] and xsums[k] (offset to the chunk) and
// accumulators acc[k] and bias_acc[k].
template <int BlocksPerGroup, int N, typename SumsOf>
__attribute__((always_inline)) inline void accumulate_chunk(
    const SumsOf& sums_of, int64_t chunk_groups, const float* const* d, const float* const* xsums,
    const float (*scales)[kTileRows], const float (*biases)[kTileRows], float (*acc)[kTileRows],
    float (*bias_acc)[kTileRows]) {
  __m512 sum[N], bias[N];
#pragma GCC unroll 4
  for (int k = 0; k < N; ++k) {
    sum[k] = _mm512_load_ps(acc[k]);
    bias[k] = _mm512_load_ps(bias_acc[k]);
  }
  for (int64_t g = 0; g < chunk_groups; ++g) {
    __m512 t[N];
#pragma GCC unroll 4
    for (int j = 0; j < BlocksPerGroup; ++j) {
      const int64_t b = g * BlocksPerGroup + j;
#pragma GCC unroll 4
      for (int k = 0; k < N; ++k) {
        const __m512 isum = _mm512_cvtepi32_ps(sums_of(b, k));
        t[k] = j == 0 ? _mm512_mul_ps(_mm512_set1_ps(d[k][b]), isum)
                      : _mm512_fmadd_ps(_mm512_set1_ps(d[k][b]), isum, t[k]);
      }
    }
    const __m512 scale = _mm512_load_ps(scales[g]), group_bias = _mm512_load_ps(biases[g]);
#pragma GCC unroll 4
    for (int k = 0; k < N; ++k) {
      sum[k] = _mm512_fmadd_ps(scale, t[k], sum[k]);
      bias[k] = _mm512_fmadd_ps(group_bias, _mm512_set1_ps(xsums[k][g]), bias[k]);
    }
  }
#pragma GCC unroll 4
  for (int k = 0; k < N; ++k) {
    _mm512_store_ps(acc[k], sum[k]);
    _mm512_store_ps(bias_acc[k], bias[k]);
  }
}

// Calls pass.template operator()<N>() with N = n, for 1 <= n <= kRowsAtOnce.
template <typename Pass>
__attribute__((always_inline)) inline void with_row_count(int64_t n, const Pass& pass) {
  static_assert(kRowsAtOnce == 4, "one case per row count up to kRowsAtOnce");
  switch (n) {
    case 1:
      return pass.template operator()<1>();
    case 2:
      return pass.template operator()<2>();
    case 3:
      return pass.template operator()<3>();
    default:
      return pass.template operator()<kRowsAtOnce>();
  }
}

// Output rows [row0, row0 + rows) (rows <= 16) against activation rows [i0, i1) (at most
// kActivationBlockRows). Lanes past `rows` repeat row row0 and are not stored.
template <int Bits, int BlocksPerGroup>
void int8_tile(const Int8Task& task, int64_t row0, int rows, int64_t i0, int64_t i1) {
  constexpr int64_t group = BlocksPerGroup * kInt8Block;
  const QuantMatrix& w = *task.w;
  const int64_t groups = w.cols / group;
  const int64_t row_bytes = w.cols * Bits / 8;
  const bool single = i1 - i0 == 1;
  const uint8_t* packed[kTileRows];
  int64_t first_group[kTileRows];
  for (int r = 0; r < kTileRows; ++r) {
    const int64_t stored_row = task.expert * w.rows + row0 + (r < rows ? r : 0);
    packed[r] = w.packed + stored_row * row_bytes;
    first_group[r] = stored_row * groups;
  }
  const int64_t first_tile = task.expert * tiles_per_expert(w.rows) + row0 / kTileValueRows;
  const int64_t next_tile = rows > kTileValueRows ? 1 : 0;
  PackedTiles values, tile_codes;
  const int64_t value_tile_bytes = groups * tile_value_group_bytes(w.scale_dtype);
  // Products that share their activation rows may start a matrix's rows mid-tile (qmatmul_shared):
  // such tiles read the originals.
  const bool tile_aligned = row0 % kTileValueRows == 0;
  if (w.tile_values != nullptr && tile_aligned) {
    values = {w.tile_values + first_tile * value_tile_bytes,
              w.tile_values + (first_tile + next_tile) * value_tile_bytes};
  }
  if (has_tile_codes(Bits) && w.tile_codes != nullptr && tile_aligned) {
    const int64_t code_tile_bytes = w.cols / kInt8Block * tile_code_block_bytes(Bits);
    tile_codes = {w.tile_codes + first_tile * code_tile_bytes,
                  w.tile_codes + (first_tile + next_tile) * code_tile_bytes};
  }
  // The next tile's codes and values are contiguous in either layout (two 8-row tiles of tile
  // codes hold the bytes of 16 packed rows).
  const uint8_t* ahead = (tile_codes.first != nullptr ? tile_codes.first : packed[0]) +
                         kPrefetchTilesAhead * kTileRows * row_bytes;
  if (values.first != nullptr) {
    // The packed values go to L1 (the codes to L2): they are few and read first. On an Emerald
    // Rapids Xeon their loads held a fifth of the 4-bit tile's samples (perf, decode) with the
    // codes' hint; with this one verify forwards took 0.98-0.99x the time at widths 1-4
    // (verify_bench, 6 paired rounds).
    const uint8_t* values_ahead =
        values.first + kPrefetchTilesAhead * (kTileRows / kTileValueRows) * value_tile_bytes;
    for (int64_t line = 0; line < 2 * value_tile_bytes; line += 64) {
      __builtin_prefetch(values_ahead + line, 0, 3);
    }
  } else {
    const int64_t size = w.scale_dtype == DType::F32 ? 4 : 2;
    const int64_t offset = (first_group[0] + kPrefetchTilesAhead * kTileRows * groups) * size;
    for (int64_t line = 0; line < kTileRows * groups * size; line += 64) {
      __builtin_prefetch(w.scales + offset + line, 0, 1);
      __builtin_prefetch(w.biases + offset + line, 0, 1);
    }
  }
  constexpr int64_t kChunkColumns = kChunkGroups * group;
  __m512i codes[kChunkGroups * BlocksPerGroup][kSteps];
  alignas(64) float scales[kChunkGroups][kTileRows];
  alignas(64) float biases[kChunkGroups][kTileRows];
  alignas(64) float acc[kActivationBlockRows][kTileRows];
  alignas(64) float bias_acc[kActivationBlockRows][kTileRows];
  // A zero the compiler cannot see: zeroing the accumulators with a constant became two memset
  // calls per tile, 3-6% of the samples of a verify forward of 8 or 16 rows (perf, Zen 4).
  __m512 zero = _mm512_setzero_ps();
  asm("" : "+v"(zero));
  for (int64_t i = 0; i < i1 - i0; ++i) {
    _mm512_store_ps(acc[i], zero);
    _mm512_store_ps(bias_acc[i], zero);
  }
  const int8_t* x8[kActivationBlockRows];
  const float* d[kActivationBlockRows];
  const float* xsums[kActivationBlockRows];
  for (int64_t c0 = 0; c0 < w.cols; c0 += kChunkColumns) {
    const int64_t columns = std::min(kChunkColumns, w.cols - c0);
    const int64_t blocks = columns / kInt8Block;
    const int64_t chunk_groups = columns / group;
    const int64_t g0 = c0 / group;
    const uint8_t* ahead_chunk = ahead + kTileRows * c0 * Bits / 8;
    // A block's share of the chunk's prefetches: 16 rows of 32 codes are Bits lines.
    const auto prefetch_block = [&](int64_t b) __attribute__((always_inline)) {
#pragma GCC unroll 8
      for (int line = 0; line < Bits; ++line) {
        __builtin_prefetch(ahead_chunk + (b * Bits + line) * 64, 0, 1);
      }
    };
    int64_t chunk_first[kTileRows];
    for (int r = 0; r < kTileRows; ++r) chunk_first[r] = first_group[r] + g0;
    if (values.first != nullptr) {
      const int64_t offset = g0 * tile_value_group_bytes(w.scale_dtype);
      read_packed_chunk_values(w.scale_dtype, {values.first + offset, values.second + offset},
                               chunk_groups, scales, biases);
    } else {
      // Lanes past `rows` repeat row row0, so the last row's values are the furthest.
      load_chunk_values(w, chunk_first, chunk_groups, chunk_first[rows - 1], scales, biases);
    }
    for (int64_t i = 0; i < i1 - i0; ++i) {
      x8[i] = task.x8[i0 + i] + c0;
      d[i] = task.block_scales[i0 + i] + c0 / kInt8Block;
      xsums[i] = task.xsums[i0 + i] + g0;
    }
    const auto unpack_block = [&](int64_t b, __m512i * steps) __attribute__((always_inline)) {
      if (tile_codes.first != nullptr) {
        const int64_t offset = (c0 / kInt8Block + b) * tile_code_block_bytes(Bits);
        unpack_tile_codes<Bits>({tile_codes.first + offset, tile_codes.second + offset}, steps);
      } else {
        unpack_interleaved<Bits>(packed, (c0 + b * kInt8Block) * Bits / 8, steps);
      }
    };
    if constexpr (kDirectSingleRow<Bits>) {
      if (single) {
        if (tile_codes.first == nullptr) {
          for (int64_t b = 0; b < blocks; ++b) prefetch_block(b);
          __m512i isums[kChunkGroups * BlocksPerGroup];
          single_row_sums<Bits>(packed, c0 * Bits / 8, x8[0], blocks, isums);
          const auto sums_of = [&](int64_t b, int) __attribute__((always_inline)) {
            return isums[b];
          };
          accumulate_chunk<BlocksPerGroup, 1>(sums_of, chunk_groups, d, xsums, scales, biases, acc,
                                              bias_acc);
          continue;
        }
      }
    }
    // Up to kRowsAtOnce rows take one pass, each block unpacked into registers as it is reached.
    const auto direct = [&]<int N>() __attribute__((always_inline)) {
      __m512i steps[kSteps];
      const auto sums_of = [&](int64_t b, int k) __attribute__((always_inline)) {
        if (k == 0) {
          prefetch_block(b);
          unpack_block(b, steps);
        }
        return block_sums(steps, x8[k] + b * kInt8Block);
      };
      accumulate_chunk<BlocksPerGroup, N>(sums_of, chunk_groups, d, xsums, scales, biases, acc,
                                          bias_acc);
    };
    if (i1 - i0 <= kRowsAtOnce) {
      with_row_count(i1 - i0, direct);
      continue;
    }
    // More rows take passes of kRowsAtOnce. Codes without the tile layout, whose unpacking
    // interleaves 16 rows, are unpacked once into the buffer; tile codes are unpacked into
    // registers again by each pass, which made 8 4-bit rows 0.90x the time of the buffer
    // (quant_bench qmatmul_cached, one thread, Zen 4). The single pass above stays apart: taking
    // up to 4 rows through this loop too made them 1.07-1.11x the time.
    const auto passes = [&]<bool Buffered>() __attribute__((always_inline)) {
      for (int64_t i = 0; i < i1 - i0; i += kRowsAtOnce) {
        const auto pass = [&]<int N>() __attribute__((always_inline)) {
          __m512i steps[kSteps];
          const auto sums_of = [&](int64_t b, int k) __attribute__((always_inline)) {
            if (i == 0 && k == 0) prefetch_block(b);
            if constexpr (Buffered) {
              return block_sums(codes[b], x8[i + k] + b * kInt8Block);
            } else {
              if (k == 0) unpack_block(b, steps);
              return block_sums(steps, x8[i + k] + b * kInt8Block);
            }
          };
          accumulate_chunk<BlocksPerGroup, N>(sums_of, chunk_groups, d + i, xsums + i, scales,
                                              biases, acc + i, bias_acc + i);
        };
        with_row_count(std::min<int64_t>(kRowsAtOnce, i1 - i0 - i), pass);
      }
    };
    if (tile_codes.first == nullptr) {
      for (int64_t b = 0; b < blocks; ++b) unpack_block(b, codes[b]);
      passes.template operator()<true>();
    } else {
      passes.template operator()<false>();
    }
  }
  const auto stored = static_cast<__mmask16>((1u << rows) - 1);
  for (int64_t i = i0; i < i1; ++i) {
    _mm512_mask_storeu_ps(
        task.y[i] + row0, stored,
        _mm512_add_ps(_mm512_load_ps(acc[i - i0]), _mm512_load_ps(bias_acc[i - i0])));
  }
}

}  // namespace

void int8_rows_avx512vnni(const Int8Task& task, int64_t row_begin, int64_t row_end) {
  for_each_int8_tile<kTileRows, kActivationBlockRows>(
      task, row_begin, row_end,
      [&]<int Bits, int Blocks>(int64_t row, int rows, int64_t i0, int64_t i1) {
        int8_tile<Bits, Blocks>(task, row, rows, i0, i1);
      });
}

}  // namespace dspark::kernels::cpu
