// Parses model outputs for reasoning and tool calls, for the oracle tests.
//
//   dspark_tool_parser <cases.json> <results.json>
//
// cases.json: {"cases": [{"template_file": path, "prompt": rendered prompt, "tools": [...] | null,
//                         "output": generated text, "chunkings": [[byte sizes...], ...]}, ...]}
// results.json: per case {"config": {...}, "oneshot": parsed, "streamed": [parsed per chunking]}
// where parsed = {"reasoning", "content", "tool_calls": [{"name", "arguments"}]}. Each chunking
// feeds the output in pieces of those byte sizes (the last piece takes the rest).
#include <fstream>
#include <iostream>

#include "base/error.h"
#include "base/file_io.h"
#include "text/tool_call_parser.h"

namespace {

using dspark::read_file;

nlohmann::ordered_json to_json(const dspark::ParsedOutput& parsed) {
  nlohmann::ordered_json calls = nlohmann::ordered_json::array();
  for (const auto& call : parsed.tool_calls)
    calls.push_back({{"name", call.name}, {"arguments", call.arguments}});
  return {{"reasoning", parsed.reasoning}, {"content", parsed.content}, {"tool_calls", calls}};
}

const char* format_name(dspark::ToolCallFormat format) {
  switch (format) {
    case dspark::ToolCallFormat::kNone:
      return "none";
    case dspark::ToolCallFormat::kXmlFunction:
      return "xml_function";
    case dspark::ToolCallFormat::kHermesJson:
      return "hermes_json";
    case dspark::ToolCallFormat::kNemotronJsonList:
      return "nemotron_json_list";
    case dspark::ToolCallFormat::kLlamaJson:
      return "llama_json";
  }
  return "?";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: dspark_tool_parser <cases.json> <results.json>\n";
    return 2;
  }
  try {
    const auto cases = nlohmann::ordered_json::parse(read_file(argv[1]));
    nlohmann::ordered_json results = nlohmann::ordered_json::array();
    for (const auto& test_case : cases.at("cases")) {
      const std::string source = read_file(test_case.at("template_file").get<std::string>());
      const auto config =
          dspark::ChatOutputParser::configure(source, test_case.at("prompt").get<std::string>(),
                                              test_case.value("tools", nlohmann::ordered_json()));
      const std::string output = test_case.at("output").get<std::string>();
      nlohmann::ordered_json result;
      result["config"] = {{"reasoning", config.reasoning.has_value()},
                          {"starts_in_reasoning", config.starts_in_reasoning},
                          {"format", format_name(config.format)}};
      result["oneshot"] = to_json(dspark::parse_output(config, output));
      nlohmann::ordered_json streamed = nlohmann::ordered_json::array();
      for (const auto& sizes : test_case.value("chunkings", nlohmann::ordered_json::array())) {
        dspark::ChatOutputParser parser(config);
        std::vector<dspark::OutputEvent> events;
        size_t pos = 0;
        for (const auto& size : sizes) {
          if (pos >= output.size()) break;
          const size_t take = std::min(output.size() - pos, size.get<size_t>());
          for (auto& event : parser.feed(std::string_view(output).substr(pos, take)))
            events.push_back(std::move(event));
          pos += take;
        }
        if (pos < output.size()) {
          for (auto& event : parser.feed(std::string_view(output).substr(pos)))
            events.push_back(std::move(event));
        }
        for (auto& event : parser.finish()) events.push_back(std::move(event));
        // Every event must hold whole UTF-8 characters: dump() rejects anything else.
        nlohmann::ordered_json texts = nlohmann::ordered_json::array();
        for (const auto& event : events) texts.push_back(event.text);
        (void)texts.dump(-1, ' ', false, nlohmann::json::error_handler_t::strict);
        streamed.push_back(to_json(dspark::collect_events(events)));
      }
      result["streamed"] = std::move(streamed);
      results.push_back(std::move(result));
    }
    std::ofstream out(argv[2], std::ios::binary);
    out << results.dump(-1, ' ', false, nlohmann::json::error_handler_t::strict);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "dspark_tool_parser: " << e.what() << "\n";
    return 1;
  }
}
