#pragma once
// Row-tile kernels shared by the SIMD ISAs. They implement the canonical order of quant_impl.h
// against a 16-lane vector type V that each ISA's translation unit defines in an anonymous
// namespace, so every instantiation is local to that unit and compiled with its flags.
//
// A tile is R output rows x MB activation rows: the R rows' packed weights are unpacked once per
// chunk and each unpacked vector is multiplied into MB accumulators, so the cost of a verify batch
// grows slower than m. Tiling never changes the order of operations of any single output.
//
// V provides:
//   using F;                                        16 fp32 lanes
//   kMaxActivationRows; kRowsPerTile<MB>: quantized tiles, activation blocks of MB = 1 ..
//   kMaxActivationRows rows, R = kRowsPerTile<MB> output rows
//   kAccumulatorsInRegisters: whether a quantized tile keeps its accumulators in registers
//   kDenseMaxActivationRows; kDenseRowsPerTile<MB>: the same for dense tiles (MB = 1, 2, or 4
//   standing for 3 and more)
//   F zero(); F load(const float*); F load_partial(const float*, int count);
//   F broadcast(float); F fma(F a, F b, F c);       a*b + c lane-wise, one rounding
//   F add(F, F); void store(float*, F);
//   float reduce(F);                                tree16
//   template <int Bits> void decode(const uint8_t* bytes, F* q);
//       unpacks one chunk (kChunkElements<Bits> elements) into q[0..chunk/16) in slot order
//   template <DType D> F load_dense(const uint8_t*); F load_dense_partial(const uint8_t*, int);
#include <cstdint>

#include "kernels/cpu/quant_impl.h"

namespace dspark::kernels::cpu::tiles {

template <int Bits>
constexpr int kChunkElements = Bits == 4 || Bits == 6 ? 32 : 16;

// Groups whose scales and biases are converted to fp32 at a time (a multiple of 16).
constexpr int kGroupBlock = 64;

// Packed weights are prefetched this many tiles ahead, into L2 (__builtin_prefetch locality 1):
// measured best on the development machine (1 and 4 tiles, L1 and non-temporal hints were slower).
constexpr int kPrefetchTilesAhead = 2;
constexpr int kPrefetchLocality = 1;

// Scales or biases [first, first + count) of one row (count <= kGroupBlock) as fp32, zero-padded to
// a multiple of 16.
template <class V>
void load_group_values(const uint8_t* base, DType dtype, int64_t first, int count, float* out) {
  for (int j = 0; j < count; j += 16) {
    const int n = count - j < 16 ? count - j : 16;
    typename V::F values;
    switch (dtype) {
      case DType::F32:
        values = V::template load_dense_partial<DType::F32>(base + 4 * (first + j), n);
        break;
      case DType::F16:
        values = V::template load_dense_partial<DType::F16>(base + 2 * (first + j), n);
        break;
      default:
        values = V::template load_dense_partial<DType::BF16>(base + 2 * (first + j), n);
        break;
    }
    V::store(out + j, values);
  }
}

// The scaled accumulators of a tile's R x MB pairs. With 32 vector registers they stay in
// registers beside the per-group partial sums (with 32-element groups each is updated once per two
// products, and a store and reload per update would cost more than the products); with 16 they
// live in memory, which leaves the registers to the partial sums of a larger tile.
template <class V, int R, int MB, bool InRegisters>
struct Accumulators;

template <class V, int R, int MB>
struct Accumulators<V, R, MB, true> {
  typename V::F value[R][MB];
  Accumulators() {
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
      for (int i = 0; i < MB; ++i) value[r][i] = V::zero();
    }
  }
  typename V::F get(int r, int i) const {
    return value[r][i];
  }
  void set(int r, int i, typename V::F v) {
    value[r][i] = v;
  }
};

