#include "model/weights.h"

#include <algorithm>
#include <memory>

#include "base/error.h"
#include "base/mapped_file.h"

namespace dspark {
namespace {

std::vector<int64_t> stacked_shape(int64_t experts, int64_t rows, int64_t cols) {
  if (experts > 0) return {experts, rows, cols};
  return {rows, cols};
}

const uint8_t* scale_tensor(const Checkpoint& checkpoint, const TensorView& view,
                            const std::vector<int64_t>& shape, DType expected_dtype) {
  if (view.shape != shape) {
    fail("{}: tensor '{}' has shape {}, expected {}", checkpoint.path(), view.name,
         shape_string(view.shape), shape_string(shape));
  }
  if (view.dtype != expected_dtype) {
    fail("{}: tensor '{}' is {} but the scales are {}", checkpoint.path(), view.name,
         dtype_name(view.dtype), dtype_name(expected_dtype));
  }
  return view.data;
}

}  // namespace

void LinearWeights::apply(const float* x, int64_t m, float* y, int64_t expert) const {
  if (quantized) {
    kernels::qmatmul(x, m, quant, y, expert);
  } else {
    kernels::matmul(x, m, dense, y, expert);
  }
  if (!bias.empty()) {
    const int64_t n = rows();
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t o = 0; o < n; ++o) y[r * n + o] += bias[o];
    }
  }
}

void LinearWeights::apply_gathered(const float* x, int64_t m, const int32_t* expert_ids,
                                   float* y) const {
  if (quantized) {
    kernels::gather_qmatmul(x, m, expert_ids, quant, y);
  } else {
    kernels::gather_matmul(x, m, expert_ids, dense, y);
  }
}

void apply_shared(const float* x, int64_t m, std::span<const LinearWeights* const> weights,
                  std::span<float* const> outputs, const kernels::RowsDone* rows_done) {
  const bool together = std::all_of(weights.begin(), weights.end(), [](const LinearWeights* w) {
    return w->quantized && w->bias.empty();
  });
  if (together) {
    std::vector<kernels::SharedInputProduct> products;
    for (size_t k = 0; k < weights.size(); ++k)
      products.push_back({&weights[k]->quant, outputs[k]});
    kernels::qmatmul_shared(x, m, products.data(), static_cast<int64_t>(products.size()),
                            rows_done);
    return;
  }
  for (size_t k = 0; k < weights.size(); ++k) weights[k]->apply(x, m, outputs[k]);
  if (rows_done != nullptr && !weights.empty()) (*rows_done)(0, weights[0]->rows());
}

void LinearWeights::row(int64_t index, float* out) const {
  if (index < 0 || index >= rows()) fail("row {} out of range [0, {})", index, rows());
  if (quantized) {
    kernels::dequantize_rows(quant, 0, index, index + 1, out);
    return;
  }
  const int64_t n = dense.cols;
  const uint8_t* source = dense.data + index * n * static_cast<int64_t>(dtype_size(dense.dtype));
  switch (dense.dtype) {
    case DType::F32:
      std::memcpy(out, source, n * sizeof(float));
      break;
    case DType::BF16:
      kernels::bf16_to_f32(source, n, out);
      break;
    case DType::F16:
      kernels::f16_to_f32(source, n, out);
      break;
    default:
      fail("unsupported dense dtype {}", dtype_name(dense.dtype));
  }
}

void pack_tile_layouts(LinearWeights& linear, bool with_codes,
                       const kernels::RowsPacked& values_packed,
                       const kernels::RowsPacked& codes_packed) {
  if (!linear.quantized || !kernels::products_read_tile_values()) return;
  // Not zeroed first: packing writes every byte.
  std::shared_ptr<uint8_t[]> values =
      std::make_shared_for_overwrite<uint8_t[]>(kernels::tile_values_bytes(linear.quant));
  kernels::pack_tile_values(linear.quant, values.get(), values_packed);
  linear.quant.tile_values = values.get();
  linear.tile_values = std::move(values);
  const bool codes_read = with_codes && kernels::products_read_tile_codes(linear.quant.format.bits);
  const int64_t bytes = codes_read ? kernels::tile_codes_bytes(linear.quant) : 0;
  if (bytes == 0) return;
  std::shared_ptr<uint8_t[]> codes = std::make_shared_for_overwrite<uint8_t[]>(bytes);
  kernels::pack_tile_codes(linear.quant, codes.get(), codes_packed);
  linear.quant.tile_codes = codes.get();
  linear.tile_codes = std::move(codes);
}

