// The OpenAI Responses dialect (stateless; docs/server-api.md §4).
#include <fmt/format.h>

#include <ctime>

#include "server/dialect.h"
#include "server/json_input.h"

namespace dspark::server::responses {
namespace {

using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;

std::string item_text(const Json& content) {
  if (content.is_string()) return content.get<std::string>();
  std::string text;
  if (content.is_array()) {
    for (const auto& part : content) {
      if (part.is_object() && part.contains("text") && part["text"].is_string()) {
        text += part["text"].get<std::string>();
      }
    }
  }
  return text;
}

Json usage_json(const Usage& usage) {
  return {{"input_tokens", usage.prompt_tokens},
          {"input_tokens_details", {{"cached_tokens", usage.cached_tokens}}},
          {"output_tokens", usage.completion_tokens},
          {"output_tokens_details", {{"reasoning_tokens", usage.reasoning_tokens}}},
          {"total_tokens", usage.prompt_tokens + usage.completion_tokens}};
}

Json base(const ChatRequest& request, const std::string& id, const std::string& status) {
  return {{"id", id},         {"object", "response"},   {"created_at", std::time(nullptr)},
          {"status", status}, {"model", request.model}, {"output", Json::array()}};
}

class Stream : public StreamSerializer {
 public:
  Stream(const ChatRequest& request, std::string id) : request_(request), id_(std::move(id)) {}
  std::string start(const Usage&) override {
    return event("response.created", {{"response", base(request_, id_, "in_progress")}});
  }
  std::string events(const std::vector<OutputEvent>& events) override {
    std::string out;
    for (const auto& e : events) {
      if (e.kind == OutputEvent::Kind::kReasoning) {
        output_.reasoning += e.text;
      } else if (e.kind == OutputEvent::Kind::kContent) {
        if (!text_open_) {
          text_open_ = true;
          out += event("response.output_item.added", {{"output_index", 0},
                                                      {"item",
                                                       {{"type", "message"},
                                                        {"id", message_id_},
                                                        {"role", "assistant"},
                                                        {"status", "in_progress"},
                                                        {"content", Json::array()}}}});
          out += event("response.content_part.added",
                       {{"item_id", message_id_},
                        {"output_index", 0},
                        {"content_index", 0},
                        {"part", {{"type", "output_text"}, {"text", ""}}}});
        }
        output_.content += e.text;
        out += event("response.output_text.delta", {{"item_id", message_id_},
                                                    {"output_index", 0},
                                                    {"content_index", 0},
                                                    {"delta", e.text}});
      } else if (e.kind == OutputEvent::Kind::kToolCallStart) {
        output_.tool_calls.push_back({e.text, ""});
      } else if (e.kind == OutputEvent::Kind::kToolCallArguments) {
        output_.tool_calls.back().arguments += e.text;
      }
    }
    return out;
  }
  std::string finish(const GenerationSummary& summary) override {
    std::string out;
    if (text_open_) {
      out += event("response.output_text.done", {{"item_id", message_id_},
                                                 {"output_index", 0},
                                                 {"content_index", 0},
                                                 {"text", output_.content}});
      out += event("response.content_part.done",
                   {{"item_id", message_id_},
                    {"output_index", 0},
                    {"content_index", 0},
                    {"part", {{"type", "output_text"}, {"text", output_.content}}}});
      out += event("response.output_item.done",
                   {{"output_index", 0}, {"item", message_item(output_.content)}});
    }
    int index = text_open_ ? 1 : 0;
    for (const auto& call : output_.tool_calls) {
      Json item = {{"type", "function_call"},       {"id", random_id("fc_")},
                   {"call_id", random_id("call_")}, {"name", call.name},
                   {"arguments", call.arguments},   {"status", "completed"}};
      out += event("response.output_item.added", {{"output_index", index}, {"item", item}});
      out += event("response.function_call_arguments.delta",
                   {{"item_id", item["id"]}, {"output_index", index}, {"delta", call.arguments}});
      out +=
          event("response.function_call_arguments.done",
                {{"item_id", item["id"]}, {"output_index", index}, {"arguments", call.arguments}});
      out += event("response.output_item.done", {{"output_index", index}, {"item", item}});
      ++index;
    }
    const Json body = response(request_, output_, summary, id_);
    const std::string name =
        body["status"] == "incomplete" ? "response.incomplete" : "response.completed";
    return out + event(name, {{"response", body}});
  }
  std::string keepalive() override { return ": keepalive\n\n"; }
  std::string error(int status, const std::string& message) override {
    return event("error", {{"code", error_type(Dialect::responses, status)}, {"message", message}});
  }

