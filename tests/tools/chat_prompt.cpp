// Renders chat prompts and tokenizes them the way generate and serve do, for the oracle tests of
// special tokens in content (prompt injection).
//
//   dspark_tool_chat_prompt <cases.json> <results.json>
//
// cases.json: {"cases": [{"tokenizer": path, "template_file": path, "messages": [...],
//   "tools": [...] | null, "add_generation_prompt": bool, "bos_token": str (optional),
//   "eos_token": str (optional), "special_tokens_in_content": bool}]}
// results.json: one {"ok": true, "ids": [...], "text": rendered prompt without marks} or
// {"ok": false, "error": ...} per case.
#include <fstream>
#include <iostream>
#include <map>
#include <memory>

#include "base/error.h"
#include "base/file_io.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace {

nlohmann::ordered_json run_case(const nlohmann::ordered_json& test_case,
                                std::map<std::string, std::unique_ptr<dspark::Tokenizer>>& cache) {
  const std::string tokenizer_path = test_case.at("tokenizer").get<std::string>();
  auto& tokenizer = cache[tokenizer_path];
  if (!tokenizer) {
    tokenizer = std::make_unique<dspark::Tokenizer>(dspark::Tokenizer::from_file(tokenizer_path));
  }
  const std::string template_path = test_case.at("template_file").get<std::string>();
  const dspark::ChatTemplate chat_template(dspark::read_file(template_path), template_path);
  dspark::ChatTemplateInputs inputs;
  inputs.messages = test_case.at("messages");
  inputs.tools = test_case.value("tools", nlohmann::ordered_json());
  inputs.add_generation_prompt = test_case.value("add_generation_prompt", false);
  if (test_case.contains("bos_token")) inputs.bos_token = test_case["bos_token"].get<std::string>();
  if (test_case.contains("eos_token")) inputs.eos_token = test_case["eos_token"].get<std::string>();
  if (!test_case.value("special_tokens_in_content", false)) {
    inputs.mark_content = [&](std::string_view content) {
      return tokenizer->mark_special_tokens(content);
    };
  }
  const std::string text = chat_template.render(inputs);
  return {{"ok", true},
          {"ids", tokenizer->encode_marked(text, /*add_special_tokens=*/false)},
          {"text", dspark::Tokenizer::strip_content_marks(text)}};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: dspark_tool_chat_prompt <cases.json> <results.json>\n";
    return 2;
  }
  try {
    const auto cases = nlohmann::ordered_json::parse(dspark::read_file(argv[1]));
    std::map<std::string, std::unique_ptr<dspark::Tokenizer>> tokenizers;
    nlohmann::ordered_json results = nlohmann::ordered_json::array();
    for (const auto& test_case : cases.at("cases")) {
      try {
        results.push_back(run_case(test_case, tokenizers));
      } catch (const dspark::Error& e) {
        results.push_back({{"ok", false}, {"error", e.what()}});
      }
    }
    std::ofstream out(argv[2], std::ios::binary);
    out << results.dump(-1, ' ', false, nlohmann::json::error_handler_t::strict);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "dspark_tool_chat_prompt: " << e.what() << "\n";
    return 1;
  }
}
