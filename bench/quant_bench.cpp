// Quantized matrix-vector products at real Nemotron-3 Nano shapes, with the weight bytes streamed
// per second beside this machine's measured read bandwidth (counters weights_GBps,
// weights_GBps_oncpu, read_bw_GBps, pct_of_read_bw), in the process's numerics (quant.h; int8
// unless DSPARK_NUMERICS=fp32).
// Each benchmark cycles through enough copies of its matrix (>= 256 MiB) that the weights come
// from memory, not from the last-level cache, as they do during decode; qmatmul_cached/... (the
// default model's shapes) multiply one copy, from the caches; code_layout/... the default model's
// 8-bit head from the caches with its codes in the tile layout and in the packed one.
//
// numerics/<shape>/<fp32|int8>/m<M>: both numerics side by side at m = 1, 8, 16 on 2 threads,
// with GMACps (weight-activation products per second) beside the GB/s. peak_int8_macs: the
// vpmaddubsw + vpmaddwd rate one core sustains (the int8 kernels' compute floor, 32 products per
// pair), as GMACps; peak_vnni_macs: the same for zmm vpdpbusd (64 products per instruction), on
// CPUs with AVX-512 VNNI. tile_loop/<part>: the AVX2 verify tile's inner loop split into its
// parts (below), against the multiplies its numerics need.
//
//   quant_bench [--benchmark_min_time=0.2s] [--benchmark_repetitions=N]
//   quant_bench --benchmark_filter='numerics|peak' --benchmark_repetitions=3
//   quant_bench --benchmark_filter='tile_loop|peak' --benchmark_repetitions=5
//   quant_bench --benchmark_filter='qmatmul_cached' --benchmark_repetitions=5
//   quant_bench --benchmark_filter=code_layout --benchmark_repetitions=10
//       --benchmark_enable_random_interleaving=true
#include <benchmark/benchmark.h>
#include <immintrin.h>
#include <time.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "base/system_info.h"
#include "base/thread_pool.h"
#include "kernels/bandwidth.h"
#include "kernels/quant.h"
#include "tensor/dtype.h"

namespace {

using dspark::kernels::QuantMatrix;

constexpr int64_t kMinWorkingSetBytes = int64_t{256} << 20;

uint64_t next_random(uint64_t& state) {
  state ^= state << 13;
  state ^= state >> 7;
  state ^= state << 17;
  return state;
}

// Random packed codes with bf16 scales and biases of realistic size, and the tile layouts the
// model loader adds (weights.cpp: tile values wherever the int8 products read them, tile codes for
// a matrix of one expert where the products read them), so that the products run the kernels' paths
// a model's do; `with_tile_codes` false leaves the codes in the packed layout alone.
struct QuantStorage {
  std::vector<uint8_t> packed, scales, biases, tile_values, tile_codes;
  QuantMatrix w;

  QuantStorage(int bits, int64_t experts, int64_t rows, int64_t cols, uint64_t seed, int group = 64,
               bool with_tile_codes = true) {
    w.format = {bits, group};
    w.scale_dtype = dspark::DType::BF16;
    w.experts = experts;
    w.rows = rows;
    w.cols = cols;
    packed.resize(experts * rows * cols * bits / 8);
    scales.resize(experts * rows * (cols / group) * 2);
    biases.resize(scales.size());
    uint64_t state = seed | 1;
    for (size_t k = 0; k + 8 <= packed.size(); k += 8) {
      const uint64_t word = next_random(state);
      std::memcpy(packed.data() + k, &word, 8);
    }
    for (size_t k = 0; k < scales.size(); k += 2) {
      const auto unit = static_cast<float>(next_random(state) % 1000) / 1000.0f;
      const uint16_t scale = dspark::f32_to_bf16(0.001f + 0.01f * unit);
      const uint16_t bias = dspark::f32_to_bf16(-0.05f * unit);
      std::memcpy(scales.data() + k, &scale, 2);
      std::memcpy(biases.data() + k, &bias, 2);
    }
    w.packed = packed.data();
    w.scales = scales.data();
    w.biases = biases.data();
    if (!dspark::kernels::products_read_tile_values()) return;
    tile_values.resize(static_cast<size_t>(dspark::kernels::tile_values_bytes(w)));
    dspark::kernels::pack_tile_values(w, tile_values.data());
    w.tile_values = tile_values.data();
    if (!with_tile_codes || experts > 1 ||
        !dspark::kernels::products_read_tile_codes(w.format.bits)) {
      return;
    }
    tile_codes.resize(static_cast<size_t>(dspark::kernels::tile_codes_bytes(w)));
    dspark::kernels::pack_tile_codes(w, tile_codes.data());
    w.tile_codes = tile_codes.data();
  }
};

double read_bandwidth_gbs(int threads) {
  static std::map<int, double> measured;
  auto found = measured.find(threads);
  if (found == measured.end()) {
    found = measured.emplace(threads, dspark::kernels::measure_read_bandwidth_gbs(threads)).first;
  }
  return found->second;
}

void use_threads(int threads) {
  if (dspark::default_pool().num_threads() != threads) dspark::set_default_threads(threads);
}

double thread_cpu_seconds() {
  timespec now;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec);
}

