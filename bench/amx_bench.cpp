// What Intel AMX tiles would cost the int8 products: the tile unit's peak, its loads and stores,
// and a block's integer sums from tiles next to the float sequence that combines them (the
// decided numerics: blocks of 32 inputs, one activation scale each, kernels/quant.h). Session 37
// measured these on an Emerald Rapids Xeon and did not build an AMX kernel on them
// (docs/benchmarks, "Session 37"). Every benchmark skips on a CPU or kernel without usable AMX.
//
//   amx_bench --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>

#include "kernels/cpu/avx512/intrinsics.h"

#define AMX_TARGET __attribute__((target("amx-tile,amx-int8,avx512f")))

namespace {

// AMX-TILE and AMX-INT8 present, the tile state enabled in XCR0 (bits 17, 18), and Linux's
// permission for this process (arch_prctl ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) granted.
bool amx_usable() {
  static const bool usable = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
    if (!((edx >> 24) & 1) || !((edx >> 25) & 1)) return false;
    if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx) || !((ecx >> 27) & 1)) return false;
    unsigned xcr0_low = 0, xcr0_high = 0;
    __asm__ volatile("xgetbv" : "=a"(xcr0_low), "=d"(xcr0_high) : "c"(0));
    if ((xcr0_low & 0x60000) != 0x60000) return false;
    constexpr int kRequestPermission = 0x1023, kTileData = 18;
    return syscall(SYS_arch_prctl, kRequestPermission, kTileData) == 0;
  }();
  return usable;
}

struct TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};
};

// tmm0-3: sums (sum_rows x 16 int32); tmm4, tmm5: activations (sum_rows x k_bytes); tmm6, tmm7:
// codes (k_bytes / 4 rows of 64 bytes), as a block product of k_bytes inputs lays them out.
AMX_TARGET void configure(int sum_rows, int k_bytes) {
  TileConfig config;
  for (int t = 0; t < 4; ++t) {
    config.rows[t] = static_cast<uint8_t>(sum_rows);
    config.bytes_per_row[t] = 64;
  }
  for (int t = 4; t < 6; ++t) {
    config.rows[t] = static_cast<uint8_t>(sum_rows);
    config.bytes_per_row[t] = static_cast<uint16_t>(k_bytes);
    config.rows[t + 2] = static_cast<uint8_t>(k_bytes / 4);
    config.bytes_per_row[t + 2] = 64;
  }
  // Not _tile_loadconfig: GCC 12's tells the compiler that it reads only the first 8 bytes, and
  // the stores of the rest may then be dropped (a #GP on the bad configuration, or tiles of the
  // wrong shape: #UD at their first use).
  __asm__ volatile("ldtilecfg %0" : : "m"(config));
}

// The operands of 8 blocks, all in L1: activations (16 rows of 8 blocks), codes, sums.
struct Operands {
  alignas(64) int8_t activations[16][8 * 64];
  alignas(64) uint8_t codes[8][16][64];
  alignas(64) int32_t sums[8][16][16];
  alignas(64) float block_scales[16][8];
  alignas(64) float scales[8][16];
  alignas(64) float biases[8][16];
  alignas(64) float xsums[16][8];
  Operands() {
    for (int r = 0; r < 16; ++r) {
      for (int k = 0; k < 8 * 64; ++k)
        activations[r][k] = static_cast<int8_t>((r * 7 + k) % 21 - 10);
    }
    for (int b = 0; b < 8; ++b) {
      for (int r = 0; r < 16; ++r) {
        for (int k = 0; k < 64; ++k) codes[b][r][k] = static_cast<uint8_t>((b + r + k) % 16);
      }
    }
    std::memset(sums, 0, sizeof(sums));
    for (int r = 0; r < 16; ++r) {
      for (int b = 0; b < 8; ++b) {
        block_scales[r][b] = 0.01f * static_cast<float>(1 + (r + b) % 5);
        xsums[r][b] = 0.5f * static_cast<float>(r - b);
        scales[b][r] = 0.02f * static_cast<float>(1 + r % 3);
        biases[b][r] = -0.1f * static_cast<float>(1 + b % 4);
      }
    }
  }
};

Operands& operands() {
  static Operands instance;
  return instance;
}

