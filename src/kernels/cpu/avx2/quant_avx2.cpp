// AVX2 + FMA + F16C kernels: a pair of ymm registers holds the 16 canonical lanes (lanes 0..7,
// then 8..15), so the results equal the scalar and AVX-512 kernels bit for bit.
#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/quant_impl.h"
#include "kernels/cpu/quant_tiles.h"
#include "kernels/cpu/unaligned_loads.h"

namespace dspark::kernels::cpu {
namespace {

// For 3 and 5 bits: 16 elements span 2·bits bytes; see the AVX-512 unit for the scheme.
template <int Bits>
struct OddBitsTables {
  alignas(16) uint8_t pair_index[2][16];
  alignas(32) uint32_t shifts[2][8];
};

template <int Bits>
constexpr OddBitsTables<Bits> make_odd_bits_tables() {
  OddBitsTables<Bits> tables{};
  for (int k = 0; k < 16; ++k) {
    const int byte = k * Bits / 8;
    tables.pair_index[k / 8][2 * (k % 8)] = static_cast<uint8_t>(byte);
    tables.pair_index[k / 8][2 * (k % 8) + 1] = static_cast<uint8_t>(byte + 1);
    tables.shifts[k / 8][k % 8] = static_cast<uint32_t>(k * Bits % 8);
  }
  return tables;
}

template <int Bits>
constexpr OddBitsTables<Bits> kOddBits = make_odd_bits_tables<Bits>();

// Lane 0 holds bytes 0-15 of a 6-bit chunk (units 0-3 at 0, 3, 6, 9), lane 1 bytes 8-23 (units
// 4-7 at 4, 7, 10, 13 within the lane); each unit becomes a zero-extended dword.
constexpr uint8_t kZero = 0x80;
alignas(32) constexpr uint8_t kSixBitUnits[32] = {
    0, 1, 2, kZero, 3, 4, 5, kZero, 6,  7,  8,  kZero, 9,  10, 11, kZero,
    4, 5, 6, kZero, 7, 8, 9, kZero, 10, 11, 12, kZero, 13, 14, 15, kZero};

alignas(32) constexpr uint32_t kTwoBitShifts[2][8] = {{0, 2, 4, 6, 8, 10, 12, 14},
                                                      {16, 18, 20, 22, 24, 26, 28, 30}};

// Exactly 2·Bits bytes (3 or 5 bits), zero-extended to 16, without reading past them.
template <int Bits>
__m128i load_odd_bits(const uint8_t* p) {
  if constexpr (Bits == 3) {
    return _mm_insert_epi16(_mm_cvtsi32_si128(static_cast<int>(load_u32(p))), load_u16(p + 4), 2);
  } else {
    return _mm_insert_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)), load_u16(p + 8),
                            4);
  }
}

struct Lanes16 {
  __m256 lo;
  __m256 hi;
};

struct Avx2 {
  using F = Lanes16;
  // 16 ymm registers, two per vector: accumulators in memory, R·MB partial sums in registers.
  static constexpr int kMaxActivationRows = 2;
  template <int MB>
  static constexpr int kRowsPerTile = MB == 1 ? 4 : 2;
  static constexpr bool kAccumulatorsInRegisters = false;
  static constexpr int kDenseMaxActivationRows = 2;
  template <int MB>
  static constexpr int kDenseRowsPerTile = MB == 1   ? 4
                                           : MB == 2 ? 2
                                                     : 2;

