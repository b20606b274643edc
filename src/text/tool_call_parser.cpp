#include "text/tool_call_parser.h"

#include <algorithm>
#include <tuple>
#include <utility>

#include "text/utf8.h"

namespace dspark {
namespace {

using Json = nlohmann::ordered_json;

// Llama 3's tool-call prefix (a special token in its tokenizer).
constexpr std::string_view kPythonTag = "<|python_tag|>";

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

std::string_view skip_space(std::string_view text) {
  size_t i = 0;
  while (i < text.size() && is_space(text[i])) ++i;
  return text.substr(i);
}

std::string_view trim(std::string_view text) {
  text = skip_space(text);
  while (!text.empty() && is_space(text.back())) text.remove_suffix(1);
  return text;
}

size_t partial_marker_suffix(std::string_view text, std::string_view marker) {
  for (size_t length = std::min(text.size(), marker.size() - 1); length > 0; --length) {
    if (text.substr(text.size() - length) == marker.substr(0, length)) return length;
  }
  return 0;
}

// Matches `pieces` in order, each after optional whitespace, against the start of `text`.
MarkerMatch match_pieces(std::string_view text, std::initializer_list<std::string_view> pieces,
                         bool final) {
  for (const std::string_view piece : pieces) {
    text = skip_space(text);
    if (text.starts_with(piece)) {
      text.remove_prefix(piece.size());
      continue;
    }
    const bool could_grow = text.size() < piece.size() && piece.starts_with(text);
    return could_grow && !final ? MarkerMatch::kNeedMore : MarkerMatch::kNo;
  }
  return MarkerMatch::kYes;
}

// Compact JSON text; bytes that are not UTF-8 (a model can emit them) become U+FFFD.
std::string dump(const Json& value) {
  return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::optional<Json> parse_json(std::string_view text) {
  Json value = Json::parse(text.begin(), text.end(), nullptr, false);
  if (value.is_discarded()) return std::nullopt;
  return value;
}

// {"name": ..., "arguments" | "parameters": {...} or its JSON text}.
std::optional<ToolCall> call_from_json(const Json& object) {
  if (!object.is_object()) return std::nullopt;
  const auto name = object.find("name");
  if (name == object.end() || !name->is_string() || name->get<std::string>().empty())
    return std::nullopt;
  auto arguments = object.find("arguments");
  if (arguments == object.end()) arguments = object.find("parameters");
  Json parsed = Json::object();
  if (arguments != object.end()) {
    if (arguments->is_string()) {
      const auto inner = parse_json(arguments->get<std::string>());
      if (!inner || !inner->is_object()) return std::nullopt;
      parsed = *inner;
    } else if (arguments->is_object()) {
      parsed = *arguments;
    } else {
      return std::nullopt;
    }
  }
  return ToolCall{name->get<std::string>(), dump(parsed)};
}

// The end of the JSON object or array starting at text[start] (brackets balanced outside
// strings), or npos when it does not close.
size_t json_value_end(std::string_view text, size_t start) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = start; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if (c == '}' || c == ']') {
      if (--depth == 0) return i + 1;
    }
  }
  return std::string_view::npos;
}

// Llama 3: the reply is one or more JSON calls separated by ";", possibly after <|python_tag|>.
std::optional<std::vector<ToolCall>> parse_llama_reply(std::string_view text) {
  text = skip_space(text);
  if (text.starts_with(kPythonTag)) text.remove_prefix(kPythonTag.size());
  std::vector<ToolCall> calls;
  while (true) {
    text = skip_space(text);
    if (text.empty() || text[0] != '{') return std::nullopt;
    const size_t end = json_value_end(text, 0);
    if (end == std::string_view::npos) return std::nullopt;
    const auto object = parse_json(text.substr(0, end));
    if (!object) return std::nullopt;
    auto call = call_from_json(*object);
    if (!call) return std::nullopt;
    calls.push_back(std::move(*call));
    text = skip_space(text.substr(end));
    if (text.empty()) return calls;
    if (text[0] != ';') return std::nullopt;
    text.remove_prefix(1);
  }
}

const Json* parameter_schema(const Json& tools, const std::string& tool_name,
                             const std::string& parameter) {
  if (!tools.is_array()) return nullptr;
  for (const Json& tool : tools) {
    const Json* function =
        tool.is_object() && tool.contains("function") ? &tool["function"] : &tool;
    if (!function->is_object() || function->value("name", "") != tool_name) continue;
    const auto parameters = function->find("parameters");
    if (parameters == function->end() || !parameters->is_object()) return nullptr;
    const auto properties = parameters->find("properties");
    if (properties == parameters->end() || !properties->is_object()) return nullptr;
    const auto schema = properties->find(parameter);
    return schema == properties->end() ? nullptr : &*schema;
  }
  return nullptr;
}

void schema_types(const Json& schema, std::vector<std::string>& types) {
  if (!schema.is_object()) return;
  if (const auto type = schema.find("type"); type != schema.end()) {
    if (type->is_string()) types.push_back(type->get<std::string>());
    if (type->is_array()) {
      for (const Json& t : *type) {
        if (t.is_string()) types.push_back(t.get<std::string>());
      }
    }
  }
  for (const char* alternatives : {"anyOf", "oneOf"}) {
    if (const auto list = schema.find(alternatives); list != schema.end() && list->is_array()) {
      for (const Json& alternative : *list) schema_types(alternative, types);
    }
  }
}

bool is_integer_text(std::string_view text) {
  if (!text.empty() && (text[0] == '-' || text[0] == '+')) text.remove_prefix(1);
  return !text.empty() &&
         std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
}

std::string lower_ascii(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// The markers around a call, empty for formats without them.
std::pair<std::string, std::string> call_markers(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kXmlFunction:
    case ToolCallFormat::kHermesJson:
      return {"<tool_call>", "</tool_call>"};
    case ToolCallFormat::kNemotronJsonList:
      return {"<TOOLCALL>", "</TOOLCALL>"};
    default:
      return {};
  }
}

// Whether the text after an opening marker starts a call of `format`: what makes a marker
// inside reasoning a real call rather than a mention.
MarkerMatch starts_tool_call(ToolCallFormat format, std::string_view after_marker, bool final) {
  switch (format) {
    case ToolCallFormat::kXmlFunction:
      return match_pieces(after_marker, {"<function="}, final);
    case ToolCallFormat::kHermesJson:
      return match_pieces(after_marker, {"{", "\"name\""}, final);
    case ToolCallFormat::kNemotronJsonList:
      return match_pieces(after_marker, {"[", "{", "\"name\""}, final);
    default:
      return MarkerMatch::kNo;
  }
}

}  // namespace

