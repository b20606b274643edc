#pragma once
// Tiny checkpoints for the speculative tests, in the storage formats real models use: the random
// fp32 models of tests/model/tiny_checkpoint.h written as bf16, or quantized to MLX affine 4-bit
// (group 32) with dspark's MLX-exact quantizer.
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "../model/tiny_checkpoint.h"
#include "formats/model_store.h"
#include "kernels/quant.h"
#include "model/model.h"
#include "tensor/dtype.h"

namespace dspark::testing {

enum class Storage { f32, bf16, q4 };

inline bool quantizable(const std::string& name, const TinyTensor& tensor) {
  if (name.size() < 7 || name.compare(name.size() - 7, 7, ".weight") != 0) return false;
  if (tensor.shape.size() < 2) return false;
  if (name.find("norm") != std::string::npos || name.find("conv1d") != std::string::npos)
    return false;
  if (name.find("mixer.gate.weight") != std::string::npos) return false;  // router: never quantized
  return tensor.shape.back() % 32 == 0;
}

// Writes `checkpoint` in the given storage to a fresh directory under the system temp dir.
inline std::string write_stored(TinyCheckpoint& checkpoint, Storage storage,
                                const std::string& tag) {
  if (storage == Storage::f32) return checkpoint.write();
  const std::string dir = (std::filesystem::temp_directory_path() /
                           ("dspark_spec_" + tag + "_" + std::to_string(getpid())))
                              .string();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  nlohmann::json config = checkpoint.config;
  if (storage == Storage::q4) config["quantization"] = {{"group_size", 32}, {"bits", 4}};
  std::ofstream(dir + "/config.json") << config.dump(2);
  std::vector<std::vector<uint8_t>> buffers;
  std::vector<TensorToWrite> list;
  auto add = [&](const std::string& name, DType dtype, std::vector<int64_t> shape,
                 std::vector<uint8_t> bytes) {
    buffers.push_back(std::move(bytes));
    list.push_back({name, dtype, std::move(shape), buffers.back().data(), buffers.back().size()});
  };
  buffers.reserve(checkpoint.tensors.size() * 3);
  for (const auto& [name, tensor] : checkpoint.tensors) {
    if (storage == Storage::q4 && quantizable(name, tensor)) {
      const int64_t cols = tensor.shape.back();
      const int64_t rows = static_cast<int64_t>(tensor.data.size()) / cols;
      std::vector<uint8_t> packed(rows * cols / 8 * 4), scales(rows * cols / 32 * 2),
          biases(scales.size());
      kernels::quantize(tensor.data.data(), rows, cols, {4, 32}, DType::BF16,
                        reinterpret_cast<uint32_t*>(packed.data()), scales.data(), biases.data());
      const std::string module = name.substr(0, name.size() - 7);
      std::vector<int64_t> packed_shape = tensor.shape, group_shape = tensor.shape;
      packed_shape.back() = cols / 8;
      group_shape.back() = cols / 32;
      add(name, DType::U32, packed_shape, std::move(packed));
      add(module + ".scales", DType::BF16, group_shape, std::move(scales));
      add(module + ".biases", DType::BF16, group_shape, std::move(biases));
      continue;
    }
    std::vector<uint8_t> bytes(tensor.data.size() * 2);
    for (size_t i = 0; i < tensor.data.size(); ++i) {
      const uint16_t half = f32_to_bf16(tensor.data[i]);
      std::memcpy(bytes.data() + 2 * i, &half, 2);
    }
    add(name, DType::BF16, tensor.shape, std::move(bytes));
  }
  write_safetensors(dir + "/model.safetensors", list, {{"format", "mlx"}});
  return dir;
}

// The default model (scripts/install_default_model.sh), for the DefaultModel tests; a test fails
// naming the script when it is not installed.
inline std::unique_ptr<Model> load_default_model() {
  const std::string dir = (std::filesystem::path(models_dir()) / kDefaultModelName).string();
  if (!std::filesystem::exists(dir + "/config.json")) {
    ADD_FAILURE() << "the default model is not installed at " << dir
                  << "; run scripts/install_default_model.sh";
  }
  return load_model(dir);
}

}  // namespace dspark::testing
