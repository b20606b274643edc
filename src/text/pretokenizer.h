#pragma once
// The "pre_tokenizer" stage of a tokenizer.json: cuts normalized text into the words that the BPE
// model encodes one by one. Supports Split, ByteLevel, Digits, Metaspace and Sequence.
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace dspark {

struct PreToken {
  std::string text;
  // Whether the piece begins at offset 0 of the text passed to encode (Metaspace's "first").
  bool at_input_start = false;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces `pieces` by their sub-pieces; empty pieces are dropped, as HF does.
  virtual void pre_tokenize(std::vector<PreToken>& pieces) const = 0;

  // Builds the pre-tokenizer described by `spec` (a tokenizer.json "pre_tokenizer" value); returns
  // null for a JSON null. Throws dspark::Error naming `source` for unsupported types.
  static std::unique_ptr<PreTokenizer> from_json(const nlohmann::json& spec,
                                                 std::string_view source);
};

// GPT-2's byte-to-character map used by ByteLevel: each byte as the UTF-8 of its printable
// stand-in.
const std::string& byte_level_char(uint8_t byte);
// The byte a ByteLevel stand-in character represents, or -1 for any other character.
int byte_level_byte(char32_t code_point);

}  // namespace dspark