// Wall and CPU time of a whole timing loop (the products are multithreaded).
struct LoopTimer {
  double wall = dspark::now_seconds();
  double cpu = thread_cpu_seconds();
};

// weights_GBps: weight bytes per wall second. weights_GBps_oncpu: per second of the calling
// thread's CPU time, which excludes the time it was preempted: on a shared, oversubscribed machine
// it is the figure to compare between runs (with 1 thread it is the kernel's own speed; with more,
// the caller also spins while it waits for the other threads).
void report(benchmark::State& state, double bytes_per_iteration, int threads,
            const LoopTimer& timer) {
  const double bytes = bytes_per_iteration * static_cast<double>(state.iterations());
  const double gbps = bytes / (dspark::now_seconds() - timer.wall) / 1e9;
  state.counters["weights_GBps"] = gbps;
  state.counters["weights_GBps_oncpu"] = bytes / (thread_cpu_seconds() - timer.cpu) / 1e9;
  state.counters["read_bw_GBps"] = read_bandwidth_gbs(threads);
  state.counters["pct_of_read_bw"] = 100.0 * gbps / read_bandwidth_gbs(threads);
}

// from_caches: one copy of the matrix, so that after the first call its weights come from the
// caches and the time is the kernel's arithmetic (qmatmul_cached/...).
void qmatmul_bench(benchmark::State& state, int bits, int64_t rows, int64_t cols, int64_t m,
                   int threads, int group, dspark::kernels::Numerics numerics, bool from_caches,
                   bool with_tile_codes) {
  use_threads(threads);
  read_bandwidth_gbs(threads);
  const QuantStorage first(bits, 1, rows, cols, 1, group, with_tile_codes);
  const int64_t bytes = first.w.bytes_per_expert();
  const int64_t copies =
      from_caches ? 1 : std::max<int64_t>(1, (kMinWorkingSetBytes + bytes - 1) / bytes);
  std::vector<std::unique_ptr<QuantStorage>> matrices;
  for (int64_t c = 0; c < copies; ++c) {
    matrices.push_back(
        std::make_unique<QuantStorage>(bits, 1, rows, cols, 100 + c, group, with_tile_codes));
  }
  std::vector<float> x(m * cols), y(m * rows);
  uint64_t random = 99;
  for (float& value : x) value = static_cast<float>(next_random(random) % 2001) / 1000.0f - 1.0f;
  int64_t next = 0;
  const dspark::kernels::Isa isa = dspark::kernels::best_isa();
  const LoopTimer timer;
  for (auto _ : state) {
    dspark::kernels::qmatmul_numerics(numerics, isa, x.data(), m, matrices[next]->w, y.data());
    benchmark::DoNotOptimize(y.data());
    next = (next + 1) % copies;
  }
  const double cpu_seconds = thread_cpu_seconds() - timer.cpu;
  const double wall_seconds = dspark::now_seconds() - timer.wall;
  report(state, static_cast<double>(bytes), threads, timer);
  state.counters["GMACps"] = static_cast<double>(rows * cols * m) *
                             static_cast<double>(state.iterations()) / wall_seconds / 1e9;
  state.counters["us_per_row_oncpu"] =
      1e6 * cpu_seconds / static_cast<double>(state.iterations()) / static_cast<double>(m);
}

