// The Anthropic Messages dialect (docs/server-api.md §2).
#include <fmt/format.h>

#include "server/dialect.h"
#include "server/json_input.h"

namespace dspark::server::anthropic {
namespace {

using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;

constexpr const char* kSignature = "dspark";

// Claude Code's first system block carries a per-request nonce (cch=...) that would defeat the
// prefix cache; it says nothing to the model, so it is dropped.
bool is_billing_header(const std::string& text) {
  return text.rfind("x-anthropic-billing-header:", 0) == 0;
}

std::string system_text(const Json& system) {
  if (system.is_null()) return "";
  if (system.is_string())
    return is_billing_header(system.get<std::string>()) ? "" : system.get<std::string>();
  if (!system.is_array()) throw ApiError(400, "'system' must be a string or a list of text blocks");
  std::string text;
  for (const auto& block : system) {
    if (!block.is_object() ||
        json_string(block.value("type", Json("text")), "system.type") != "text") {
      throw ApiError(400, "'system' blocks must be text blocks", "", "system");
    }
    const std::string piece = json_string(block.value("text", Json()), "system.text");
    if (is_billing_header(piece)) continue;
    if (!text.empty()) text += "\n\n";
    text += piece;
  }
  return text;
}

std::string blocks_text(const Json& content) {
  if (content.is_string()) return content.get<std::string>();
  std::string text;
  if (!content.is_array()) return text;
  for (const auto& block : content) {
    if (block.is_object() && block.value("type", "") == "text" && block.contains("text") &&
        block["text"].is_string()) {
      text += block["text"].get<std::string>();
    }
  }
  return text;
}

void add_message(ChatRequest& request, const Json& message) {
  if (!message.is_object()) throw ApiError(400, "each message must be an object");
  const std::string role = json_string(message.value("role", Json()), "role");
  if (role != "user" && role != "assistant") {
    throw ApiError(400, fmt::format("unknown message role '{}': expected user or assistant", role));
  }
  const Json content = message.value("content", Json());
  if (content.is_string()) {
    request.messages.push_back({{"role", role}, {"content", content.get<std::string>()}});
    return;
  }
  if (!content.is_array()) throw ApiError(400, "'content' must be a string or a list of blocks");
  std::string text;
  std::string reasoning;
  OrderedJson calls = OrderedJson::array();
  std::vector<OrderedJson> tool_results;
  for (const auto& block : content) {
    if (!block.is_object()) throw ApiError(400, "each content block must be an object");
    const std::string type = json_string(block.value("type", Json()), "content.type");
    if (type == "text") {
      text += json_string(block.value("text", Json()), "text");
    } else if (type == "image") {
      throw ApiError(400, "this model takes text only; image blocks are not supported");
    } else if (type == "tool_use") {
      if (block.contains("input"))
        check_field_size(block["input"], "tool_use.input", kMaxToolArgumentsBytes);
      OrderedJson input =
          block.contains("input") ? OrderedJson(block["input"]) : OrderedJson::object();
      calls.push_back({{"id", json_string(block.value("id", Json("")), "tool_use.id")},
                       {"type", "function"},
                       {"function",
                        {{"name", json_string(block.value("name", Json()), "tool_use.name")},
                         {"arguments", input}}}});
    } else if (type == "tool_result") {
      std::string result = blocks_text(block.value("content", Json("")));
      if (json_bool(block.value("is_error", Json(false)), "tool_result.is_error"))
        result = "Error: " + result;
      tool_results.push_back({{"role", "tool"},
                              {"tool_call_id", json_string(block.value("tool_use_id", Json("")),
                                                           "tool_result.tool_use_id")},
                              {"content", result}});
    } else if (type == "thinking") {
      reasoning += json_string(block.value("thinking", Json("")), "thinking");
    }
    // document, redacted_thinking, server_tool_use, web_search_tool_result, ...: dropped.
  }
  // Tool results answer the previous assistant turn, so they come first, as tool messages.
  for (auto& result : tool_results) request.messages.push_back(std::move(result));
  if (!text.empty() || !calls.empty() || (tool_results.empty() && reasoning.empty())) {
    OrderedJson out = {{"role", role}, {"content", text}};
    if (!calls.empty()) out["tool_calls"] = calls;
    if (!reasoning.empty()) out["reasoning_content"] = reasoning;
    request.messages.push_back(out);
  }
}

Json usage_json(const Usage& usage) {
  return {{"input_tokens", usage.prompt_tokens - usage.cached_tokens},
          {"cache_read_input_tokens", usage.cached_tokens},
          {"cache_creation_input_tokens", 0},
          {"output_tokens", usage.completion_tokens}};
}

Json tool_input(const std::string& arguments) {
  if (nests_too_deep(arguments)) return Json::object();
  try {
    Json input = Json::parse(arguments);
    if (input.is_object()) return input;
  } catch (const nlohmann::json::exception&) {
  }
  return Json::object();
}

class MessagesStream : public StreamSerializer {
 public:
  MessagesStream(const ChatRequest& request, std::string id)
      : request_(request), id_(std::move(id)) {}

