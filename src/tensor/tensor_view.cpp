#include "tensor/tensor_view.h"

#include "base/error.h"

namespace dspark {

float TensorView::load_float(int64_t index) const {
  switch (dtype) {
    case DType::F32:
      return load<float>(index);
    case DType::F16:
      return f16_to_f32(load<uint16_t>(index));
    case DType::BF16:
      return bf16_to_f32(load<uint16_t>(index));
    case DType::F64:
      return static_cast<float>(load<double>(index));
    case DType::I32:
      return static_cast<float>(load<int32_t>(index));
    case DType::I64:
      return static_cast<float>(load<int64_t>(index));
    case DType::U32:
      return static_cast<float>(load<uint32_t>(index));
    case DType::U8:
      return static_cast<float>(load<uint8_t>(index));
    case DType::I8:
      return static_cast<float>(load<int8_t>(index));
    default:
      fail("tensor '{}': cannot read dtype {} as float", name, dtype_name(dtype));
  }
}

std::vector<float> TensorView::to_floats() const {
  std::vector<float> values(static_cast<size_t>(numel()));
  for (int64_t i = 0; i < numel(); ++i) values[i] = load_float(i);
  return values;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) text += ", ";
    text += std::to_string(shape[i]);
  }
  return text + "]";
}

}  // namespace dspark
