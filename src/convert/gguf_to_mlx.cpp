#include "convert/gguf_to_mlx.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <vector>

#include "base/error.h"
#include "convert/gguf_blocks.h"
#include "convert/gguf_tokenizer.h"
#include "formats/gguf.h"
#include "formats/safetensors.h"

namespace dspark {
namespace fs = std::filesystem;
namespace {

const char* kSupportedTypes = "F32, F16, BF16, Q4_0, Q4_1, Q8_0";

struct OutputTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

// GGUF tensor name -> MLX/HF module path (without ".weight") for llama-family models.
std::string mlx_module_name(const std::string& gguf_name) {
  static const std::map<std::string, std::string> kTop = {
      {"token_embd", "model.embed_tokens"}, {"output_norm", "model.norm"}, {"output", "lm_head"}};
  static const std::map<std::string, std::string> kLayer = {
      {"attn_norm", "input_layernorm"},    {"attn_q", "self_attn.q_proj"},
      {"attn_k", "self_attn.k_proj"},      {"attn_v", "self_attn.v_proj"},
      {"attn_output", "self_attn.o_proj"}, {"attn_q_norm", "self_attn.q_norm"},
      {"attn_k_norm", "self_attn.k_norm"}, {"ffn_norm", "post_attention_layernorm"},
      {"ffn_gate", "mlp.gate_proj"},       {"ffn_up", "mlp.up_proj"},
      {"ffn_down", "mlp.down_proj"},
  };
  static const std::regex kLayerPattern(R"(blk\.(\d+)\.(\w+))");
  auto found = kTop.find(gguf_name);
  if (found != kTop.end()) return found->second;
  std::smatch match;
  if (std::regex_match(gguf_name, match, kLayerPattern)) {
    auto part = kLayer.find(match[2].str());
    if (part != kLayer.end()) return "model.layers." + match[1].str() + "." + part->second;
  }
  return "";
}

// llama.cpp stores llama q/k rows permuted for its interleaved RoPE: GGUF row (head, i, j) with
// i < head_dim/2, j < 2 holds HF row (head, j, i). Returns, for each HF row, its GGUF row.
std::vector<int64_t> unpermute_rows(int64_t rows, int64_t heads) {
  const int64_t head_dim = rows / heads;
  const int64_t half = head_dim / 2;
  std::vector<int64_t> source(rows);
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t j = 0; j < 2; ++j) {
      for (int64_t i = 0; i < half; ++i)
        source[h * head_dim + j * half + i] = h * head_dim + i * 2 + j;
    }
  }
  return source;
}

void convert_quantized(const GgufFile& gguf, const GgufTensor& tensor, const std::string& module,
                       const std::vector<int64_t>& row_source, std::vector<OutputTensor>& out,
                       int& bits) {
  const int64_t cols = tensor.dims[0];
  const int64_t rows = tensor.numel() / cols;
  const int64_t groups = cols / gguf_blocks::kBlock;
  int64_t block_bytes = 0;
  bool (*unpack)(const uint8_t*, uint8_t*, uint16_t&, uint16_t&) = nullptr;
  switch (static_cast<GgmlType>(tensor.type)) {
    case GgmlType::Q4_0:
      bits = 4;
      block_bytes = gguf_blocks::kQ4_0Bytes;
      unpack = gguf_blocks::q4_0_block;
      break;
    case GgmlType::Q4_1:
      bits = 4;
      block_bytes = gguf_blocks::kQ4_1Bytes;
      unpack = gguf_blocks::q4_1_block;
      break;
    case GgmlType::Q8_0:
      bits = 8;
      block_bytes = gguf_blocks::kQ8_0Bytes;
      unpack = gguf_blocks::q8_0_block;
      break;
    default:
      fail("{}: tensor '{}' unexpected type", gguf.path(), tensor.name);
  }
  const int64_t words_per_row = cols * bits / 32;
  OutputTensor weight{module + ".weight", DType::U32, {rows, words_per_row}, {}};
  OutputTensor scales{module + ".scales", DType::F16, {rows, groups}, {}};
  OutputTensor biases{module + ".biases", DType::F16, {rows, groups}, {}};
  weight.bytes.resize(rows * words_per_row * 4);
  scales.bytes.resize(rows * groups * 2);
  biases.bytes.resize(rows * groups * 2);
  auto* words = reinterpret_cast<uint32_t*>(weight.bytes.data());
  auto* scale_bits = reinterpret_cast<uint16_t*>(scales.bytes.data());
  auto* bias_bits = reinterpret_cast<uint16_t*>(biases.bytes.data());
  uint8_t codes[32];
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t source_row = row_source.empty() ? row : row_source[row];
    const uint8_t* row_blocks = tensor.data + source_row * groups * block_bytes;
    for (int64_t g = 0; g < groups; ++g) {
      if (!unpack(row_blocks + g * block_bytes, codes, scale_bits[row * groups + g],
                  bias_bits[row * groups + g])) {
        fail("{}: tensor '{}' row {} block {}: the MLX bias overflows f16", gguf.path(),
             tensor.name, row, g);
      }
      gguf_blocks::pack_codes(codes, bits, words + row * words_per_row + g * bits);
    }
  }
  out.push_back(std::move(weight));
  out.push_back(std::move(scales));
  out.push_back(std::move(biases));
}

