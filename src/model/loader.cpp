#include "model/loader.h"

#include <cmath>
#include <limits>

#include "base/error.h"

namespace dspark {

ConfigReader::ConfigReader(const nlohmann::json& config, std::string source)
    : config_(config), source_(std::move(source)) {}

bool ConfigReader::has(const std::string& key) const {
  return config_.contains(key) && !config_[key].is_null();
}

const nlohmann::json& ConfigReader::raw(const std::string& key) const {
  if (!has(key)) fail("{}: missing field '{}'", source_, key);
  return config_[key];
}

int64_t ConfigReader::integer(const std::string& key) const {
  const nlohmann::json& value = raw(key);
  if (!value.is_number_integer()) fail("{}: field '{}' must be an integer", source_, key);
  if (value.is_number_unsigned() &&
      value.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    fail("{}: field '{}' is {}, too large", source_, key, value.get<uint64_t>());
  }
  return value.get<int64_t>();
}

int64_t ConfigReader::integer(const std::string& key, int64_t fallback) const {
  return has(key) ? integer(key) : fallback;
}

double ConfigReader::number(const std::string& key) const {
  const nlohmann::json& value = raw(key);
  if (!value.is_number()) fail("{}: field '{}' must be a number", source_, key);
  return value.get<double>();
}

double ConfigReader::number(const std::string& key, double fallback) const {
  return has(key) ? number(key) : fallback;
}

int64_t ConfigReader::integer_in(const std::string& key, int64_t min, int64_t max) const {
  const int64_t value = integer(key);
  if (value < min || value > max) {
    fail("{}: field '{}' is {}; it must be in [{}, {}]", source_, key, value, min, max);
  }
  return value;
}

int64_t ConfigReader::integer_in(const std::string& key, int64_t fallback, int64_t min,
                                 int64_t max) const {
  return has(key) ? integer_in(key, min, max) : fallback;
}

double ConfigReader::number_above(const std::string& key, double fallback, double exclusive_min,
                                  double max) const {
  const double value = number(key, fallback);
  if (!std::isfinite(value) || value <= exclusive_min || value > max) {
    fail("{}: field '{}' is {}; it must be in ({}, {}]", source_, key, value, exclusive_min, max);
  }
  return value;
}

bool ConfigReader::flag(const std::string& key, bool fallback) const {
  if (!has(key)) return fallback;
  const nlohmann::json& value = config_[key];
  if (!value.is_boolean()) fail("{}: field '{}' must be true or false", source_, key);
  return value.get<bool>();
}

std::string ConfigReader::string(const std::string& key, const std::string& fallback) const {
  if (!has(key)) return fallback;
  const nlohmann::json& value = config_[key];
  if (!value.is_string()) fail("{}: field '{}' must be a string", source_, key);
  return value.get<std::string>();
}

LinearWeights WeightLoader::linear(const std::string& path, int64_t out, int64_t in,
                                   int64_t experts) {
  use_module(path);
  return load_linear(checkpoint_, path, out, in, experts);
}

LinearWeights WeightLoader::embedding(const std::string& path, int64_t vocab, int64_t hidden,
                                      bool tied) {
  use_module(path);
  return load_linear(checkpoint_, path, vocab, hidden, 0, true, !tied);
}

void WeightLoader::use_module(const std::string& path) {
  for (const char* suffix : {".weight", ".scales", ".biases", ".bias"}) used_.insert(path + suffix);
}

std::vector<float> WeightLoader::floats(const std::string& name,
                                        const std::vector<int64_t>& shape) {
  used_.insert(name);
  return load_floats(checkpoint_, name, shape);
}

const TensorView& WeightLoader::tensor(const std::string& name) {
  used_.insert(name);
  return checkpoint_.tensor(name);
}

void WeightLoader::check_all_used(const std::function<bool(const std::string&)>& ignored) const {
  for (const std::string& name : checkpoint_.names()) {
    if (used_.count(name) == 0 && !ignored(name)) {
      fail("{}: unexpected tensor '{}': the model's config has no place for it", checkpoint_.path(),
           name);
    }
  }
}

}  // namespace dspark