// One decoded token through a MoE expert stack: 6 of 128 experts, one activation row each.
void gather_bench(benchmark::State& state, int bits, int64_t rows, int64_t cols, int threads) {
  use_threads(threads);
  read_bandwidth_gbs(threads);
  constexpr int64_t kExperts = 128, kActive = 6;
  const QuantStorage stack(bits, kExperts, rows, cols, 7);
  std::vector<float> x(kActive * cols, 0.5f), y(kActive * rows);
  std::vector<int32_t> ids(kActive);
  uint64_t random = 12345;
  const LoopTimer timer;
  for (auto _ : state) {
    // Distinct experts, changing every token (as routing does).
    for (int64_t k = 0; k < kActive; ++k) {
      bool fresh = false;
      while (!fresh) {
        ids[k] = static_cast<int32_t>(next_random(random) % kExperts);
        fresh = true;
        for (int64_t j = 0; j < k; ++j) fresh &= ids[j] != ids[k];
      }
    }
    dspark::kernels::gather_qmatmul(x.data(), kActive, ids.data(), stack.w, y.data());
    benchmark::DoNotOptimize(y.data());
  }
  report(state, static_cast<double>(stack.w.bytes_per_expert() * kActive), threads, timer);
}

struct Shape {
  const char* name;
  int64_t rows;
  int64_t cols;
};

// The default model's (SmolLM2-135M) matrices: 4-bit group-32 layers, 8-bit group-32 tied head,
// at speculative verify widths, one thread (weights_GBps_oncpu is the kernel's own speed); and
// qmatmul_cached/...: the same from the caches (the head from L3 where it fits), the kernels'
// arithmetic alone.
void register_default_model_benchmarks() {
  struct DefaultShape {
    const char* name;
    int bits;
    int64_t rows;
    int64_t cols;
  };
  const DefaultShape shapes[] = {{"smollm2_gate_576x1536", 4, 1536, 576},
                                 {"smollm2_down_1536x576", 4, 576, 1536},
                                 {"smollm2_lm_head_576x49152", 8, 49152, 576}};
  for (const DefaultShape& shape : shapes) {
    for (int64_t m : {1, 2, 4, 8, 16}) {
      const std::string name = std::string("qmatmul/") + shape.name + "/b" +
                               std::to_string(shape.bits) + "_g32/m" + std::to_string(m) +
                               "/threads:1";
      benchmark::RegisterBenchmark(name.c_str(), qmatmul_bench, shape.bits, shape.rows, shape.cols,
                                   m, 1, 32, dspark::kernels::numerics(), false, true)
          ->UseRealTime()
          ->Unit(benchmark::kMicrosecond);
    }
    for (int64_t m : {1, 2, 3, 4, 8, 16}) {
      const std::string name = std::string("qmatmul_cached/") + shape.name + "/b" +
                               std::to_string(shape.bits) + "_g32/m" + std::to_string(m) +
                               "/threads:1";
      benchmark::RegisterBenchmark(name.c_str(), qmatmul_bench, shape.bits, shape.rows, shape.cols,
                                   m, 1, 32, dspark::kernels::numerics(), true, true)
          ->UseRealTime()
          ->Unit(benchmark::kMicrosecond);
    }
  }
  // The 8-bit head from the caches with its codes in the tile layout (where this CPU's products
  // read it) against the packed layout, side by side: run with
  // --benchmark_enable_random_interleaving=true so that a drifting machine favours neither.
  for (int64_t m : {1, 2, 3, 4, 8, 16}) {
    for (bool tiled : {true, false}) {
      const std::string name = std::string("code_layout/smollm2_lm_head_576x49152/b8_g32/") +
                               (tiled ? "tile" : "packed") + "/m" + std::to_string(m) +
                               "/threads:1";
      benchmark::RegisterBenchmark(name.c_str(), qmatmul_bench, 8, 49152, 576, m, 1, 32,
                                   dspark::kernels::numerics(), true, tiled)
          ->UseRealTime()
          ->Unit(benchmark::kMicrosecond);
    }
  }
}

