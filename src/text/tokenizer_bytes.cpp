// Tokenizer::token_bytes: one token's bytes, read from the decoder description step by step.
// Only the steps that act on each token by itself apply (Fuse joins tokens, Strip and Metaspace's
// first-token rule act at the start of the whole text): a token in the middle of a text adds
// exactly these bytes.
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "text/bpe.h"
#include "text/detokenizer.h"
#include "text/tokenizer.h"

namespace dspark {
namespace {

void replace_all(std::string& text, std::string_view pattern, std::string_view content) {
  if (pattern.empty()) return;
  size_t pos = 0;
  while ((pos = text.find(pattern, pos)) != std::string::npos) {
    text.replace(pos, pattern.size(), content);
    pos += content.size();
  }
}

void apply_decoder(const nlohmann::json& spec, std::string& token) {
  if (spec.is_null()) return;
  const std::string& type = spec.at("type").get_ref<const std::string&>();
  if (type == "Sequence") {
    for (const auto& step : spec.at("decoders")) apply_decoder(step, token);
  } else if (type == "ByteLevel") {
    if (std::optional<std::string> bytes = byte_level_token_bytes(token)) token = std::move(*bytes);
  } else if (type == "ByteFallback") {
    const int byte = byte_fallback_byte(token);
    if (byte >= 0) token.assign(1, static_cast<char>(byte));
  } else if (type == "Metaspace") {
    replace_all(token, spec.value("replacement", std::string("\u2581")), " ");
  } else if (type == "Replace") {
    const auto& pattern = spec.at("pattern");
    if (!pattern.contains("String")) {
      fail("tokenizer decoder: token bytes need a Replace step with a String pattern, got {}",
           pattern.dump());
    }
    replace_all(token, pattern.at("String").get_ref<const std::string&>(),
                spec.at("content").get_ref<const std::string&>());
  } else if (type == "BPEDecoder") {
    const std::string suffix = spec.value("suffix", std::string("</w>"));
    if (token.size() >= suffix.size() &&
        token.compare(token.size() - suffix.size(), suffix.size(), suffix) == 0) {
      token.resize(token.size() - suffix.size());
      token.push_back(' ');
    }
  } else if (type != "Fuse" && type != "Strip") {
    fail("tokenizer decoder: token bytes do not support decoder type '{}'", type);
  }
}

}  // namespace

std::optional<std::string> Tokenizer::token_bytes(int32_t id) const {
  std::string token;
  const auto added = added_by_id_.find(id);
  if (added != added_by_id_.end()) {
    const AddedToken& entry = added_tokens_[added->second];
    if (entry.special) return std::nullopt;
    token = entry.decoded;
  } else if (const std::string* model_token = model_->id_to_token(id)) {
    token = *model_token;
  } else {
    return std::nullopt;
  }
  apply_decoder(*decoder_spec_, token);
  return token;
}

}  // namespace dspark
