#pragma once
// GGUF files (llama.cpp's format, version 2 and 3): metadata key/values and tensor infos, with the
// tensor data memory-mapped. Dimensions are kept in GGUF order: dims[0] is the innermost
// (contiguous) dimension, so a [rows, cols] matrix has dims {cols, rows}.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/mapped_file.h"

namespace dspark {

// The ggml tensor types dspark knows by name; others are reported by number.
enum class GgmlType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  BF16 = 30,
};

std::string ggml_type_name(uint32_t type);

struct GgufTensor {
  std::string name;
  uint32_t type = 0;
  std::vector<int64_t> dims;
  const uint8_t* data = nullptr;
  size_t nbytes = 0;

  int64_t numel() const;
};

class GgufFile {
 public:
  explicit GgufFile(const std::string& path);

  const std::string& path() const { return file_.path(); }
  uint32_t version() const { return version_; }
  // Every key/value; arrays become JSON arrays, integers JSON integers.
  const nlohmann::json& metadata() const { return metadata_; }
  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  const GgufTensor* find(const std::string& name) const;

  // Typed metadata access; throws naming the key and the file when absent or of another type.
  std::string get_string(const std::string& key) const;
  int64_t get_int(const std::string& key) const;
  double get_float(const std::string& key) const;
  bool has(const std::string& key) const { return metadata_.contains(key); }

 private:
  MappedFile file_;
  uint32_t version_ = 0;
  nlohmann::json metadata_ = nlohmann::json::object();
  std::vector<GgufTensor> tensors_;
};

}  // namespace dspark
