#pragma once
// MLX affine quantization (bits 2, 3, 4, 5, 6, 8; group sizes 32, 64, 128) and the products that
// read quantized weights. Layout: see docs/model-math.md §8.1. Weights are [rows, cols]
// (output, input), optionally stacked [experts, rows, cols]; `packed` holds each row as a
// little-endian bit stream of `cols * bits / 32` U32 words; scales and biases hold one value per
// group of `group_size` consecutive inputs. Pointers may be unaligned (MLX does not pad tensors).
//
// Quantized products have two numerics (see Numerics below); both compute
// y[r, o] = Σ_i x[r, i] · (s·q + b), factored per group g as s_g·Σ x·q + b_g·Σ x:
//   fp32: every product and sum in fp32, x used as given (the oracle path: it matches MLX's
//         fp32 arithmetic up to summation order).
//   int8: each activation row is first quantized to int8 in blocks of 32 inputs, symmetric, one
//         fp32 scale per block: d_b = max|x| / 127 (fp32), x8 = round-half-even(x / d_b) clamped
//         to [-127, 127] (d_b = 0: all zeros); it depends only on that row. Then
//         y = Σ_g [ s_g · Σ_{blocks b in g} d_b · Σ_{k in b} q_k·x8_k + b_g · Σx_g ], the inner
//         sums exact int32 and Σx_g taken from the quantized row (Σ_b d_b·Σ x8), so the
//         product is exactly W·x̂ with x̂ = d_b·x8. (Σx from the fp32 row would leave the
//         rounding error multiplied by s·q = W - b instead of W: affine groups have |b| about
//         their largest weight, and the logits came out ~4x further from fp32 in KL.) The
//         integer dot products cost less per weight than fp32 products, most of all when several
//         activation rows share the unpacked weights (speculative verify, prefill): quant_bench's
//         numerics/* benchmarks compare the two.
//
// Determinism: in either numerics each output y[r, o] is computed in one fixed order (documented
// in kernels/cpu/quant_impl.h) that depends only on the matrix, x[r] and W[o] — NOT on m, on which
// other rows are in the batch, on the expert mix of a gathered product, on the thread count, or
// on the ISA. So qmatmul's row r result is bit-identical whether it is computed alone (m = 1,
// plain decode) or inside a batch (m > 1, speculative verify), and gather_qmatmul equals qmatmul
// with the same expert; likewise for matmul / gather_matmul. All ISAs (scalar, avx2, avxvnni,
// avx512, avx512vnni) give bit-identical results. x is [m, cols] and y is [m, rows], both
// contiguous fp32, not overlapping.
#include <cstdint>
#include <functional>
#include <string_view>

#include "tensor/dtype.h"

namespace dspark::kernels {

struct QuantFormat {
  int bits = 4;
  int group_size = 64;
};

// Throws dspark::Error naming `what` when bits or group size are outside what MLX supports.
void check_quant_format(const QuantFormat& format, const char* what);

struct QuantMatrix {
  const uint8_t* packed = nullptr;  // U32 words, [experts, rows, cols*bits/32]
  const uint8_t* scales = nullptr;  // [experts, rows, cols/group_size] of scale_dtype
  const uint8_t* biases = nullptr;  // same shape and dtype as scales
  DType scale_dtype = DType::BF16;  // BF16, F16 or F32
  int64_t experts = 1;
  int64_t rows = 0;
  int64_t cols = 0;
  QuantFormat format;
  // Optional: the scales and biases again, as pack_tile_values lays them out for the int8 kernels,
  // which then read them instead of transposing each tile's values. Null: they transpose.
  const uint8_t* tile_values = nullptr;
  // Optional, 4- and 8-bit only: the codes again, as pack_tile_codes lays them out for the int8
  // kernels, which then load each block's 8 rows as 4 (8) vectors instead of transposing them.
  const uint8_t* tile_codes = nullptr;