 private:
  Json message_item(const std::string& text) const {
    return {
        {"type", "message"},
        {"id", message_id_},
        {"role", "assistant"},
        {"status", "completed"},
        {"content",
         Json::array({{{"type", "output_text"}, {"text", text}, {"annotations", Json::array()}}})}};
  }
  std::string event(const std::string& name, Json data) {
    data["type"] = name;
    data["sequence_number"] = sequence_++;
    return sse_event(name, data);
  }
  const ChatRequest& request_;
  std::string id_;
  std::string message_id_ = random_id("msg_");
  bool text_open_ = false;
  int sequence_ = 0;
  ParsedOutput output_;
};

}  // namespace

ChatRequest parse(const Json& body) {
  if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object");
  ChatRequest request;
  request.dialect = Dialect::responses;
  request.model =
      body.contains("model") && body["model"].is_string() ? body["model"].get<std::string>() : "";
  if (body.contains("instructions") && body["instructions"].is_string()) {
    request.messages.push_back(
        {{"role", "system"}, {"content", body["instructions"].get<std::string>()}});
  }
  const Json input = body.value("input", Json());
  if (input.is_string()) {
    request.messages.push_back({{"role", "user"}, {"content", input.get<std::string>()}});
  } else if (input.is_array()) {
    for (const auto& item : input) {
      if (!item.is_object()) throw ApiError(400, "each input item must be an object", "", "input");
      const std::string type = item.value("type", "message");
      if (type == "message") {
        std::string role = json_string(item.value("role", Json()), "role");
        if (role == "developer") role = "system";
        if (role != "system" && role != "user" && role != "assistant") {
          throw ApiError(400, fmt::format("unknown message role '{}'", role), "", "input");
        }
        request.messages.push_back(
            {{"role", role}, {"content", item_text(item.value("content", Json()))}});
      } else if (type == "function_call") {
        OrderedJson arguments = OrderedJson::object();
        const std::string text = json_string(item.value("arguments", Json("{}")), "arguments");
        check_field_size(text, "function_call.arguments", kMaxToolArgumentsBytes);
        if (nests_too_deep(text)) {
          throw ApiError(400,
                         fmt::format("function_call arguments nest deeper than {} levels of "
                                     "arrays and objects",
                                     kMaxJsonDepth),
                         "", "input");
        }
        try {
          arguments = OrderedJson::parse(text);
        } catch (const nlohmann::json::exception&) {
        }
        request.messages.push_back(
            {{"role", "assistant"},
             {"content", ""},
             {"tool_calls", OrderedJson::array({{{"id", item.value("call_id", "")},
                                                 {"type", "function"},
                                                 {"function",
                                                  {{"name", item.value("name", "")},
                                                   {"arguments", arguments}}}}})}});
      } else if (type == "function_call_output") {
        request.messages.push_back({{"role", "tool"},
                                    {"tool_call_id", item.value("call_id", "")},
                                    {"content", item_text(item.value("output", Json("")))}});
      }
    }
  }
  if (request.messages.empty() ||
      (request.messages.size() == 1 && request.messages[0]["role"] == "system")) {
    throw ApiError(400, "'input' must be a non-empty string or list of items", "", "input");
  }
  if (body.contains("tools") && body["tools"].is_array()) {
    check_field_size(body["tools"], "tools", kMaxToolsBytes);
    OrderedJson tools = OrderedJson::array();
    for (size_t i = 0; i < body["tools"].size(); ++i) {
      const Json& tool = body["tools"][i];
      if (!tool.is_object() || tool.value("type", "") != "function") continue;
      check_field_size(tool, fmt::format("tools[{}]", i), kMaxToolBytes);
      tools.push_back({{"type", "function"},
                       {"function",
                        {{"name", json_string(tool.value("name", Json()), "tools.name")},
                         {"description", tool.value("description", "")},
                         {"parameters", OrderedJson(tool.value("parameters", Json::object()))}}}});
    }
    if (!tools.empty()) request.tools = tools;
  }
  if (body.contains("parallel_tool_calls") && !body["parallel_tool_calls"].is_null()) {
    request.parallel_tool_calls = json_bool(body["parallel_tool_calls"], "parallel_tool_calls");
  }
  if (body.contains("tool_choice") && !body["tool_choice"].is_null()) {
    const Json& choice = body["tool_choice"];
    if (choice.is_string()) {
      apply_tool_choice(request, choice.get<std::string>(), false);
    } else if (choice.is_object() && choice.value("type", "") == "function") {
      apply_tool_choice(request, json_string(choice.value("name", Json()), "tool_choice.name"),
                        true);
    } else {
      throw ApiError(400, "'tool_choice' must be a string or {\"type\": \"function\", \"name\"}",
                     "", "tool_choice");
    }
  }
  if (body.contains("max_output_tokens") && !body["max_output_tokens"].is_null()) {
    request.max_tokens = json_int(body["max_output_tokens"], "max_output_tokens");
    if (*request.max_tokens < 1) throw ApiError(400, "'max_output_tokens' must be at least 1");
  }
  parse_core_sampling(body, request.sampling);
  if (body.contains("metadata")) check_field_size(body["metadata"], "metadata", kMaxMetadataBytes);
  if (body.contains("stream") && !body["stream"].is_null())
    request.stream = json_bool(body["stream"], "stream");
  if (body.contains("reasoning") && body["reasoning"].is_object()) {
    const Json& requested = body["reasoning"].value("effort", Json());
    const std::string effort =
        requested.is_null() ? "" : json_string(requested, "reasoning.effort");
    if (effort == "none")
      request.enable_thinking = false;
    else if (!effort.empty())
      request.enable_thinking = true;
  }
  if (body.contains("text") && body["text"].is_object() && body["text"].contains("format") &&
      !body["text"]["format"].is_null()) {
    request.response_format =
        parse_response_format(body["text"]["format"], "text.format", "/text/format");
  }
  parse_reasoning_budget(body, request);
  return request;
}

Json response(const ChatRequest& request, const ParsedOutput& output,
              const GenerationSummary& summary, const std::string& id) {
  const bool incomplete = summary.finish == Finish::length;
  Json body = base(request, id, incomplete ? "incomplete" : "completed");
  if (!output.reasoning.empty()) {
    body["output"].push_back(
        {{"type", "reasoning"},
         {"id", random_id("rs_")},
         {"summary", Json::array({{{"type", "summary_text"}, {"text", output.reasoning}}})}});
  }
  for (const auto& call : output.tool_calls) {
    body["output"].push_back({{"type", "function_call"},
                              {"id", random_id("fc_")},
                              {"call_id", random_id("call_")},
                              {"name", call.name},
                              {"arguments", call.arguments},
                              {"status", "completed"}});
  }
  if (!output.content.empty() || output.tool_calls.empty()) {
    body["output"].push_back({{"type", "message"},
                              {"id", random_id("msg_")},
                              {"role", "assistant"},
                              {"status", "completed"},
                              {"content", Json::array({{{"type", "output_text"},
                                                        {"text", output.content},
                                                        {"annotations", Json::array()}}})}});
  }
  body["incomplete_details"] = incomplete ? Json({{"reason", "max_output_tokens"}}) : Json();
  body["usage"] = usage_json(summary.usage);
  body["x_dspark"] = summary.stats;
  return body;
}

std::unique_ptr<StreamSerializer> stream(const ChatRequest& request, const std::string& id) {
  return std::make_unique<Stream>(request, id);
}

}  // namespace dspark::server::responses
