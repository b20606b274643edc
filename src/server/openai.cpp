// The OpenAI dialect: chat completions and legacy completions (docs/server-api.md §1).
#include <fmt/format.h>

#include <ctime>

#include "server/dialect.h"
#include "server/json_input.h"

namespace dspark::server {

std::string sse_data(const nlohmann::json& data) {
  return "data: " + dump_json(data) + "\n\n";
}

std::string sse_event(const std::string& name, const nlohmann::json& data) {
  return "event: " + name + "\ndata: " + dump_json(data) + "\n\n";
}

namespace openai {
namespace {

constexpr size_t kMaxStopTokenIds = 256;
// The reference product's bound on `n`.
constexpr int64_t kMaxChoices = 8;

using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;

// Text of a content value: a string, null, or a list of parts of which only text is kept.
std::string content_text(const Json& content, const char* field) {
  if (content.is_null()) return "";
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) {
    throw ApiError(400, fmt::format("'{}' must be a string, null or a list of parts", field), "",
                   field);
  }
  std::string text;
  for (const auto& part : content) {
    if (part.is_string()) {
      text += part.get<std::string>();
      continue;
    }
    if (!part.is_object())
      throw ApiError(400, fmt::format("'{}' has a part that is not an object", field));
    const std::string type = part.value("type", "text");
    if (type == "text" || type == "input_text" || type == "output_text") {
      text += json_string(part.value("text", Json()), "text");
    } else if (type == "image_url" || type == "input_image" || type == "input_audio" ||
               type == "image" || type == "file") {
      throw ApiError(
          400, fmt::format("this model takes text only; '{}' content is not supported", type));
    }
  }
  return text;
}

// Assistant tool_calls: `arguments` JSON strings become objects, as templates iterate them.
OrderedJson normalise_tool_calls(const Json& calls) {
  if (!calls.is_array()) throw ApiError(400, "'tool_calls' must be a list", "", "tool_calls");
  OrderedJson out = OrderedJson::array();
  for (const auto& call : calls) {
    if (!call.is_object() || !call.contains("function") || !call["function"].is_object()) {
      throw ApiError(400, "each tool call needs a 'function' object", "", "tool_calls");
    }
    const Json& function = call["function"];
    OrderedJson arguments = OrderedJson::object();
    if (function.contains("arguments")) {
      const Json& raw = function["arguments"];
      check_field_size(raw, "tool_calls.function.arguments", kMaxToolArgumentsBytes);
      if (raw.is_string()) {
        const std::string& text = raw.get_ref<const std::string&>();
        if (nests_too_deep(text)) {
          throw ApiError(400,
                         fmt::format("tool call arguments nest deeper than {} levels of arrays "
                                     "and objects",
                                     kMaxJsonDepth),
                         "", "tool_calls");
        }
        try {
          arguments = OrderedJson::parse(text);
        } catch (const nlohmann::json::exception&) {
          arguments = text;
        }
      } else {
        arguments = OrderedJson(raw);
      }
    }
    OrderedJson normalised = {{"type", "function"},
                              {"function",
                               {{"name", json_string(function.value("name", Json()), "name")},
                                {"arguments", arguments}}}};
    if (call.contains("id")) normalised["id"] = OrderedJson(call["id"]);
    out.push_back(normalised);
  }
  return out;
}

void parse_sampling(const Json& body, ChatRequest& request) {
  RequestSampling& s = request.sampling;
  parse_core_sampling(body, s);
  auto penalty = [&](const char* field, float& out, float lo, float hi) {
    if (body.contains(field) && !body[field].is_null()) {
      out = json_float(body[field], field);
      if (out < lo || out > hi)
        throw ApiError(400, fmt::format("'{}' must be in [{}, {}]", field, lo, hi), "", field);
    }
  };
  penalty("presence_penalty", s.presence_penalty, -2, 2);
  penalty("frequency_penalty", s.frequency_penalty, -2, 2);
  penalty("repetition_penalty", s.repetition_penalty, 0.01f, 10);
  penalty("repeat_penalty", s.repetition_penalty, 0.01f, 10);
}

void parse_common(const Json& body, ChatRequest& request) {
  if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object");
  request.model =
      body.contains("model") && body["model"].is_string() ? body["model"].get<std::string>() : "";
  parse_sampling(body, request);
  for (const char* field : {"max_tokens", "max_completion_tokens"}) {
    if (body.contains(field) && !body[field].is_null()) {
      request.max_tokens = json_int(body[field], field);
      if (*request.max_tokens < 1) {
        throw ApiError(400, fmt::format("'{}' must be at least 1", field), "", field);
      }
    }
  }
  if (body.contains("stop")) request.stop = json_string_list(body["stop"], "stop");
  if (body.contains("response_format") && !body["response_format"].is_null()) {
    request.response_format =
        parse_response_format(body["response_format"], "response_format", "/response_format");
  } else if (body.contains("json_schema") && !body["json_schema"].is_null()) {
    // llama.cpp's top-level schema field.
    request.response_format = parse_response_format(
        {{"type", "json_schema"}, {"schema", body["json_schema"]}}, "json_schema", "");
    request.response_format.pointer = "/json_schema";
  }
  parse_reasoning_budget(body, request);
  if (body.contains("skip_special_tokens") && !body["skip_special_tokens"].is_null()) {
    request.skip_special_tokens = json_bool(body["skip_special_tokens"], "skip_special_tokens");
  }
  if (body.contains("min_tokens") && !body["min_tokens"].is_null()) {
    request.sampling.min_tokens = json_int(body["min_tokens"], "min_tokens");
    if (request.sampling.min_tokens < 0)
      throw ApiError(400, "'min_tokens' must be >= 0", "", "min_tokens");
  }
  if (body.contains("ignore_eos") && !body["ignore_eos"].is_null())
    request.ignore_eos = json_bool(body["ignore_eos"], "ignore_eos");
  if (body.contains("stop_token_ids") && !body["stop_token_ids"].is_null()) {
    const Json& ids = body["stop_token_ids"];
    if (!ids.is_array() || ids.size() > kMaxStopTokenIds) {
      throw ApiError(
          400,
          fmt::format("'stop_token_ids' must be a list of at most {} token ids", kMaxStopTokenIds),
          "", "stop_token_ids");
    }
    for (const Json& id : ids)
      request.stop_token_ids.push_back(json_token_id(id, "stop_token_ids"));
  }
  if (body.contains("stream") && !body["stream"].is_null())
    request.stream = json_bool(body["stream"], "stream");
  if (body.contains("stream_options") && !body["stream_options"].is_null() &&
      !body["stream_options"].is_object()) {
    throw ApiError(400, "'stream_options' must be an object", "", "stream_options");
  }
  if (body.contains("stream_options") && body["stream_options"].is_object()) {
    const Json& options = body["stream_options"];
    if (options.contains("include_usage")) {
      request.include_usage = json_bool(options["include_usage"], "stream_options.include_usage");
    }
  }
  if (body.contains("metadata")) check_field_size(body["metadata"], "metadata", kMaxMetadataBytes);
  if (body.contains("n") && !body["n"].is_null()) {
    const int64_t n = json_int(body["n"], "n");
    if (n < 1 || n > kMaxChoices)
      throw ApiError(400, fmt::format("'n' must be in [1, {}]", kMaxChoices), "", "n");
    if (n > 1 && request.stream)
      throw ApiError(400, "'n' > 1 is not supported with 'stream'", "", "n");
    request.n = static_cast<int>(n);
  }
}

Json base_chunk(const std::string& id, const std::string& object, const std::string& model,
                int64_t created) {
  return {{"id", id},
          {"object", object},
          {"created", created},
          {"model", model},
          {"system_fingerprint", "dspark-0.1.0"}};
}

Json logprobs_json(const GenerationSummary& summary) {
  Json content = Json::array();
  for (const auto& entry : summary.logprobs) {
    Json top = Json::array();
    for (const auto& [token, logprob] : entry.top) {
      top.push_back({{"token", token},
                     {"logprob", logprob},
                     {"bytes", std::vector<uint8_t>(token.begin(), token.end())}});
    }
    content.push_back({{"token", entry.token},
                       {"logprob", entry.logprob},
                       {"bytes", std::vector<uint8_t>(entry.token.begin(), entry.token.end())},
                       {"top_logprobs", top}});
  }
  return {{"content", content}};
}

// The legacy /v1/completions shape: parallel lists, top alternatives as {token: logprob}. With
// echo the prompt's tokens come first, the first of them with null entries (nothing precedes
// it), as in OpenAI's and vLLM's answers.
Json completion_logprobs_json(const GenerationSummary& summary) {
  Json tokens = Json::array(), token_logprobs = Json::array(), top_logprobs = Json::array(),
       text_offset = Json::array();
  size_t offset = 0;
  const auto add = [&](const TokenLogprobEntry& entry, bool defined) {
    tokens.push_back(entry.token);
    Json top = Json::object();
    for (const auto& [token, logprob] : entry.top) top[token] = logprob;
    token_logprobs.push_back(defined ? Json(entry.logprob) : Json());
    top_logprobs.push_back(defined ? top : Json());
    text_offset.push_back(offset);
    offset += entry.token.size();
  };
  for (size_t i = 0; i < summary.prompt_logprobs.size(); ++i)
    add(summary.prompt_logprobs[i], i > 0);
  for (const auto& entry : summary.logprobs) add(entry, true);
  return {{"tokens", tokens},
          {"token_logprobs", token_logprobs},
          {"top_logprobs", top_logprobs},
          {"text_offset", text_offset}};
}

// The end of an OpenAI stream: the usage chunk (when stream_options.include_usage) and [DONE].
std::string stream_tail(const ChatRequest& request, const std::string& id, const char* object,
                        int64_t created, const GenerationSummary& summary) {
  std::string out;
  if (request.include_usage) {
    Json usage = base_chunk(id, object, request.model, created);
    usage["choices"] = Json::array();
    usage["usage"] = usage_json(summary.usage);
    out += sse_data(usage);
  }
  return out + "data: [DONE]\n\n";
}

class ChatStream : public StreamSerializer {
 public:
  ChatStream(const ChatRequest& request, std::string id)
      : request_(request), id_(std::move(id)), created_(std::time(nullptr)) {}