void convert_plain(const GgufTensor& tensor, const std::string& module,
                   const std::vector<int64_t>& row_source, std::vector<OutputTensor>& out) {
  DType dtype = DType::F32;
  if (tensor.type == static_cast<uint32_t>(GgmlType::F16)) dtype = DType::F16;
  if (tensor.type == static_cast<uint32_t>(GgmlType::BF16)) dtype = DType::BF16;
  std::vector<int64_t> shape(tensor.dims.rbegin(), tensor.dims.rend());
  OutputTensor result{module + ".weight", dtype, shape, {}};
  result.bytes.resize(tensor.nbytes);
  if (row_source.empty()) {
    std::memcpy(result.bytes.data(), tensor.data, tensor.nbytes);
  } else {
    const size_t row_bytes = tensor.nbytes / row_source.size();
    for (size_t row = 0; row < row_source.size(); ++row) {
      std::memcpy(result.bytes.data() + row * row_bytes, tensor.data + row_source[row] * row_bytes,
                  row_bytes);
    }
  }
  out.push_back(std::move(result));
}

void write_json(const fs::path& path, const nlohmann::ordered_json& value) {
  std::ofstream out(path);
  if (!out) fail("{}: cannot write", path.string());
  out << value.dump(2) << "\n";
}

}  // namespace