// The fp32 and int8 numerics side by side on 2 threads (and on 1, where weights_GBps_oncpu is the
// kernel's own speed on a busy machine): a small matrix whose weights fit in L2
// (SmolLM2's gate projection shape) and a 4096 x 4096 one, 4-bit group 64, at m = 1, 8, 16.
void register_numerics_benchmarks() {
  const Shape shapes[] = {{"576x1536", 1536, 576}, {"4096x4096", 4096, 4096}};
  for (const Shape& shape : shapes) {
    for (int threads : {2, 1}) {
      for (int64_t m : {1, 8, 16}) {
        for (auto numerics : {dspark::kernels::Numerics::fp32, dspark::kernels::Numerics::int8}) {
          const std::string name = std::string("numerics/") + shape.name + "/b4_g64/" +
                                   dspark::kernels::numerics_name(numerics) + "/m" +
                                   std::to_string(m) + "/threads:" + std::to_string(threads);
          benchmark::RegisterBenchmark(name.c_str(), qmatmul_bench, 4, shape.rows, shape.cols, m,
                                       threads, 64, numerics, false, true)
              ->UseRealTime()
              ->Unit(benchmark::kMicrosecond);
        }
      }
    }
  }
}

// 12 independent chains of vpmaddubsw + vpmaddwd + vpaddd, 32 products per chain step: the
// int8 kernels' multiply rate on one core with nothing else in the way.
__attribute__((target("avx2"))) void peak_int8_macs(benchmark::State& state) {
  constexpr int kChains = 12;
  constexpr int64_t kSteps = 4096;
  __m256i acc[kChains];
  __m256i codes[kChains];
  for (int c = 0; c < kChains; ++c) {
    acc[c] = _mm256_setzero_si256();
    codes[c] = _mm256_set1_epi8(static_cast<char>(c + 1));
  }
  const __m256i x = _mm256_set1_epi8(3), ones = _mm256_set1_epi16(1);
  const double start = dspark::now_seconds();
  for (auto _ : state) {
    for (int64_t step = 0; step < kSteps; ++step) {
#pragma GCC unroll 12
      for (int c = 0; c < kChains; ++c) {
        acc[c] =
            _mm256_add_epi32(acc[c], _mm256_madd_epi16(_mm256_maddubs_epi16(codes[c], x), ones));
      }
    }
    for (int c = 0; c < kChains; ++c) benchmark::DoNotOptimize(acc[c]);
  }
  const double seconds = dspark::now_seconds() - start;
  state.counters["GMACps"] =
      32.0 * kChains * kSteps * static_cast<double>(state.iterations()) / seconds / 1e9;
}

// The AVX2 verify tile's inner loop (kernels/cpu/int8_tiles_256.h, 4-bit codes, group 32) on data
// in L1, one core, in three forms, each per "block-row" (8 output rows x 32 inputs x one activation
// row, 256 products), so that the time it takes can be split between its parts:
//   full: the kernel's work: the activation dwords broadcast to the 8 lanes (vpshufd of a 16-byte
//     broadcast), 8 vpmaddubsw and a vpaddw tree, vpmaddwd to dwords, then the canonical float
//     sequence (convert, times the block scale, fma with the group scale, fma of the group bias
//     with the activation sum);
//   integer: the same without the float sequence;
//   multiplies: only the 12 multiply-pipe instructions the numerics need per block-row (8
//     vpmaddubsw, 1 vpmaddwd, 1 vmulps, 2 vfmadd), as independent chains: the loop's floor on a
//     core whose integer multiplies share its two FMA pipes (Zen 3).
// Counter ns_block_row; GMACps = 256 products per block-row.
enum class TileLoopPart { full, integer, multiplies };

