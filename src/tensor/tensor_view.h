#pragma once
// A non-owning view of a tensor's bytes (usually inside a memory-mapped checkpoint). Data may be
// unaligned: read elements with load<T>(), never by casting the pointer.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "tensor/dtype.h"

namespace dspark {

struct TensorView {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  size_t nbytes = 0;

  int64_t numel() const {
    int64_t count = 1;
    for (int64_t dim : shape) count *= dim;
    return count;
  }
  int rank() const { return static_cast<int>(shape.size()); }
  int64_t dim(int axis) const { return shape[axis < 0 ? shape.size() + axis : axis]; }

  template <typename T>
  T load(int64_t index) const {
    T value;
    std::memcpy(&value, data + index * sizeof(T), sizeof(T));
    return value;
  }

  // Element `index` as float, for F32, F16, BF16 and the integer types.
  float load_float(int64_t index) const;
  // All elements as float (copies; for small tensors such as norms and biases).
  std::vector<float> to_floats() const;
};

std::string shape_string(const std::vector<int64_t>& shape);

}  // namespace dspark