GgufConversionSummary convert_gguf_to_mlx(const std::string& gguf_path,
                                          const std::string& output_dir) {
  GgufFile gguf(gguf_path);
  GgufConversionSummary summary;
  summary.architecture = gguf.get_string("general.architecture");
  const std::string& arch = summary.architecture;
  if (arch != "llama" && arch != "qwen2" && arch != "qwen3") {
    fail("{}: GGUF architecture '{}' cannot be converted (supported: llama, qwen2, qwen3)",
         gguf_path, arch);
  }
  const int64_t hidden = gguf.get_int(arch + ".embedding_length");
  const int64_t heads = gguf.get_int(arch + ".attention.head_count");
  const int64_t kv_heads = gguf.has(arch + ".attention.head_count_kv")
                               ? gguf.get_int(arch + ".attention.head_count_kv")
                               : heads;
  const int64_t layers = gguf.get_int(arch + ".block_count");
  const GgufTensor* embedding = gguf.find("token_embd.weight");
  if (embedding == nullptr) fail("{}: no token_embd.weight tensor", gguf_path);
  const int64_t vocab = embedding->dims.size() == 2 ? embedding->dims[1] : 0;
  const int64_t head_dim = gguf.has(arch + ".attention.key_length")
                               ? gguf.get_int(arch + ".attention.key_length")
                               : hidden / heads;

  std::vector<OutputTensor> outputs;
  nlohmann::ordered_json quantization;
  quantization["group_size"] = gguf_blocks::kBlock;
  quantization["bits"] = 4;
  quantization["mode"] = "affine";
  std::map<std::string, int> module_bits;
  for (const auto& tensor : gguf.tensors()) {
    if (tensor.name == "rope_freqs.weight") continue;  // recomputed from the config's rope_scaling
    const std::string suffix = ".weight";
    if (tensor.name.size() <= suffix.size() ||
        tensor.name.compare(tensor.name.size() - suffix.size(), suffix.size(), suffix) != 0) {
      fail("{}: tensor '{}' is not a weight dspark knows how to place", gguf_path, tensor.name);
    }
    const std::string stem = tensor.name.substr(0, tensor.name.size() - suffix.size());
    const std::string module = mlx_module_name(stem);
    if (module.empty()) fail("{}: tensor '{}' has no MLX counterpart", gguf_path, tensor.name);
    std::vector<int64_t> row_source;
    if (arch == "llama" && (stem.ends_with(".attn_q") || stem.ends_with(".attn_k"))) {
      const int64_t rows = tensor.numel() / tensor.dims[0];
      row_source = unpermute_rows(rows, stem.ends_with(".attn_q") ? heads : kv_heads);
    }
    switch (static_cast<GgmlType>(tensor.type)) {
      case GgmlType::Q4_0:
      case GgmlType::Q4_1:
      case GgmlType::Q8_0: {
        int bits = 0;
        convert_quantized(gguf, tensor, module, row_source, outputs, bits);
        module_bits[module] = bits;
        ++summary.quantized_tensors;
        break;
      }
      case GgmlType::F32:
      case GgmlType::F16:
      case GgmlType::BF16:
        convert_plain(tensor, module, row_source, outputs);
        break;
      default:
        fail("{}: tensor '{}' has GGUF type {}, which dspark cannot convert; supported types: {}",
             gguf_path, tensor.name, ggml_type_name(tensor.type), kSupportedTypes);
    }
    ++summary.tensors;
  }
  int fours = 0, eights = 0;
  for (const auto& [module, bits] : module_bits) (bits == 4 ? fours : eights) += 1;
  const int global_bits = eights > fours ? 8 : 4;
  quantization["bits"] = global_bits;
  for (const auto& [module, bits] : module_bits) {
    if (bits != global_bits) {
      quantization[module] = {
          {"group_size", gguf_blocks::kBlock}, {"bits", bits}, {"mode", "affine"}};
    }
  }

  fs::create_directories(output_dir);
  const fs::path dir(output_dir);
  std::vector<TensorToWrite> to_write;
  for (const auto& tensor : outputs) {
    to_write.push_back(
        {tensor.name, tensor.dtype, tensor.shape, tensor.bytes.data(), tensor.bytes.size()});
    summary.output_bytes += static_cast<int64_t>(tensor.bytes.size());
  }
  std::sort(to_write.begin(), to_write.end(),
            [](const TensorToWrite& a, const TensorToWrite& b) { return a.name < b.name; });
  write_safetensors((dir / "model.safetensors").string(), to_write, {{"format", "mlx"}});

  nlohmann::ordered_json config;
  const bool qwen = arch != "llama";
  config["architectures"] = {arch == "llama"   ? "LlamaForCausalLM"
                             : arch == "qwen2" ? "Qwen2ForCausalLM"
                                               : "Qwen3ForCausalLM"};
  config["model_type"] = arch;
  config["hidden_size"] = hidden;
  config["intermediate_size"] = gguf.get_int(arch + ".feed_forward_length");
  config["num_hidden_layers"] = layers;
  config["num_attention_heads"] = heads;
  config["num_key_value_heads"] = kv_heads;
  config["head_dim"] = head_dim;
  config["rms_norm_eps"] = gguf.get_float(arch + ".attention.layer_norm_rms_epsilon");
  config["rope_theta"] =
      gguf.has(arch + ".rope.freq_base") ? gguf.get_float(arch + ".rope.freq_base") : 10000.0;
  config["max_position_embeddings"] = gguf.get_int(arch + ".context_length");
  config["vocab_size"] = vocab;
  config["tie_word_embeddings"] = gguf.find("output.weight") == nullptr;
  config["attention_bias"] = gguf.find("blk.0.attn_q.bias") != nullptr;
  if (qwen && gguf.find("blk.0.attn_q.bias") != nullptr) {
    fail("{}: attention biases (blk.N.attn_q.bias) are not converted yet", gguf_path);
  }
  if (gguf.has("tokenizer.ggml.bos_token_id"))
    config["bos_token_id"] = gguf.get_int("tokenizer.ggml.bos_token_id");
  if (gguf.has("tokenizer.ggml.eos_token_id"))
    config["eos_token_id"] = gguf.get_int("tokenizer.ggml.eos_token_id");
  if (!module_bits.empty()) {
    config["quantization"] = quantization;
    config["quantization_config"] = quantization;
  }
  config["converted_from"] = fs::path(gguf_path).filename().string();
  write_json(dir / "config.json", config);

  nlohmann::ordered_json generation;
  if (config.contains("bos_token_id")) generation["bos_token_id"] = config["bos_token_id"];
  if (config.contains("eos_token_id")) generation["eos_token_id"] = config["eos_token_id"];
  write_json(dir / "generation_config.json", generation);

  write_gguf_tokenizer_files(gguf, output_dir);
  return summary;
}

}  // namespace dspark