  std::string start(const Usage& prompt_usage) override {
    Usage usage = prompt_usage;
    usage.completion_tokens = 1;
    Json message = {{"id", id_},
                    {"type", "message"},
                    {"role", "assistant"},
                    {"model", request_.model},
                    {"content", Json::array()},
                    {"stop_reason", Json()},
                    {"stop_sequence", Json()},
                    {"usage", usage_json(usage)}};
    return sse_event("message_start", {{"type", "message_start"}, {"message", message}}) +
           sse_event("ping", {{"type", "ping"}});
  }

  std::string events(const std::vector<OutputEvent>& events) override {
    std::string out;
    for (const auto& event : events) {
      switch (event.kind) {
        case OutputEvent::Kind::kReasoning:
          if (request_.drop_reasoning) break;
          out += open("thinking", {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}});
          out += delta({{"type", "thinking_delta"}, {"thinking", event.text}});
          break;
        case OutputEvent::Kind::kContent:
          out += open("text", {{"type", "text"}, {"text", ""}});
          out += delta({{"type", "text_delta"}, {"text", event.text}});
          break;
        case OutputEvent::Kind::kToolCallStart:
          out += close();
          out += open("tool_use", {{"type", "tool_use"},
                                   {"id", random_id("toolu_")},
                                   {"name", event.text},
                                   {"input", Json::object()}});
          break;
        case OutputEvent::Kind::kToolCallArguments:
          out += delta({{"type", "input_json_delta"}, {"partial_json", event.text}});
          break;
        case OutputEvent::Kind::kToolCallEnd:
          out += close();
          break;
      }
    }
    return out;
  }

  std::string finish(const GenerationSummary& summary) override {
    std::string out = close();
    out += sse_event(
        "message_delta",
        {{"type", "message_delta"},
         {"delta",
          {{"stop_reason", stop_reason(summary.finish)},
           {"stop_sequence",
            summary.finish == Finish::stop_sequence ? Json(summary.stop_sequence) : Json()}}},
         {"usage", usage_json(summary.usage)}});
    return out + sse_event("message_stop", {{"type", "message_stop"}});
  }

  std::string keepalive() override { return sse_event("ping", {{"type", "ping"}}); }

  std::string error(int status, const std::string& message) override {
    return sse_event("error", error_body(Dialect::anthropic, status, message));
  }

 private:
  // Opens a block of `type` unless one is open already (a tool_use block always opens anew).
  std::string open(const std::string& type, const Json& block) {
    if (open_type_ == type && type != "tool_use") return "";
    std::string out = close();
    open_type_ = type;
    out +=
        sse_event("content_block_start",
                  {{"type", "content_block_start"}, {"index", index_}, {"content_block", block}});
    return out;
  }
  std::string delta(const Json& delta) {
    return sse_event("content_block_delta",
                     {{"type", "content_block_delta"}, {"index", index_}, {"delta", delta}});
  }
  std::string close() {
    if (open_type_.empty()) return "";
    std::string out;
    if (open_type_ == "thinking")
      out += delta({{"type", "signature_delta"}, {"signature", kSignature}});
    out += sse_event("content_block_stop", {{"type", "content_block_stop"}, {"index", index_}});
    open_type_.clear();
    ++index_;
    return out;
  }

  const ChatRequest& request_;
  std::string id_;
  std::string open_type_;
  int index_ = 0;
};

}  // namespace

const char* stop_reason(Finish finish) {
  switch (finish) {
    case Finish::length:
      return "max_tokens";
    case Finish::stop_sequence:
      return "stop_sequence";
    case Finish::tool_calls:
      return "tool_use";
    default:
      return "end_turn";
  }
}