// One block product into sums tile C: codes into W, activations into A, zero C, tdpbsud, store.
#define BLOCK_PRODUCT(C, A, W, activations, stride, codes, sums) \
  do {                                                           \
    _tile_loadd(W, codes, 64);                                   \
    _tile_loadd(A, activations, stride);                         \
    _tile_zero(C);                                               \
    _tile_dpbsud(C, A, W);                                       \
    _tile_stored(C, sums, 64);                                   \
  } while (0)

// 8 blocks of the configured activation rows, four sums tiles in turn.
AMX_TARGET void eight_block_products(Operands& o) {
  for (int b = 0; b < 8; b += 4) {
    BLOCK_PRODUCT(0, 4, 6, &o.activations[0][32 * b], 8 * 64, o.codes[b], o.sums[b]);
    BLOCK_PRODUCT(1, 5, 7, &o.activations[0][32 * (b + 1)], 8 * 64, o.codes[b + 1], o.sums[b + 1]);
    BLOCK_PRODUCT(2, 4, 6, &o.activations[0][32 * (b + 2)], 8 * 64, o.codes[b + 2], o.sums[b + 2]);
    BLOCK_PRODUCT(3, 5, 7, &o.activations[0][32 * (b + 3)], 8 * 64, o.codes[b + 3], o.sums[b + 3]);
  }
}

// The float sequence of the decided numerics for 8 blocks of `rows` rows and 16 output rows, one
// group per block: t = d·Σ, sum += s·t, bias += b·Σx (4 vector operations a row and block).
AMX_TARGET void combine_eight_blocks(Operands& o, int64_t rows, __m512* sum, __m512* bias) {
  for (int b = 0; b < 8; ++b) {
    const __m512 scale = _mm512_load_ps(o.scales[b]), group_bias = _mm512_load_ps(o.biases[b]);
    for (int64_t r = 0; r < rows; ++r) {
      const __m512 isum = _mm512_cvtepi32_ps(_mm512_load_si512(o.sums[b][r]));
      const __m512 t = _mm512_mul_ps(_mm512_set1_ps(o.block_scales[r][b]), isum);
      sum[r] = _mm512_fmadd_ps(scale, t, sum[r]);
      bias[r] = _mm512_fmadd_ps(group_bias, _mm512_set1_ps(o.xsums[r][b]), bias[r]);
    }
  }
}

