#pragma once
// The "normalizer" stage of a tokenizer.json: rewrites each stretch of text between added tokens
// before pre-tokenization. Supports NFC, NFD, NFKC, NFKD, Lowercase, Prepend, Replace, Strip and
// Sequence, the normalizers that byte-level and SentencePiece-style BPE files use.
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>

namespace dspark {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // `text` is valid UTF-8; so is the result.
  virtual std::string normalize(std::string_view text) const = 0;

  // Builds the normalizer described by `spec` (a tokenizer.json "normalizer" value); returns null
  // for a JSON null. Throws dspark::Error naming `source` for unsupported types.
  static std::unique_ptr<Normalizer> from_json(const nlohmann::json& spec, std::string_view source);
};

}  // namespace dspark