Json coerce_parameter(const std::string& text, const Json& schema) {
  std::vector<std::string> types;
  schema_types(schema, types);
  const std::string_view trimmed = trim(text);
  for (const std::string& raw_type : types) {
    const std::string type = lower_ascii(raw_type);
    if (type == "string" || type == "str" || type == "text") return text;
    if (type == "null") {
      if (trimmed == "null") return nullptr;
    } else if (type == "integer" || type == "int") {
      if (is_integer_text(trimmed)) {
        const auto value = parse_json(trimmed[0] == '+' ? trimmed.substr(1) : trimmed);
        if (value && value->is_number_integer()) return *value;
      }
    } else if (type == "number" || type == "float" || type == "double") {
      const auto value = parse_json(trimmed[0] == '+' ? trimmed.substr(1) : trimmed);
      if (value && value->is_number()) return *value;
    } else if (type == "boolean" || type == "bool") {
      const std::string lowered = lower_ascii(trimmed);
      if (lowered == "true" || lowered == "false") return lowered == "true";
    } else if (type == "object" || type == "array") {
      const auto value = parse_json(trimmed);
      if (value && (type == "object" ? value->is_object() : value->is_array())) return *value;
    }
  }
  return text;
}

ToolCallFormat detect_tool_call_format(std::string_view source) {
  auto has = [&](std::string_view needle) { return source.find(needle) != std::string_view::npos; };
  if (has("<function=") && has("<parameter=")) return ToolCallFormat::kXmlFunction;
  if (has("<TOOLCALL>")) return ToolCallFormat::kNemotronJsonList;
  if (has("<tool_call>")) return ToolCallFormat::kHermesJson;
  if (has("<|start_header_id|>") && has("ipython")) return ToolCallFormat::kLlamaJson;
  return ToolCallFormat::kNone;
}

