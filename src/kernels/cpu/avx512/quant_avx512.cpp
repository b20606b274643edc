// AVX-512 (F, BW, VL, DQ) kernels: one zmm register holds the 16 canonical lanes.

#include <cstring>

#include "kernels/cpu/avx512/intrinsics.h"
#include "kernels/cpu/quant_impl.h"
#include "kernels/cpu/quant_tiles.h"

namespace dspark::kernels::cpu {
namespace {

// For 3 and 5 bits: 16 elements span 2·bits bytes. Word k of the shuffle gathers the two bytes
// holding element k; a variable shift then drops its bit offset.
template <int Bits>
struct OddBitsTables {
  alignas(32) uint8_t pair_index[32];
  alignas(64) uint32_t shifts[16];
};

template <int Bits>
constexpr OddBitsTables<Bits> make_odd_bits_tables() {
  OddBitsTables<Bits> tables{};
  for (int k = 0; k < 16; ++k) {
    const int byte = k * Bits / 8;
    // Both 128-bit halves of the ymm hold the same 16 source bytes; elements 8..15 use the upper.
    tables.pair_index[2 * k] = static_cast<uint8_t>(byte);
    tables.pair_index[2 * k + 1] = static_cast<uint8_t>(byte + 1);
    tables.shifts[k] = static_cast<uint32_t>(k * Bits % 8);
  }
  return tables;
}

template <int Bits>
constexpr OddBitsTables<Bits> kOddBits = make_odd_bits_tables<Bits>();

// Per 128-bit lane, the four three-byte units it holds as zero-extended dwords: lanes 0 and 2 hold
// bytes 0-15 of a 6-bit chunk (units 0-3 at 0, 3, 6, 9), lanes 1 and 3 bytes 8-23 (units 4-7 at
// 4, 7, 10, 13 within the lane).
constexpr uint8_t kZero = 0x80;
alignas(64) constexpr uint8_t kSixBitUnits[64] = {
    0, 1, 2, kZero, 3, 4, 5, kZero, 6,  7,  8,  kZero, 9,  10, 11, kZero,
    4, 5, 6, kZero, 7, 8, 9, kZero, 10, 11, 12, kZero, 13, 14, 15, kZero,
    0, 1, 2, kZero, 3, 4, 5, kZero, 6,  7,  8,  kZero, 9,  10, 11, kZero,
    4, 5, 6, kZero, 7, 8, 9, kZero, 10, 11, 12, kZero, 13, 14, 15, kZero};

alignas(64) constexpr uint32_t kTwoBitShifts[16] = {0,  2,  4,  6,  8,  10, 12, 14,
                                                    16, 18, 20, 22, 24, 26, 28, 30};

__mmask16 first_lanes(int count) {
  return static_cast<__mmask16>((1u << count) - 1);
}

struct Avx512 {
  using F = __m512;
  // 32 vector registers: 2·R·MB of them hold a tile's partial sums and accumulators, the rest
  // the decoded weights and activations. Blocks of up to 4 activation rows: blocks of 8 (R = 1)
  // measured slower, their activations outgrowing L1 beside the weights at 1536 columns.
  static constexpr int kMaxActivationRows = 4;
  template <int MB>
  static constexpr int kRowsPerTile = MB == 1   ? 8
                                      : MB == 2 ? 4
                                                : 3;
  static constexpr bool kAccumulatorsInRegisters = true;
  static constexpr int kDenseMaxActivationRows = 4;
  template <int MB>
  static constexpr int kDenseRowsPerTile = MB == 1   ? 8
                                           : MB == 2 ? 6
                                                     : 4;

  static F zero() { return _mm512_setzero_ps(); }
  static F load(const float* p) { return _mm512_loadu_ps(p); }
  static F load_partial(const float* p, int count) {
    return _mm512_maskz_loadu_ps(first_lanes(count), p);
  }
  static F broadcast(float value) { return _mm512_set1_ps(value); }
  static F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static void store(float* p, F a) { _mm512_storeu_ps(p, a); }

