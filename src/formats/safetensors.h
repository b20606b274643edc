#pragma once
// safetensors files: u64 little-endian header length N, N bytes of JSON header, raw tensor bytes.
// Reading memory-maps the file and validates every header entry (dtype, shape vs byte count,
// offsets inside the buffer and non-overlapping); errors name the file and the tensor.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "base/mapped_file.h"
#include "tensor/tensor_view.h"

namespace dspark {

class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);

  const std::string& path() const { return file_.path(); }
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  MappedFile file_;
  std::map<std::string, TensorView> tensors_;
  std::map<std::string, std::string> metadata_;
};

// A tensor to be written: name, dtype, shape and its raw little-endian bytes.
struct TensorToWrite {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t nbytes = 0;
};

// Writes a safetensors file (header padded to 8 bytes, tensors in the given order) atomically:
// to `path + ".partial"` first, then renamed.
void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace dspark
