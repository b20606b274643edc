#pragma once
// A model checkpoint: a directory with config.json and one model.safetensors or shards listed by
// model.safetensors.index.json (or a single .safetensors file). Tensors are memory-mapped.
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "formats/quant_config.h"
#include "formats/safetensors.h"

namespace dspark {

class Checkpoint {
 public:
  // Opens a checkpoint directory (or one .safetensors file, with no config). Validates the shard
  // index against the shards' headers when an index exists.
  explicit Checkpoint(const std::string& path);

  const std::string& path() const { return path_; }
  // config.json (an empty object when the checkpoint has none).
  const nlohmann::json& config() const { return config_; }
  const QuantConfig& quant_config() const { return quant_config_; }

  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  // Throws naming the tensor and the checkpoint when absent.
  const TensorView& tensor(const std::string& name) const;
  // Throws unless the tensor exists with exactly this shape.
  const TensorView& tensor(const std::string& name, const std::vector<int64_t>& shape) const;
  std::vector<std::string> names() const;
  // Total bytes of tensor data.
  int64_t total_bytes() const;

 private:
  std::string path_;
  nlohmann::json config_;
  QuantConfig quant_config_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorView*> tensors_;
};

// Reads a JSON file; errors name the file and the parse position.
nlohmann::json read_json_file(const std::string& path);

}  // namespace dspark