  static float reduce(F a) {
    const __m256 r8 = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
    const __m128 r4 = _mm_add_ps(_mm256_castps256_ps128(r8), _mm256_extractf128_ps(r8, 1));
    const __m128 r2 = _mm_add_ps(r4, _mm_movehl_ps(r4, r4));
    return _mm_cvtss_f32(_mm_add_ss(r2, _mm_movehdup_ps(r2)));
  }

  template <int Bits>
  static void decode(const uint8_t* bytes, F* q) {
    if constexpr (Bits == 4) {
      const __m512i v =
          _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes)));
      q[0] = _mm512_cvtepi32_ps(_mm512_and_si512(v, _mm512_set1_epi32(15)));
      q[1] = _mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4));
    } else if constexpr (Bits == 6) {
      // 24 bytes = 8 three-byte units. Put unit k in dword k and again in dword 8 + k (shifted
      // down by 12 bits there), then take 6 bits at offsets 0 and 6 of every dword.
      const __m256i packed = _mm256_maskz_loadu_epi8(0xffffff, bytes);
      const __m512i lanes = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 1, 1, 2, 0, 1, 1, 2),
                                                     _mm512_castsi256_si512(packed));
      const __m512i units = _mm512_srlv_epi32(
          _mm512_shuffle_epi8(lanes, _mm512_load_si512(kSixBitUnits)),
          _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 12, 12, 12, 12, 12, 12, 12, 12));
      const __m512i mask = _mm512_set1_epi32(63);
      q[0] = _mm512_cvtepi32_ps(_mm512_and_si512(units, mask));
      q[1] = _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(units, 6), mask));
    } else if constexpr (Bits == 8) {
      q[0] = _mm512_cvtepi32_ps(
          _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes))));
    } else if constexpr (Bits == 2) {
      uint32_t word;
      std::memcpy(&word, bytes, 4);
      const __m512i v = _mm512_srlv_epi32(_mm512_set1_epi32(static_cast<int>(word)),
                                          _mm512_load_si512(kTwoBitShifts));
      q[0] = _mm512_cvtepi32_ps(_mm512_and_si512(v, _mm512_set1_epi32(3)));
    } else {
      constexpr int kBytes = 2 * Bits;
      const __m128i packed =
          _mm_maskz_loadu_epi8(static_cast<__mmask16>((1u << kBytes) - 1), bytes);
      const __m256i pairs = _mm256_shuffle_epi8(
          _mm256_broadcastsi128_si256(packed),
          _mm256_load_si256(reinterpret_cast<const __m256i*>(kOddBits<Bits>.pair_index)));
      const __m512i v =
          _mm512_srlv_epi32(_mm512_cvtepu16_epi32(pairs), _mm512_load_si512(kOddBits<Bits>.shifts));
      q[0] = _mm512_cvtepi32_ps(_mm512_and_si512(v, _mm512_set1_epi32((1 << Bits) - 1)));
    }
  }

  template <DType D>
  static F load_dense(const uint8_t* p) {
    if constexpr (D == DType::F32) {
      return _mm512_loadu_ps(p);
    } else {
      const __m256i halves = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
      return widen<D>(halves);
    }
  }

  template <DType D>
  static F load_dense_partial(const uint8_t* p, int count) {
    if constexpr (D == DType::F32) {
      return _mm512_maskz_loadu_ps(first_lanes(count), p);
    } else {
      return widen<D>(_mm256_maskz_loadu_epi16(first_lanes(count), p));
    }
  }

  template <DType D>
  static F widen(__m256i halves) {
    if constexpr (D == DType::BF16) {
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(halves), 16));
    } else {
      return _mm512_cvtph_ps(halves);
    }
  }
};

void bf16_to_f32_avx512(const uint8_t* src, int64_t n, float* dst) {
  int64_t k = 0;
  for (; k + 16 <= n; k += 16)
    _mm512_storeu_ps(dst + k, Avx512::load_dense<DType::BF16>(src + 2 * k));
  if (k < n) {
    const int count = static_cast<int>(n - k);
    _mm512_mask_storeu_ps(dst + k, first_lanes(count),
                          Avx512::load_dense_partial<DType::BF16>(src + 2 * k, count));
  }
}

