#pragma once
// Checkpoint tensors bound to kernel operands. A Linear module at `path` is quantized exactly when
// "<path>.scales" exists; then "<path>.weight" (U32), "<path>.scales" and "<path>.biases" must all
// be present with shapes that agree with the expected [experts,] out x in and the bits / group size
// of the quantization record. Errors name the tensor and the checkpoint.
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "formats/checkpoint.h"
#include "kernels/quant.h"

namespace dspark {

struct LinearWeights {
  bool quantized = false;
  kernels::QuantMatrix quant;
  kernels::DenseMatrix dense;
  std::vector<float> bias;  // empty when the module has no bias
  // What quant.tile_values points into, when the loader packed them.
  std::shared_ptr<const uint8_t[]> tile_values;
  // What quant.tile_codes points into, when the loader packed them (4- and 8-bit matrices).
  std::shared_ptr<const uint8_t[]> tile_codes;

  int64_t rows() const { return quantized ? quant.rows : dense.rows; }
  int64_t cols() const { return quantized ? quant.cols : dense.cols; }
  // y[m, rows] = x[m, cols] · Wᵀ (+ bias).
  void apply(const float* x, int64_t m, float* y, int64_t expert = 0) const;
  // Row r of x uses expert expert_ids[r].
  void apply_gathered(const float* x, int64_t m, const int32_t* expert_ids, float* y) const;
  // One row of the matrix (an embedding lookup), dequantized to fp32.
  void row(int64_t index, float* out) const;
};

// outputs[k] = x · weights[k]ᵀ (+ bias) for matrices that read the same activation rows, each
// equal to weights[k]->apply(x, m, outputs[k]). Quantized matrices without biases run as one
// kernels::qmatmul_shared (one quantization of x, one parallel loop); rows_done as there, which
// needs matrices of equal rows.
void apply_shared(const float* x, int64_t m, std::span<const LinearWeights* const> weights,
                  std::span<float* const> outputs, const kernels::RowsDone* rows_done = nullptr);

// Binds the module at `path`; `experts` = 0 for a plain [out, in] matrix, else the leading
// stacked dimension. `with_bias` reads "<path>.bias" when it exists. Where this process's int8
// products read tile values (kernels::products_read_tile_values), a quantized module's scales and
// biases are packed into them, and a plain (not stacked) 4-bit module's codes into tile codes, the
// originals' pages released: weights stay resident once.
// `lookups_only`: the module is only ever read a row at a time (an untied embedding table), so its
// codes stay in the file mapping, which holds only the rows looked up.
LinearWeights load_linear(const Checkpoint& checkpoint, const std::string& path, int64_t out,
                          int64_t in, int64_t experts = 0, bool with_bias = true,
                          bool lookups_only = false);

// Where this process's int8 products read tile values (kernels::products_read_tile_values), packs
// a quantized module's tile values and, `with_codes`, its tile codes where the products read them
// (kernels::products_read_tile_codes), and points the matrix at them; the packing callbacks are as
// kernels::pack_tile_values' rows_packed. Otherwise (or for an unquantized module) does nothing.
void pack_tile_layouts(LinearWeights& linear, bool with_codes,
                       const kernels::RowsPacked& values_packed = {},
                       const kernels::RowsPacked& codes_packed = {});

// A small unquantized vector or matrix (norm weights, biases, A_log, ...) as fp32.
std::vector<float> load_floats(const Checkpoint& checkpoint, const std::string& name,
                               const std::vector<int64_t>& shape);

}  // namespace dspark
