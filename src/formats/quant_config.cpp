#include "formats/quant_config.h"

#include "base/error.h"

namespace dspark {
namespace {

bool supported_bits(int bits) {
  return bits == 2 || bits == 3 || bits == 4 || bits == 5 || bits == 6 || bits == 8;
}
bool supported_group_size(int group_size) {
  return group_size == 32 || group_size == 64 || group_size == 128;
}

QuantSettings parse_settings(const nlohmann::json& record, const QuantSettings& defaults,
                             const std::string& source, const std::string& where) {
  QuantSettings settings = defaults;
  if (record.contains("mode")) {
    if (!record["mode"].is_string()) fail("{}: {}: mode is not a string", source, where);
    settings.mode = record["mode"].get<std::string>();
  }
  if (record.contains("bits")) {
    if (!record["bits"].is_number_integer()) fail("{}: {}: bits is not an integer", source, where);
    settings.bits = record["bits"].get<int>();
  }
  if (record.contains("group_size")) {
    if (!record["group_size"].is_number_integer()) {
      fail("{}: {}: group_size is not an integer", source, where);
    }
    settings.group_size = record["group_size"].get<int>();
  }
  if (settings.mode != "affine") {
    fail("{}: {}: quantization mode '{}' is not supported (dspark reads MLX affine quantization)",
         source, where, settings.mode);
  }
  if (!supported_bits(settings.bits)) {
    fail("{}: {}: {} bits is not an MLX affine width (2, 3, 4, 5, 6 or 8)", source, where,
         settings.bits);
  }
  if (!supported_group_size(settings.group_size)) {
    fail("{}: {}: group size {} is not supported by MLX (32, 64 or 128)", source, where,
         settings.group_size);
  }
  return settings;
}

}  // namespace

QuantConfig QuantConfig::from_config(const nlohmann::json& config, const std::string& source) {
  QuantConfig result;
  result.source_ = source;
  const nlohmann::json* record = nullptr;
  if (config.contains("quantization")) {
    record = &config["quantization"];
  } else if (config.contains("quantization_config")) {
    record = &config["quantization_config"];
  }
  if (record == nullptr || record->is_null()) return result;
  if (!record->is_object()) fail("{}: quantization is not an object", source);
  result.global_ = parse_settings(*record, QuantSettings{}, source, "quantization");
  for (auto& [key, value] : record->items()) {
    if (key == "bits" || key == "group_size" || key == "mode") continue;
    const std::string where = "quantization override '" + key + "'";
    if (value.is_boolean()) {
      if (value.get<bool>()) {
        result.overrides_[key] = result.global_;
      } else {
        result.overrides_[key] = std::nullopt;
      }
    } else if (value.is_object()) {
      result.overrides_[key] = parse_settings(value, *result.global_, source, where);
    }
    // Other scalar keys (e.g. "quant_method" written by HF tooling) carry no per-module meaning.
  }
  return result;
}

QuantSettings QuantConfig::settings_for(const std::string& module_path) const {
  auto found = overrides_.find(module_path);
  if (found != overrides_.end()) {
    if (!found->second) {
      fail("{}: module '{}' has quantized weights but the quantization record marks it unquantized",
           source_, module_path);
    }
    return *found->second;
  }
  if (!global_) {
    fail(
        "{}: module '{}' has quantized weights (.scales) but config.json has no quantization "
        "record",
        source_, module_path);
  }
  return *global_;
}

bool QuantConfig::excluded(const std::string& module_path) const {
  auto found = overrides_.find(module_path);
  return found != overrides_.end() && !found->second;
}

}  // namespace dspark
