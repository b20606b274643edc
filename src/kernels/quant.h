#pragma once
// MLX affine quantization (bits 2, 3, 4, 5, 6, 8; group sizes 32, 64, 128) and the products that
// read quantized weights. Layout: see shared spec nemotron_h.md §8.1. Weights are [rows, cols]
// (output, input), optionally stacked [experts, rows, cols]; `packed` holds each row as a
// little-endian bit stream of `cols * bits / 32` U32 words; scales and biases hold one value per
// group of `group_size` consecutive inputs. Pointers may be unaligned (MLX does not pad tensors).
//
// Every product accumulates in fp32 and computes y[r, o] = Σ_i x[r, i] · (s·q + b), factored per
// group as s·Σ x·q + b·Σ x.
//
// Determinism: each output y[r, o] is computed in one fixed summation order (documented in
// kernels/cpu/quant_impl.h) that depends only on the matrix, x[r] and W[o] — NOT on m, on which
// other rows are in the batch, on the expert mix of a gathered product, on the thread count, or
// on the ISA. So qmatmul's row r result is bit-identical whether it is computed alone (m = 1,
// plain decode) or inside a batch (m > 1, speculative verify), and gather_qmatmul equals qmatmul
// with the same expert; likewise for matmul / gather_matmul. All ISAs (scalar, avx2, avx512) give
// bit-identical results. x is [m, cols] and y is [m, rows], both contiguous fp32, not overlapping.
#include <cstdint>

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

enum class Isa { scalar, avx2, avx512 };
const char* isa_name(Isa isa);
// The best ISA this CPU supports, unless DSPARK_ISA=scalar|avx2|avx512 asks for another (an
// ISA the CPU lacks is refused with an error). The *_isa functions also refuse such an ISA.
Isa best_isa();

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

// y[m, rows] = x[m, cols] · W[expert]ᵀ. Multithreaded on the default pool.
void qmatmul(const float* x, int64_t m, const QuantMatrix& w, float* y, int64_t expert = 0);
void qmatmul_isa(Isa isa, const float* x, int64_t m, const QuantMatrix& w, float* y,
                 int64_t expert = 0);

// Gathered per-expert product: row r of x (cols wide) is multiplied by expert expert_ids[r]:
// y[r, rows] = x[r] · W[expert_ids[r]]ᵀ. Rows sharing an expert read its weights once.
void gather_qmatmul(const float* x, int64_t m, const int32_t* expert_ids, const QuantMatrix& w,
                    float* y);
void gather_qmatmul_isa(Isa isa, const float* x, int64_t m, const int32_t* expert_ids,
                        const QuantMatrix& w, float* y);

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
