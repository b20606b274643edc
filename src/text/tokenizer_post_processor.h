#pragma once
// The "post_processor" stage of a tokenizer.json for a single sequence: the special tokens that
// encode(..., add_special_tokens=true) puts around the ids (TemplateProcessing, Roberta/Bert
// processing, ByteLevel, Sequence).
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string_view>
#include <vector>

namespace dspark {

class PostProcessor {
 public:
  // Reads `spec` (may be null: no special tokens). Throws dspark::Error naming `source` for
  // unsupported types.
  PostProcessor(const nlohmann::json& spec, std::string_view source);

  void add_special_tokens(std::vector<int32_t>& ids) const;

 private:
  void read(const nlohmann::json& spec, std::string_view source);

  std::vector<int32_t> before_;
  std::vector<int32_t> after_;
};

}  // namespace dspark