template <class V, int R, int MB>
struct Accumulators<V, R, MB, false> {
  alignas(64) float value[R][MB][16] = {};
  typename V::F get(int r, int i) const { return V::load(value[r][i]); }
  void set(int r, int i, typename V::F v) { V::store(value[r][i], v); }
};

template <class V, int Bits, int R, int MB>
void quant_tile(const QuantTask& task, int64_t row0, int64_t i0) {
  using F = typename V::F;
  constexpr int kChunk = kChunkElements<Bits>;
  constexpr int kVectors = kChunk / 16;
  const QuantMatrix& w = *task.w;
  const int64_t group = w.format.group_size;
  // Computed here rather than with QuantMatrix's inline helpers: see quant_impl.h on sharing.
  const int64_t groups = w.cols / group;
  const int64_t row_bytes = w.cols * Bits / 8;
  const uint8_t* packed[R];
  int64_t first_group[R];
  // Loops over R and MB carry `#pragma GCC unroll`: fully unrolled, the per-pair arrays become
  // registers (GCC's default unrolling limits stop short of the larger tiles).
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    const int64_t stored_row = task.expert * w.rows + row0 + r;
    packed[r] = w.packed + stored_row * row_bytes;
    first_group[r] = stored_row * groups;
  }
  const float* xslots[MB];
  const float* xsums[MB];
#pragma GCC unroll 16
  for (int i = 0; i < MB; ++i) {
    xslots[i] = task.xslots[i0 + i];
    xsums[i] = task.xsums[i0 + i];
  }
  Accumulators<V, R, MB, V::kAccumulatorsInRegisters> acc;
  alignas(64) float bias_lanes[R][MB][16] = {};
  if constexpr (V::kAccumulatorsInRegisters) {
    // Keeps the bias lanes in memory: otherwise the compiler promotes them to registers and
    // spills partial sums from the hot loop instead.
    asm("" : : "r"(&bias_lanes[0][0][0]) : "memory");
  }
  const uint8_t* next_tile = packed[0] + kPrefetchTilesAhead * R * row_bytes;
  alignas(64) float scales[R][kGroupBlock];
  alignas(64) float biases[R][kGroupBlock];
  for (int64_t block = 0; block < groups; block += kGroupBlock) {
    const int count = static_cast<int>(groups - block < kGroupBlock ? groups - block : kGroupBlock);
    for (int r = 0; r < R; ++r) {
      load_group_values<V>(w.scales, w.scale_dtype, first_group[r] + block, count, scales[r]);
      load_group_values<V>(w.biases, w.scale_dtype, first_group[r] + block, count, biases[r]);
    }
    for (int j = 0; j < count; j += 16) {
      for (int i = 0; i < MB; ++i) {
        const F sums = V::load(xsums[i] + block + j);
        for (int r = 0; r < R; ++r) {
          V::store(bias_lanes[r][i],
                   V::fma(V::load(biases[r] + j), sums, V::load(bias_lanes[r][i])));
        }
      }
    }
    for (int gb = 0; gb < count; ++gb) {
      const int64_t g = block + gb;
      F partial[R][MB];
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
        for (int i = 0; i < MB; ++i) partial[r][i] = V::zero();
      }
      for (int64_t first = g * group; first < (g + 1) * group; first += kChunk) {
        // Later tiles' rows follow this tile's in memory: fetch them in step with this tile's
        // progress, so their lines arrive in time however the hardware prefetcher treats R
        // interleaved short streams.
        const uint8_t* ahead = next_tile + first * Bits / 8 * R;
        for (int line = 0; line < R * kChunk * Bits / 8; line += 64) {
          __builtin_prefetch(ahead + line, 0, kPrefetchLocality);
        }
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
          F q[kVectors];
          V::template decode<Bits>(packed[r] + first * Bits / 8, q);
#pragma GCC unroll 16
          for (int v = 0; v < kVectors; ++v) {
#pragma GCC unroll 16
            for (int i = 0; i < MB; ++i) {
              partial[r][i] = V::fma(V::load(xslots[i] + first + 16 * v), q[v], partial[r][i]);
            }
          }
        }
      }
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        const F scale = V::broadcast(scales[r][gb]);
#pragma GCC unroll 16
        for (int i = 0; i < MB; ++i) acc.set(r, i, V::fma(scale, partial[r][i], acc.get(r, i)));
      }
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
    for (int i = 0; i < MB; ++i) {
      task.y[i0 + i][row0 + r] = V::reduce(V::add(acc.get(r, i), V::load(bias_lanes[r][i])));
    }
  }
}