void f16_to_f32_avx512(const uint8_t* src, int64_t n, float* dst) {
  int64_t k = 0;
  for (; k + 16 <= n; k += 16)
    _mm512_storeu_ps(dst + k, Avx512::load_dense<DType::F16>(src + 2 * k));
  if (k < n) {
    const int count = static_cast<int>(n - k);
    _mm512_mask_storeu_ps(dst + k, first_lanes(count),
                          Avx512::load_dense_partial<DType::F16>(src + 2 * k, count));
  }
}

// Round to nearest even; NaN stays a quiet NaN (as dspark::f32_to_bf16).
__m256i to_bf16(__m512 values) {
  const __m512i bits = _mm512_castps_si512(values);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(
      _mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(
      _mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))), 16);
  const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(0x40));
  return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet));
}

void f32_to_bf16_avx512(const float* src, int64_t n, uint8_t* dst) {
  int64_t k = 0;
  for (; k + 16 <= n; k += 16) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 2 * k), to_bf16(_mm512_loadu_ps(src + k)));
  }
  if (k < n) {
    const __mmask16 mask = first_lanes(static_cast<int>(n - k));
    _mm256_mask_storeu_epi16(dst + 2 * k, mask, to_bf16(_mm512_maskz_loadu_ps(mask, src + k)));
  }
}

void f32_to_f16_avx512(const float* src, int64_t n, uint8_t* dst) {
  const __m512 low = _mm512_set1_ps(-kF16Max), high = _mm512_set1_ps(kF16Max);
  auto convert = [&](__m512 values) {
    return _mm512_cvtps_ph(_mm512_min_ps(high, _mm512_max_ps(low, values)),
                           _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  };
  int64_t k = 0;
  for (; k + 16 <= n; k += 16) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 2 * k), convert(_mm512_loadu_ps(src + k)));
  }
  if (k < n) {
    const __mmask16 mask = first_lanes(static_cast<int>(n - k));
    _mm256_mask_storeu_epi16(dst + 2 * k, mask, convert(_mm512_maskz_loadu_ps(mask, src + k)));
  }
}

uint64_t read_sweep_avx512(const uint8_t* data, int64_t bytes) {
  __m512i a = _mm512_setzero_si512(), b = a, c = a, d = a;
  for (int64_t offset = 0; offset < bytes; offset += 256) {
    a = _mm512_add_epi64(a, _mm512_loadu_si512(data + offset));
    b = _mm512_add_epi64(b, _mm512_loadu_si512(data + offset + 64));
    c = _mm512_add_epi64(c, _mm512_loadu_si512(data + offset + 128));
    d = _mm512_add_epi64(d, _mm512_loadu_si512(data + offset + 192));
  }
  return static_cast<uint64_t>(
      _mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_add_epi64(a, b), _mm512_add_epi64(c, d))));
}

}  // namespace

// The two tables differ in their int8 kernel and whether it reads spread activations. Without VNNI
// the int8 entries are the AVX2 kernels, which every AVX-512 CPU runs.
constexpr KernelTable avx512_table(void (*int8_rows)(const Int8Task&, int64_t, int64_t),
                                   void (*spread)(const int8_t*, int64_t, SpreadVector*)) {
  return {tiles::quant_rows<Avx512>, int8_rows,
          quantize_activations_avx2, tiles::dense_rows<Avx512>,
          bf16_to_f32_avx512,        f16_to_f32_avx512,
          f32_to_bf16_avx512,        f32_to_f16_avx512,
          read_sweep_avx512,         spread,
          spread != nullptr};
}

const KernelTable kAvx512Kernels = avx512_table(int8_rows_avx2, spread_activations_avx2);
const KernelTable kAvx512VnniKernels = avx512_table(int8_rows_avx512vnni, nullptr);

}  // namespace dspark::kernels::cpu