  int64_t words_per_row() const { return cols * format.bits / 32; }
  int64_t groups_per_row() const { return cols / format.group_size; }
  // Bytes of packed weights, scales and biases streamed when every row of one expert is read.
  int64_t bytes_per_expert() const;
};

// An unquantized matrix [experts, rows, cols] of F32, F16 or BF16.
struct DenseMatrix {
  const uint8_t* data = nullptr;
  DType dtype = DType::BF16;
  int64_t experts = 1;
  int64_t rows = 0;
  int64_t cols = 0;
};

// The arithmetic of quantized products (above). Dense (unquantized) matrices always use fp32.
enum class Numerics { int8, fp32 };
const char* numerics_name(Numerics numerics);
// "int8" or "fp32"; anything else throws dspark::Error naming `what` (e.g. "--numerics").
Numerics parse_numerics(std::string_view name, const char* what);
// The process-wide numerics of qmatmul / gather_qmatmul (and their *_isa forms): int8 unless
// DSPARK_NUMERICS=int8|fp32 says otherwise (read at first use; a bad value throws), or
// set_numerics was called. Set it before products run concurrently (e.g. from a CLI flag).
Numerics numerics();
void set_numerics(Numerics numerics);

// avxvnni is avx2 with the int8 products on VEX vpdpbusd / vpdpwssd (AVX-VNNI, e.g. Intel client
// cores without AVX-512); avx512vnni is avx512 with them on zmm vpdpbusd (AVX-512 VNNI). Every
// other kernel is avx2's or avx512's.
enum class Isa { scalar, avx2, avxvnni, avx512, avx512vnni };
const char* isa_name(Isa isa);
// The best ISA this CPU supports, unless DSPARK_ISA=scalar|avx2|avxvnni|avx512|avx512vnni asks for
// another (an ISA the CPU lacks is refused with an error). The *_isa functions also refuse such an
// ISA.
Isa best_isa();
// Whether this CPU runs `isa`'s kernels.
bool isa_supported(Isa isa);

// Tile values: a matrix's scales and biases regrouped the way the int8 kernels read them (the
// 256-bit ones, of avx2, avxvnni and avx512, a tile at a time; avx512vnni's 16-row tiles, two at a
// time), per expert, per tile of 8 rows (the last one padded with zeros), per group: the tile's 8
// scales and 8 biases, 16 values of scale_dtype (order: kernels/cpu/quant_impl.h). The same bytes
// as the scales and biases, plus the padding. A loader that packs them should release the
// originals' pages (release_resident_pages), so the values are not resident twice; products that
// read the originals (the scalar reference, the fp32 numerics, dequantize_rows) still may, from
// the file.
int64_t tile_values_bytes(const QuantMatrix& w);
// Packs w's tile values into out[tile_values_bytes(w)] (every byte written, the padding zeros), a
// slice of tiles at a time; after each
// slice, rows_packed(n) (when given) says that the first n stored rows ([experts · rows] order)
// are packed, so that a loader can release their originals before the next slice faults more in.
using RowsPacked = std::function<void(int64_t rows)>;
void pack_tile_values(const QuantMatrix& w, uint8_t* out, const RowsPacked& rows_packed = {});
// Whether the int8 products of this process read tile values: numerics() is int8 and
// best_isa() is not scalar.
bool products_read_tile_values();
// Tile codes of a 4- or 8-bit matrix: per expert, per tile of 8 rows (the last one padded with zero
// rows), per block of 32 inputs, 128 (256) bytes: 4 (8) vectors of 32 bytes whose dword r of
// vector s holds bytes 4s .. 4s+3 of row r's 16 (32) packed bytes of the block (order:
// kernels/cpu/quant_impl.h). The same bytes as the packed codes, plus the padding; 0 for other bit
// widths, which have none. A loader that packs them should release the originals' pages, as with
// tile values.
int64_t tile_codes_bytes(const QuantMatrix& w);
void pack_tile_codes(const QuantMatrix& w, uint8_t* out, const RowsPacked& rows_packed = {});
// Whether the int8 products of this process read the tile codes of `bits`-bit matrices: 4 bits
// wherever they read tile values; 8 bits where the best ISA is AVX-512 VNNI, whose kernel they
// serve best, or AVX2 without VNNI, whose 256-bit kernel multiplies them as nibble pairs. (The
// AVX-VNNI kernel reads them too, as its interleaved buffer, so that the kernel plan may still time
// it on an AVX-512 VNNI CPU.)
bool products_read_tile_codes(int bits);

// Quantize `rows` x `cols` fp32 weights the way mlx.core.quantize does, bit for bit. Scales and
// biases are written in scale_dtype (the dtype of the source weights in MLX).
void quantize(const float* weights, int64_t rows, int64_t cols, QuantFormat format,
              DType scale_dtype, uint32_t* packed, void* scales, void* biases);

// Dequantize rows [row_begin, row_end) of expert `expert` into out[(row - row_begin) * cols]:
// w = s·q + b in fp32 (a product, then a sum, each rounded to fp32, as mx.dequantize does for fp32
// scales).
void dequantize_rows(const QuantMatrix& w, int64_t expert, int64_t row_begin, int64_t row_end,
                     float* out);
// The same rows rounded the way mx.dequantize computes them in a 16-bit scale dtype: s·q rounded to
// that dtype, plus b, rounded again; returned widened to fp32. Equals dequantize_rows for F32
// scales. Use it where a result must equal MLX's bit for bit (e.g. a bf16 embedding lookup).
void dequantize_rows_mlx(const QuantMatrix& w, int64_t expert, int64_t row_begin, int64_t row_end,
                         float* out);

// y[m, rows] = x[m, cols] · W[expert]ᵀ in numerics(). Multithreaded on the default pool. Where the
// CPU has more than one ISA's kernels (AVX-512 and AVX2) and DSPARK_ISA does not pin one, the first
// product of each shape, format and number of rows (1, 2, 3-4, 5-8, 9-16) times both and later
// ones run the faster; more rows run best_isa(). The bits are the same either way (Determinism).
void qmatmul(const float* x, int64_t m, const QuantMatrix& w, float* y, int64_t expert = 0);
// The ISA qmatmul runs for `w` with m rows in numerics(): the measured choice once one was made,
// else best_isa().
Isa planned_isa(const QuantMatrix& w, int64_t m);
void qmatmul_isa(Isa isa, const float* x, int64_t m, const QuantMatrix& w, float* y,
                 int64_t expert = 0);

// The same in the given numerics, whatever numerics() says.
void qmatmul_numerics(Numerics numerics, Isa isa, const float* x, int64_t m, const QuantMatrix& w,
                      float* y, int64_t expert = 0);

// Quantized products that share their activation rows (an attention's q, k and v; an MLP's gate
// and up): y_k[m, W_k.rows] = x[m, cols] · W_kᵀ, each bit-identical to qmatmul(x, m, W_k, y_k).
// In the int8 numerics the rows are quantized once for every matrix of one format, and one
// parallel loop covers all the matrices' rows, so the threads meet once instead of once per
// matrix (a decode step of a small model runs hundreds of loops, and each ends with one thread
// waiting for the other). Matrices of other numerics or formats, or whose kernel is still to be
// measured, run one qmatmul each.
struct SharedInputProduct {
  const QuantMatrix* w = nullptr;
  float* y = nullptr;  // [m, w->rows]
};
// Called as rows_done(begin, end) once output rows [begin, end) of every product are computed for
// every activation row: the element-wise step that joins the products (SwiGLU) then runs on the
// thread that computed them, inside the same loop. It needs matrices of equal rows.
using RowsDone = std::function<void(int64_t begin, int64_t end)>;
void qmatmul_shared(const float* x, int64_t m, const SharedInputProduct* products, int64_t count,
                    const RowsDone* rows_done = nullptr);

// Gathered per-expert product: row r of x (cols wide) is multiplied by expert expert_ids[r]:
// y[r, rows] = x[r] · W[expert_ids[r]]ᵀ. Rows sharing an expert read its weights once. Its kernels
// are chosen by measurement as qmatmul's are, by the most rows that share an expert.
void gather_qmatmul(const float* x, int64_t m, const int32_t* expert_ids, const QuantMatrix& w,
                    float* y);
void gather_qmatmul_isa(Isa isa, const float* x, int64_t m, const int32_t* expert_ids,
                        const QuantMatrix& w, float* y);
void gather_qmatmul_numerics(Numerics numerics, Isa isa, const float* x, int64_t m,
                             const int32_t* expert_ids, const QuantMatrix& w, float* y);

// y[m, rows] = x[m, cols] · W[expert]ᵀ for an unquantized matrix.
void matmul(const float* x, int64_t m, const DenseMatrix& w, float* y, int64_t expert = 0);
void matmul_isa(Isa isa, const float* x, int64_t m, const DenseMatrix& w, float* y,
                int64_t expert = 0);
void gather_matmul(const float* x, int64_t m, const int32_t* expert_ids, const DenseMatrix& w,
                   float* y);
void gather_matmul_isa(Isa isa, const float* x, int64_t m, const int32_t* expert_ids,
                       const DenseMatrix& w, float* y);

// Bulk conversions (round to nearest even for f32_to_bf16). Inside dspark::kernels these names
// hide the scalar dspark::bf16_to_f32 & co. of tensor/dtype.h: qualify those.
void bf16_to_f32(const void* src, int64_t n, float* dst);
void f16_to_f32(const void* src, int64_t n, float* dst);
void f32_to_bf16(const float* src, int64_t n, void* dst);

}  // namespace dspark::kernels
