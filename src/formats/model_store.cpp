#include "formats/model_store.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "base/error.h"
#include "formats/checkpoint.h"

namespace dspark {
namespace fs = std::filesystem;

std::string models_dir(const std::string& override_dir) {
  if (!override_dir.empty()) return override_dir;
  if (const char* env = std::getenv("DSPARK_MODELS_DIR"); env != nullptr && *env != '\0')
    return env;
  const char* home = std::getenv("HOME");
  return (fs::path(home != nullptr ? home : ".") / ".cache" / "dspark" / "models").string();
}

namespace {

InstalledModel describe(const fs::path& dir) {
  InstalledModel model;
  model.name = dir.filename().string();
  model.path = dir.string();
  const nlohmann::json config = read_json_file((dir / "config.json").string());
  model.architecture = config.value("model_type", "?");
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.is_regular_file() && entry.path().extension() == ".safetensors") {
      model.bytes += static_cast<int64_t>(entry.file_size());
    }
  }
  const nlohmann::json* quant = nullptr;
  if (config.contains("quantization")) quant = &config["quantization"];
  if (quant != nullptr && quant->is_object()) {
    model.quantization = std::to_string(quant->value("bits", 4)) + "-bit g" +
                         std::to_string(quant->value("group_size", 64));
  } else {
    model.quantization = config.value("torch_dtype", "unquantized");
  }
  return model;
}

}  // namespace

std::vector<InstalledModel> list_models(const std::string& dir) {
  std::vector<InstalledModel> models;
  if (!fs::is_directory(dir)) return models;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.is_directory() && fs::exists(entry.path() / "config.json")) {
      try {
        models.push_back(describe(entry.path()));
      } catch (const Error&) {
        // A directory with an unreadable config.json is not a model; `dspark models` skips it.
      }
    }
  }
  std::sort(models.begin(), models.end(),
            [](const InstalledModel& a, const InstalledModel& b) { return a.name < b.name; });
  return models;
}

std::string resolve_model(const std::string& model, const std::string& dir) {
  const std::string name = model.empty() ? kDefaultModelName : model;
  std::vector<std::string> looked;
  if (!model.empty()) {
    const fs::path direct(model);
    if (fs::is_directory(direct) && fs::exists(direct / "config.json")) return direct.string();
    looked.push_back(direct.string());
  }
  const fs::path in_store = fs::path(dir) / name;
  if (fs::is_directory(in_store) && fs::exists(in_store / "config.json")) return in_store.string();
  looked.push_back(in_store.string());
  std::string places;
  for (const auto& place : looked) places += "\n  " + place;
  if (model.empty()) {
    fail(
        "the default model {} is not installed; looked in:{}\nInstall it with "
        "scripts/install_default_model.sh (or pass --model)",
        kDefaultModelName, places);
  }
  fail("model '{}' not found; looked in:{}", model, places);
}

}  // namespace dspark
