#include "text/tokenizer_post_processor.h"

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "text/tokenizer_json.h"

namespace dspark {

PostProcessor::PostProcessor(const nlohmann::json& spec, std::string_view source) {
  read(spec, source);
}

void PostProcessor::read(const nlohmann::json& spec, std::string_view source) {
  if (spec.is_null()) return;
  const std::string type = spec.at("type").get<std::string>();
  if (type == "ByteLevel") return;  // only adjusts offsets
  if (type == "Sequence") {
    for (const auto& step : spec.at("processors")) read(step, source);
    return;
  }
  if (type == "TemplateProcessing") {
    bool seen_sequence = false;
    for (const auto& piece : spec.at("single")) {
      if (piece.contains("Sequence")) {
        seen_sequence = true;
        continue;
      }
      const std::string name = piece.at("SpecialToken").at("id").get<std::string>();
      const auto& special = spec.at("special_tokens");
      if (!special.contains(name)) {
        fail("{}: TemplateProcessing uses '{}' that its special_tokens do not define", source,
             name);
      }
      auto& target = seen_sequence ? after_ : before_;
      for (const auto& id : special.at(name).at("ids")) {
        target.push_back(json_token_id(id, "a TemplateProcessing special token id", source));
      }
    }
    return;
  }
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    before_.push_back(json_token_id(spec.at("cls").at(1), "the cls token id", source));
    after_.insert(after_.begin(), json_token_id(spec.at("sep").at(1), "the sep token id", source));
    return;
  }
  fail("{}: unsupported post_processor type '{}'", source, type);
}

void PostProcessor::add_special_tokens(std::vector<int32_t>& ids) const {
  ids.insert(ids.begin(), before_.begin(), before_.end());
  ids.insert(ids.end(), after_.begin(), after_.end());
}

}  // namespace dspark
