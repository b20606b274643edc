#include "convert/hf_to_mlx.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <vector>

#include "base/error.h"
#include "base/mapped_file.h"
#include "convert/hf_layout.h"
#include "formats/checkpoint.h"
#include "formats/safetensors.h"
#include "kernels/quant.h"

namespace dspark {
namespace fs = std::filesystem;
namespace {

// Elements converted per step: bounds the working memory whatever the tensor's size.
constexpr int64_t kChunkElements = int64_t{1} << 22;

const char* kCopiedFiles[] = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                              "chat_template.jinja", "generation_config.json"};

bool is_float(DType dtype) {
  return dtype == DType::F32 || dtype == DType::F16 || dtype == DType::BF16;
}

std::optional<DType> conversion_dtype(const std::string& name) {
  if (name == "float16") return DType::F16;
  if (name == "bfloat16") return DType::BF16;
  if (name == "float32") return DType::F32;
  return std::nullopt;
}

// The dtype mlx-lm's convert casts to: the option, else config.json's torch_dtype, else the
// text_config's dtype; none (tensors keep their own dtype) when that is not one of the three.
std::optional<DType> target_dtype(const HfConversionOptions& options,
                                  const nlohmann::json& config) {
  if (!options.dtype.empty()) {
    auto dtype = conversion_dtype(options.dtype);
    if (!dtype) {
      fail("conversion dtype '{}' is not one of float16, bfloat16, float32", options.dtype);
    }
    return dtype;
  }
  const nlohmann::json* named = nullptr;
  if (config.contains("torch_dtype") && !config["torch_dtype"].is_null()) {
    named = &config["torch_dtype"];
  } else if (config.contains("text_config") && config["text_config"].is_object() &&
             config["text_config"].contains("dtype")) {
    named = &config["text_config"]["dtype"];
  }
  if (named == nullptr || !named->is_string()) return std::nullopt;
  return conversion_dtype(named->get<std::string>());
}

struct PlannedParameter {
  const HfParameter* spec = nullptr;
  std::vector<const TensorView*> sources;
  DType source_dtype = DType::F32;
  DType dtype = DType::F32;  // as written (scales and biases too, when quantized)
  bool quantized = false;
  int64_t numel() const {
    int64_t count = 1;
    for (int64_t dim : spec->shape) count *= dim;
    return count;
  }
  int64_t cols() const { return spec->shape.back(); }
  // The bytes can be written straight from the memory-mapped source.
  bool verbatim() const { return !quantized && sources.size() == 1 && dtype == source_dtype; }
};

enum class Part { whole, packed, scales, biases };

struct OutputTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  int64_t nbytes = 0;
  size_t parameter = 0;
  Part part = Part::whole;
};

int64_t byte_size(DType dtype, const std::vector<int64_t>& shape) {
  int64_t count = static_cast<int64_t>(dtype_size(dtype));
  for (int64_t dim : shape) count *= dim;
  return count;
}

std::string joined(const std::vector<std::string>& names, size_t limit) {
  std::string text;
  for (size_t i = 0; i < names.size() && i < limit; ++i) text += (i ? ", " : "") + names[i];
  if (names.size() > limit) text += fmt::format(" and {} more", names.size() - limit);
  return text;
}