  std::string start(const Usage&) override {
    return chunk({{"role", "assistant"}, {"content", ""}}, Json());
  }

  std::string events(const std::vector<OutputEvent>& events) override {
    std::string out;
    for (const auto& event : events) {
      switch (event.kind) {
        case OutputEvent::Kind::kReasoning:
          out += chunk({{"reasoning_content", event.text}}, Json());
          break;
        case OutputEvent::Kind::kContent:
          out += chunk({{"content", event.text}}, Json());
          break;
        case OutputEvent::Kind::kToolCallStart:
          out += chunk({{"tool_calls",
                         Json::array({{{"index", event.index},
                                       {"id", random_id("call_")},
                                       {"type", "function"},
                                       {"function", {{"name", event.text}, {"arguments", ""}}}}})}},
                       Json());
          break;
        case OutputEvent::Kind::kToolCallArguments:
          out += chunk({{"tool_calls", Json::array({{{"index", event.index},
                                                     {"function", {{"arguments", event.text}}}}})}},
                       Json());
          break;
        case OutputEvent::Kind::kToolCallEnd:
          break;
      }
    }
    return out;
  }

  std::string finish(const GenerationSummary& summary) override {
    Json last = base_chunk(id_, "chat.completion.chunk", request_.model, created_);
    Json choice = {{"index", 0},
                   {"delta", Json::object()},
                   {"finish_reason", finish_reason(summary.finish)},
                   {"logprobs", request_.logprobs ? logprobs_json(summary) : Json()}};
    last["choices"] = Json::array({choice});
    last["usage"] = Json();
    last["x_dspark"] = summary.stats;
    return sse_data(last) + stream_tail(request_, id_, "chat.completion.chunk", created_, summary);
  }