std::string forced_call_prefix(ToolCallFormat format, const std::string& function) {
  const bool named = !function.empty();
  switch (format) {
    case ToolCallFormat::kXmlFunction:
      return named ? "<tool_call>\n<function=" + function + ">\n" : "<tool_call>";
    case ToolCallFormat::kHermesJson:
      return named ? "<tool_call>\n{\"name\": \"" + function + "\", \"arguments\": "
                   : "<tool_call>";
    case ToolCallFormat::kNemotronJsonList:
      return named ? "<TOOLCALL>[{\"name\": \"" + function + "\", \"arguments\": " : "<TOOLCALL>[";
    case ToolCallFormat::kLlamaJson:
      return named ? "{\"name\": \"" + function + "\", \"parameters\": " : "{\"name\": \"";
    case ToolCallFormat::kNone:
      break;
  }
  return "";
}

ParsedOutput collect_events(const std::vector<OutputEvent>& events) {
  ParsedOutput out;
  for (const OutputEvent& event : events) {
    switch (event.kind) {
      case OutputEvent::Kind::kReasoning:
        out.reasoning += event.text;
        break;
      case OutputEvent::Kind::kContent:
        out.content += event.text;
        break;
      case OutputEvent::Kind::kToolCallStart:
        if (out.tool_calls.size() <= event.index) out.tool_calls.resize(event.index + 1);
        out.tool_calls[event.index].name = event.text;
        break;
      case OutputEvent::Kind::kToolCallArguments:
        if (out.tool_calls.size() <= event.index) out.tool_calls.resize(event.index + 1);
        out.tool_calls[event.index].arguments += event.text;
        break;
      case OutputEvent::Kind::kToolCallEnd:
        break;
    }
  }
  return out;
}

ToolCallParser::ToolCallParser(ToolCallFormat format, Json tools)
    : format_(format), tools_(std::move(tools)), mode_(Mode::kStart) {
  std::tie(open_, close_) = call_markers(format);
}

void ToolCallParser::feed(std::string_view content, std::vector<OutputEvent>& events) {
  buffer_ += content;
  process(false, events);
}

void ToolCallParser::finish(std::vector<OutputEvent>& events) {
  process(true, events);
  // A reply that ends in content keeps its last whitespace (the text before a stop string, or a
  // reply cut at max_tokens, is what the model wrote); after a tool call it goes.
  if (content_started_ && !call_since_content_ && !pending_whitespace_.empty()) {
    append_content(std::move(pending_whitespace_), events);
  }
  pending_whitespace_.clear();
}

void ToolCallParser::append_content(std::string piece, std::vector<OutputEvent>& events) {
  if (!events.empty() && events.back().kind == OutputEvent::Kind::kContent) {
    events.back().text += piece;
  } else {
    events.push_back(OutputEvent{OutputEvent::Kind::kContent, std::move(piece), 0});
  }
}

// Content loses its leading whitespace, and a tool call the whitespace run before it: a
// whitespace run is held until more content follows it (or the reply ends in it).
void ToolCallParser::emit_content(std::string_view text, std::vector<OutputEvent>& events) {
  size_t last = text.size();
  while (last > 0 && is_space(text[last - 1])) --last;
  if (last == 0) {
    if (content_started_) pending_whitespace_ += text;
    return;
  }
  std::string_view head = text.substr(0, last);
  std::string piece;
  if (content_started_) {
    piece = pending_whitespace_;
  } else {
    head = skip_space(head);
  }
  piece += head;
  pending_whitespace_ = text.substr(last);
  content_started_ = true;
  call_since_content_ = false;
  append_content(std::move(piece), events);
}

