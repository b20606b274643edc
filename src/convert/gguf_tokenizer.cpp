#include "convert/gguf_tokenizer.h"

#include <filesystem>
#include <fstream>

#include "base/error.h"

namespace dspark {
namespace {

// ggml token types (llama.cpp's llama_token_type).
constexpr int kTokenControl = 3;
constexpr int kTokenUserDefined = 4;

// The regexes named by tokenizer.ggml.pre, as the original tokenizer.json files spell them.
const char* kLlama3Regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const char* kQwen2Regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

nlohmann::ordered_json byte_level(bool use_regex) {
  return {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true},
          {"use_regex", use_regex}};
}

nlohmann::ordered_json split(const char* regex) {
  return {{"type", "Split"},
          {"pattern", {{"Regex", regex}}},
          {"behavior", "Isolated"},
          {"invert", false}};
}

nlohmann::ordered_json pre_tokenizer_for(const GgufFile& gguf, nlohmann::ordered_json& normalizer) {
  const std::string pre =
      gguf.has("tokenizer.ggml.pre") ? gguf.get_string("tokenizer.ggml.pre") : "default";
  nlohmann::ordered_json sequence = {{"type", "Sequence"}, {"pretokenizers", nlohmann::ordered_json::array()}};
  auto& steps = sequence["pretokenizers"];
  if (pre == "smollm") {
    steps.push_back({{"type", "Digits"}, {"individual_digits", true}});
    steps.push_back(byte_level(true));
  } else if (pre == "gpt-2" || pre == "default") {
    steps.push_back(byte_level(true));
  } else if (pre == "llama-bpe" || pre == "llama3") {
    steps.push_back(split(kLlama3Regex));
    steps.push_back(byte_level(false));
  } else if (pre == "qwen2") {
    normalizer = {{"type", "NFC"}};
    steps.push_back(split(kQwen2Regex));
    steps.push_back(byte_level(false));
  } else {
    fail("{}: tokenizer.ggml.pre '{}' is not supported (smollm, gpt-2, default, llama-bpe, qwen2)",
         gguf.path(), pre);
  }
  return sequence;
}

const nlohmann::json& array_field(const GgufFile& gguf, const std::string& key) {
  if (!gguf.has(key) || !gguf.metadata()[key].is_array()) {
    fail("{}: metadata '{}' is missing or not an array", gguf.path(), key);
  }
  return gguf.metadata()[key];
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

nlohmann::ordered_json gguf_tokenizer_json(const GgufFile& gguf) {
  const std::string model = gguf.get_string("tokenizer.ggml.model");
  if (model != "gpt2") {
    fail("{}: tokenizer.ggml.model '{}' is not supported (byte-level BPE 'gpt2' only)",
         gguf.path(), model);
  }
  const auto& tokens = array_field(gguf, "tokenizer.ggml.tokens");
  const auto& merges = array_field(gguf, "tokenizer.ggml.merges");
  const nlohmann::json* types =
      gguf.has("tokenizer.ggml.token_type") ? &array_field(gguf, "tokenizer.ggml.token_type") : nullptr;
  if (types != nullptr && types->size() != tokens.size()) {
    fail("{}: token_type has {} entries for {} tokens", gguf.path(), types->size(), tokens.size());
  }
  nlohmann::ordered_json tokenizer;
  tokenizer["version"] = "1.0";
  tokenizer["truncation"] = nullptr;
  tokenizer["padding"] = nullptr;
  nlohmann::ordered_json added = nlohmann::ordered_json::array();
  nlohmann::ordered_json vocab = nlohmann::ordered_json::object();
  for (size_t id = 0; id < tokens.size(); ++id) {
    const std::string text = tokens[id].get<std::string>();
    vocab[text] = id;
    const int type = types != nullptr ? (*types)[id].get<int>() : 1;
    if (type == kTokenControl || type == kTokenUserDefined) {
      added.push_back({{"id", id},
                       {"content", text},
                       {"single_word", false},
                       {"lstrip", false},
                       {"rstrip", false},
                       {"normalized", type == kTokenUserDefined},
                       {"special", type == kTokenControl}});
    }
  }
  tokenizer["added_tokens"] = added;
  nlohmann::ordered_json normalizer = nullptr;
  tokenizer["pre_tokenizer"] = pre_tokenizer_for(gguf, normalizer);
  tokenizer["normalizer"] = normalizer;
  tokenizer["post_processor"] = nullptr;
  tokenizer["decoder"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true},
                          {"use_regex", true}};
  nlohmann::ordered_json merge_list = nlohmann::ordered_json::array();
  for (const auto& merge : merges) {
    const std::string text = merge.get<std::string>();
    const size_t space = text.find(' ', 1);
    if (space == std::string::npos) fail("{}: merge '{}' has no separating space", gguf.path(), text);
    merge_list.push_back({text.substr(0, space), text.substr(space + 1)});
  }
  tokenizer["model"] = {{"type", "BPE"},
                        {"dropout", nullptr},
                        {"unk_token", nullptr},
                        {"continuing_subword_prefix", nullptr},
                        {"end_of_word_suffix", nullptr},
                        {"fuse_unk", false},
                        {"byte_fallback", false},
                        {"ignore_merges", false},
                        {"vocab", vocab},
                        {"merges", merge_list}};
  return tokenizer;
}

nlohmann::ordered_json gguf_tokenizer_config(const GgufFile& gguf) {
  nlohmann::ordered_json config;
  config["tokenizer_class"] = "PreTrainedTokenizerFast";
  config["add_bos_token"] =
      gguf.has("tokenizer.ggml.add_bos_token") && gguf.metadata()["tokenizer.ggml.add_bos_token"].get<bool>();
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
  const std::pair<const char*, nlohmann::ordered_json> files[] = {
      {"tokenizer.json", gguf_tokenizer_json(gguf)},
      {"tokenizer_config.json", gguf_tokenizer_config(gguf)}};
  for (const auto& [name, value] : files) {
    std::ofstream out(dir / name);
    if (!out) fail("{}: cannot write", (dir / name).string());
    out << value.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << "\n";
  }
}

}  // namespace dspark