LinearWeights load_linear(const Checkpoint& checkpoint, const std::string& path, int64_t out,
                          int64_t in, int64_t experts, bool with_bias, bool lookups_only) {
  LinearWeights linear;
  const std::string weight_name = path + ".weight";
  const TensorView& weight = checkpoint.tensor(weight_name);
  const std::string scales_name = path + ".scales";
  const std::string biases_name = path + ".biases";
  linear.quantized = checkpoint.has(scales_name);
  if (linear.quantized) {
    if (!checkpoint.has(biases_name)) {
      fail("{}: quantized module '{}' has scales but no '{}'", checkpoint.path(), path,
           biases_name);
    }
    if (weight.dtype != DType::U32) {
      fail("{}: quantized weight '{}' is {}, expected U32", checkpoint.path(), weight_name,
           dtype_name(weight.dtype));
    }
    const TensorView& scales = checkpoint.tensor(scales_name);
    const TensorView& biases = checkpoint.tensor(biases_name);
    if (scales.dtype != DType::BF16 && scales.dtype != DType::F16 && scales.dtype != DType::F32) {
      fail("{}: scales '{}' are {}, expected BF16, F16 or F32", checkpoint.path(), scales_name,
           dtype_name(scales.dtype));
    }
    if (weight.rank() != (experts > 0 ? 3 : 2) || scales.rank() != weight.rank()) {
      fail("{}: quantized module '{}': weight {} and scales {} do not fit [{}{} x {}]",
           checkpoint.path(), path, shape_string(weight.shape), shape_string(scales.shape),
           experts > 0 ? std::to_string(experts) + " x " : "", out, in);
    }
    kernels::QuantFormat format;
    const int64_t packed_cols = weight.dim(-1);
    const int64_t scale_cols = scales.dim(-1);
    const bool shapes_divide =
        packed_cols > 0 && scale_cols > 0 && (packed_cols * 32) % in == 0 && in % scale_cols == 0;
    if (!shapes_divide) {
      fail("{}: quantized module '{}': packed width {} and {} scale groups do not fit {} inputs",
           checkpoint.path(), path, packed_cols, scale_cols, in);
    }
    const int shape_bits = static_cast<int>(packed_cols * 32 / in);
    const int shape_group = static_cast<int>(in / scale_cols);
    if (checkpoint.quant_config().present()) {
      QuantSettings settings = checkpoint.quant_config().settings_for(path);
      if (settings.bits != shape_bits || settings.group_size != shape_group) {
        fail(
            "{}: quantized module '{}': config says {} bits / group {} but tensor shapes give {} "
            "bits / group {}",
            checkpoint.path(), path, settings.bits, settings.group_size, shape_bits, shape_group);
      }
    }
    format.bits = shape_bits;
    format.group_size = shape_group;
    kernels::check_quant_format(format, weight_name.c_str());
    const int64_t words = in * format.bits / 32;
    const std::vector<int64_t> weight_shape = stacked_shape(experts, out, words);
    if (weight.shape != weight_shape) {
      fail("{}: tensor '{}' has shape {}, expected {}", checkpoint.path(), weight_name,
           shape_string(weight.shape), shape_string(weight_shape));
    }
    const std::vector<int64_t> group_shape = stacked_shape(experts, out, in / format.group_size);
    linear.quant.packed = weight.data;
    linear.quant.scales = scale_tensor(checkpoint, scales, group_shape, scales.dtype);
    linear.quant.biases = scale_tensor(checkpoint, biases, group_shape, scales.dtype);
    linear.quant.scale_dtype = scales.dtype;
    linear.quant.experts = experts > 0 ? experts : 1;
    linear.quant.rows = out;
    linear.quant.cols = in;
    linear.quant.format = format;
    const int64_t row_bytes = linear.quant.groups_per_row() * dtype_size(scales.dtype);
    // MLX checkpoints store a module's biases right before its scales: released as one range,
    // the page they share goes too (small matrices' tensors are a few pages each).
    const bool adjacent = biases.data + biases.nbytes == scales.data;
    const int64_t code_row_bytes = words * 4;
    // Codes only for plain matrices, which every forward reads whole: an expert bank stays in
    // the file mapping, where the experts no row routes to are never read and the page cache
    // can evict cold ones (packing the 128 experts of a Nemotron layer made them all resident
    // and took 7 s per 2.6 GB at load).
    pack_tile_layouts(
        linear, experts <= 1 && !lookups_only,
        [&](int64_t rows) {
          const auto bytes = static_cast<size_t>(rows * row_bytes);
          if (adjacent && rows == linear.quant.experts * out) {
            release_resident_pages(biases.data, biases.nbytes + scales.nbytes);
            return;
          }
          release_resident_pages(scales.data, bytes);
          release_resident_pages(biases.data, bytes);
        },
        [&](int64_t rows) {
          release_resident_pages(weight.data, static_cast<size_t>(rows * code_row_bytes));
        });
  } else {
    if (checkpoint.has(biases_name)) {
      fail("{}: module '{}' has '{}' but no scales: a quantized module needs both",
           checkpoint.path(), path, biases_name);
    }
    if (weight.dtype != DType::F32 && weight.dtype != DType::BF16 && weight.dtype != DType::F16) {
      fail("{}: weight '{}' is {}, expected F32, F16 or BF16 (or U32 with scales and biases)",
           checkpoint.path(), weight_name, dtype_name(weight.dtype));
    }
    const std::vector<int64_t> shape = stacked_shape(experts, out, in);
    if (weight.shape != shape) {
      fail("{}: tensor '{}' has shape {}, expected {}", checkpoint.path(), weight_name,
           shape_string(weight.shape), shape_string(shape));
    }
    linear.dense.data = weight.data;
    linear.dense.dtype = weight.dtype;
    linear.dense.experts = experts > 0 ? experts : 1;
    linear.dense.rows = out;
    linear.dense.cols = in;
  }
  const std::string bias_name = path + ".bias";
  if (with_bias && checkpoint.has(bias_name)) {
    linear.bias = load_floats(checkpoint, bias_name, {out});
  }
  return linear;
}

std::vector<float> load_floats(const Checkpoint& checkpoint, const std::string& name,
                               const std::vector<int64_t>& shape) {
  const TensorView& view = checkpoint.tensor(name, shape);
  if (view.dtype != DType::F32 && view.dtype != DType::BF16 && view.dtype != DType::F16) {
    fail("{}: tensor '{}' is {}, expected a float type", checkpoint.path(), name,
         dtype_name(view.dtype));
  }
  return view.to_floats();
}

}  // namespace dspark
