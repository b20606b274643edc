#include "engine/model_bundle.h"

#include <algorithm>
#include <filesystem>

#include "base/error.h"
#include "base/file_io.h"
#include "formats/checkpoint.h"
#include "text/chat_template.h"

namespace dspark {
namespace fs = std::filesystem;
namespace {

void add_ids(const nlohmann::json& value, std::vector<int32_t>& ids) {
  if (value.is_number_integer()) ids.push_back(value.get<int32_t>());
  if (value.is_array()) {
    for (const auto& item : value) add_ids(item, ids);
  }
}

// tokenizer_config.json spells special tokens as strings or as {"content": ...} objects.
std::string token_text(const nlohmann::json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_object() && value.contains("content")) return value["content"].get<std::string>();
  return "";
}

}  // namespace

std::unique_ptr<ModelBundle> load_model_bundle(const std::string& model_dir) {
  auto bundle = std::make_unique<ModelBundle>();
  const fs::path dir(model_dir);
  bundle->path = model_dir;
  bundle->name = fs::path(model_dir).filename().string();
  if (bundle->name.empty()) bundle->name = fs::path(model_dir).parent_path().filename().string();
  bundle->model = load_model(model_dir);
  if (!fs::exists(dir / "tokenizer.json")) fail("{}: no tokenizer.json", model_dir);
  bundle->tokenizer =
      std::make_unique<Tokenizer>(Tokenizer::from_file((dir / "tokenizer.json").string()));

  nlohmann::json tokenizer_config = nlohmann::json::object();
  if (fs::exists(dir / "tokenizer_config.json")) {
    tokenizer_config = read_json_file((dir / "tokenizer_config.json").string());
  }
  if (fs::exists(dir / "chat_template.jinja")) {
    bundle->chat_template = read_file((dir / "chat_template.jinja").string());
  } else if (tokenizer_config.contains("chat_template")) {
    const auto& value = tokenizer_config["chat_template"];
    if (value.is_string()) {
      bundle->chat_template = value.get<std::string>();
    } else if (value.is_array()) {
      for (const auto& entry : value) {
        if (entry.value("name", "") == "default")
          bundle->chat_template = entry.value("template", "");
      }
    }
  }
  if (tokenizer_config.contains("bos_token"))
    bundle->bos_token = token_text(tokenizer_config["bos_token"]);
  if (tokenizer_config.contains("eos_token"))
    bundle->eos_token = token_text(tokenizer_config["eos_token"]);

  std::vector<int32_t>& eos = bundle->eos_ids;
  if (fs::exists(dir / "generation_config.json")) {
    bundle->generation_defaults = read_json_file((dir / "generation_config.json").string());
    if (bundle->generation_defaults.contains("eos_token_id")) {
      add_ids(bundle->generation_defaults["eos_token_id"], eos);
    }
  }
  const auto& config = bundle->model->checkpoint().config();
  if (config.contains("eos_token_id")) add_ids(config["eos_token_id"], eos);
  if (!bundle->eos_token.empty()) {
    if (auto id = bundle->tokenizer->token_to_id(bundle->eos_token)) eos.push_back(*id);
  }
  for (const char* end_of_turn : {"<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|endoftext|>"}) {
    if (auto id = bundle->tokenizer->token_to_id(end_of_turn)) eos.push_back(*id);
  }
  std::sort(eos.begin(), eos.end());
  eos.erase(std::unique(eos.begin(), eos.end()), eos.end());
  return bundle;
}

std::vector<int32_t> encode_chat_prompt(const ModelBundle& bundle, const ChatPrompt& prompt) {
  if (prompt.no_chat_template || bundle.chat_template.empty()) {
    const std::string text =
        prompt.system.empty() ? prompt.user : prompt.system + "\n\n" + prompt.user;
    return bundle.tokenizer->encode(text, /*add_special_tokens=*/true);
  }
  ChatTemplateInputs inputs;
  if (!prompt.system.empty()) {
    inputs.messages.push_back({{"role", "system"}, {"content", prompt.system}});
  }
  inputs.messages.push_back({{"role", "user"}, {"content", prompt.user}});
  inputs.add_generation_prompt = true;
  inputs.kwargs = prompt.template_kwargs;
  if (!bundle.bos_token.empty()) inputs.bos_token = bundle.bos_token;
  if (!bundle.eos_token.empty()) inputs.eos_token = bundle.eos_token;
  if (!prompt.special_tokens_in_content) {
    inputs.mark_content = [&](std::string_view content) {
      return bundle.tokenizer->mark_special_tokens(content);
    };
  }
  const std::string rendered =
      ChatTemplate(bundle.chat_template, bundle.name + " chat template").render(inputs);
  return bundle.tokenizer->encode_marked(rendered, /*add_special_tokens=*/false);
}

}  // namespace dspark
