#pragma once
// The BPE model of a tokenizer.json: vocabulary, ranked merges, and the word -> ids algorithm of
// HF tokenizers (lowest-ranked pair first, leftmost on ties), with ignore_merges, byte fallback,
// unknown-token fusing and subword prefix/suffix. Encoded words are cached.
#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace dspark {

struct BpeOptions {
  std::optional<std::string> unk_token;
  std::string continuing_subword_prefix;
  std::string end_of_word_suffix;
  bool fuse_unk = false;
  bool byte_fallback = false;
  bool ignore_merges = false;
};

class BpeModel {
 public:
  // `vocab` maps token strings to ids; `merges` are pairs of token strings in rank order.
  BpeModel(std::vector<std::pair<std::string, int32_t>> vocab,
           const std::vector<std::pair<std::string, std::string>>& merges, BpeOptions options,
           std::string_view source);
  ~BpeModel();

  // Builds the model from a tokenizer.json "model" value; only type BPE is supported.
  static std::unique_ptr<BpeModel> from_json(const nlohmann::json& spec, std::string_view source);
  // The tokenizer.json "model" value describing this model.
  nlohmann::ordered_json to_json() const;

  // Appends the ids of one pre-token to `ids`.
  void tokenize(std::string_view word, std::vector<int32_t>& ids) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  // Null when no token has this id.
  const std::string* id_to_token(int32_t id) const;
  // One more than the largest id.
  int32_t id_limit() const { return static_cast<int32_t>(id_to_token_.size()); }
  size_t token_count() const { return token_to_id_.size(); }
  const BpeOptions& options() const { return options_; }

 private:
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view text) const { return std::hash<std::string_view>{}(text); }
  };
  class MergeTable;

  void merge_word(std::string_view word, std::vector<int32_t>& ids) const;

  BpeOptions options_;
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> token_to_id_;
  std::vector<std::string> id_to_token_;
  std::vector<uint8_t> id_present_;
  // Ids of single characters below U+10000, -1 when absent: the first step of every word.
  std::vector<int32_t> char_ids_;
  std::vector<std::pair<int32_t, int32_t>> merge_pairs_;  // in rank order, for to_json
  std::unique_ptr<MergeTable> merges_;
  std::optional<int32_t> unk_id_;
  std::vector<int32_t> byte_ids_;  // <0xNN> tokens for byte fallback, -1 when absent

  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache_;
};

}  // namespace dspark
