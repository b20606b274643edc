#include "formats/safetensors.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "base/error.h"

namespace dspark {
namespace {

// MLX refuses headers above 100 MB; a larger length means a corrupt or foreign file.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

uint64_t read_u64_le(const uint8_t* bytes) {
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = (value << 8) | bytes[i];
  return value;
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path) : file_(path) {
  const size_t file_size = file_.size();
  if (file_size < 8)
    fail("{}: truncated safetensors file ({} bytes, no header length)", path, file_size);
  const uint64_t header_bytes = read_u64_le(file_.data());
  if (header_bytes > kMaxHeaderBytes) {
    fail("{}: safetensors header length {} exceeds the {} byte limit", path, header_bytes,
         kMaxHeaderBytes);
  }
  if (8 + header_bytes > file_size) {
    fail("{}: safetensors header length {} runs past the end of the file ({} bytes)", path,
         header_bytes, file_size);
  }
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(file_.data() + 8, file_.data() + 8 + header_bytes);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: safetensors header is not valid JSON: {}", path, e.what());
  }
  if (!header.is_object()) fail("{}: safetensors header is not a JSON object", path);

  const uint64_t buffer_start = 8 + header_bytes;
  const uint64_t buffer_size = file_size - buffer_start;
  std::vector<std::pair<uint64_t, uint64_t>> extents;
  std::vector<std::string> extent_names;
  for (auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (entry.is_null()) continue;  // mx.save_safetensors writes null when given no metadata
      if (!entry.is_object()) fail("{}: __metadata__ is not an object", path);
      for (auto& [key, value] : entry.items()) {
        if (!value.is_string()) fail("{}: __metadata__ value '{}' is not a string", path, key);
        metadata_[key] = value.get<std::string>();
      }
      continue;
    }
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") ||
        !entry.contains("data_offsets")) {
      fail("{}: tensor '{}': header entry needs dtype, shape and data_offsets", path, name);
    }
    const auto& dtype_field = entry["dtype"];
    if (!dtype_field.is_string()) fail("{}: tensor '{}': dtype is not a string", path, name);
    auto dtype = parse_dtype(dtype_field.get<std::string>());
    if (!dtype) {
      fail("{}: tensor '{}': unknown dtype '{}'", path, name, dtype_field.get<std::string>());
    }
    TensorView view;
    view.name = name;
    view.dtype = *dtype;
    const auto& shape = entry["shape"];
    if (!shape.is_array()) fail("{}: tensor '{}': shape is not an array", path, name);
    uint64_t elements = 1;
    for (const auto& dim : shape) {
      if (!dim.is_number_integer() || dim.get<int64_t>() < 0) {
        fail("{}: tensor '{}': shape {} has a non-integer or negative dimension", path, name,
             shape.dump());
      }
      const uint64_t extent = dim.get<uint64_t>();
      if (extent != 0 && elements > UINT64_MAX / extent) {
        fail("{}: tensor '{}': shape {} overflows", path, name, shape.dump());
      }
      elements *= extent;
      view.shape.push_back(static_cast<int64_t>(extent));
    }
    const auto& offsets = entry["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned()) {
      fail("{}: tensor '{}': data_offsets must be two non-negative integers", path, name);
    }
    const uint64_t begin = offsets[0].get<uint64_t>();
    const uint64_t end = offsets[1].get<uint64_t>();
    if (end < begin)
      fail("{}: tensor '{}': data_offsets [{}, {}] end before begin", path, name, begin, end);
    if (end > buffer_size) {
      fail(
          "{}: tensor '{}': data_offsets [{}, {}] run past the end of the data ({} bytes; file "
          "truncated?)",
          path, name, begin, end, buffer_size);
    }
    const uint64_t expected_bytes = elements * dtype_size(*dtype);
    if (end - begin != expected_bytes) {
      fail("{}: tensor '{}': shape {} of {} needs {} bytes but data_offsets give {}", path, name,
           shape_string(view.shape), dtype_name(*dtype), expected_bytes, end - begin);
    }
    view.data = file_.data() + buffer_start + begin;
    view.nbytes = end - begin;
    extents.emplace_back(begin, end);
    extent_names.push_back(name);
    tensors_.emplace(name, std::move(view));
  }
  std::vector<size_t> order(extents.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return extents[a] < extents[b]; });
  for (size_t i = 1; i < order.size(); ++i) {
    const auto& previous = extents[order[i - 1]];
    const auto& current = extents[order[i]];
    if (current.first < previous.second && current.first != current.second &&
        previous.first != previous.second) {
      fail("{}: tensors '{}' [{}, {}] and '{}' [{}, {}] overlap", path, extent_names[order[i - 1]],
           previous.first, previous.second, extent_names[order[i]], current.first, current.second);
    }
  }
}

void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& tensor : tensors) {
    uint64_t elements = 1;
    for (int64_t dim : tensor.shape) elements *= static_cast<uint64_t>(dim);
    if (elements * dtype_size(tensor.dtype) != tensor.nbytes) {
      fail("{}: tensor '{}': shape {} of {} needs {} bytes, given {}", path, tensor.name,
           shape_string(tensor.shape), dtype_name(tensor.dtype),
           elements * dtype_size(tensor.dtype), tensor.nbytes);
    }
    header[tensor.name] = {{"dtype", std::string(dtype_name(tensor.dtype))},
                           {"shape", tensor.shape},
                           {"data_offsets", {offset, offset + tensor.nbytes}}};
    offset += tensor.nbytes;
  }
  std::string header_text = header.dump();
  while ((8 + header_text.size()) % 8 != 0) header_text.push_back(' ');

  const std::string partial = path + ".partial";
  {
    std::ofstream out(partial, std::ios::binary | std::ios::trunc);
    if (!out) fail("{}: cannot create file", partial);
    uint8_t length[8];
    uint64_t header_size = header_text.size();
    for (int i = 0; i < 8; ++i) length[i] = static_cast<uint8_t>(header_size >> (8 * i));
    out.write(reinterpret_cast<const char*>(length), 8);
    out.write(header_text.data(), static_cast<std::streamsize>(header_text.size()));
    for (const auto& tensor : tensors) {
      out.write(static_cast<const char*>(tensor.data), static_cast<std::streamsize>(tensor.nbytes));
    }
    out.flush();
    if (!out) fail("{}: write failed (disk full?)", partial);
  }
  if (std::rename(partial.c_str(), path.c_str()) != 0) {
    fail("{}: cannot move into place from {}", path, partial);
  }
}

}  // namespace dspark