// Resolves a layout parameter against the checkpoint: picks its sources, checks their shapes and
// dtypes, and decides its output dtype and whether it is quantized, as mlx-lm would.
std::optional<PlannedParameter> plan_parameter(const Checkpoint& checkpoint,
                                               const HfParameter& spec, std::optional<DType> target,
                                               const HfConversionOptions& options) {
  const std::vector<std::string>* names = nullptr;
  for (const auto& alternative : spec.sources) {
    if (checkpoint.has(alternative.front())) {
      names = &alternative;
      break;
    }
  }
  if (names == nullptr) {
    if (spec.optional) return std::nullopt;
    fail("{}: missing tensor '{}' (for the MLX parameter '{}')", checkpoint.path(),
         spec.sources.front().front(), spec.name);
  }
  PlannedParameter plan;
  plan.spec = &spec;
  const bool stacked = names->size() > 1;
  std::vector<int64_t> expected = spec.shape;
  if (stacked) expected.erase(expected.begin());
  for (const auto& name : *names) {
    const TensorView& view = checkpoint.tensor(name);
    const bool conv_hf_shape = spec.conv_weight && view.rank() == 3 && view.shape[1] == 1 &&
                               view.shape[0] == expected[0] && view.shape[2] == expected[1];
    if (view.shape != expected && !conv_hf_shape) {
      fail("{}: tensor '{}' has shape {}, expected {} for '{}'", checkpoint.path(), name,
           shape_string(view.shape), shape_string(expected), spec.name);
    }
    if (plan.sources.empty()) {
      plan.source_dtype = view.dtype;
    } else if (view.dtype != plan.source_dtype) {
      fail("{}: tensor '{}' is {} but '{}' is {}; the stacked experts must share one dtype",
           checkpoint.path(), name, dtype_name(view.dtype), names->front(),
           dtype_name(plan.source_dtype));
    }
    plan.sources.push_back(&view);
  }
  const bool floating = is_float(plan.source_dtype);
  if (!floating && (plan.source_dtype == DType::F64 || plan.source_dtype == DType::F8_E4M3 ||
                    plan.source_dtype == DType::F8_E5M2)) {
    fail("{}: tensor '{}' is {}; dspark converts F32, F16 and BF16 weights", checkpoint.path(),
         names->front(), dtype_name(plan.source_dtype));
  }
  plan.dtype = (target && spec.castable && floating) ? *target : plan.source_dtype;
  plan.quantized = spec.quantizable && plan.cols() % options.group_size == 0;
  if (spec.quantizable && !floating) {
    fail("{}: tensor '{}' is {}, not a float weight that can be quantized", checkpoint.path(),
         names->front(), dtype_name(plan.source_dtype));
  }
  return plan;
}

std::vector<OutputTensor> output_tensors(const std::vector<PlannedParameter>& plan,
                                         const HfConversionOptions& options) {
  std::vector<OutputTensor> outputs;
  for (size_t index = 0; index < plan.size(); ++index) {
    const PlannedParameter& parameter = plan[index];
    const HfParameter& spec = *parameter.spec;
    if (!parameter.quantized) {
      outputs.push_back({spec.name, parameter.dtype, spec.shape,
                         byte_size(parameter.dtype, spec.shape), index, Part::whole});
      continue;
    }
    const std::string module =
        spec.name.substr(0, spec.name.size() - std::string(".weight").size());
    std::vector<int64_t> packed = spec.shape;
    packed.back() = parameter.cols() * options.bits / 32;
    std::vector<int64_t> groups = spec.shape;
    groups.back() = parameter.cols() / options.group_size;
    outputs.push_back({module + ".weight", DType::U32, packed, byte_size(DType::U32, packed), index,
                       Part::packed});
    for (auto [suffix, part] :
         {std::pair{".scales", Part::scales}, std::pair{".biases", Part::biases}}) {
      outputs.push_back({module + suffix, parameter.dtype, groups,
                         byte_size(parameter.dtype, groups), index, part});
    }
  }
  return outputs;
}

// mlx-lm's make_shards: tensors in order, a new shard whenever the next one would not fit.
std::vector<std::vector<size_t>> split_shards(const std::vector<OutputTensor>& outputs,
                                              int64_t max_shard_bytes) {
  std::vector<std::vector<size_t>> shards;
  int64_t shard_bytes = 0;
  for (size_t index = 0; index < outputs.size(); ++index) {
    if (shards.empty() || shard_bytes + outputs[index].nbytes > max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(index);
    shard_bytes += outputs[index].nbytes;
  }
  return shards;
}

// A file that converted tensors are written into at known offsets, then memory-mapped for
// write_safetensors; removed when it goes out of scope.
class ScratchFile {
 public:
  explicit ScratchFile(std::string path) : path_(std::move(path)) {
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd_ < 0) fail("{}: cannot create: {}", path_, std::strerror(errno));
  }
  ~ScratchFile() {
    if (fd_ >= 0) ::close(fd_);
    ::unlink(path_.c_str());
  }
  ScratchFile(const ScratchFile&) = delete;
  ScratchFile& operator=(const ScratchFile&) = delete;

  const std::string& path() const { return path_; }

  void write_at(int64_t offset, const void* data, int64_t size) {
    const auto* bytes = static_cast<const uint8_t*>(data);
    while (size > 0) {
      const ssize_t written = ::pwrite(fd_, bytes, static_cast<size_t>(size), offset);
      if (written < 0) {
        if (errno == EINTR) continue;
        fail("{}: write failed: {}", path_, std::strerror(errno));
      }
      bytes += written;
      offset += written;
      size -= written;
    }
  }

 private:
  std::string path_;
  int fd_ = -1;
};

