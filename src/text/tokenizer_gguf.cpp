// Tokenizer::from_gguf_metadata: turns the tokenizer.ggml.* fields into the tokenizer.json that
// the original Hugging Face tokenizer had, then loads that. llama.cpp names each pre-tokenizer
// (tokenizer.ggml.pre); each supported name maps to the HF components it was converted from.
#include <nlohmann/json.hpp>
#include <unordered_set>

#include "base/error.h"
#include "text/tokenizer.h"

namespace dspark {
namespace {

constexpr std::string_view kSource = "GGUF tokenizer metadata";

// Split patterns of the HF tokenizer.json files behind llama.cpp's pre-tokenizer names.
constexpr std::string_view kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3})"
    R"(| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N})"
    R"(| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kTekkenPattern =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+)"
    R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*)"
    R"(|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

struct PreTokenizerRecipe {
  nlohmann::json normalizer;
  nlohmann::json pre_tokenizer;
  bool ignore_merges = false;
  bool add_bos = false;  // llama.cpp's default when the GGUF does not say
};

nlohmann::json byte_level(bool use_regex) {
  return {{"type", "ByteLevel"},
          {"add_prefix_space", false},
          {"trim_offsets", true},
          {"use_regex", use_regex}};
}

nlohmann::json split_then_byte_level(std::string_view pattern) {
  return {{"type", "Sequence"},
          {"pretokenizers",
           {{{"type", "Split"},
             {"pattern", {{"Regex", std::string(pattern)}}},
             {"behavior", "Isolated"},
             {"invert", false}},
            byte_level(false)}}};
}

PreTokenizerRecipe recipe_for(const std::string& pre) {
  static const std::unordered_set<std::string> gpt2 = {"gpt-2", "gpt2", "phi-2", "mpt", "olmo"};
  static const std::unordered_set<std::string> llama3 = {"llama3", "llama-v3", "llama-bpe",
                                                         "falcon3", "pixtral"};
  static const std::unordered_set<std::string> qwen2 = {"qwen2", "deepseek-r1-qwen", "megrez"};
  static const std::unordered_set<std::string> starcoder = {"smollm", "starcoder"};
  PreTokenizerRecipe recipe;
  recipe.normalizer = nullptr;
  if (gpt2.count(pre)) {
    recipe.pre_tokenizer = byte_level(true);
  } else if (llama3.count(pre)) {
    recipe.pre_tokenizer = split_then_byte_level(kLlama3Pattern);
    recipe.ignore_merges = true;
    recipe.add_bos = true;
  } else if (qwen2.count(pre)) {
    recipe.normalizer = {{"type", "NFC"}};
    recipe.pre_tokenizer = split_then_byte_level(kQwen2Pattern);
  } else if (starcoder.count(pre)) {
    recipe.pre_tokenizer = {
        {"type", "Sequence"},
        {"pretokenizers", {{{"type", "Digits"}, {"individual_digits", true}}, byte_level(true)}}};
  } else if (pre == "tekken") {
    recipe.pre_tokenizer = split_then_byte_level(kTekkenPattern);
    recipe.ignore_merges = true;
    recipe.add_bos = true;
  } else {
    fail("{}: unsupported tokenizer.ggml.pre '{}'", kSource, pre);
  }
  return recipe;
}

nlohmann::json special_token_piece(const std::string& name, int type_id) {
  return {{"SpecialToken", {{"id", name}, {"type_id", type_id}}}};
}

nlohmann::json sequence_piece(const char* name, int type_id) {
  return {{"Sequence", {{"id", name}, {"type_id", type_id}}}};
}