// One tile of R output rows against every activation row, in blocks of up to kMaxActivationRows:
// the tile's weights stay in L1 between blocks.
template <class V, int Bits, int R, int MB = 1>
void quant_tile_block(const QuantTask& task, int64_t row0, int64_t i0, int rows) {
  if constexpr (MB < V::kMaxActivationRows) {
    if (rows != MB) return quant_tile_block<V, Bits, R, MB + 1>(task, row0, i0, rows);
  }
  quant_tile<V, Bits, R, MB>(task, row0, i0);
}

template <class V, int Bits, int R>
void quant_tile_rows(const QuantTask& task, int64_t row0) {
  constexpr int kMaxRows = V::kMaxActivationRows;
  for (int64_t i0 = 0; i0 < task.m; i0 += kMaxRows) {
    const int rows = static_cast<int>(task.m - i0 < kMaxRows ? task.m - i0 : kMaxRows);
    quant_tile_block<V, Bits, R>(task, row0, i0, rows);
  }
}

// Tiles of kRowsPerTile<MB> output rows, MB the size of the first activation block, then single
// rows.
template <class V, int Bits, int MB = 1>
void quant_rows_tiled(const QuantTask& task, int64_t row_begin, int64_t row_end) {
  if constexpr (MB < V::kMaxActivationRows) {
    if (task.m > MB) return quant_rows_tiled<V, Bits, MB + 1>(task, row_begin, row_end);
  }
  constexpr int R = V::template kRowsPerTile<MB>;
  int64_t row = row_begin;
  for (; row + R <= row_end; row += R) quant_tile_rows<V, Bits, R>(task, row);
  if constexpr (R > 1) {
    for (; row < row_end; ++row) quant_tile_rows<V, Bits, 1>(task, row);
  }
}

template <class V>
void quant_rows(const QuantTask& task, int64_t row_begin, int64_t row_end) {
  switch (task.w->format.bits) {
    case 2:
      return quant_rows_tiled<V, 2>(task, row_begin, row_end);
    case 3:
      return quant_rows_tiled<V, 3>(task, row_begin, row_end);
    case 4:
      return quant_rows_tiled<V, 4>(task, row_begin, row_end);
    case 5:
      return quant_rows_tiled<V, 5>(task, row_begin, row_end);
    case 6:
      return quant_rows_tiled<V, 6>(task, row_begin, row_end);
    case 8:
      return quant_rows_tiled<V, 8>(task, row_begin, row_end);
  }
}

