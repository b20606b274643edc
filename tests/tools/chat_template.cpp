// Renders chat templates and raw Jinja sources for the oracle tests.
//
//   dspark_tool_chat_template <cases.json> <results.json>
//
// cases.json: {"cases": [case, ...]} where a case is either
//   {"template_file": path, "messages": [...], "tools": [...] | null, "add_generation_prompt":
//   bool,
//    "kwargs": {...}, "bos_token": str (optional), "eos_token": str (optional)}
// or {"source": jinja text, "variables": {...}}.
// results.json: one {"ok": true, "text": ...} or {"ok": false, "raised": bool, "error": ...} per
// case; "raised" tells that the template called raise_exception().
#include "text/chat_template.h"

#include <fstream>
#include <iostream>
#include <map>
#include <memory>

#include "base/error.h"
#include "base/file_io.h"

namespace {

using dspark::read_file;

std::string render_case(const nlohmann::ordered_json& test_case,
                        std::map<std::string, std::unique_ptr<dspark::ChatTemplate>>& templates) {
  if (test_case.contains("source")) {
    const dspark::jinja::Template source(test_case["source"].get<std::string>(), "source");
    dspark::jinja::Dict variables;
    const auto given = test_case.value("variables", nlohmann::ordered_json::object());
    for (const auto& [key, value] : given.items()) {
      variables.set(key, dspark::jinja::Value::from_json(value));
    }
    return source.render(variables);
  }
  const std::string path = test_case.at("template_file").get<std::string>();
  auto& chat_template = templates[path];
  if (!chat_template) chat_template = std::make_unique<dspark::ChatTemplate>(read_file(path), path);
  dspark::ChatTemplateInputs inputs;
  inputs.messages = test_case.at("messages");
  inputs.tools = test_case.value("tools", nlohmann::ordered_json());
  inputs.add_generation_prompt = test_case.value("add_generation_prompt", false);
  inputs.kwargs = test_case.value("kwargs", nlohmann::ordered_json::object());
  if (test_case.contains("bos_token")) inputs.bos_token = test_case["bos_token"].get<std::string>();
  if (test_case.contains("eos_token")) inputs.eos_token = test_case["eos_token"].get<std::string>();
  return chat_template->render(inputs);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: dspark_tool_chat_template <cases.json> <results.json>\n";
    return 2;
  }
  try {
    const auto cases = nlohmann::ordered_json::parse(read_file(argv[1]));
    std::map<std::string, std::unique_ptr<dspark::ChatTemplate>> templates;
    nlohmann::ordered_json results = nlohmann::ordered_json::array();
    for (const auto& test_case : cases.at("cases")) {
      nlohmann::ordered_json result;
      try {
        result["ok"] = true;
        result["text"] = render_case(test_case, templates);
      } catch (const dspark::jinja::TemplateRaisedError& e) {
        result = {{"ok", false}, {"raised", true}, {"error", e.what()}};
      } catch (const dspark::Error& e) {
        result = {{"ok", false}, {"raised", false}, {"error", e.what()}};
      }
      results.push_back(std::move(result));
    }
    std::ofstream out(argv[2], std::ios::binary);
    out << results.dump(-1, ' ', false, nlohmann::json::error_handler_t::strict);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "dspark_tool_chat_template: " << e.what() << "\n";
    return 1;
  }
}
