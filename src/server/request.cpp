#include "server/request.h"

#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <limits>
#include <random>

#include "server/json_input.h"

namespace dspark::server {

std::string error_type(Dialect dialect, int status) {
  if (dialect == Dialect::anthropic) {
    switch (status) {
      case 401:
        return "authentication_error";
      case 402:
        return "billing_error";
      case 403:
        return "permission_error";
      case 404:
        return "not_found_error";
      case 413:
        return "request_too_large";
      case 429:
        return "rate_limit_error";
      case 503:
        return "overloaded_error";
      case 529:
        return "overloaded_error";
      default:
        return status >= 500 ? "api_error" : "invalid_request_error";
    }
  }
  switch (status) {
    case 401:
      return "authentication_error";
    case 403:
      return "permission_error";
    case 404:
      return "not_found_error";
    case 413:
      return "invalid_request_error";
    case 429:
      return "rate_limit_error";
    case 501:
      return "not_supported_error";
    case 503:
      return "unavailable_error";
    default:
      return status >= 500 ? "server_error" : "invalid_request_error";
  }
}

nlohmann::json error_body(Dialect dialect, int status, const std::string& message,
                          const std::string& code, const std::string& param,
                          const nlohmann::json& extra) {
  if (dialect == Dialect::anthropic) {
    return {{"type", "error"},
            {"error", {{"type", error_type(dialect, status)}, {"message", message}}}};
  }
  nlohmann::json error = {{"message", message},
                          {"type", error_type(dialect, status)},
                          {"param", param.empty() ? nlohmann::json() : nlohmann::json(param)},
                          {"code", code.empty() ? nlohmann::json() : nlohmann::json(code)}};
  for (const auto& [key, value] : extra.items()) error[key] = value;
  return {{"error", error}};
}

nlohmann::json error_body(Dialect dialect, const ApiError& error) {
  return error_body(dialect, error.status(), error.what(), error.code(), error.param(),
                    error.extra);
}

float json_float(const nlohmann::json& value, const char* field) {
  if (!value.is_number())
    throw ApiError(400, fmt::format("'{}' must be a number", field), "", field);
  const float number = value.get<float>();
  // JSON has no NaN, but 1e999 parses as infinity and 1e300 overflows a float.
  if (!std::isfinite(number)) {
    throw ApiError(400, fmt::format("'{}' must be a finite number", field), "", field);
  }
  return number;
}

int64_t json_int(const nlohmann::json& value, const char* field) {
  if (value.is_number_unsigned() &&
      value.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    throw ApiError(400, fmt::format("'{}' is out of range", field), "", field);
  }
  if (value.is_number_integer()) return value.get<int64_t>();
  if (value.is_number_float()) {
    const double number = value.get<double>();
    // The cast is only defined inside int64's range.
    if (std::isfinite(number) && number >= -9.2e18 && number <= 9.2e18 &&
        number == static_cast<double>(static_cast<int64_t>(number)))
      return static_cast<int64_t>(number);
  }
  throw ApiError(400, fmt::format("'{}' must be an integer", field), "", field);
}

void parse_core_sampling(const nlohmann::json& body, RequestSampling& sampling) {
  auto given = [&](const char* field) { return body.contains(field) && !body[field].is_null(); };
  if (given("temperature")) {
    sampling.temperature = json_float(body["temperature"], "temperature");
    if (*sampling.temperature < 0)
      throw ApiError(400, "'temperature' must be >= 0", "", "temperature");
  }
  if (given("top_p")) {
    sampling.top_p = json_float(body["top_p"], "top_p");
    if (*sampling.top_p <= 0 || *sampling.top_p > 1)
      throw ApiError(400, "'top_p' must be in (0, 1]", "", "top_p");
  }
  if (given("top_k")) {
    const int64_t top_k = json_int(body["top_k"], "top_k");
    if (top_k > std::numeric_limits<int32_t>::max()) {
      throw ApiError(400, "'top_k' must be at most 2147483647 (0 or negative = off)", "", "top_k");
    }
    sampling.top_k = static_cast<int>(std::max<int64_t>(top_k, 0));
  }
  if (given("min_p")) {
    sampling.min_p = json_float(body["min_p"], "min_p");
    if (*sampling.min_p < 0 || *sampling.min_p > 1)
      throw ApiError(400, "'min_p' must be in [0, 1]", "", "min_p");
  }
  if (body.contains("logit_bias") && !body["logit_bias"].is_null()) {
    if (!body["logit_bias"].is_object()) {
      throw ApiError(400, "'logit_bias' must be an object of token id -> bias", "", "logit_bias");
    }
    for (const auto& [key, value] : body["logit_bias"].items()) {
      int64_t id = -1;
      const auto [end, error] = std::from_chars(key.data(), key.data() + key.size(), id);
      if (error != std::errc() || end != key.data() + key.size() || id < 0 ||
          id > std::numeric_limits<int32_t>::max()) {
        throw ApiError(400, fmt::format("logit_bias key '{}' is not a token id", key), "",
                       "logit_bias");
      }
      const float bias = json_float(value, "logit_bias");
      if (bias < -100 || bias > 100) {
        throw ApiError(400, "logit_bias values must be in [-100, 100]", "", "logit_bias");
      }
      sampling.logit_bias.emplace_back(static_cast<int32_t>(id), bias);
    }
  }
  if (given("seed")) {
    const nlohmann::json& seed = body["seed"];
    // Any 64-bit integer: negative ones wrap, as llama.cpp and vLLM take them.
    sampling.seed = seed.is_number_unsigned() ? seed.get<uint64_t>()
                                              : static_cast<uint64_t>(json_int(seed, "seed"));
  }
}

bool json_bool(const nlohmann::json& value, const char* field) {
  if (!value.is_boolean())
    throw ApiError(400, fmt::format("'{}' must be a boolean", field), "", field);
  return value.get<bool>();
}

int32_t json_token_id(const nlohmann::json& value, const char* field) {
  const int64_t id = json_int(value, field);
  if (id < 0 || id > std::numeric_limits<int32_t>::max())
    throw ApiError(400, fmt::format("'{}' holds {}, not a token id", field, id), "", field);
  return static_cast<int32_t>(id);
}

void check_in_vocabulary(int64_t id, int64_t vocab, const char* field) {
  if (id < 0 || id >= vocab) {
    throw ApiError(
        400,
        fmt::format("'{}' holds token id {}, outside the vocabulary ({} tokens)", field, id, vocab),
        "", field);
  }
}

std::string json_string(const nlohmann::json& value, const char* field) {
  if (!value.is_string())
    throw ApiError(400, fmt::format("'{}' must be a string", field), "", field);
  return value.get<std::string>();
}

std::vector<std::string> json_string_list(const nlohmann::json& value, const char* field) {
  if (value.is_null()) return {};
  if (value.is_string()) return {value.get<std::string>()};
  if (!value.is_array()) {
    throw ApiError(400, fmt::format("'{}' must be a string or a list of strings", field), "",
                   field);
  }
  std::vector<std::string> out;
  for (const auto& item : value) {
    const std::string text = json_string(item, field);
    if (!text.empty()) out.push_back(text);
  }
  return out;
}

void apply_tool_choice(ChatRequest& request, const std::string& choice, bool named) {
  if (named) {
    nlohmann::ordered_json kept = nlohmann::ordered_json::array();
    for (const auto& tool : request.tools) {
      if (tool["function"].value("name", "") == choice) kept.push_back(tool);
    }
    if (kept.empty()) {
      throw ApiError(400,
                     fmt::format("tool_choice names '{}', which is not among the tools", choice),
                     "", "tool_choice");
    }
    request.tools = std::move(kept);
    request.forced_tool_call = choice;
  } else if (choice == "none") {
    request.parse_tool_calls = false;
  } else if (choice == "required") {
    if (request.tools.is_null()) {
      throw ApiError(400, "tool_choice 'required' needs tools", "", "tool_choice");
    }
    request.forced_tool_call = "";
  } else if (choice != "auto") {
    throw ApiError(400, fmt::format("unknown tool_choice '{}'", choice), "", "tool_choice");
  }
}

void parse_reasoning_budget(const nlohmann::json& body, ChatRequest& request) {
  if (body.contains("reasoning_budget") && !body["reasoning_budget"].is_null()) {
    const nlohmann::json& value = body["reasoning_budget"];
    // nlohmann keeps bools apart from numbers, so a bool fails here as well.
    if (!value.is_number_integer() || value.get<int64_t>() < 0) {
      throw ApiError(400,
                     fmt::format("'reasoning_budget' must be a non-negative integer (0 = off), "
                                 "got {}",
                                 dump_json(value)),
                     "", "reasoning_budget");
    }
    request.reasoning_budget = value.get<int64_t>();
  }
  if (body.contains("reasoning_budget_message") && !body["reasoning_budget_message"].is_null()) {
    request.reasoning_budget_message =
        json_string(body["reasoning_budget_message"], "reasoning_budget_message");
  }
}

ReasoningBudgetConfig resolve_reasoning_budget(const ChatRequest& request, int64_t default_budget,
                                               const std::string& default_message,
                                               const std::optional<ReasoningSyntax>& syntax,
                                               bool starts_in_reasoning, const Tokenizer& tokenizer,
                                               const std::vector<int32_t>& eos_ids) {
  const int64_t budget = request.reasoning_budget.value_or(default_budget);
  if (!syntax || budget <= 0) return {};
  return make_reasoning_budget(tokenizer, budget,
                               request.reasoning_budget_message.value_or(default_message),
                               syntax->start, syntax->end, starts_in_reasoning, eos_ids);
}

ResponseFormat parse_response_format(const nlohmann::json& value, const std::string& field,
                                     const std::string& pointer) {
  if (!value.is_object())
    throw ApiError(400, fmt::format("'{}' must be an object", field), "", field);
  ResponseFormat format;
  const std::string type = json_string(value.value("type", nlohmann::json("text")), "type");
  const nlohmann::json* schema = nullptr;
  std::string schema_field;
  if (value.contains("json_schema") && value["json_schema"].is_object() &&
      value["json_schema"].contains("schema")) {
    schema = &value["json_schema"]["schema"];
    format.pointer = pointer + "/json_schema/schema";
    schema_field = field + ".json_schema.schema";
  } else if (value.contains("schema")) {
    schema = &value["schema"];
    format.pointer = pointer + "/schema";
    schema_field = field + ".schema";
  }
  if (type == "text") return format;
  if (type == "json_object" && schema == nullptr) {
    format.kind = ResponseFormat::Kind::json_object;
    return format;
  }
  if (type == "json_object" || type == "json_schema") {
    if (schema == nullptr || !(schema->is_object() || schema->is_boolean())) {
      throw ApiError(400, fmt::format("'{}' of type json_schema needs a schema object", field), "",
                     field);
    }
    check_field_size(*schema, schema_field, kMaxResponseSchemaBytes);
    format.kind = ResponseFormat::Kind::json_schema;
    format.schema = nlohmann::ordered_json::parse(dump_json(*schema));
    return format;
  }
  throw ApiError(
      400, fmt::format("'{}.type' must be text, json_object or json_schema, not '{}'", field, type),
      "", field);
}

void set_schema_in_order(ResponseFormat& format, const std::string& body) {
  if (format.kind != ResponseFormat::Kind::json_schema || format.pointer.empty()) return;
  format.schema =
      nlohmann::ordered_json::parse(body).at(nlohmann::ordered_json::json_pointer(format.pointer));
}

bool delivers_event(const ChatRequest& request, const OutputEvent& event) {
  const bool call = event.kind == OutputEvent::Kind::kToolCallStart ||
                    event.kind == OutputEvent::Kind::kToolCallArguments ||
                    event.kind == OutputEvent::Kind::kToolCallEnd;
  return request.parallel_tool_calls || !call || event.index == 0;
}

std::string random_id(const std::string& prefix) {
  thread_local std::mt19937_64 engine(std::random_device{}());
  return prefix + fmt::format("{:016x}{:08x}", engine(), static_cast<uint32_t>(engine()));
}

}  // namespace dspark::server
