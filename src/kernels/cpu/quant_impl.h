#pragma once
// Internal to the kernels module: the per-ISA kernel tables behind quant.h and the summation order
// that every one of them follows.
//
// Canonical order. Every ISA computes exactly the following, so results are bit-identical across
// ISAs, activation-row counts m, row tilings and thread counts. Products use 16 lanes.
//   Quantized row (group size G, scale s_g, bias b_g, activation x):
//     xsum_g = x[gG] + x[gG+1] + ... + x[gG+G-1]        (left to right, from 0)
//     the group's elements are visited in slot order j = 0..G-1: slot j holds the element
//     slot_element(bits, j) of the group and belongs to lane j % 16;
//     p_g[l]  = fma(x[e], q[e], p_g[l])       over the slots of lane l in slot order, from 0
//     acc[l]  = fma(s_g, p_g[l], acc[l])      over groups in order, from 0
//     bias[l] = fma(b_g, xsum_g, bias[l])     over groups g ≡ l (mod 16) in order, from 0
//     y       = tree16(acc[l] + bias[l])
//   Dense row: acc[l] = fma(x[k], w[k], acc[l]) over k ≡ l (mod 16) in order, from 0;
//     y = tree16(acc).
//   tree16(a): r8[l] = a[l] + a[l+8]; r4[l] = r8[l] + r8[l+4]; r2[l] = r4[l] + r4[l+2];
//     result r2[0] + r2[1].
// The slot order equals the element order except for 4 and 6 bits, where each run of 32 elements
// is visited in the order SIMD code unpacks it cheaply. 4 bits (16 bytes): the 16 low nibbles, then
// the 16 high nibbles. 6 bits (24 bytes = 8 three-byte units of 4 elements): lanes 0-7 take
// element 0 of units 0-7 and lanes 8-15 element 2, then lanes 0-7 element 1 and lanes 8-15
// element 3. Activations are permuted once into slot order ("xslots") so that the kernels read
// them contiguously.
//
// Int8 numerics (quant.h). Activation row x (cols a multiple of 32) is quantized per block b of
// 32 inputs: amax_b = max_k |x[k]|, d_b = amax_b / 127 (fp32 division); if d_b = 0 every x8 is 0,
// else c = x[k] / d_b (fp32 division), c = c < 127 ? c : 127, c = c > -127 ? c : -127 (so a NaN
// becomes 127, as minps/maxps do), x8[k] = round-half-even(c). xsum_g is the sum of the quantized
// row over group g: with S_b = Σ_{k in b} x8[k] (exact int32), xsum_g = d_{b0} * float(S_{b0}),
// then xsum_g = fma(d_{bj}, float(S_{bj}), xsum_g) for j = 1..n.
// Per output (row of W, activation row), with isum_b = Σ_{k in b} q[k]·x8[k] exact in int32 (any
// order; |isum_b| <= 32·255·127 < 2^24, so float(isum_b) is exact):
//     acc = 0, bias = 0
//     for each group g in order:
//       t = d_{b0} * float(isum_{b0})                 b0..bn the blocks of g, in order
//       t = fma(d_{bj}, float(isum_{bj}), t)          for j = 1..n
//       acc  = fma(s_g, t, acc)
//       bias = fma(b_g, xsum_g, bias)
//     y = acc + bias
// SIMD kernels run this sequence in one vector lane per output row, so the order never depends
// on m, tiling, threads or ISA. Each table quantizes activations into the element order its own
// int8 kernel reads (the integer sums do not depend on it); its block scales are the same.
//
// The ISA translation units are compiled with AVX flags; anything they share with portable code
// must not be an inline function or template instantiated there (the linker could keep the AVX
// copy), so this header holds only declarations and `static` helpers.
#include <cstdint>

#include "kernels/quant.h"