template <class V, DType D, int R, int MB>
void dense_tile(const DenseTask& task, int64_t row0, int64_t i0) {
  using F = typename V::F;
  const DenseMatrix& w = *task.w;
  const int64_t cols = w.cols;
  constexpr int64_t kSize = D == DType::F32 ? 4 : 2;
  const uint8_t* rows[R];
  for (int r = 0; r < R; ++r) rows[r] = w.data + (task.expert * w.rows + row0 + r) * cols * kSize;
  const float* xs[MB];
  for (int i = 0; i < MB; ++i) xs[i] = task.x[i0 + i];
  F acc[R][MB];
  for (int r = 0; r < R; ++r) {
    for (int i = 0; i < MB; ++i) acc[r][i] = V::zero();
  }
  const uint8_t* next_tile = rows[0] + kPrefetchTilesAhead * R * cols * kSize;
  int64_t k = 0;
  for (; k + 16 <= cols; k += 16) {
    // As in quant_tile: later tiles are fetched in step with this one.
    const uint8_t* ahead = next_tile + k * kSize * R;
    for (int line = 0; line < R * 16 * kSize; line += 64) {
      __builtin_prefetch(ahead + line, 0, kPrefetchLocality);
    }
    F x[MB];
    for (int i = 0; i < MB; ++i) x[i] = V::load(xs[i] + k);
    for (int r = 0; r < R; ++r) {
      const F weights = V::template load_dense<D>(rows[r] + k * kSize);
      for (int i = 0; i < MB; ++i) acc[r][i] = V::fma(x[i], weights, acc[r][i]);
    }
  }
  if (k < cols) {
    // Missing lanes load as zero, and fma(0, 0, acc) leaves acc unchanged (acc is never -0).
    const int count = static_cast<int>(cols - k);
    F x[MB];
    for (int i = 0; i < MB; ++i) x[i] = V::load_partial(xs[i] + k, count);
    for (int r = 0; r < R; ++r) {
      const F weights = V::template load_dense_partial<D>(rows[r] + k * kSize, count);
      for (int i = 0; i < MB; ++i) acc[r][i] = V::fma(x[i], weights, acc[r][i]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int i = 0; i < MB; ++i) task.y[i0 + i][row0 + r] = V::reduce(acc[r][i]);
  }
}

template <class V, DType D, int R>
void dense_tile_rows(const DenseTask& task, int64_t row0) {
  constexpr int kMaxRows = V::kDenseMaxActivationRows;
  for (int64_t i0 = 0; i0 < task.m; i0 += kMaxRows) {
    const int64_t rows = task.m - i0 < kMaxRows ? task.m - i0 : kMaxRows;
    switch (rows) {
      case 1:
        dense_tile<V, D, R, 1>(task, row0, i0);
        break;
      case 2:
        if constexpr (kMaxRows >= 2) dense_tile<V, D, R, 2>(task, row0, i0);
        break;
      case 3:
        if constexpr (kMaxRows >= 3) dense_tile<V, D, R, 3>(task, row0, i0);
        break;
      default:
        if constexpr (kMaxRows >= 4) dense_tile<V, D, R, 4>(task, row0, i0);
        break;
    }
  }
}

template <class V, DType D>
void dense_rows_typed(const DenseTask& task, int64_t row_begin, int64_t row_end) {
  int64_t row = row_begin;
  switch (task.m < V::kDenseMaxActivationRows ? task.m : V::kDenseMaxActivationRows) {
    case 1: {
      constexpr int R = V::template kDenseRowsPerTile<1>;
      for (; row + R <= row_end; row += R) dense_tile_rows<V, D, R>(task, row);
      break;
    }
    case 2: {
      constexpr int R = V::template kDenseRowsPerTile<2>;
      for (; row + R <= row_end; row += R) dense_tile_rows<V, D, R>(task, row);
      break;
    }
    default: {
      constexpr int R = V::template kDenseRowsPerTile<4>;
      for (; row + R <= row_end; row += R) dense_tile_rows<V, D, R>(task, row);
      break;
    }
  }
  for (; row < row_end; ++row) dense_tile_rows<V, D, 1>(task, row);
}

template <class V>
void dense_rows(const DenseTask& task, int64_t row_begin, int64_t row_end) {
  switch (task.w->dtype) {
    case DType::F32:
      return dense_rows_typed<V, DType::F32>(task, row_begin, row_end);
    case DType::F16:
      return dense_rows_typed<V, DType::F16>(task, row_begin, row_end);
    case DType::BF16:
      return dense_rows_typed<V, DType::BF16>(task, row_begin, row_end);
    default:
      return;  // Validated before kernels run.
  }
}

}  // namespace dspark::kernels::cpu::tiles
