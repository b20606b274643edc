#include "convert/gguf_tokenizer.h"

#include <filesystem>
#include <fstream>
#include <limits>

#include "base/error.h"

namespace dspark {
namespace {

const nlohmann::json& array_field(const GgufFile& gguf, const std::string& key) {
  if (!gguf.has(key) || !gguf.metadata()[key].is_array()) {
    fail("{}: metadata '{}' is missing or not an array", gguf.path(), key);
  }
  return gguf.metadata()[key];
}

std::optional<int32_t> optional_id(const GgufFile& gguf, const std::string& key) {
  if (!gguf.has(key)) return std::nullopt;
  return static_cast<int32_t>(gguf.get_int(key));
}

std::optional<bool> optional_flag(const GgufFile& gguf, const std::string& key) {
  if (!gguf.has(key)) return std::nullopt;
  if (!gguf.metadata()[key].is_boolean())
    fail("{}: metadata '{}' is not a boolean", gguf.path(), key);
  return gguf.metadata()[key].get<bool>();
}

std::string token_string(const GgufFile& gguf, const char* id_key) {
  if (!gguf.has(id_key)) return "";
  const auto& tokens = array_field(gguf, "tokenizer.ggml.tokens");
  const int64_t id = gguf.get_int(id_key);
  if (id < 0 || id >= static_cast<int64_t>(tokens.size())) {
    fail("{}: {} = {} is outside the vocabulary", gguf.path(), id_key, id);
  }
  return tokens[id].get<std::string>();
}

}  // namespace

GgufTokenizerData gguf_tokenizer_data(const GgufFile& gguf) {
  GgufTokenizerData data;
  data.model = gguf.get_string("tokenizer.ggml.model");
  data.pre = gguf.has("tokenizer.ggml.pre") ? gguf.get_string("tokenizer.ggml.pre") : "default";
  for (const auto& token : array_field(gguf, "tokenizer.ggml.tokens")) {
    data.tokens.push_back(token.get<std::string>());
  }
  if (gguf.has("tokenizer.ggml.token_type")) {
    for (const auto& type : array_field(gguf, "tokenizer.ggml.token_type")) {
      // A float entry (NaN included) would convert to int undefined; types are small integers.
      if (!type.is_number_integer() || type.get<int64_t>() < std::numeric_limits<int32_t>::min() ||
          type.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
        fail("{}: tokenizer.ggml.token_type holds {}, not a token type", gguf.path(), type.dump());
      }
      data.token_types.push_back(static_cast<int32_t>(type.get<int64_t>()));
    }
  }
  if (gguf.has("tokenizer.ggml.merges")) {
    for (const auto& merge : array_field(gguf, "tokenizer.ggml.merges")) {
      data.merges.push_back(merge.get<std::string>());
    }
  }
  data.bos_id = optional_id(gguf, "tokenizer.ggml.bos_token_id");
  data.eos_id = optional_id(gguf, "tokenizer.ggml.eos_token_id");
  data.unknown_id = optional_id(gguf, "tokenizer.ggml.unknown_token_id");
  data.padding_id = optional_id(gguf, "tokenizer.ggml.padding_token_id");
  data.add_bos = optional_flag(gguf, "tokenizer.ggml.add_bos_token");
  data.add_eos = optional_flag(gguf, "tokenizer.ggml.add_eos_token");
  return data;
}

nlohmann::ordered_json gguf_tokenizer_config(const GgufFile& gguf) {
  nlohmann::ordered_json config;
  config["tokenizer_class"] = "PreTrainedTokenizerFast";
  config["add_bos_token"] = optional_flag(gguf, "tokenizer.ggml.add_bos_token").value_or(false);
  const std::pair<const char*, const char*> specials[] = {
      {"bos_token", "tokenizer.ggml.bos_token_id"},
      {"eos_token", "tokenizer.ggml.eos_token_id"},
      {"unk_token", "tokenizer.ggml.unknown_token_id"},
      {"pad_token", "tokenizer.ggml.padding_token_id"}};
  for (const auto& [name, key] : specials) {
    const std::string text = token_string(gguf, key);
    if (!text.empty()) config[name] = text;
  }
  if (gguf.has("tokenizer.chat_template")) {
    config["chat_template"] = gguf.get_string("tokenizer.chat_template");
  }
  return config;
}

void write_gguf_tokenizer_files(const GgufFile& gguf, const std::string& output_dir) {
  const std::filesystem::path dir(output_dir);
  const Tokenizer tokenizer = Tokenizer::from_gguf_metadata(gguf_tokenizer_data(gguf));
  {
    std::ofstream out(dir / "tokenizer.json");
    if (!out) fail("{}: cannot write", (dir / "tokenizer.json").string());
    out << tokenizer.to_tokenizer_json() << "\n";
  }
  std::ofstream out(dir / "tokenizer_config.json");
  if (!out) fail("{}: cannot write", (dir / "tokenizer_config.json").string());
  out << gguf_tokenizer_config(gguf).dump(2, ' ', false,
                                          nlohmann::ordered_json::error_handler_t::replace)
      << "\n";
}

}  // namespace dspark
