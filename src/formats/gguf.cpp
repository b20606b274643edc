#include "formats/gguf.h"

#include <cstring>

#include "base/error.h"

namespace dspark {
namespace {

enum ValueType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};

// Block size (elements) and bytes per block of each ggml type dspark can size.
struct TypeLayout {
  int64_t block_elements;
  int64_t block_bytes;
};

bool type_layout(uint32_t type, TypeLayout& layout) {
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::F32:
      layout = {1, 4};
      return true;
    case GgmlType::F16:
      layout = {1, 2};
      return true;
    case GgmlType::BF16:
      layout = {1, 2};
      return true;
    case GgmlType::F64:
      layout = {1, 8};
      return true;
    case GgmlType::I8:
      layout = {1, 1};
      return true;
    case GgmlType::I16:
      layout = {1, 2};
      return true;
    case GgmlType::I32:
      layout = {1, 4};
      return true;
    case GgmlType::I64:
      layout = {1, 8};
      return true;
    case GgmlType::Q4_0:
      layout = {32, 18};
      return true;
    case GgmlType::Q4_1:
      layout = {32, 20};
      return true;
    case GgmlType::Q5_0:
      layout = {32, 22};
      return true;
    case GgmlType::Q5_1:
      layout = {32, 24};
      return true;
    case GgmlType::Q8_0:
      layout = {32, 34};
      return true;
    case GgmlType::Q8_1:
      layout = {32, 36};
      return true;
    case GgmlType::Q2_K:
      layout = {256, 84};
      return true;
    case GgmlType::Q3_K:
      layout = {256, 110};
      return true;
    case GgmlType::Q4_K:
      layout = {256, 144};
      return true;
    case GgmlType::Q5_K:
      layout = {256, 176};
      return true;
    case GgmlType::Q6_K:
      layout = {256, 210};
      return true;
    case GgmlType::Q8_K:
      layout = {256, 292};
      return true;
  }
  return false;
}

class Reader {
 public:
  Reader(const std::string& path, const uint8_t* data, size_t size)
      : path_(path), data_(data), size_(size) {}

  template <typename T>
  T read() {
    need(sizeof(T));
    T value;
    std::memcpy(&value, data_ + offset_, sizeof(T));
    offset_ += sizeof(T);
    return value;
  }

  std::string read_string() {
    const uint64_t length = read<uint64_t>();
    need(length);
    std::string text(reinterpret_cast<const char*>(data_ + offset_), length);
    offset_ += length;
    return text;
  }

  nlohmann::json read_value(uint32_t type, const std::string& key, int depth = 0) {
    switch (type) {
      case kU8:
        return read<uint8_t>();
      case kI8:
        return read<int8_t>();
      case kU16:
        return read<uint16_t>();
      case kI16:
        return read<int16_t>();
      case kU32:
        return read<uint32_t>();
      case kI32:
        return read<int32_t>();
      case kF32:
        return read<float>();
      case kBool:
        return read<uint8_t>() != 0;
      case kString:
        return read_string();
      case kU64:
        return read<uint64_t>();
      case kI64:
        return read<int64_t>();
      case kF64:
        return read<double>();
      case kArray: {
        if (depth > 0) fail("{}: metadata '{}': nested arrays are not supported", path_, key);
        const uint32_t element_type = read<uint32_t>();
        const uint64_t count = read<uint64_t>();
        if (count > size_)
          fail("{}: metadata '{}': array length {} is impossible", path_, key, count);
        nlohmann::json array = nlohmann::json::array();
        array.get_ref<nlohmann::json::array_t&>().reserve(count);
        for (uint64_t i = 0; i < count; ++i)
          array.push_back(read_value(element_type, key, depth + 1));
        return array;
      }
      default:
        fail("{}: metadata '{}': unknown value type {}", path_, key, type);
    }
  }

  size_t offset() const { return offset_; }

 private:
  void need(uint64_t bytes) {
    if (bytes > size_ || offset_ > size_ - bytes) {
      fail("{}: truncated GGUF header (needs {} more bytes at offset {}, file has {})", path_,
           bytes, offset_, size_);
    }
  }

  const std::string& path_;
  const uint8_t* data_;
  size_t size_;
  size_t offset_ = 0;
};

}  // namespace

std::string ggml_type_name(uint32_t type) {
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::F32:
      return "F32";
    case GgmlType::F16:
      return "F16";
    case GgmlType::BF16:
      return "BF16";
    case GgmlType::F64:
      return "F64";
    case GgmlType::I8:
      return "I8";
    case GgmlType::I16:
      return "I16";
    case GgmlType::I32:
      return "I32";
    case GgmlType::I64:
      return "I64";
    case GgmlType::Q4_0:
      return "Q4_0";
    case GgmlType::Q4_1:
      return "Q4_1";
    case GgmlType::Q5_0:
      return "Q5_0";
    case GgmlType::Q5_1:
      return "Q5_1";
    case GgmlType::Q8_0:
      return "Q8_0";
    case GgmlType::Q8_1:
      return "Q8_1";
    case GgmlType::Q2_K:
      return "Q2_K";
    case GgmlType::Q3_K:
      return "Q3_K";
    case GgmlType::Q4_K:
      return "Q4_K";
    case GgmlType::Q5_K:
      return "Q5_K";
    case GgmlType::Q6_K:
      return "Q6_K";
    case GgmlType::Q8_K:
      return "Q8_K";
  }
  return "type " + std::to_string(type);
}