  static F zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
  static F load(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
  static F load_partial(const float* p, int count) {
    alignas(32) float padded[16] = {};
    std::memcpy(padded, p, sizeof(float) * count);
    return load(padded);
  }
  static F broadcast(float value) { return {_mm256_set1_ps(value), _mm256_set1_ps(value)}; }
  static F fma(F a, F b, F c) {
    return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
  }
  static F add(F a, F b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
  static void store(float* p, F a) {
    _mm256_storeu_ps(p, a.lo);
    _mm256_storeu_ps(p + 8, a.hi);
  }

  static float reduce(F a) {
    const __m256 r8 = _mm256_add_ps(a.lo, a.hi);
    const __m128 r4 = _mm_add_ps(_mm256_castps256_ps128(r8), _mm256_extractf128_ps(r8, 1));
    const __m128 r2 = _mm_add_ps(r4, _mm_movehl_ps(r4, r4));
    return _mm_cvtss_f32(_mm_add_ss(r2, _mm_movehdup_ps(r2)));
  }

  static __m256 to_float(__m256i v) { return _mm256_cvtepi32_ps(v); }

  template <int Bits>
  static void decode(const uint8_t* bytes, F* q) {
    if constexpr (Bits == 4 || Bits == 8) {
      const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes));
      const __m256i low = _mm256_cvtepu8_epi32(packed);
      const __m256i high = _mm256_cvtepu8_epi32(_mm_unpackhi_epi64(packed, packed));
      if constexpr (Bits == 4) {
        const __m256i mask = _mm256_set1_epi32(15);
        q[0] = {to_float(_mm256_and_si256(low, mask)), to_float(_mm256_and_si256(high, mask))};
        q[1] = {to_float(_mm256_srli_epi32(low, 4)), to_float(_mm256_srli_epi32(high, 4))};
      } else {
        q[0] = {to_float(low), to_float(high)};
      }
    } else if constexpr (Bits == 6) {
      // 24 bytes = 8 three-byte units: unit k in dword k, then 6 bits at offsets 0, 12 (lanes
      // 0-7 / 8-15 of q[0]) and 6, 18 (q[1]).
      const __m256i packed = _mm256_inserti128_si256(
          _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes))),
          _mm_loadl_epi64(reinterpret_cast<const __m128i*>(bytes + 16)), 1);
      const __m256i units =
          _mm256_shuffle_epi8(_mm256_permute4x64_epi64(packed, 0x94),
                              _mm256_load_si256(reinterpret_cast<const __m256i*>(kSixBitUnits)));
      const __m256i mask = _mm256_set1_epi32(63);
      const __m256i high = _mm256_srli_epi32(units, 12);
      q[0] = {to_float(_mm256_and_si256(units, mask)), to_float(_mm256_and_si256(high, mask))};
      q[1] = {to_float(_mm256_and_si256(_mm256_srli_epi32(units, 6), mask)),
              to_float(_mm256_and_si256(_mm256_srli_epi32(high, 6), mask))};
    } else if constexpr (Bits == 2) {
      const __m256i word = _mm256_set1_epi32(static_cast<int>(load_u32(bytes)));
      const __m256i mask = _mm256_set1_epi32(3);
      const auto* shifts = reinterpret_cast<const __m256i*>(kTwoBitShifts);
      q[0] = {
          to_float(_mm256_and_si256(_mm256_srlv_epi32(word, _mm256_load_si256(shifts)), mask)),
          to_float(_mm256_and_si256(_mm256_srlv_epi32(word, _mm256_load_si256(shifts + 1)), mask))};
    } else {
      const __m128i packed = load_odd_bits<Bits>(bytes);
      const __m256i mask = _mm256_set1_epi32((1 << Bits) - 1);
      __m256 halves[2];
      for (int h = 0; h < 2; ++h) {
        const __m128i pairs = _mm_shuffle_epi8(
            packed, _mm_load_si128(reinterpret_cast<const __m128i*>(kOddBits<Bits>.pair_index[h])));
        const __m256i shifts =
            _mm256_load_si256(reinterpret_cast<const __m256i*>(kOddBits<Bits>.shifts[h]));
        halves[h] = to_float(
            _mm256_and_si256(_mm256_srlv_epi32(_mm256_cvtepu16_epi32(pairs), shifts), mask));
      }
      q[0] = {halves[0], halves[1]};
    }
  }

  template <DType D>
  static __m256 widen8(const uint8_t* p) {
    if constexpr (D == DType::F32) {
      return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
    } else {
      const __m128i halves = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
      if constexpr (D == DType::BF16) {
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(halves), 16));
      } else {
        return _mm256_cvtph_ps(halves);
      }
    }
  }

  template <DType D>
  static F load_dense(const uint8_t* p) {
    constexpr int kSize = D == DType::F32 ? 4 : 2;
    return {widen8<D>(p), widen8<D>(p + 8 * kSize)};
  }

  template <DType D>
  static F load_dense_partial(const uint8_t* p, int count) {
    constexpr int kSize = D == DType::F32 ? 4 : 2;
    alignas(64) uint8_t padded[16 * kSize] = {};
    std::memcpy(padded, p, static_cast<size_t>(kSize) * count);
    return load_dense<D>(padded);
  }

  static float widen_one(const uint8_t* base, DType dtype, int64_t index) {
    if (dtype == DType::F32) {
      float value;
      std::memcpy(&value, base + 4 * index, 4);
      return value;
    }
    const uint16_t bits = load_u16(base + 2 * index);
    if (dtype == DType::F16) return _cvtsh_ss(bits);
    const uint32_t widened = static_cast<uint32_t>(bits) << 16;
    float value;
    std::memcpy(&value, &widened, 4);
    return value;
  }
};