nlohmann::json post_processor(const GgufTokenizerData& data, bool add_bos, bool add_eos) {
  if (!add_bos && !add_eos) return byte_level(true);
  nlohmann::json single = nlohmann::json::array();
  nlohmann::json pair = nlohmann::json::array();
  nlohmann::json special_tokens = nlohmann::json::object();
  auto special = [&](const std::optional<int32_t>& id, const char* what) {
    if (!id || *id < 0 || *id >= static_cast<int32_t>(data.tokens.size())) {
      fail("{}: add_{}_token is set but the {} token id is missing or out of range", kSource, what,
           what);
    }
    const std::string& name = data.tokens[*id];
    special_tokens[name] = {{"id", name}, {"ids", {*id}}, {"tokens", {name}}};
    return name;
  };
  if (add_bos) {
    const std::string bos = special(data.bos_id, "bos");
    single.push_back(special_token_piece(bos, 0));
    pair.push_back(special_token_piece(bos, 0));
  }
  single.push_back(sequence_piece("A", 0));
  pair.push_back(sequence_piece("A", 0));
  if (add_eos) {
    const std::string eos = special(data.eos_id, "eos");
    single.push_back(special_token_piece(eos, 0));
    pair.push_back(special_token_piece(eos, 0));
  }
  if (add_bos) pair.push_back(special_token_piece(data.tokens[*data.bos_id], 1));
  pair.push_back(sequence_piece("B", 1));
  if (add_eos) pair.push_back(special_token_piece(data.tokens[*data.eos_id], 1));
  return {{"type", "TemplateProcessing"},
          {"single", single},
          {"pair", pair},
          {"special_tokens", special_tokens}};
}

}  // namespace

Tokenizer Tokenizer::from_gguf_metadata(const GgufTokenizerData& data) {
  if (data.model != "gpt2") {
    fail("{}: unsupported tokenizer.ggml.model '{}' (only byte-level BPE 'gpt2')", kSource,
         data.model);
  }
  if (data.tokens.empty()) fail("{}: tokenizer.ggml.tokens is empty", kSource);
  if (!data.token_types.empty() && data.token_types.size() != data.tokens.size()) {
    fail("{}: tokenizer.ggml.token_type has {} entries for {} tokens", kSource,
         data.token_types.size(), data.tokens.size());
  }
  const PreTokenizerRecipe recipe = recipe_for(data.pre);

  nlohmann::json vocab = nlohmann::json::object();
  nlohmann::json added = nlohmann::json::array();
  for (size_t id = 0; id < data.tokens.size(); ++id) {
    const std::string& token = data.tokens[id];
    if (vocab.contains(token)) {
      fail("{}: token '{}' appears twice (ids {} and {})", kSource, token,
           vocab.at(token).get<int64_t>(), id);
    }
    vocab[token] = id;
    const int32_t type =
        data.token_types.empty() ? GgufTokenizerData::kNormal : data.token_types[id];
    if (type == GgufTokenizerData::kControl || type == GgufTokenizerData::kUserDefined) {
      added.push_back({{"id", id},
                       {"content", token},
                       {"single_word", false},
                       {"lstrip", false},
                       {"rstrip", false},
                       {"normalized", false},
                       {"special", type == GgufTokenizerData::kControl}});
    }
  }
  nlohmann::json merges = nlohmann::json::array();
  for (size_t rank = 0; rank < data.merges.size(); ++rank) {
    const std::string& merge = data.merges[rank];
    const size_t space = merge.find(' ', 1);
    if (space == std::string::npos) {
      fail("{}: tokenizer.ggml.merges[{}] '{}' is not 'left right'", kSource, rank, merge);
    }
    merges.push_back({merge.substr(0, space), merge.substr(space + 1)});
  }

  nlohmann::json document;
  document["version"] = "1.0";
  document["added_tokens"] = std::move(added);
  document["normalizer"] = recipe.normalizer;
  document["pre_tokenizer"] = recipe.pre_tokenizer;
  document["post_processor"] =
      post_processor(data, data.add_bos.value_or(recipe.add_bos), data.add_eos.value_or(false));
  document["decoder"] = byte_level(true);
  document["model"] = {{"type", "BPE"},
                       {"dropout", nullptr},
                       {"unk_token", nullptr},
                       {"continuing_subword_prefix", nullptr},
                       {"end_of_word_suffix", nullptr},
                       {"fuse_unk", false},
                       {"byte_fallback", false},
                       {"ignore_merges", recipe.ignore_merges},
                       {"vocab", std::move(vocab)},
                       {"merges", std::move(merges)}};
  Tokenizer tokenizer = from_document(document, kSource);
  auto checked_id = [&](const std::optional<int32_t>& id) -> std::optional<int32_t> {
    if (id && *id >= 0 && *id < static_cast<int32_t>(data.tokens.size())) return id;
    return std::nullopt;
  };
  tokenizer.bos_id_ = checked_id(data.bos_id);
  tokenizer.eos_id_ = checked_id(data.eos_id);
  return tokenizer;
}

}  // namespace dspark