template <TileLoopPart Part>
__attribute__((target("avx2,fma"))) void tile_loop(benchmark::State& state) {
  constexpr int kBlocks = 8, kSteps = 8, kRows = 4;
  alignas(32) static uint8_t codes[kBlocks][kSteps][32];
  alignas(32) static int8_t x8[kRows][kBlocks * 32];
  alignas(32) static float block_scale[kRows][kBlocks], xsum[kRows][kBlocks];
  alignas(32) static float scales[kBlocks][8], biases[kBlocks][8];
  std::memset(codes, 3, sizeof codes);
  std::memset(x8, 5, sizeof x8);
  std::fill_n(&block_scale[0][0], kRows * kBlocks, 1e-3f);
  std::fill_n(&xsum[0][0], kRows * kBlocks, 1e-3f);
  std::fill_n(&scales[0][0], kBlocks * 8, 1e-3f);
  std::fill_n(&biases[0][0], kBlocks * 8, 1e-3f);
  __m256 sum[kRows], bias[kRows];
  __m256i isum[kRows];
  for (int r = 0; r < kRows; ++r) {
    sum[r] = bias[r] = _mm256_setzero_ps();
    isum[r] = _mm256_setzero_si256();
  }
  const __m256i ones = _mm256_set1_epi16(1);
  int64_t block_rows = 0;
  const double start = dspark::now_seconds();
  for (auto _ : state) {
    for (int rep = 0; rep < 256; ++rep) {
      for (int b = 0; b < kBlocks; ++b) {
        __m256i steps[kSteps];
        for (int s = 0; s < kSteps; ++s) {
          steps[s] = _mm256_load_si256(reinterpret_cast<const __m256i*>(codes[b][s]));
        }
        const __m256 scale = _mm256_load_ps(scales[b]), group_bias = _mm256_load_ps(biases[b]);
#pragma GCC unroll 4
        for (int r = 0; r < kRows; ++r) {
          const int8_t* x = x8[r] + b * 32;
          __m256i p[kSteps];
          if constexpr (Part == TileLoopPart::multiplies) {
            const __m256i xs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
#pragma GCC unroll 8
            for (int s = 0; s < kSteps; ++s) {
              p[s] = _mm256_maddubs_epi16(steps[s], xs);
              asm volatile("" : "+x"(p[s]));  // kept, without a store
            }
            isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(p[r], ones));
            const __m256 t = _mm256_mul_ps(_mm256_set1_ps(block_scale[r][b]), scale);
            sum[r] = _mm256_fmadd_ps(scale, t, sum[r]);
            bias[r] = _mm256_fmadd_ps(group_bias, t, bias[r]);
            continue;
          }
          const __m256i low =
              _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x)));
          const __m256i high = _mm256_broadcastsi128_si256(
              _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + 16)));
          p[0] = _mm256_maddubs_epi16(steps[0], _mm256_shuffle_epi32(low, 0x00));
          p[1] = _mm256_maddubs_epi16(steps[1], _mm256_shuffle_epi32(low, 0x55));
          p[2] = _mm256_maddubs_epi16(steps[2], _mm256_shuffle_epi32(low, 0xaa));
          p[3] = _mm256_maddubs_epi16(steps[3], _mm256_shuffle_epi32(low, 0xff));
          p[4] = _mm256_maddubs_epi16(steps[4], _mm256_shuffle_epi32(high, 0x00));
          p[5] = _mm256_maddubs_epi16(steps[5], _mm256_shuffle_epi32(high, 0x55));
          p[6] = _mm256_maddubs_epi16(steps[6], _mm256_shuffle_epi32(high, 0xaa));
          p[7] = _mm256_maddubs_epi16(steps[7], _mm256_shuffle_epi32(high, 0xff));
          const __m256i words = _mm256_add_epi16(
              _mm256_add_epi16(_mm256_add_epi16(p[0], p[1]), _mm256_add_epi16(p[2], p[3])),
              _mm256_add_epi16(_mm256_add_epi16(p[4], p[5]), _mm256_add_epi16(p[6], p[7])));
          const __m256i dwords = _mm256_madd_epi16(words, ones);
          if constexpr (Part == TileLoopPart::integer) {
            isum[r] = _mm256_add_epi32(isum[r], dwords);
          } else {
            const __m256 t =
                _mm256_mul_ps(_mm256_set1_ps(block_scale[r][b]), _mm256_cvtepi32_ps(dwords));
            sum[r] = _mm256_fmadd_ps(scale, t, sum[r]);
            bias[r] = _mm256_fmadd_ps(group_bias, _mm256_set1_ps(xsum[r][b]), bias[r]);
          }
        }
      }
      block_rows += kBlocks * kRows;
    }
  }
  const double seconds = dspark::now_seconds() - start;
  for (int r = 0; r < kRows; ++r) {
    benchmark::DoNotOptimize(sum[r]);
    benchmark::DoNotOptimize(bias[r]);
    benchmark::DoNotOptimize(isum[r]);
  }
  state.counters["ns_block_row"] = seconds / static_cast<double>(block_rows) * 1e9;
  state.counters["GMACps"] = 256.0 * static_cast<double>(block_rows) / seconds / 1e9;
}

