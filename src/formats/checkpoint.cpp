#include "formats/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <set>

#include "base/error.h"
#include "base/file_io.h"

namespace dspark {
namespace fs = std::filesystem;

nlohmann::json read_json_file(const std::string& path) {
  const std::string text = read_file(path);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    fail("{}: invalid JSON at byte {}: {}", path, e.byte, e.what());
  } catch (const nlohmann::json::exception& e) {
    // A number past a double's range (1e999) is an out_of_range error, not a parse_error.
    fail("{}: invalid JSON: {}", path, e.what());
  }
}

Checkpoint::Checkpoint(const std::string& path) : path_(path) {
  config_ = nlohmann::json::object();
  std::vector<std::string> shard_paths;
  const fs::path root(path);
  if (fs::is_regular_file(root)) {
    shard_paths.push_back(path);
  } else if (fs::is_directory(root)) {
    const fs::path config_path = root / "config.json";
    if (fs::exists(config_path)) {
      config_ = read_json_file(config_path.string());
      if (!config_.is_object()) fail("{}: config.json is not a JSON object", config_path.string());
      quant_config_ = QuantConfig::from_config(config_, config_path.string());
    }
    const fs::path index_path = root / "model.safetensors.index.json";
    if (fs::exists(index_path)) {
      nlohmann::json index = read_json_file(index_path.string());
      if (!index.contains("weight_map") || !index["weight_map"].is_object()) {
        fail("{}: no weight_map object", index_path.string());
      }
      std::set<std::string> shard_names;
      for (auto& [tensor_name, shard] : index["weight_map"].items()) {
        if (!shard.is_string()) {
          fail("{}: weight_map entry '{}' is not a file name", index_path.string(), tensor_name);
        }
        shard_names.insert(shard.get<std::string>());
      }
      for (const auto& shard : shard_names) {
        if (shard.find('/') != std::string::npos || shard == "..") {
          fail("{}: shard name '{}' must be a plain file name", index_path.string(), shard);
        }
        if (!fs::exists(root / shard)) {
          fail("{}: shard '{}' listed in the index is missing", index_path.string(), shard);
        }
        shard_paths.push_back((root / shard).string());
      }
      // Checked after the shards are read: every indexed tensor sits in the shard named for it.
      for (const auto& shard_path : shard_paths) {
        files_.push_back(std::make_unique<SafetensorsFile>(shard_path));
      }
      for (auto& [tensor_name, shard] : index["weight_map"].items()) {
        const std::string shard_path = (root / shard.get<std::string>()).string();
        auto file = std::find_if(files_.begin(), files_.end(),
                                 [&](const auto& f) { return f->path() == shard_path; });
        if ((*file)->tensors().count(tensor_name) == 0) {
          fail("{}: tensor '{}' is indexed in '{}' but that shard does not hold it",
               index_path.string(), tensor_name, shard.get<std::string>());
        }
      }
      for (const auto& file : files_) {
        for (const auto& [tensor_name, view] : file->tensors()) {
          auto entry = index["weight_map"].find(tensor_name);
          if (entry == index["weight_map"].end()) {
            fail("{}: tensor '{}' in shard '{}' is missing from the index", index_path.string(),
                 tensor_name, file->path());
          }
          if ((root / entry->get<std::string>()).string() != file->path()) continue;
          tensors_[tensor_name] = &view;
        }
      }
      return;
    }
    for (const auto& entry : fs::directory_iterator(root)) {
      if (entry.path().extension() == ".safetensors") shard_paths.push_back(entry.path().string());
    }
    std::sort(shard_paths.begin(), shard_paths.end());
    if (shard_paths.empty()) fail("{}: no .safetensors files in the checkpoint directory", path);
  } else {
    fail("{}: no such checkpoint directory or file", path);
  }
  for (const auto& shard_path : shard_paths) {
    files_.push_back(std::make_unique<SafetensorsFile>(shard_path));
  }
  for (const auto& file : files_) {
    for (const auto& [tensor_name, view] : file->tensors()) {
      auto [it, inserted] = tensors_.emplace(tensor_name, &view);
      if (!inserted) {
        fail("{}: tensor '{}' appears in both {} and another shard", path, tensor_name,
             file->path());
      }
    }
  }
}

const TensorView& Checkpoint::tensor(const std::string& name) const {
  auto found = tensors_.find(name);
  if (found == tensors_.end()) fail("{}: missing tensor '{}'", path_, name);
  return *found->second;
}

const TensorView& Checkpoint::tensor(const std::string& name,
                                     const std::vector<int64_t>& shape) const {
  const TensorView& view = tensor(name);
  if (view.shape != shape) {
    fail("{}: tensor '{}' has shape {}, expected {}", path_, name, shape_string(view.shape),
         shape_string(shape));
  }
  return view;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> result;
  result.reserve(tensors_.size());
  for (const auto& [name, view] : tensors_) result.push_back(name);
  return result;
}

int64_t Checkpoint::total_bytes() const {
  int64_t total = 0;
  for (const auto& [name, view] : tensors_) total += static_cast<int64_t>(view->nbytes);
  return total;
}

}  // namespace dspark