// Reads elements [first, first + count) of a planned parameter as fp32, across its stacked
// sources, rounded to the output dtype the way a cast to it would round them.
void read_floats(const PlannedParameter& parameter, int64_t first, int64_t count, float* out) {
  const int64_t per_source = parameter.numel() / static_cast<int64_t>(parameter.sources.size());
  while (count > 0) {
    const TensorView& view = *parameter.sources[first / per_source];
    const int64_t local = first % per_source;
    const int64_t n = std::min(count, per_source - local);
    const uint8_t* data = view.data + local * static_cast<int64_t>(dtype_size(view.dtype));
    switch (view.dtype) {
      case DType::BF16:
        kernels::bf16_to_f32(data, n, out);
        break;
      case DType::F16:
        kernels::f16_to_f32(data, n, out);
        break;
      default:
        std::memcpy(out, data, static_cast<size_t>(n) * sizeof(float));
        break;
    }
    if (parameter.dtype == DType::BF16 && view.dtype != DType::BF16) {
      for (int64_t i = 0; i < n; ++i) out[i] = round_to_bf16(out[i]);
    } else if (parameter.dtype == DType::F16 && view.dtype != DType::F16) {
      for (int64_t i = 0; i < n; ++i) out[i] = f16_to_f32(f32_to_f16(out[i]));
    }
    first += n;
    count -= n;
    out += n;
  }
}

void encode_floats(const float* values, int64_t count, DType dtype, uint8_t* out) {
  switch (dtype) {
    case DType::BF16:
      kernels::f32_to_bf16(values, count, out);
      break;
    case DType::F16:
      for (int64_t i = 0; i < count; ++i) {
        const uint16_t bits = f32_to_f16(values[i]);
        std::memcpy(out + 2 * i, &bits, 2);
      }
      break;
    default:
      std::memcpy(out, values, static_cast<size_t>(count) * sizeof(float));
      break;
  }
}

// Writes the parts of one parameter that `offsets` asks for (part -> scratch offset).
void produce(const PlannedParameter& parameter, const std::map<Part, int64_t>& offsets,
             const HfConversionOptions& options, ScratchFile& scratch) {
  const int64_t total = parameter.numel();
  if (!parameter.quantized) {
    const int64_t offset = offsets.at(Part::whole);
    if (parameter.dtype == parameter.source_dtype) {
      int64_t written = 0;
      for (const TensorView* view : parameter.sources) {
        scratch.write_at(offset + written, view->data, static_cast<int64_t>(view->nbytes));
        written += static_cast<int64_t>(view->nbytes);
      }
      return;
    }
    const int64_t element_bytes = static_cast<int64_t>(dtype_size(parameter.dtype));
    std::vector<float> values(static_cast<size_t>(std::min(total, kChunkElements)));
    std::vector<uint8_t> encoded(values.size() * element_bytes);
    for (int64_t first = 0; first < total; first += kChunkElements) {
      const int64_t count = std::min(kChunkElements, total - first);
      read_floats(parameter, first, count, values.data());
      encode_floats(values.data(), count, parameter.dtype, encoded.data());
      scratch.write_at(offset + first * element_bytes, encoded.data(), count * element_bytes);
    }
    return;
  }
  const kernels::QuantFormat format{options.bits, options.group_size};
  const int64_t cols = parameter.cols();
  const int64_t rows = total / cols;
  const int64_t row_bytes = cols * options.bits / 8;
  const int64_t group_bytes =
      cols / options.group_size * static_cast<int64_t>(dtype_size(parameter.dtype));
  const int64_t chunk_rows = std::max<int64_t>(1, kChunkElements / cols);
  std::vector<float> values(static_cast<size_t>(std::min(rows, chunk_rows) * cols));
  std::vector<uint32_t> packed(static_cast<size_t>(std::min(rows, chunk_rows) * row_bytes / 4));
  std::vector<uint8_t> scales(static_cast<size_t>(std::min(rows, chunk_rows) * group_bytes));
  std::vector<uint8_t> biases(scales.size());
  for (int64_t row = 0; row < rows; row += chunk_rows) {
    const int64_t count = std::min(chunk_rows, rows - row);
    read_floats(parameter, row * cols, count * cols, values.data());
    kernels::quantize(values.data(), count, cols, format, parameter.dtype, packed.data(),
                      scales.data(), biases.data());
    for (auto [part, data, bytes_per_row] :
         {std::tuple{Part::packed, static_cast<const void*>(packed.data()), row_bytes},
          std::tuple{Part::scales, static_cast<const void*>(scales.data()), group_bytes},
          std::tuple{Part::biases, static_cast<const void*>(biases.data()), group_bytes}}) {
      auto found = offsets.find(part);
      if (found == offsets.end()) continue;
      scratch.write_at(found->second + row * bytes_per_row, data, count * bytes_per_row);
    }
  }
}

