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
//   kMaxActivationRows; kRowsPerTile<MB>: output rows per tile when activation blocks hold MB
//   rows (MB = 1, 2, or 4 standing for 3 and more)
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
  for (int r = 0; r < R; ++r) {
    const int64_t stored_row = task.expert * w.rows + row0 + r;
    packed[r] = w.packed + stored_row * row_bytes;
    first_group[r] = stored_row * groups;
  }
  const float* xslots[MB];
  const float* xsums[MB];
  for (int i = 0; i < MB; ++i) {
    xslots[i] = task.xslots[i0 + i];
    xsums[i] = task.xsums[i0 + i];
  }
  // The accumulators live in memory: they are touched once per group, and keeping them out of
  // registers leaves those to the per-group partial sums of all R x MB pairs.
  alignas(64) float acc[R][MB][16] = {};
  alignas(64) float bias_lanes[R][MB][16] = {};
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
      for (int r = 0; r < R; ++r) {
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
        F x[MB][kVectors];
        for (int i = 0; i < MB; ++i) {
          for (int v = 0; v < kVectors; ++v) x[i][v] = V::load(xslots[i] + first + 16 * v);
        }
        for (int r = 0; r < R; ++r) {
          F q[kVectors];
          V::template decode<Bits>(packed[r] + first * Bits / 8, q);
          for (int v = 0; v < kVectors; ++v) {
            for (int i = 0; i < MB; ++i) partial[r][i] = V::fma(x[i][v], q[v], partial[r][i]);
          }
        }
      }
      for (int r = 0; r < R; ++r) {
        const F scale = V::broadcast(scales[r][gb]);
        for (int i = 0; i < MB; ++i) {
          V::store(acc[r][i], V::fma(scale, partial[r][i], V::load(acc[r][i])));
        }
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int i = 0; i < MB; ++i) {
      task.y[i0 + i][row0 + r] = V::reduce(V::add(V::load(acc[r][i]), V::load(bias_lanes[r][i])));
    }
  }
}

template <class V, int Bits, int R>
void quant_tile_rows(const QuantTask& task, int64_t row0) {
  constexpr int kMaxRows = V::kMaxActivationRows;
  for (int64_t i0 = 0; i0 < task.m; i0 += kMaxRows) {
    const int64_t rows = task.m - i0 < kMaxRows ? task.m - i0 : kMaxRows;
    switch (rows) {
      case 1:
        quant_tile<V, Bits, R, 1>(task, row0, i0);
        break;
      case 2:
        if constexpr (kMaxRows >= 2) quant_tile<V, Bits, R, 2>(task, row0, i0);
        break;
      case 3:
        if constexpr (kMaxRows >= 3) quant_tile<V, Bits, R, 3>(task, row0, i0);
        break;
      default:
        if constexpr (kMaxRows >= 4) quant_tile<V, Bits, R, 4>(task, row0, i0);
        break;
    }
  }
}

template <class V, int Bits>
void quant_rows_bits(const QuantTask& task, int64_t row_begin, int64_t row_end) {
  int64_t row = row_begin;
  switch (task.m < V::kMaxActivationRows ? task.m : V::kMaxActivationRows) {
    case 1: {
      constexpr int R = V::template kRowsPerTile<1>;
      for (; row + R <= row_end; row += R) quant_tile_rows<V, Bits, R>(task, row);
      break;
    }
    case 2: {
      constexpr int R = V::template kRowsPerTile<2>;
      for (; row + R <= row_end; row += R) quant_tile_rows<V, Bits, R>(task, row);
      break;
    }
    default: {
      constexpr int R = V::template kRowsPerTile<4>;
      for (; row + R <= row_end; row += R) quant_tile_rows<V, Bits, R>(task, row);
      break;
    }
  }
  for (; row < row_end; ++row) quant_tile_rows<V, Bits, 1>(task, row);
}

template <class V>
void quant_rows(const QuantTask& task, int64_t row_begin, int64_t row_end) {
  switch (task.w->format.bits) {
    case 2:
      return quant_rows_bits<V, 2>(task, row_begin, row_end);
    case 3:
      return quant_rows_bits<V, 3>(task, row_begin, row_end);
    case 4:
      return quant_rows_bits<V, 4>(task, row_begin, row_end);
    case 5:
      return quant_rows_bits<V, 5>(task, row_begin, row_end);
    case 6:
      return quant_rows_bits<V, 6>(task, row_begin, row_end);
    case 8:
      return quant_rows_bits<V, 8>(task, row_begin, row_end);
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
  constexpr int kMaxRows = V::kMaxActivationRows;
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
  switch (task.m < V::kMaxActivationRows ? task.m : V::kMaxActivationRows) {
    case 1: {
      constexpr int R = V::template kRowsPerTile<1>;
      for (; row + R <= row_end; row += R) dense_tile_rows<V, D, R>(task, row);
      break;
    }
    case 2: {
      constexpr int R = V::template kRowsPerTile<2>;
      for (; row + R <= row_end; row += R) dense_tile_rows<V, D, R>(task, row);
      break;
    }
    default: {
      constexpr int R = V::template kRowsPerTile<4>;
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