namespace dspark::kernels::cpu {

// The element of a group that occupies slot j (0 <= j < group size).
static inline int64_t slot_element(int bits, int64_t j) {
  const int64_t run = j / 32 * 32, vector = j % 32 / 16, lane = j % 16;
  if (bits == 4) return run + 2 * lane + vector;
  if (bits == 6) return run + 4 * (lane % 8) + 2 * (lane / 8) + vector;
  return j;
}

// Whether slot order differs from element order for this bit width.
static inline bool slots_permuted(int bits) {
  return bits == 4 || bits == 6;
}

// m activation rows multiplied by rows [begin, end) of one expert of a quantized matrix.
struct QuantTask {
  const QuantMatrix* w = nullptr;
  int64_t expert = 0;
  int64_t m = 0;
  const float* const* x = nullptr;       // m rows of cols values, element order
  const float* const* xslots = nullptr;  // the same rows in slot order
  // m rows of group sums: groups_per_row values, then zeros up to a multiple of 16.
  const float* const* xsums = nullptr;
  float* const* y = nullptr;  // y[i][row] receives output `row` of activation row i
};

struct DenseTask {
  const DenseMatrix* w = nullptr;
  int64_t expert = 0;
  int64_t m = 0;
  const float* const* x = nullptr;
  float* const* y = nullptr;
};

// Activation rows quantized for the int8 numerics, multiplied by rows [begin, end) of one expert.
struct Int8Task {
  const QuantMatrix* w = nullptr;
  int64_t expert = 0;
  int64_t m = 0;
  const int8_t* const* x8 = nullptr;           // m rows of cols values, in the table's order
  const float* const* block_scales = nullptr;  // m rows of cols / 32 values d_b
  const float* const* xsums = nullptr;         // m rows of groups_per_row values
  float* const* y = nullptr;
  // Null, or m rows of the activations spread (KernelTable::spread_activations).
  const uint8_t* const* spread = nullptr;
};

// Tile values (quant.h): per tile of kTileValueRows rows and group, 16 values of the scale dtype.
// Row r's scale and bias sit at the slots below: BF16 [s0-s3 b0-b3 | s4-s7 b4-b7] (interleaving
// zero words widens each 128-bit lane's low half into fp32 scales and its high half into biases,
// in row order), F16 and F32 [s0-s7 | b0-b7] (vcvtph2ps, or plain loads).
constexpr int kTileValueRows = 8;
struct TileValueSlots {
  int scale;
  int bias;
};
static inline int64_t tiles_per_expert(int64_t rows) {
  return (rows + kTileValueRows - 1) / kTileValueRows;
}
// Bytes of one (tile, group): its 8 scales and 8 biases.
static inline int64_t tile_value_group_bytes(DType dtype) {
  return 2 * kTileValueRows * (dtype == DType::F32 ? 4 : 2);
}
static inline TileValueSlots tile_value_slots(DType dtype, int row) {
  if (dtype == DType::BF16) {
    const int slot = row < 4 ? row : row + 4;
    return {slot, slot + 4};
  }
  return {row, row + kTileValueRows};
}

// The largest finite f16 value.
constexpr float kF16Max = 65504.0f;

// Quantized activations are made and read in blocks of this many inputs.
constexpr int64_t kInt8Block = 32;

// Tile codes (quant.h): per tile and block of 32 inputs, one vector of 32 bytes per dword of a
// row's block, dword r of vector s = bytes 4s .. 4s+3 of row r's block. At 4 bits, 4 vectors
// (codes 8s .. 8s+7, two per byte); at 8 bits, 8 (codes 4s .. 4s+3).
constexpr bool has_tile_codes(int bits) {
  return bits == 4 || bits == 8;
}
constexpr int64_t tile_code_vectors(int bits) {
  return kInt8Block * bits / 8 / 4;
}
constexpr int64_t tile_code_block_bytes(int bits) {
  return tile_code_vectors(bits) * 32;
}
constexpr int64_t kTileCodeVectors = tile_code_vectors(4);
constexpr int64_t kTileCodeBytes = tile_code_block_bytes(4);

// Activation rows spread for the 256-bit tiles' passes over 4-bit (and 8-bit) tile codes: each
// dword of x8 repeated in all 8 dwords of a 32-byte vector, so that vpmaddubsw reads the
// activations of a step straight from memory where a broadcast per step cost a vector-pipe slot.
// Made once per product, by the calling thread, when the table reads them and spread_pays for its
// tasks.
constexpr int64_t kSpreadBytesPerInput = 8;
// Every tile of a task reads all of the task's spread rows, so they pay while they stay near L1:
// Zen 3, scripts/int8_tile_ab.sh from caches, against broadcasts: 4 and 8 rows of 576 inputs
// (37 KiB) 0.94-0.95x, 4 rows of 1536 (48 KiB) 0.98x, 8 rows of 1536 (96 KiB) 1.02-1.08x. One or
// two rows always pay (0.85-0.92x at two rows).
constexpr int64_t kSpreadTaskBytes = 48 * 1024;
constexpr bool spread_pays(int64_t task_rows, int64_t cols) {
  return task_rows <= 2 || task_rows * cols * kSpreadBytesPerInput <= kSpreadTaskBytes;
}
struct alignas(32) SpreadVector {
  uint8_t bytes[32];
};

struct KernelTable {
  void (*quant_rows)(const QuantTask& task, int64_t row_begin, int64_t row_end);
  void (*int8_rows)(const Int8Task& task, int64_t row_begin, int64_t row_end);
  // One activation row of `cols` inputs to int8 for a `bits`-bit matrix: x8[cols] in the order
  // int8_rows reads, block_scales[cols / 32].
  void (*quantize_activations)(const float* x, int64_t cols, int bits, int8_t* x8,
                               float* block_scales);
  void (*dense_rows)(const DenseTask& task, int64_t row_begin, int64_t row_end);
  void (*bf16_to_f32)(const uint8_t* src, int64_t n, float* dst);
  void (*f16_to_f32)(const uint8_t* src, int64_t n, float* dst);
  void (*f32_to_bf16)(const float* src, int64_t n, uint8_t* dst);
  // Round to nearest even; finite values and infinities past ±65504 saturate there (a KV cache
  // must not hold an infinity), NaN stays a NaN.
  void (*f32_to_f16)(const float* src, int64_t n, uint8_t* dst);
  // Reads `bytes` bytes (a multiple of 256) as fast as the ISA allows; the result only defeats
  // dead-code elimination. Used by the read-bandwidth probe.
  uint64_t (*read_sweep)(const uint8_t* data, int64_t bytes);
  // x8[cols] (in quantize_activations' order) spread into out[cols / 4]; null where int8_rows
  // does not read spread activations.
  void (*spread_activations)(const int8_t* x8, int64_t cols, SpreadVector* out);
  // Whether int8_rows reads spread activations against 8-bit tile codes too, not only 4-bit ones.
  bool spreads_byte_tile_codes;
};

// The AVX2 int8 kernels, which the AVX-512 table also uses (every AVX-512 CPU runs them).
void int8_rows_avx2(const Int8Task& task, int64_t row_begin, int64_t row_end);
void quantize_activations_avx2(const float* x, int64_t cols, int bits, int8_t* x8,
                               float* block_scales);
void spread_activations_avx2(const int8_t* x8, int64_t cols, SpreadVector* out);
// The AVX-VNNI int8 kernel (the AVX2 tiles on vpdpbusd / vpdpwssd) and the AVX-512 VNNI one; both
// read activations in quantize_activations_avx2's order.
void int8_rows_avxvnni(const Int8Task& task, int64_t row_begin, int64_t row_end);
void int8_rows_avx512vnni(const Int8Task& task, int64_t row_begin, int64_t row_end);

extern const KernelTable kRefKernels;
extern const KernelTable kAvx2Kernels;
extern const KernelTable kAvxVnniKernels;
extern const KernelTable kAvx512Kernels;
extern const KernelTable kAvx512VnniKernels;

const KernelTable& kernel_table(Isa isa);

}  // namespace dspark::kernels::cpu