void write_shard(const std::string& path, const std::vector<size_t>& members,
                 const std::vector<OutputTensor>& outputs,
                 const std::vector<PlannedParameter>& plan, const HfConversionOptions& options) {
  // Tensors that need converting go to the scratch file; the others are written from the
  // checkpoint's memory map as they are.
  std::map<size_t, std::map<Part, int64_t>> scratch_parts;
  std::vector<int64_t> scratch_offset(outputs.size(), -1);
  int64_t scratch_bytes = 0;
  for (size_t index : members) {
    const OutputTensor& tensor = outputs[index];
    if (plan[tensor.parameter].verbatim()) continue;
    scratch_parts[tensor.parameter][tensor.part] = scratch_bytes;
    scratch_offset[index] = scratch_bytes;
    scratch_bytes += tensor.nbytes;
  }
  std::optional<ScratchFile> scratch;
  std::unique_ptr<MappedFile> scratch_map;
  if (scratch_bytes > 0) {
    scratch.emplace(path + ".scratch");
    for (const auto& [parameter, offsets] : scratch_parts) {
      produce(plan[parameter], offsets, options, *scratch);
    }
    scratch_map = std::make_unique<MappedFile>(scratch->path());
  }
  std::vector<TensorToWrite> tensors;
  for (size_t index : members) {
    const OutputTensor& tensor = outputs[index];
    const uint8_t* data = scratch_offset[index] >= 0 ? scratch_map->data() + scratch_offset[index]
                                                     : plan[tensor.parameter].sources[0]->data;
    tensors.push_back(
        {tensor.name, tensor.dtype, tensor.shape, data, static_cast<size_t>(tensor.nbytes)});
  }
  write_safetensors(path, tensors, {{"format", "mlx"}});
}

bool truthy(const nlohmann::json& value) {
  if (value.is_null()) return false;
  if (value.is_boolean()) return value.get<bool>();
  if (value.is_number()) return value.get<double>() != 0.0;
  if (value.is_string() || value.is_array() || value.is_object()) return !value.empty();
  return true;
}

// config.json as mlx-lm's load_config / quantize_model / save_config leave it.
nlohmann::json output_config(const nlohmann::json& source, const fs::path& input,
                             const HfConversionOptions& options) {
  nlohmann::json config = source;
  const fs::path generation = input / "generation_config.json";
  if (fs::exists(generation)) {
    try {
      const nlohmann::json values = read_json_file(generation.string());
      // Python truthiness: mlx-lm ignores an eos_token_id of 0, null or [].
      if (values.is_object() && values.contains("eos_token_id") && truthy(values["eos_token_id"])) {
        config["eos_token_id"] = values["eos_token_id"];
      }
    } catch (const Error&) {
      // mlx-lm ignores an unreadable generation_config.json as well (and still copies it).
    }
  }
  config.erase("_name_or_path");
  config.erase("vision_config");
  const nlohmann::json quantization = {
      {"group_size", options.group_size}, {"bits", options.bits}, {"mode", "affine"}};
  config["quantization"] = quantization;
  config["quantization_config"] = quantization;
  return config;
}

void write_json(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) fail("{}: cannot create", path.string());
  out << text;
  out.flush();
  if (!out) fail("{}: write failed", path.string());
}

