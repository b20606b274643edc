#pragma once
// The "decoder" stage of a tokenizer.json: turns token strings back into text. Supports
// ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip, BPEDecoder and Sequence. Like HF, each
// step maps the list of token strings to a new list and the final list is concatenated.
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dspark {

// The bytes a ByteLevel token stands for, or nullopt when it holds a character outside GPT-2's
// stand-in alphabet (the decoder then takes the token as it is).
std::optional<std::string> byte_level_token_bytes(std::string_view token);
// The byte a byte-fallback token <0xNN> stands for, or -1 for any other token.
int byte_fallback_byte(std::string_view token);

class Detokenizer {
 public:
  virtual ~Detokenizer() = default;
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;

  // Builds the decoder described by `spec` (a tokenizer.json "decoder" value); returns null for a
  // JSON null. Throws dspark::Error naming `source` for unsupported types.
  static std::unique_ptr<Detokenizer> from_json(const nlohmann::json& spec,
                                                std::string_view source);
};

}  // namespace dspark