// Seconds per block (of 32 inputs and 16 output rows), printed with an SI prefix (7.5n: 7.5 ns).
void report_per_block(benchmark::State& state, int64_t blocks_per_iteration) {
  state.counters["time_per_block"] =
      benchmark::Counter(static_cast<double>(state.iterations() * blocks_per_iteration),
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

// Four independent 16 x 16 x 64 products: the tile unit's peak rate of multiply-adds.
AMX_TARGET void BM_PeakTileMacs(benchmark::State& state) {
  if (!amx_usable()) return state.SkipWithError("AMX is not usable here");
  Operands& o = operands();
  configure(16, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, o.activations, 8 * 64);
  _tile_loadd(5, o.activations, 8 * 64);
  _tile_loadd(6, o.codes[0], 64);
  _tile_loadd(7, o.codes[1], 64);
  for (auto _ : state) {
    for (int i = 0; i < 64; ++i) {
      _tile_dpbsud(0, 4, 6);
      _tile_dpbsud(1, 4, 7);
      _tile_dpbsud(2, 5, 6);
      _tile_dpbsud(3, 5, 7);
    }
  }
  _tile_stored(0, o.sums[0], 64);
  benchmark::DoNotOptimize(o.sums[0][0][0]);
  state.counters["MACs"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * 64 * 4 * 16 * 16 * 64, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_PeakTileMacs)->UseRealTime();

// A tile store of `rows` rows of 64 bytes into L1, four tiles in turn.
AMX_TARGET void BM_TileStore(benchmark::State& state) {
  if (!amx_usable()) return state.SkipWithError("AMX is not usable here");
  Operands& o = operands();
  configure(static_cast<int>(state.range(0)), 32);
  for (auto _ : state) {
    _tile_stored(0, o.sums[0], 64);
    _tile_stored(1, o.sums[1], 64);
    _tile_stored(2, o.sums[2], 64);
    _tile_stored(3, o.sums[3], 64);
    benchmark::ClobberMemory();
  }
  report_per_block(state, 4);
}
BENCHMARK(BM_TileStore)->ArgName("rows")->Arg(2)->Arg(8)->Arg(16)->UseRealTime();

// A tile load of `rows` activation rows of 32 bytes from L1.
AMX_TARGET void BM_TileLoad(benchmark::State& state) {
  if (!amx_usable()) return state.SkipWithError("AMX is not usable here");
  Operands& o = operands();
  configure(static_cast<int>(state.range(0)), 32);
  for (auto _ : state) {
    for (int b = 0; b < 8; b += 2) {
      _tile_loadd(4, &o.activations[0][32 * b], 8 * 64);
      _tile_loadd(5, &o.activations[0][32 * (b + 1)], 8 * 64);
    }
  }
  report_per_block(state, 8);
}
BENCHMARK(BM_TileLoad)->ArgName("rows")->Arg(2)->Arg(8)->Arg(16)->UseRealTime();

// A block's sums for `rows` activation rows and 16 output rows: the whole tile part of a block.
AMX_TARGET void BM_BlockProduct(benchmark::State& state) {
  if (!amx_usable()) return state.SkipWithError("AMX is not usable here");
  Operands& o = operands();
  configure(static_cast<int>(state.range(0)), 32);
  for (auto _ : state) {
    eight_block_products(o);
    benchmark::ClobberMemory();
  }
  report_per_block(state, 8);
}
BENCHMARK(BM_BlockProduct)->ArgName("rows")->Arg(2)->Arg(8)->Arg(16)->UseRealTime();

// Two blocks in one product (64 inputs, the activations of each row given once per block with the
// other block's half zero): the sums tile holds 2 x rows rows, so each store serves two blocks.
AMX_TARGET void BM_PairedBlockProduct(benchmark::State& state) {
  if (!amx_usable()) return state.SkipWithError("AMX is not usable here");
  Operands& o = operands();
  const int64_t rows = state.range(0);
  configure(static_cast<int>(2 * rows), 64);
  for (auto _ : state) {
    for (int q = 0; q < 4; q += 2) {
      BLOCK_PRODUCT(0, 4, 6, &o.activations[0][64 * q], 64, o.codes[2 * q], o.sums[2 * q]);
      BLOCK_PRODUCT(1, 5, 7, &o.activations[0][64 * (q + 1)], 64, o.codes[2 * q + 2],
                    o.sums[2 * q + 2]);
    }
    benchmark::ClobberMemory();
  }
  report_per_block(state, 8);
}
BENCHMARK(BM_PairedBlockProduct)->ArgName("rows")->Arg(2)->Arg(4)->Arg(8)->UseRealTime();

// The float sequence alone, reading sums from L1.
AMX_TARGET void BM_CombineOnly(benchmark::State& state) {
  if (!amx_usable()) return state.SkipWithError("AMX is not usable here");
  Operands& o = operands();
  __m512 sum[16], bias[16];
  for (int r = 0; r < 16; ++r) sum[r] = bias[r] = _mm512_setzero_ps();
  for (auto _ : state) {
    combine_eight_blocks(o, state.range(0), sum, bias);
    benchmark::ClobberMemory();
  }
  for (int r = 0; r < 16; ++r) benchmark::DoNotOptimize(sum[r] = _mm512_add_ps(sum[r], bias[r]));
  report_per_block(state, 8);
}
BENCHMARK(BM_CombineOnly)->ArgName("rows")->Arg(2)->Arg(8)->Arg(16)->UseRealTime();

// Both: 8 blocks' sums from tiles, then their float sequence. On the Xeon of session 37 the time
// was the sum of the two parts: the tile loads and stores did not overlap the vector work.
AMX_TARGET void BM_ProductThenCombine(benchmark::State& state) {
  if (!amx_usable()) return state.SkipWithError("AMX is not usable here");
  Operands& o = operands();
  configure(static_cast<int>(state.range(0)), 32);
  __m512 sum[16], bias[16];
  for (int r = 0; r < 16; ++r) sum[r] = bias[r] = _mm512_setzero_ps();
  for (auto _ : state) {
    eight_block_products(o);
    // GCC's tile intrinsics are asm statements that declare no memory effects: without this
    // barrier the sums' loads below could be moved before the tile stores.
    benchmark::ClobberMemory();
    combine_eight_blocks(o, state.range(0), sum, bias);
  }
  for (int r = 0; r < 16; ++r) benchmark::DoNotOptimize(sum[r] = _mm512_add_ps(sum[r], bias[r]));
  report_per_block(state, 8);
}
BENCHMARK(BM_ProductThenCombine)->ArgName("rows")->Arg(2)->Arg(8)->Arg(16)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