// Independent chains of zmm vpdpbusd, 64 products per step: the AVX-512 VNNI kernel's multiply
// rate on one core. 16 chains: an Emerald Rapids Xeon issues two a cycle, and 12 chains, too few
// to cover the latency, ran at 0.74-0.79x the rate of 16 there (3 paired runs, session 36).
__attribute__((target("avx512f,avx512vnni"))) void peak_vnni_macs(benchmark::State& state) {
  constexpr int kChains = 16, kCodes = 4;
  constexpr int64_t kSteps = 4096;
  __m512i acc[kChains];
  __m512i codes[kCodes];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_setzero_si512();
  for (int c = 0; c < kCodes; ++c) codes[c] = _mm512_set1_epi8(static_cast<char>(c + 1));
  const __m512i x = _mm512_set1_epi8(3);
  const double start = dspark::now_seconds();
  for (auto _ : state) {
    for (int64_t step = 0; step < kSteps; ++step) {
#pragma GCC unroll 16
      for (int c = 0; c < kChains; ++c) {
        acc[c] = _mm512_dpbusd_epi32(acc[c], codes[c % kCodes], x);
      }
    }
    for (int c = 0; c < kChains; ++c) benchmark::DoNotOptimize(acc[c]);
  }
  const double seconds = dspark::now_seconds() - start;
  state.counters["GMACps"] =
      64.0 * kChains * kSteps * static_cast<double>(state.iterations()) / seconds / 1e9;
}

void register_benchmarks() {
  register_numerics_benchmarks();
  if (dspark::cpu_features().avx2) {
    benchmark::RegisterBenchmark("peak_int8_macs/threads:1", peak_int8_macs)
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark("tile_loop/full/threads:1", tile_loop<TileLoopPart::full>)
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark("tile_loop/integer/threads:1", tile_loop<TileLoopPart::integer>)
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark("tile_loop/multiplies/threads:1",
                                 tile_loop<TileLoopPart::multiplies>)
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
  }
  if (dspark::cpu_features().avx512vnni) {
    benchmark::RegisterBenchmark("peak_vnni_macs/threads:1", peak_vnni_macs)
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
  }
  register_default_model_benchmarks();
  const Shape shapes[] = {{"in_proj_2688x10304", 10304, 2688},
                          {"out_proj_4096x2688", 2688, 4096},
                          {"expert_up_2688x1856", 1856, 2688},
                          {"expert_down_1856x2688", 2688, 1856},
                          {"lm_head_2688x131072", 131072, 2688}};
  for (int threads : {1, 2}) {
    for (int bits : {4, 6, 8}) {
      for (const Shape& shape : shapes) {
        const std::string name = std::string("qmatmul/") + shape.name + "/b" +
                                 std::to_string(bits) + "/m1/threads:" + std::to_string(threads);
        benchmark::RegisterBenchmark(name.c_str(), qmatmul_bench, bits, shape.rows, shape.cols,
                                     int64_t{1}, threads, 64, dspark::kernels::numerics(), false,
                                     true)
            ->UseRealTime()
            ->Unit(benchmark::kMicrosecond);
      }
      const std::string gather = "gather_qmatmul/experts_6_of_128_2688x1856/b" +
                                 std::to_string(bits) + "/threads:" + std::to_string(threads);
      benchmark::RegisterBenchmark(gather.c_str(), gather_bench, bits, int64_t{1856}, int64_t{2688},
                                   threads)
          ->UseRealTime()
          ->Unit(benchmark::kMicrosecond);
    }
    // Speculative verify widths on the in_proj shape.
    for (int bits : {4, 6, 8}) {
      for (int64_t m = 2; m <= 9; ++m) {
        const std::string name = "qmatmul/in_proj_2688x10304/b" + std::to_string(bits) + "/m" +
                                 std::to_string(m) + "/threads:" + std::to_string(threads);
        benchmark::RegisterBenchmark(name.c_str(), qmatmul_bench, bits, int64_t{10304},
                                     int64_t{2688}, m, threads, 64, dspark::kernels::numerics(),
                                     false, true)
            ->UseRealTime()
            ->Unit(benchmark::kMicrosecond);
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  register_benchmarks();
  benchmark::AddCustomContext("isa", dspark::kernels::isa_name(dspark::kernels::best_isa()));
  benchmark::AddCustomContext("numerics",
                              dspark::kernels::numerics_name(dspark::kernels::numerics()));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
