#pragma once
// Everything one served model needs, loaded from its directory: the weights (memory-mapped), the
// tokenizer, the chat template, the end-of-generation token ids, and generation_config.json's
// sampling defaults.
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "model/model.h"
#include "text/tokenizer.h"

namespace dspark {

struct ModelBundle {
  std::string name;  // directory name
  std::string path;
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tokenizer;
  std::string chat_template;  // empty when the model has none
  std::string bos_token;
  std::string eos_token;
  // generation_config.json ∪ config.json ∪ tokenizer_config eos ∪ the end-of-turn tokens the
  // vocabulary has (<|im_end|>, <|eot_id|>, <end_of_turn>, <|endoftext|>).
  std::vector<int32_t> eos_ids;
  nlohmann::json generation_defaults = nlohmann::json::object();  // generation_config.json
};

std::unique_ptr<ModelBundle> load_model_bundle(const std::string& model_dir);

// One user turn (after an optional system turn) to be answered.
struct ChatPrompt {
  std::string system;  // empty: none
  std::string user;
  nlohmann::ordered_json template_kwargs = nlohmann::ordered_json::object();
  // Special-token text inside the turns (code and docs quote them) is plain text unless set.
  bool special_tokens_in_content = false;
  // The turns joined as plain text, with the tokenizer's special tokens, and no template.
  bool no_chat_template = false;
};

// The prompt's token ids: the turns rendered by the model's chat template with the generation
// prompt, or (no template, or no_chat_template) their text encoded as it is.
std::vector<int32_t> encode_chat_prompt(const ModelBundle& bundle, const ChatPrompt& prompt);

}  // namespace dspark