// Removes the half-written output directory unless the conversion completes.
class StagingDirectory {
 public:
  explicit StagingDirectory(fs::path path) : path_(std::move(path)) {
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~StagingDirectory() {
    if (!committed_) {
      std::error_code ignored;
      fs::remove_all(path_, ignored);
    }
  }
  StagingDirectory(const StagingDirectory&) = delete;
  StagingDirectory& operator=(const StagingDirectory&) = delete;

  const fs::path& path() const { return path_; }
  void commit(const fs::path& destination) {
    fs::rename(path_, destination);
    committed_ = true;
  }

 private:
  fs::path path_;
  bool committed_ = false;
};

// Writes the shards, the index, config.json and the tokenizer files into a staging directory
// that becomes `output` once everything is in place.
void write_model(const fs::path& input, const fs::path& output,
                 const std::vector<PlannedParameter>& plan,
                 const std::vector<OutputTensor>& outputs, const nlohmann::json& config,
                 const HfConversionOptions& options, HfConversionSummary& summary) {
  const auto shards = split_shards(outputs, options.max_shard_bytes);
  StagingDirectory staging(output.string() + ".partial");
  int64_t total_parameters = 0;
  for (const auto& parameter : plan) {
    if (parameter.spec->counted) total_parameters += parameter.numel();
  }
  for (const auto& tensor : outputs) summary.output_bytes += tensor.nbytes;
  std::map<std::string, std::string> weight_map;
  for (size_t shard = 0; shard < shards.size(); ++shard) {
    const std::string file = shards.size() == 1 ? "model.safetensors"
                                                : fmt::format("model-{:05d}-of-{:05d}.safetensors",
                                                              shard + 1, shards.size());
    write_shard((staging.path() / file).string(), shards[shard], outputs, plan, options);
    for (size_t tensor : shards[shard]) weight_map[outputs[tensor].name] = file;
  }
  // mlx-lm writes the index even for a single file.
  nlohmann::ordered_json index;
  index["metadata"] = {{"total_size", summary.output_bytes},
                       {"total_parameters", total_parameters}};
  index["weight_map"] = weight_map;
  write_json(staging.path() / "model.safetensors.index.json", index.dump(4));
  write_json(staging.path() / "config.json", output_config(config, input, options).dump(4));
  for (const char* name : kCopiedFiles) {
    if (fs::exists(input / name)) fs::copy_file(input / name, staging.path() / name);
  }
  staging.commit(output);
  summary.tensors = static_cast<int64_t>(outputs.size());
  summary.shards = static_cast<int64_t>(shards.size());
}

}  // namespace

HfConversionSummary convert_hf_to_mlx(const std::string& input_dir, const std::string& output_dir,
                                      const HfConversionOptions& options) {
  if (options.bits != 2 && options.bits != 3 && options.bits != 4 && options.bits != 5 &&
      options.bits != 6 && options.bits != 8) {
    fail("{} bits: MLX affine quantization takes 2, 3, 4, 5, 6 or 8 bits", options.bits);
  }
  if (options.group_size != 32 && options.group_size != 64 && options.group_size != 128) {
    fail("group size {}: MLX affine quantization takes groups of 32, 64 or 128",
         options.group_size);
  }
  if (options.max_shard_bytes <= 0) fail("the shard size limit must be positive");
  const fs::path input(input_dir);
  const fs::path config_path = input / "config.json";
  if (!fs::is_directory(input)) fail("{}: not a checkpoint directory", input_dir);
  if (!fs::exists(config_path)) fail("{}: no config.json", input_dir);
  const fs::path output(output_dir);
  if (fs::exists(output)) {
    fail("{}: already exists; choose a new output directory", output_dir);
  }

  const Checkpoint checkpoint(input_dir);
  const nlohmann::json& config = checkpoint.config();
  for (const char* key : {"quantization", "quantization_config"}) {
    if (config.contains(key) && !config[key].is_null()) {
      fail(
          "{}: the checkpoint is already quantized ('{}'); dspark converts unquantized "
          "Hugging Face checkpoints",
          config_path.string(), key);
    }
  }
  const HfLayout layout = hf_layout(config, config_path.string());
  const std::optional<DType> target = target_dtype(options, config);

  HfConversionSummary summary;
  summary.architecture = layout.architecture;
  summary.dtype = target ? std::string(dtype_name(*target)) : "source";

  std::vector<PlannedParameter> plan;
  std::set<std::string> consumed;
  for (const HfParameter& spec : layout.parameters) {
    auto planned = plan_parameter(checkpoint, spec, target, options);
    if (!planned) continue;
    for (const TensorView* view : planned->sources) consumed.insert(view->name);
    if (spec.quantizable)
      ++(planned->quantized ? summary.quantized_modules : summary.unquantized_modules);
    plan.push_back(std::move(*planned));
  }
  std::vector<std::string> unexpected;
  for (const auto& name : checkpoint.names()) {
    if (consumed.count(name) == 0 && !layout.dropped(name)) unexpected.push_back(name);
  }
  if (!unexpected.empty()) {
    fail("{}: {} tensor(s) have no place in an MLX {} model: {}", input_dir, unexpected.size(),
         layout.architecture, joined(unexpected, 8));
  }

  const std::vector<OutputTensor> outputs = output_tensors(plan, options);
  try {
    write_model(input, output, plan, outputs, config, options, summary);
  } catch (const fs::filesystem_error& e) {
    fail("{}: {}", output_dir, e.what());
  }
  return summary;
}

}  // namespace dspark