  std::string keepalive() override { return ": keepalive\n\n"; }

  // A cut stream says so twice: finish_reason "error" for clients that read choices, then the
  // error object that the SDKs raise on. No [DONE]: the answer is not complete.
  std::string error(int status, const std::string& message) override {
    return chunk(Json::object(), "error") + sse_data(error_body(Dialect::openai, status, message));
  }

 private:
  std::string chunk(const Json& delta, const Json& finish) {
    Json c = base_chunk(id_, "chat.completion.chunk", request_.model, created_);
    c["choices"] = Json::array(
        {{{"index", 0}, {"delta", delta}, {"logprobs", Json()}, {"finish_reason", finish}}});
    c["usage"] = Json();
    return sse_data(c);
  }

  const ChatRequest& request_;
  std::string id_;
  int64_t created_;
};

class CompletionStream : public StreamSerializer {
 public:
  CompletionStream(const ChatRequest& request, std::string id)
      : request_(request), id_(std::move(id)), created_(std::time(nullptr)) {}
  std::string start(const Usage&) override { return ""; }
  std::string events(const std::vector<OutputEvent>& events) override {
    std::string text;
    for (const auto& event : events) {
      if (event.kind == OutputEvent::Kind::kContent) text += event.text;
    }
    return text.empty() ? "" : chunk(text, Json());
  }
  std::string finish(const GenerationSummary& summary) override {
    return chunk("", finish_reason(summary.finish)) +
           stream_tail(request_, id_, "text_completion", created_, summary);
  }
  std::string keepalive() override { return ": keepalive\n\n"; }
  std::string error(int status, const std::string& message) override {
    return chunk("", "error") + sse_data(error_body(Dialect::openai, status, message));
  }

