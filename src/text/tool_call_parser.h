#pragma once
// Extracts tool calls from generated text, incrementally, in the formats our target models emit:
//   kXmlFunction      Qwen3-Coder / Nemotron 3: <tool_call>\n<function=NAME>\n<parameter=ARG>\n
//                     VALUE\n</parameter>\n</function>\n</tool_call>; values are text, converted
//                     to the type the tool's JSON schema gives the parameter.
//   kHermesJson       Qwen / Hermes: <tool_call>{"name": ..., "arguments": {...}}</tool_call>
//   kNemotronJsonList Nemotron Nano v2: <TOOLCALL>[{"name": ..., "arguments": {...}},
//   ...]</TOOLCALL> kLlamaJson        Llama 3: the whole reply is {"name": ..., "parameters":
//   {...}} (several
//                     joined by ";"), possibly after <|python_tag|>.
// A call is reported once complete (start, arguments, end together); text that looks like a call
// but does not parse, or is cut off, is reported as content. Content is trimmed of leading and
// trailing whitespace and of the whitespace just before a call.
//
// ChatOutputParser combines this with the reasoning split (reasoning_parser.h). Streaming and
// one-shot parsing agree: feeding any chunking of a text yields the same events, merged, as
// feeding it whole. Events never split a UTF-8 character.
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "text/reasoning_parser.h"

namespace dspark {

enum class ToolCallFormat { kNone, kXmlFunction, kHermesJson, kNemotronJsonList, kLlamaJson };

// The format a chat template teaches its model, judged from the template text.
ToolCallFormat detect_tool_call_format(std::string_view template_source);

// The text that opens a call in `format`, through the function's name when `function` is not
// empty: what tool_choice "required" or a named function forces. Empty for kNone.
std::string forced_call_prefix(ToolCallFormat format, const std::string& function);

struct OutputEvent {
  enum class Kind { kReasoning, kContent, kToolCallStart, kToolCallArguments, kToolCallEnd };
  Kind kind;
  std::string text;  // reasoning or content text, the tool name (start), arguments JSON text
  size_t index = 0;  // tool calls: position of the call in the reply
};

struct ToolCall {
  std::string name;
  std::string arguments;  // a JSON object, as text
};

struct ParsedOutput {
  std::string reasoning;
  std::string content;
  std::vector<ToolCall> tool_calls;
};

// Folds events into the message they describe.
ParsedOutput collect_events(const std::vector<OutputEvent>& events);

// Converts an XML parameter's text to the JSON type its schema declares (docs/server-api.md §3.1):
// string verbatim, integer/number parsed, boolean true/false, object/array parsed as JSON,
// null from "null"; anything that does not convert stays a string.
nlohmann::ordered_json coerce_parameter(const std::string& text,
                                        const nlohmann::ordered_json& schema);

class ToolCallParser {
 public:
  // `tools` is the request's tool list (for parameter types); tool names are not filtered.
  ToolCallParser(ToolCallFormat format, nlohmann::ordered_json tools);

  void feed(std::string_view content, std::vector<OutputEvent>& events);
  void finish(std::vector<OutputEvent>& events);

 private:
  enum class Mode { kStart, kText, kInCall, kWholeReply };
  void process(bool final, std::vector<OutputEvent>& events);
  void emit_content(std::string_view text, std::vector<OutputEvent>& events);
  static void append_content(std::string piece, std::vector<OutputEvent>& events);
  bool emit_calls(std::string_view block, bool whole_reply, std::vector<OutputEvent>& events);
  std::optional<std::vector<ToolCall>> parse_block(std::string_view block) const;

  ToolCallFormat format_;
  nlohmann::ordered_json tools_;
  std::string open_;
  std::string close_;
  Mode mode_;
  std::string buffer_;
  bool content_started_ = false;
  bool call_since_content_ = false;  // a tool call was emitted after the last content
  std::string pending_whitespace_;
  size_t next_index_ = 0;
};

class ChatOutputParser {
 public:
  struct Config {
    std::optional<ReasoningSyntax> reasoning;
    bool starts_in_reasoning = false;
    ToolCallFormat format = ToolCallFormat::kNone;
    nlohmann::ordered_json tools;  // null or empty: no tool-call parsing
    // The text as the model wrote it, whitespace and all (a raw completion): nothing is parsed.
    bool verbatim = false;
  };

  // The parser settings for a model's template and an already rendered prompt: reasoning if the
  // template uses <think> (open from the start if the prompt left it open), tool calls in the
  // template's format when the request has tools.
  static Config configure(std::string_view template_source, std::string_view prompt,
                          const nlohmann::ordered_json& tools);

  explicit ChatOutputParser(Config config);

  std::vector<OutputEvent> feed(std::string_view text);
  std::vector<OutputEvent> finish();

 private:
  void route(ReasoningParser::Output& split, std::vector<OutputEvent>& events);

  bool verbatim_;
  std::optional<ReasoningParser> reasoning_;
  ToolCallParser tools_;
  std::string incomplete_utf8_;
};

// The markup the parser `config` describes reads in the text (reasoning and tool-call markers).
// A tokenizer may mark such a token special; the text fed to the parser must still spell it.
std::vector<std::string> parser_markers(const ChatOutputParser::Config& config);

// The whole reply at once; equals collect_events() of any streamed feeding.
ParsedOutput parse_output(const ChatOutputParser::Config& config, std::string_view text);

}  // namespace dspark
