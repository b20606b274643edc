#pragma once
// The MLX quantization record of config.json ("quantization", or "quantization_config"): a global
// {group_size, bits, mode} plus per-module overrides keyed by module path (value false = the module
// is not quantized). A module is quantized exactly when "<path>.scales" exists in the weights; the
// record only supplies its bits and group size.
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace dspark {

struct QuantSettings {
  int bits = 4;
  int group_size = 64;
  std::string mode = "affine";
};

class QuantConfig {
 public:
  QuantConfig() = default;
  // Parses the record from a config.json object; `source` names the file in errors. Refuses modes
  // other than affine and bits / group sizes MLX does not support.
  static QuantConfig from_config(const nlohmann::json& config, const std::string& source);

  bool present() const { return global_.has_value(); }
  // Settings for a module known to be quantized (its .scales exist). Throws naming the module when
  // the record is absent or says the module is not quantized.
  QuantSettings settings_for(const std::string& module_path) const;
  // True when an override marks the module as not quantized.
  bool excluded(const std::string& module_path) const;

 private:
  std::string source_;
  std::optional<QuantSettings> global_;
  std::map<std::string, std::optional<QuantSettings>> overrides_;
};

}  // namespace dspark
