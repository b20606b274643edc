#pragma once
// The parameters of an MLX model as mlx-lm's model classes declare them (nemotron_h, llama,
// qwen2, qwen3), derived from a Hugging Face config.json, and where each one comes from in the
// HF checkpoint once mlx-lm's `sanitize` has run. The order is mlx-lm's parameter order, which
// decides how its save_model splits shards.
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace dspark {

struct HfParameter {
  std::string name;            // MLX name, e.g. "backbone.layers.3.mixer.switch_mlp.fc1.weight"
  std::vector<int64_t> shape;  // MLX shape before quantization
  // HF tensors holding it: one, or one per expert, stacked along a new leading axis. Each
  // alternative list is tried in turn; the first whose first tensor exists is used.
  std::vector<std::vector<std::string>> sources;
  // Weight of a module mlx-lm can quantize (Linear, Embedding, SwitchLinear).
  bool quantizable = false;
  // Held by a module with no submodules: mlx-lm's total_parameters counts only those.
  bool counted = true;
  // mlx-lm's cast_predicate: false keeps the source dtype under a conversion dtype.
  bool castable = true;
  // A depthwise conv weight, MLX [C, K, 1]: the HF file may hold it as [C, 1, K] (same bytes).
  bool conv_weight = false;
  // Absent from the checkpoint without error (and then absent from the output).
  bool optional = false;
};

struct HfLayout {
  std::string architecture;  // config.json model_type
  std::vector<HfParameter> parameters;
  // HF tensor names that sanitize drops (e.g. "mtp." prefixes, "rotary_emb.inv_freq").
  std::vector<std::string> dropped_prefixes;
  std::vector<std::string> dropped_substrings;
  std::vector<std::string> dropped_names;

  bool dropped(const std::string& hf_name) const;
};

// Throws naming `config_path` for an unsupported model_type or a missing / malformed key.
HfLayout hf_layout(const nlohmann::json& config, const std::string& config_path);

}  // namespace dspark
