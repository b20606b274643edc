#pragma once
// Helpers shared by the architecture loaders: typed config.json fields with errors naming the
// field, and a weight loader that remembers which tensors it bound so that a checkpoint holding
// tensors the architecture does not use is refused by name.
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "formats/checkpoint.h"
#include "model/weights.h"

namespace dspark {

// Bounds on config.json sizes. They are far above any released model and far below what would
// overflow the int64 products of the weight and state shapes, so a degenerate or hostile config
// is refused by field name before anything is allocated.
constexpr int64_t kMaxConfigLayers = 1024;
constexpr int64_t kMaxConfigHidden = 1 << 16;
constexpr int64_t kMaxConfigHeads = 1024;
constexpr int64_t kMaxConfigHeadDim = 4096;
constexpr int64_t kMaxConfigIntermediate = 1 << 20;
constexpr int64_t kMaxConfigVocab = 1 << 24;
constexpr int64_t kMaxConfigContext = int64_t{1} << 30;
constexpr int64_t kMaxConfigExperts = 4096;
constexpr int64_t kMaxConfigSsmState = 4096;
constexpr int64_t kMaxConfigConvKernel = 64;

class ConfigReader {
 public:
  ConfigReader(const nlohmann::json& config, std::string source);

  // True when the key exists and is not null.
  bool has(const std::string& key) const;
  int64_t integer(const std::string& key) const;
  int64_t integer(const std::string& key, int64_t fallback) const;
  double number(const std::string& key) const;
  double number(const std::string& key, double fallback) const;
  // An integer in [min, max]; otherwise an error naming the field, its value and the range.
  int64_t integer_in(const std::string& key, int64_t min, int64_t max) const;
  int64_t integer_in(const std::string& key, int64_t fallback, int64_t min, int64_t max) const;
  // A finite number in (exclusive_min, max].
  double number_above(const std::string& key, double fallback, double exclusive_min,
                      double max) const;
  bool flag(const std::string& key, bool fallback) const;
  std::string string(const std::string& key, const std::string& fallback) const;
  const nlohmann::json& raw(const std::string& key) const;
  const std::string& source() const { return source_; }

 private:
  const nlohmann::json& config_;
  std::string source_;
};

class WeightLoader {
 public:
  explicit WeightLoader(const Checkpoint& checkpoint) : checkpoint_(checkpoint) {}

  const Checkpoint& checkpoint() const { return checkpoint_; }
  bool has(const std::string& name) const { return checkpoint_.has(name); }
  // load_linear, remembering the module's tensors.
  LinearWeights linear(const std::string& path, int64_t out, int64_t in, int64_t experts = 0);
  // An embedding table: load_linear with lookups_only unless it is also the output head (tied).
  LinearWeights embedding(const std::string& path, int64_t vocab, int64_t hidden, bool tied);
  // load_floats, remembering the tensor.
  std::vector<float> floats(const std::string& name, const std::vector<int64_t>& shape);
  // A tensor to be read by the caller, remembered.
  const TensorView& tensor(const std::string& name);
  // Throws naming the first checkpoint tensor that was not bound and is not `ignored`.
  void check_all_used(const std::function<bool(const std::string&)>& ignored) const;

 private:
  // Remembers the tensors of the module at `path`.
  void use_module(const std::string& path);

  const Checkpoint& checkpoint_;
  std::set<std::string> used_;
};

}  // namespace dspark
