#pragma once
// Converts a llama.cpp GGUF file (architectures llama, qwen2, qwen3) into an MLX-format model
// directory: config.json, model.safetensors, tokenizer.json, tokenizer_config.json and
// generation_config.json. Q4_0, Q4_1 and Q8_0 blocks map without loss onto MLX affine 4/4/8-bit
// with group size 32; F32, F16 and BF16 tensors are kept as they are.
#include <string>

namespace dspark {

struct GgufConversionSummary {
  std::string architecture;
  int64_t tensors = 0;
  int64_t quantized_tensors = 0;
  int64_t output_bytes = 0;
};

GgufConversionSummary convert_gguf_to_mlx(const std::string& gguf_path,
                                          const std::string& output_dir);

}  // namespace dspark
