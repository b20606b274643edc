#pragma once
// Converts an unquantized Hugging Face checkpoint (model_type nemotron_h, llama, qwen2, qwen3;
// safetensors, single file or sharded with an index) into an MLX affine-quantized model directory
// that equals what `mlx_lm.convert(quantize=True)` writes: the same tensors bit for bit, the same
// shard split and index, and config.json with its "quantization" record. Tensors stream through
// one at a time in bounded chunks, so memory stays far below the model's size.
#include <cstdint>
#include <string>

namespace dspark {

struct HfConversionOptions {
  int bits = 4;         // 2, 3, 4, 5, 6 or 8
  int group_size = 64;  // 32, 64 or 128
  // "float16", "bfloat16" or "float32"; empty = config.json's torch_dtype, as mlx-lm does.
  std::string dtype;
  // A shard is closed before a tensor that would take it past this size (mlx-lm: 5 GiB).
  int64_t max_shard_bytes = int64_t{5} << 30;
};

struct HfConversionSummary {
  std::string architecture;
  std::string dtype;  // conversion dtype, or "source" when the tensors keep their own
  int64_t tensors = 0;
  int64_t quantized_modules = 0;
  int64_t unquantized_modules = 0;  // quantizable, but the input size is not a group multiple
  int64_t output_bytes = 0;
  int64_t shards = 0;
};

// `output_dir` must not exist yet; it appears only once the conversion is complete.
HfConversionSummary convert_hf_to_mlx(const std::string& input_dir, const std::string& output_dir,
                                      const HfConversionOptions& options = {});

}  // namespace dspark