std::optional<std::vector<ToolCall>> ToolCallParser::parse_block(std::string_view block) const {
  std::vector<ToolCall> calls;
  if (format_ == ToolCallFormat::kHermesJson || format_ == ToolCallFormat::kNemotronJsonList) {
    const auto value = parse_json(trim(block));
    if (!value) return std::nullopt;
    if (format_ == ToolCallFormat::kHermesJson) {
      auto call = call_from_json(*value);
      if (!call) return std::nullopt;
      calls.push_back(std::move(*call));
      return calls;
    }
    if (!value->is_array() || value->empty()) return std::nullopt;
    for (const Json& item : *value) {
      auto call = call_from_json(item);
      if (!call) return std::nullopt;
      calls.push_back(std::move(*call));
    }
    return calls;
  }
  // <function=NAME> (<parameter=ARG>VALUE</parameter>)* </function>, whitespace between tags.
  constexpr std::string_view kFunction = "<function=";
  constexpr std::string_view kFunctionEnd = "</function>";
  constexpr std::string_view kParameter = "<parameter=";
  constexpr std::string_view kParameterEnd = "</parameter>";
  std::string_view rest = skip_space(block);
  if (!rest.starts_with(kFunction)) return std::nullopt;
  rest.remove_prefix(kFunction.size());
  size_t close = rest.find('>');
  if (close == std::string_view::npos) return std::nullopt;
  const std::string name(trim(rest.substr(0, close)));
  if (name.empty() || name.find('<') != std::string::npos) return std::nullopt;
  rest.remove_prefix(close + 1);
  Json arguments = Json::object();
  while (true) {
    rest = skip_space(rest);
    if (rest.starts_with(kFunctionEnd)) {
      rest.remove_prefix(kFunctionEnd.size());
      break;
    }
    if (!rest.starts_with(kParameter)) return std::nullopt;
    rest.remove_prefix(kParameter.size());
    close = rest.find('>');
    if (close == std::string_view::npos) return std::nullopt;
    const std::string parameter(trim(rest.substr(0, close)));
    if (parameter.empty() || parameter.find('<') != std::string::npos) return std::nullopt;
    rest.remove_prefix(close + 1);
    const size_t end = rest.find(kParameterEnd);
    if (end == std::string_view::npos) return std::nullopt;
    // The template writes "\n" + value + "\n" between the tags.
    std::string_view value = rest.substr(0, end);
    if (value.starts_with('\n')) value.remove_prefix(1);
    if (value.ends_with('\n')) value.remove_suffix(1);
    const Json* schema = parameter_schema(tools_, name, parameter);
    arguments[parameter] =
        coerce_parameter(std::string(value), schema != nullptr ? *schema : Json());
    rest.remove_prefix(end + kParameterEnd.size());
  }
  if (!skip_space(rest).empty()) return std::nullopt;
  calls.push_back(ToolCall{name, dump(arguments)});
  return calls;
}

bool ToolCallParser::emit_calls(std::string_view block, bool whole_reply,
                                std::vector<OutputEvent>& events) {
  const auto calls = whole_reply ? parse_llama_reply(block) : parse_block(block);
  if (!calls) return false;
  pending_whitespace_.clear();
  call_since_content_ = true;
  for (const ToolCall& call : *calls) {
    const size_t index = next_index_++;
    events.push_back(OutputEvent{OutputEvent::Kind::kToolCallStart, call.name, index});
    events.push_back(OutputEvent{OutputEvent::Kind::kToolCallArguments, call.arguments, index});
    events.push_back(OutputEvent{OutputEvent::Kind::kToolCallEnd, "", index});
  }
  return true;
}

void ToolCallParser::process(bool final, std::vector<OutputEvent>& events) {
  while (true) {
    switch (mode_) {
      case Mode::kStart: {
        if (format_ != ToolCallFormat::kLlamaJson) {
          mode_ = Mode::kText;
          break;
        }
        const std::string_view rest = skip_space(buffer_);
        if (rest.starts_with(kPythonTag) || rest.starts_with('{')) {
          mode_ = Mode::kWholeReply;
          break;
        }
        if (!final && rest.size() < kPythonTag.size() && kPythonTag.starts_with(rest)) return;
        mode_ = Mode::kText;
        break;
      }
      case Mode::kWholeReply:
        // A Llama reply is a call only if all of it parses, so it is decided at the end.
        if (!final) return;
        if (!emit_calls(buffer_, true, events)) emit_content(buffer_, events);
        buffer_.clear();
        return;
      case Mode::kText: {
        const size_t open = open_.empty() ? std::string::npos : buffer_.find(open_);
        if (open != std::string::npos) {
          emit_content(std::string_view(buffer_).substr(0, open), events);
          buffer_.erase(0, open);
          mode_ = Mode::kInCall;
          break;
        }
        const size_t keep = final || open_.empty() ? 0 : partial_marker_suffix(buffer_, open_);
        emit_content(std::string_view(buffer_).substr(0, buffer_.size() - keep), events);
        buffer_.erase(0, buffer_.size() - keep);
        return;
      }
      case Mode::kInCall: {
        const size_t close = buffer_.find(close_, open_.size());
        if (close == std::string::npos && !final) return;
        // Without its closing marker (output cut off) a call still counts if its body is complete.
        const size_t body_end = close == std::string::npos ? buffer_.size() : close;
        const size_t consumed = close == std::string::npos ? buffer_.size() : close + close_.size();
        const std::string_view body =
            std::string_view(buffer_).substr(open_.size(), body_end - open_.size());
        if (!emit_calls(body, false, events))
          emit_content(std::string_view(buffer_).substr(0, consumed), events);
        buffer_.erase(0, consumed);
        mode_ = Mode::kText;
        break;
      }
    }
  }
}