template <DType D>
void widen_to_f32(const uint8_t* src, int64_t n, float* dst) {
  int64_t k = 0;
  for (; k + 8 <= n; k += 8) _mm256_storeu_ps(dst + k, Avx2::widen8<D>(src + 2 * k));
  for (; k < n; ++k) dst[k] = Avx2::widen_one(src, D, k);
}

void bf16_to_f32_avx2(const uint8_t* src, int64_t n, float* dst) {
  widen_to_f32<DType::BF16>(src, n, dst);
}

void f16_to_f32_avx2(const uint8_t* src, int64_t n, float* dst) {
  widen_to_f32<DType::F16>(src, n, dst);
}

// Round to nearest even; NaN stays a quiet NaN (as dspark::f32_to_bf16). Returns 8 results in the
// low 16 bits of each lane.
__m256i to_bf16(__m256 values) {
  const __m256i bits = _mm256_castps_si256(values);
  const __m256i magnitude = _mm256_and_si256(bits, _mm256_set1_epi32(0x7fffffff));
  const __m256i nan = _mm256_cmpgt_epi32(magnitude, _mm256_set1_epi32(0x7f800000));
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(
      _mm256_add_epi32(bits, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))), 16);
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(0x40));
  return _mm256_blendv_epi8(rounded, quiet, nan);
}

void f32_to_bf16_avx2(const float* src, int64_t n, uint8_t* dst) {
  int64_t k = 0;
  for (; k + 8 <= n; k += 8) {
    const __m256i lanes = to_bf16(_mm256_loadu_ps(src + k));
    const __m128i packed =
        _mm_packus_epi32(_mm256_castsi256_si128(lanes), _mm256_extracti128_si256(lanes, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * k), packed);
  }
  for (; k < n; ++k) {
    alignas(32) float one[8] = {src[k]};
    alignas(32) uint32_t result[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(result), to_bf16(_mm256_load_ps(one)));
    const auto bits = static_cast<uint16_t>(result[0]);
    std::memcpy(dst + 2 * k, &bits, 2);
  }
}

void f32_to_f16_avx2(const float* src, int64_t n, uint8_t* dst) {
  const __m256 low = _mm256_set1_ps(-kF16Max), high = _mm256_set1_ps(kF16Max);
  auto convert = [&](__m256 values) {
    return _mm256_cvtps_ph(_mm256_min_ps(high, _mm256_max_ps(low, values)),
                           _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  };
  int64_t k = 0;
  for (; k + 8 <= n; k += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * k), convert(_mm256_loadu_ps(src + k)));
  }
  for (; k < n; ++k) {
    const auto bits = static_cast<uint16_t>(_mm_extract_epi16(convert(_mm256_set1_ps(src[k])), 0));
    std::memcpy(dst + 2 * k, &bits, 2);
  }
}

uint64_t read_sweep_avx2(const uint8_t* data, int64_t bytes) {
  __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
  for (int64_t offset = 0; offset < bytes; offset += 128) {
    a = _mm256_add_epi64(a, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(data + offset)));
    b = _mm256_add_epi64(b,
                         _mm256_loadu_si256(reinterpret_cast<const __m256i*>(data + offset + 32)));
    c = _mm256_add_epi64(c,
                         _mm256_loadu_si256(reinterpret_cast<const __m256i*>(data + offset + 64)));
    d = _mm256_add_epi64(d,
                         _mm256_loadu_si256(reinterpret_cast<const __m256i*>(data + offset + 96)));
  }
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes),
                     _mm256_add_epi64(_mm256_add_epi64(a, b), _mm256_add_epi64(c, d)));
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}

}  // namespace

// The two tables differ in their int8 kernel alone (and what it reads against 8-bit tile codes).
constexpr KernelTable avx2_table(void (*int8_rows)(const Int8Task&, int64_t, int64_t),
                                 bool spreads_byte_tile_codes) {
  return {tiles::quant_rows<Avx2>,   int8_rows,
          quantize_activations_avx2, tiles::dense_rows<Avx2>,
          bf16_to_f32_avx2,          f16_to_f32_avx2,
          f32_to_bf16_avx2,          f32_to_f16_avx2,
          read_sweep_avx2,           spread_activations_avx2,
          spreads_byte_tile_codes};
}

const KernelTable kAvx2Kernels = avx2_table(int8_rows_avx2, true);
const KernelTable kAvxVnniKernels = avx2_table(int8_rows_avxvnni, false);

}  // namespace dspark::kernels::cpu