int64_t GgufTensor::numel() const {
  int64_t count = 1;
  for (int64_t dim : dims) count *= dim;
  return count;
}

GgufFile::GgufFile(const std::string& path) : file_(path) {
  Reader reader(path, file_.data(), file_.size());
  const uint32_t magic = reader.read<uint32_t>();
  if (magic != 0x46554747u) fail("{}: not a GGUF file (bad magic)", path);
  version_ = reader.read<uint32_t>();
  if (version_ != 2 && version_ != 3) {
    fail("{}: GGUF version {} is not supported (2 or 3)", path, version_);
  }
  const uint64_t tensor_count = reader.read<uint64_t>();
  const uint64_t kv_count = reader.read<uint64_t>();
  if (tensor_count > file_.size() || kv_count > file_.size()) {
    fail("{}: impossible tensor or key counts ({}, {})", path, tensor_count, kv_count);
  }
  for (uint64_t i = 0; i < kv_count; ++i) {
    std::string key = reader.read_string();
    const uint32_t type = reader.read<uint32_t>();
    metadata_[key] = reader.read_value(type, key);
  }
  struct Info {
    GgufTensor tensor;
    uint64_t offset;
  };
  std::vector<Info> infos;
  for (uint64_t i = 0; i < tensor_count; ++i) {
    Info info;
    info.tensor.name = reader.read_string();
    const uint32_t rank = reader.read<uint32_t>();
    if (rank > 4)
      fail("{}: tensor '{}' has {} dimensions (at most 4)", path, info.tensor.name, rank);
    for (uint32_t d = 0; d < rank; ++d) info.tensor.dims.push_back(reader.read<int64_t>());
    info.tensor.type = reader.read<uint32_t>();
    info.offset = reader.read<uint64_t>();
    infos.push_back(std::move(info));
  }
  uint64_t alignment = 32;
  if (metadata_.contains("general.alignment")) {
    if (!metadata_["general.alignment"].is_number_unsigned()) {
      fail("{}: general.alignment is not an unsigned integer", path);
    }
    alignment = metadata_["general.alignment"].get<uint64_t>();
  }
  // Past 1 MiB an alignment is no real file's, and rounding up to it could overflow.
  if (alignment == 0 || (alignment & (alignment - 1)) != 0 || alignment > (uint64_t{1} << 20)) {
    fail("{}: general.alignment {} is not a power of two up to 1 MiB", path, alignment);
  }
  const uint64_t data_start = (reader.offset() + alignment - 1) / alignment * alignment;
  for (auto& info : infos) {
    GgufTensor& tensor = info.tensor;
    TypeLayout layout{};
    if (!type_layout(tensor.type, layout)) {
      fail("{}: tensor '{}' has unknown ggml type {}", path, tensor.name, tensor.type);
    }
    if (tensor.dims.empty() || tensor.dims[0] % layout.block_elements != 0) {
      fail("{}: tensor '{}': first dimension is not a multiple of the {} block size {}", path,
           tensor.name, ggml_type_name(tensor.type), layout.block_elements);
    }
    // Checked products: dimensions from the file could overflow the element and byte counts,
    // and a wrapped count would pass the bounds check below.
    int64_t elements = 1;
    for (int64_t dim : tensor.dims) {
      if (dim < 0) fail("{}: tensor '{}' has a negative dimension", path, tensor.name);
      if (__builtin_mul_overflow(elements, dim, &elements)) {
        fail("{}: tensor '{}' has more elements than an int64 holds", path, tensor.name);
      }
    }
    uint64_t nbytes = 0;
    if (__builtin_mul_overflow(static_cast<uint64_t>(elements / layout.block_elements),
                               static_cast<uint64_t>(layout.block_bytes), &nbytes)) {
      fail("{}: tensor '{}' has more bytes than a file can hold", path, tensor.name);
    }
    tensor.nbytes = static_cast<size_t>(nbytes);
    if (data_start > file_.size() || info.offset > file_.size() - data_start ||
        tensor.nbytes > file_.size() - data_start - info.offset) {
      fail("{}: tensor '{}' ({} bytes at offset {}) runs past the end of the file (truncated?)",
           path, tensor.name, tensor.nbytes, info.offset);
    }
    tensor.data = file_.data() + data_start + info.offset;
    tensors_.push_back(std::move(tensor));
  }
}

const GgufTensor* GgufFile::find(const std::string& name) const {
  for (const auto& tensor : tensors_) {
    if (tensor.name == name) return &tensor;
  }
  return nullptr;
}

std::string GgufFile::get_string(const std::string& key) const {
  if (!metadata_.contains(key) || !metadata_[key].is_string()) {
    fail("{}: metadata '{}' is missing or not a string", path(), key);
  }
  return metadata_[key].get<std::string>();
}

int64_t GgufFile::get_int(const std::string& key) const {
  if (!metadata_.contains(key) || !metadata_[key].is_number_integer()) {
    fail("{}: metadata '{}' is missing or not an integer", path(), key);
  }
  return metadata_[key].get<int64_t>();
}

double GgufFile::get_float(const std::string& key) const {
  if (!metadata_.contains(key) || !metadata_[key].is_number()) {
    fail("{}: metadata '{}' is missing or not a number", path(), key);
  }
  return metadata_[key].get<double>();
}

}  // namespace dspark