ChatOutputParser::Config ChatOutputParser::configure(std::string_view template_source,
                                                     std::string_view prompt, const Json& tools) {
  Config config;
  config.reasoning = detect_reasoning_syntax(template_source);
  const bool has_tools = tools.is_array() && !tools.empty();
  config.format = has_tools ? detect_tool_call_format(template_source) : ToolCallFormat::kNone;
  config.tools = tools;
  if (config.reasoning) {
    config.starts_in_reasoning = prompt_opens_reasoning(prompt, *config.reasoning);
    const ToolCallFormat format = config.format;
    const std::string open = call_markers(format).first;
    if (!open.empty()) {
      config.reasoning->implicit_end_marker = open;
      config.reasoning->implicit_end_check = [format](std::string_view after, bool final) {
        return starts_tool_call(format, after, final);
      };
    }
  }
  return config;
}

std::vector<std::string> parser_markers(const ChatOutputParser::Config& config) {
  std::vector<std::string> markers;
  if (config.verbatim) return markers;
  if (config.reasoning) {
    markers.push_back(config.reasoning->start);
    markers.push_back(config.reasoning->end);
  }
  const auto [open, close] = call_markers(config.format);
  if (!open.empty()) {
    markers.push_back(open);
    markers.push_back(close);
  }
  if (config.format == ToolCallFormat::kLlamaJson) markers.emplace_back(kPythonTag);
  return markers;
}

ChatOutputParser::ChatOutputParser(Config config)
    : verbatim_(config.verbatim), tools_(config.format, std::move(config.tools)) {
  if (config.reasoning)
    reasoning_.emplace(std::move(*config.reasoning), config.starts_in_reasoning);
}

void ChatOutputParser::route(ReasoningParser::Output& split, std::vector<OutputEvent>& events) {
  if (!split.reasoning.empty()) {
    events.push_back(OutputEvent{OutputEvent::Kind::kReasoning, std::move(split.reasoning), 0});
  }
  if (!split.content.empty()) tools_.feed(split.content, events);
}

std::vector<OutputEvent> ChatOutputParser::feed(std::string_view text) {
  // Hold back a character cut by the chunking, so no event carries part of one.
  std::string data = incomplete_utf8_;
  data += text;
  const size_t complete = utf8_complete_prefix_length(data);
  incomplete_utf8_ = data.substr(complete);
  data.resize(complete);
  std::vector<OutputEvent> events;
  if (verbatim_) {
    if (!data.empty()) events.push_back(OutputEvent{OutputEvent::Kind::kContent, data, 0});
  } else if (reasoning_) {
    ReasoningParser::Output split;
    reasoning_->feed(data, split);
    route(split, events);
  } else {
    tools_.feed(data, events);
  }
  return events;
}

std::vector<OutputEvent> ChatOutputParser::finish() {
  std::vector<OutputEvent> events;
  const std::string rest = std::move(incomplete_utf8_);
  incomplete_utf8_.clear();
  if (verbatim_) {
    if (!rest.empty()) events.push_back(OutputEvent{OutputEvent::Kind::kContent, rest, 0});
    return events;
  }
  if (reasoning_) {
    ReasoningParser::Output split;
    reasoning_->feed(rest, split);
    reasoning_->finish(split);
    route(split, events);
  } else {
    tools_.feed(rest, events);
  }
  tools_.finish(events);
  return events;
}

ParsedOutput parse_output(const ChatOutputParser::Config& config, std::string_view text) {
  ChatOutputParser parser(config);
  std::vector<OutputEvent> events = parser.feed(text);
  for (OutputEvent& event : parser.finish()) events.push_back(std::move(event));
  return collect_events(events);
}

}  // namespace dspark