 private:
  std::string chunk(const std::string& text, const Json& finish) {
    Json c = base_chunk(id_, "text_completion", request_.model, created_);
    c["choices"] = Json::array(
        {{{"index", 0}, {"text", text}, {"logprobs", Json()}, {"finish_reason", finish}}});
    return sse_data(c);
  }
  const ChatRequest& request_;
  std::string id_;
  int64_t created_;
};

}  // namespace

const char* finish_reason(Finish finish) {
  switch (finish) {
    case Finish::length:
      return "length";
    case Finish::tool_calls:
      return "tool_calls";
    case Finish::cancelled:
    case Finish::error:
      return "error";
    default:
      return "stop";
  }
}

nlohmann::json usage_json(const Usage& usage) {
  return {{"prompt_tokens", usage.prompt_tokens},
          {"completion_tokens", usage.completion_tokens},
          {"total_tokens", usage.prompt_tokens + usage.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", usage.cached_tokens}}},
          {"completion_tokens_details", {{"reasoning_tokens", usage.reasoning_tokens}}}};
}

ChatRequest parse_chat(const Json& body) {
  ChatRequest request;
  request.dialect = Dialect::openai;
  parse_common(body, request);
  if (!body.contains("messages") || !body["messages"].is_array() || body["messages"].empty()) {
    throw ApiError(400, "'messages' must be a non-empty list", "", "messages");
  }
  for (const auto& message : body["messages"]) {
    if (!message.is_object()) throw ApiError(400, "each message must be an object", "", "messages");
    std::string role = json_string(message.value("role", Json()), "role");
    if (role == "developer") role = "system";
    if (role == "function") role = "tool";
    if (role != "system" && role != "user" && role != "assistant" && role != "tool") {
      throw ApiError(400, fmt::format("unknown message role '{}'", role), "", "messages");
    }
    OrderedJson out = {{"role", role},
                       {"content", content_text(message.value("content", Json()), "content")}};
    if (role == "assistant") {
      if (message.contains("tool_calls") && !message["tool_calls"].is_null()) {
        out["tool_calls"] = normalise_tool_calls(message["tool_calls"]);
      }
      for (const char* key : {"reasoning_content", "reasoning"}) {
        if (message.contains(key) && message[key].is_string()) {
          out["reasoning_content"] = message[key].get<std::string>();
        }
      }
    }
    if (role == "tool") {
      if (message.contains("tool_call_id"))
        out["tool_call_id"] = OrderedJson(message["tool_call_id"]);
      if (message.contains("name")) out["name"] = OrderedJson(message["name"]);
    }
    request.messages.push_back(out);
  }
  if (body.contains("tools") && !body["tools"].is_null()) {
    if (!body["tools"].is_array()) throw ApiError(400, "'tools' must be a list", "", "tools");
    if (!body["tools"].empty()) {
      for (size_t i = 0; i < body["tools"].size(); ++i) {
        const Json& tool = body["tools"][i];
        if (!tool.is_object() || !tool.contains("function") || !tool["function"].is_object() ||
            !tool["function"].contains("name")) {
          throw ApiError(
              400, "each tool must be {\"type\": \"function\", \"function\": {\"name\", ...}}", "",
              "tools");
        }
        check_field_size(tool, fmt::format("tools[{}]", i), kMaxToolBytes);
      }
      check_field_size(body["tools"], "tools", kMaxToolsBytes);
      request.tools = OrderedJson(body["tools"]);
    }
  }
  if (body.contains("parallel_tool_calls") && !body["parallel_tool_calls"].is_null()) {
    request.parallel_tool_calls = json_bool(body["parallel_tool_calls"], "parallel_tool_calls");
  }
  if (body.contains("tool_choice") && !body["tool_choice"].is_null()) {
    const Json& choice = body["tool_choice"];
    if (choice.is_string()) {
      apply_tool_choice(request, choice.get<std::string>(), false);
    } else if (choice.is_object() && choice.contains("function") &&
               choice["function"].is_object()) {
      apply_tool_choice(
          request,
          json_string(choice["function"].value("name", Json()), "tool_choice.function.name"), true);
    } else {
      throw ApiError(400, "'tool_choice' must be a string or {\"type\": \"function\", ...}", "",
                     "tool_choice");
    }
  }
  if (body.contains("logprobs") && !body["logprobs"].is_null()) {
    request.logprobs = json_bool(body["logprobs"], "logprobs");
  }
  if (body.contains("top_logprobs") && !body["top_logprobs"].is_null()) {
    const int64_t top = json_int(body["top_logprobs"], "top_logprobs");
    if (top < 0 || top > 20)
      throw ApiError(400, "'top_logprobs' must be in [0, 20]", "", "top_logprobs");
    if (!request.logprobs)
      throw ApiError(400, "'top_logprobs' requires 'logprobs': true", "", "top_logprobs");
    request.sampling.top_logprobs = static_cast<int>(top);
  }
  if (body.contains("reasoning_effort") && !body["reasoning_effort"].is_null()) {
    std::string effort = json_string(body["reasoning_effort"], "reasoning_effort");
    for (auto& c : effort) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (effort == "none") {
      request.enable_thinking = false;
    } else if (effort == "minimal" || effort == "low" || effort == "medium" || effort == "high" ||
               effort == "xhigh") {
      request.enable_thinking = true;
      request.template_kwargs["reasoning_effort"] = effort;
    } else {
      throw ApiError(400, fmt::format("unknown reasoning_effort '{}'", effort), "",
                     "reasoning_effort");
    }
  }
  if (body.contains("enable_thinking") && !body["enable_thinking"].is_null()) {
    request.enable_thinking = json_bool(body["enable_thinking"], "enable_thinking");
  }
  if (body.contains("chat_template_kwargs") && !body["chat_template_kwargs"].is_null()) {
    const Json& kwargs = body["chat_template_kwargs"];
    if (!kwargs.is_object()) {
      throw ApiError(400, "'chat_template_kwargs' must be an object", "", "chat_template_kwargs");
    }
    check_field_size(kwargs, "chat_template_kwargs", kMaxTemplateKwargsBytes);
    if (kwargs.contains("enable_thinking"))
      json_bool(kwargs["enable_thinking"], "chat_template_kwargs.enable_thinking");
    for (const auto& [key, value] : kwargs.items())
      request.template_kwargs[key] = OrderedJson(value);
  }
  return request;
}

ChatRequest parse_completion(const Json& body) {
  ChatRequest request;
  request.dialect = Dialect::openai;
  parse_common(body, request);
  for (const char* unsupported : {"suffix", "best_of"}) {
    if (body.contains(unsupported) && !body[unsupported].is_null()) {
      throw ApiError(400, fmt::format("unsupported parameter '{}'", unsupported), "", unsupported);
    }
  }
  if (body.contains("echo") && !body["echo"].is_null()) {
    request.echo = json_bool(body["echo"], "echo");
    if (request.echo && request.stream) {
      throw ApiError(400, "'echo' is not supported with 'stream'", "", "echo");
    }
  }
  // Legacy logprobs: the number of alternatives per token (0-5), not a flag.
  if (body.contains("logprobs") && !body["logprobs"].is_null()) {
    const int64_t top = json_int(body["logprobs"], "logprobs");
    if (top < 0 || top > 5) throw ApiError(400, "'logprobs' must be in [0, 5]", "", "logprobs");
    request.logprobs = true;
    request.sampling.top_logprobs = static_cast<int>(top);
  }
  // A string or token ids, alone or as the one element of a list (a batch of one).
  Json prompt = body.value("prompt", Json());
  if (prompt.is_array() && prompt.size() == 1 && (prompt[0].is_string() || prompt[0].is_array()))
    prompt = Json(prompt[0]);
  if (prompt.is_string()) {
    request.raw_prompt = prompt.get<std::string>();
    if (request.raw_prompt->empty()) throw ApiError(400, "'prompt' is empty", "", "prompt");
  } else if (prompt.is_array() && !prompt.empty() && prompt[0].is_number()) {
    std::vector<int32_t> ids;
    for (const Json& id : prompt) ids.push_back(json_token_id(id, "prompt"));
    request.raw_prompt_ids = std::move(ids);
  } else if (prompt.is_array() && prompt.size() > 1) {
    throw ApiError(400, "only one prompt per request is supported", "", "prompt");
  } else {
    throw ApiError(400, "'prompt' must be a string or token ids (or a list of one of them)", "",
                   "prompt");
  }
  return request;
}

Json chat_response(const ChatRequest& request, const ParsedOutput& output,
                   const GenerationSummary& summary, const std::string& id) {
  Json message = {
      {"role", "assistant"},
      {"content",
       output.content.empty() && !output.tool_calls.empty() ? Json() : Json(output.content)}};
  if (!output.reasoning.empty()) message["reasoning_content"] = output.reasoning;
  if (!output.tool_calls.empty()) {
    Json calls = Json::array();
    for (const auto& call : output.tool_calls) {
      calls.push_back({{"id", random_id("call_")},
                       {"type", "function"},
                       {"function", {{"name", call.name}, {"arguments", call.arguments}}}});
    }
    message["tool_calls"] = calls;
  }
  Json response = base_chunk(id, "chat.completion", request.model, std::time(nullptr));
  response["choices"] =
      Json::array({{{"index", 0},
                    {"message", message},
                    {"logprobs", request.logprobs ? logprobs_json(summary) : Json()},
                    {"finish_reason", finish_reason(summary.finish)}}});
  response["usage"] = usage_json(summary.usage);
  response["x_dspark"] = summary.stats;
  return response;
}

Json completion_response(const ChatRequest& request, const ParsedOutput& output,
                         const GenerationSummary& summary, const std::string& id) {
  Json response = base_chunk(id, "text_completion", request.model, std::time(nullptr));
  response["choices"] =
      Json::array({{{"index", 0},
                    {"text", summary.echo_text + output.content},
                    {"logprobs", request.logprobs ? completion_logprobs_json(summary) : Json()},
                    {"finish_reason", finish_reason(summary.finish)}}});
  response["usage"] = usage_json(summary.usage);
  response["x_dspark"] = summary.stats;
  return response;
}

std::unique_ptr<StreamSerializer> chat_stream(const ChatRequest& request, const std::string& id) {
  return std::make_unique<ChatStream>(request, id);
}

std::unique_ptr<StreamSerializer> completion_stream(const ChatRequest& request,
                                                    const std::string& id) {
  return std::make_unique<CompletionStream>(request, id);
}

}  // namespace openai
}  // namespace dspark::server