ChatRequest parse_messages(const Json& body, bool count_only) {
  if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object");
  ChatRequest request;
  request.dialect = Dialect::anthropic;
  request.model =
      body.contains("model") && body["model"].is_string() ? body["model"].get<std::string>() : "";
  if (!count_only && body.contains("max_tokens") && !body["max_tokens"].is_null()) {
    request.max_tokens = json_int(body["max_tokens"], "max_tokens");
    if (*request.max_tokens < 1) throw ApiError(400, "'max_tokens' must be at least 1");
  }
  if (!body.contains("messages") || !body["messages"].is_array() || body["messages"].empty()) {
    throw ApiError(400, "'messages' must be a non-empty list");
  }
  const std::string system = system_text(body.value("system", Json()));
  if (!system.empty()) request.messages.push_back({{"role", "system"}, {"content", system}});
  for (const auto& message : body["messages"]) add_message(request, message);
  if (body.contains("tools") && body["tools"].is_array()) {
    check_field_size(body["tools"], "tools", kMaxToolsBytes);
    OrderedJson tools = OrderedJson::array();
    for (size_t i = 0; i < body["tools"].size(); ++i) {
      const Json& tool = body["tools"][i];
      if (!tool.is_object() || !tool.contains("input_schema")) continue;  // server tools
      check_field_size(tool, fmt::format("tools[{}]", i), kMaxToolBytes);
      OrderedJson function = {{"name", json_string(tool.value("name", Json()), "tools.name")},
                              {"description", tool.value("description", "")},
                              {"parameters", OrderedJson(tool["input_schema"])}};
      tools.push_back({{"type", "function"}, {"function", function}});
    }
    if (!tools.empty()) request.tools = tools;
  } else if (body.contains("tools") && !body["tools"].is_null()) {
    throw ApiError(400, "'tools' must be a list");
  }
  if (body.contains("tool_choice") && !body["tool_choice"].is_null()) {
    const Json& choice = body["tool_choice"];
    const std::string type = choice.is_object() ? choice.value("type", "") : "";
    if (choice.is_object() && choice.contains("disable_parallel_tool_use")) {
      request.parallel_tool_calls =
          !json_bool(choice["disable_parallel_tool_use"], "tool_choice.disable_parallel_tool_use");
    }
    if (type == "tool") {
      apply_tool_choice(request, json_string(choice.value("name", Json()), "tool_choice.name"),
                        true);
    } else if (type == "auto" || type == "none") {
      apply_tool_choice(request, type, false);
    } else if (type == "any") {
      apply_tool_choice(request, "required", false);
    } else {
      throw ApiError(400,
                     "'tool_choice' must be {\"type\": \"auto\" | \"any\" | \"tool\" | \"none\"}");
    }
  }
  if (body.contains("metadata")) check_field_size(body["metadata"], "metadata", kMaxMetadataBytes);
  if (body.contains("stop_sequences"))
    request.stop = json_string_list(body["stop_sequences"], "stop_sequences");
  if (body.contains("stream") && !body["stream"].is_null())
    request.stream = json_bool(body["stream"], "stream");
  parse_core_sampling(body, request.sampling);
  if (body.contains("thinking") && !body["thinking"].is_null() && !body["thinking"].is_object()) {
    throw ApiError(400, "'thinking' must be an object such as {\"type\": \"enabled\"}", "",
                   "thinking");
  }
  if (body.contains("thinking") && body["thinking"].is_object()) {
    const std::string type = json_string(body["thinking"].value("type", Json("")), "thinking.type");
    if (type == "disabled") {
      request.enable_thinking = false;
      request.drop_reasoning = true;
    } else if (type == "enabled" || type == "adaptive") {
      request.enable_thinking = true;
      // docs/server-api.md §2.2: budget_tokens is the reasoning budget (an explicit
      // reasoning_budget field still wins, below).
      const Json& tokens = body["thinking"].value("budget_tokens", Json());
      if (!tokens.is_null()) {
        if (!tokens.is_number_integer() || tokens.get<int64_t>() < 0) {
          throw ApiError(400, "'thinking.budget_tokens' must be a non-negative integer");
        }
        request.reasoning_budget = tokens.get<int64_t>();
      }
    } else {
      throw ApiError(400, fmt::format("unknown thinking type '{}'", type));
    }
  }
  parse_reasoning_budget(body, request);
  if (body.contains("output_config") && body["output_config"].is_object() &&
      body["output_config"].contains("format") && !body["output_config"]["format"].is_null()) {
    request.response_format = parse_response_format(
        body["output_config"]["format"], "output_config.format", "/output_config/format");
  }
  if (body.contains("chat_template_kwargs") && body["chat_template_kwargs"].is_object()) {
    const Json& kwargs = body["chat_template_kwargs"];
    check_field_size(kwargs, "chat_template_kwargs", kMaxTemplateKwargsBytes);
    if (kwargs.contains("enable_thinking"))
      json_bool(kwargs["enable_thinking"], "chat_template_kwargs.enable_thinking");
    for (const auto& [key, value] : kwargs.items())
      request.template_kwargs[key] = OrderedJson(value);
  }
  return request;
}

Json messages_response(const ChatRequest& request, const ParsedOutput& output,
                       const GenerationSummary& summary, const std::string& id) {
  Json content = Json::array();
  if (!output.reasoning.empty() && !request.drop_reasoning) {
    content.push_back(
        {{"type", "thinking"}, {"thinking", output.reasoning}, {"signature", kSignature}});
  }
  if (!output.content.empty() || output.tool_calls.empty()) {
    content.push_back({{"type", "text"}, {"text", output.content}});
  }
  for (const auto& call : output.tool_calls) {
    content.push_back({{"type", "tool_use"},
                       {"id", random_id("toolu_")},
                       {"name", call.name},
                       {"input", tool_input(call.arguments)}});
  }
  return {{"id", id},
          {"type", "message"},
          {"role", "assistant"},
          {"model", request.model},
          {"content", content},
          {"stop_reason", stop_reason(summary.finish)},
          {"stop_sequence",
           summary.finish == Finish::stop_sequence ? Json(summary.stop_sequence) : Json()},
          {"usage", usage_json(summary.usage)}};
}

std::unique_ptr<StreamSerializer> messages_stream(const ChatRequest& request,
                                                  const std::string& id) {
  return std::make_unique<MessagesStream>(request, id);
}

}  // namespace dspark::server::anthropic
