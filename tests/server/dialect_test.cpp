#include "server/dialect.h"

#include <gtest/gtest.h>

#include <regex>
#include <string>

#include "base/error.h"
#include "server/metrics.h"

namespace dspark::server {
namespace {

using Json = nlohmann::json;

int status_of(const std::function<void()>& body) {
  try {
    body();
  } catch (const ApiError& e) {
    return e.status();
  }
  return 0;
}

TEST(OpenAiParse, NormalisesRolesContentAndToolCalls) {
  const Json body = Json::parse(R"({
    "model": "m", "max_completion_tokens": 7, "max_tokens": 3, "stop": "END", "temperature": 0,
    "messages": [
      {"role": "developer", "content": "be brief"},
      {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]},
      {"role": "assistant", "content": null, "reasoning": "thought",
       "tool_calls": [{"id": "call_1", "type": "function",
                       "function": {"name": "f", "arguments": "{\"x\": 1}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "42"}],
    "chat_template_kwargs": {"enable_thinking": false}, "user": "ignored"})");
  const ChatRequest request = openai::parse_chat(body);
  ASSERT_EQ(request.messages.size(), 4u);
  EXPECT_EQ(request.messages[0]["role"], "system");
  EXPECT_EQ(request.messages[1]["content"], "hi there");
  EXPECT_EQ(request.messages[2]["content"], "");
  EXPECT_EQ(request.messages[2]["reasoning_content"], "thought");
  EXPECT_EQ(request.messages[2]["tool_calls"][0]["function"]["arguments"]["x"], 1);
  EXPECT_EQ(request.messages[3]["tool_call_id"], "call_1");
  EXPECT_EQ(*request.max_tokens, 7);  // max_completion_tokens wins
  EXPECT_EQ(request.stop, std::vector<std::string>{"END"});
  EXPECT_EQ(*request.sampling.temperature, 0.0f);
  EXPECT_EQ(request.template_kwargs["enable_thinking"], false);
}

TEST(OpenAiParse, RejectsMalformedRequestsWith400) {
  EXPECT_EQ(status_of([] { openai::parse_chat(Json::array()); }), 400);
  EXPECT_EQ(status_of([] { openai::parse_chat({{"messages", Json::array()}}); }), 400);
  EXPECT_EQ(status_of([] { openai::parse_chat({{"messages", "hi"}}); }), 400);
  EXPECT_EQ(
      status_of([] {
        openai::parse_chat(Json::parse(R"({"messages": [{"role": "wizard", "content": "x"}]})"));
      }),
      400);
  EXPECT_EQ(status_of([] {
              openai::parse_chat(Json::parse(
                  R"({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"})"));
            }),
            400);
  EXPECT_EQ(status_of([] {
              openai::parse_chat(Json::parse(
                  R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": -1})"));
            }),
            400);
  EXPECT_EQ(status_of([] {
              openai::parse_chat(Json::parse(
                  R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})"));
            }),
            400);
  EXPECT_EQ(
      status_of([] {
        openai::parse_chat(Json::parse(
            R"({"messages": [{"role": "user", "content": "x"}], "reasoning_effort": "huge"})"));
      }),
      400);
  EXPECT_EQ(status_of([] {
              openai::parse_chat(Json::parse(
                  R"({"messages": [{"role": "user", "content": "x"}],
                      "chat_template_kwargs": {"enable_thinking": "yes"}})"));
            }),
            400);
  EXPECT_EQ(status_of([] {
              openai::parse_chat(
                  Json::parse(R"({"messages": [{"role": "user", "content": "x"}], "n": 9})"));
            }),
            400);
  EXPECT_EQ(status_of([] {
              openai::parse_chat(Json::parse(
                  R"({"messages": [{"role": "user", "content": "x"}], "n": 2, "stream": true})"));
            }),
            400);
  EXPECT_EQ(
      openai::parse_chat(Json::parse(R"({"messages": [{"role": "user", "content": "x"}], "n": 8})"))
          .n,
      8);
}

TEST(OpenAiParse, ReasoningEffortSwitchesThinking) {
  auto effort = [](const char* value) {
    return openai::parse_chat({{"messages", Json::array({{{"role", "user"}, {"content", "x"}}})},
                               {"reasoning_effort", value}});
  };
  EXPECT_EQ(*effort("none").enable_thinking, false);
  EXPECT_EQ(*effort("HIGH").enable_thinking, true);
  EXPECT_EQ(effort("low").template_kwargs["reasoning_effort"], "low");
}

TEST(AnthropicParse, ConvertsBlocksToolResultsAndThinking) {
  const Json body = Json::parse(R"({
    "model": "claude", "max_tokens": 100, "stop_sequences": ["###"],
    "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=1; cch=abcde;"},
               {"type": "text", "text": "You are helpful.", "cache_control": {"type": "ephemeral"}}],
    "thinking": {"type": "disabled"},
    "tools": [{"name": "get", "input_schema": {"type": "object"}}, {"type": "web_search_20250305", "name": "ws"}],
    "messages": [
      {"role": "user", "content": "weather?"},
      {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm", "signature": "x"},
                                         {"type": "tool_use", "id": "toolu_1", "name": "get", "input": {"c": "P"}}]},
      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                                   {"type": "text", "text": "thanks"}]}]})");
  const ChatRequest request = anthropic::parse_messages(body);
  ASSERT_EQ(request.messages.size(), 5u);
  EXPECT_EQ(request.messages[0]["role"], "system");
  EXPECT_EQ(request.messages[0]["content"], "You are helpful.");
  EXPECT_EQ(request.messages[2]["tool_calls"][0]["function"]["arguments"]["c"], "P");
  EXPECT_EQ(request.messages[2]["reasoning_content"], "hmm");
  EXPECT_EQ(request.messages[3]["role"], "tool");
  EXPECT_EQ(request.messages[3]["content"], "sunny");
  EXPECT_EQ(request.messages[4]["content"], "thanks");
  EXPECT_EQ(request.tools.size(), 1u);
  EXPECT_EQ(request.tools[0]["function"]["name"], "get");
  EXPECT_TRUE(request.drop_reasoning);
  EXPECT_EQ(*request.enable_thinking, false);
  EXPECT_EQ(request.stop, std::vector<std::string>{"###"});
}

TEST(ToolChoice, ParallelCallsOffKeepsOnlyTheFirstCall) {
  const Json tools = Json::parse(R"([{"type": "function", "function": {"name": "f"}}])");
  ChatRequest request =
      openai::parse_chat({{"messages", {{{"role", "user"}, {"content", "x"}}}}, {"tools", tools}});
  const OutputEvent first{OutputEvent::Kind::kToolCallStart, "f", 0};
  const OutputEvent second{OutputEvent::Kind::kToolCallArguments, "{}", 1};
  const OutputEvent text{OutputEvent::Kind::kContent, "hi", 1};
  EXPECT_TRUE(delivers_event(request, second));
  request = openai::parse_chat({{"messages", {{{"role", "user"}, {"content", "x"}}}},
                                {"tools", tools},
                                {"parallel_tool_calls", false}});
  EXPECT_TRUE(delivers_event(request, first));
  EXPECT_FALSE(delivers_event(request, second));
  EXPECT_TRUE(delivers_event(request, text));
  const ChatRequest anthropic_request = anthropic::parse_messages(Json::parse(R"({
    "max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
    "tools": [{"name": "f", "input_schema": {"type": "object"}}],
    "tool_choice": {"type": "auto", "disable_parallel_tool_use": true}})"));
  EXPECT_FALSE(anthropic_request.parallel_tool_calls);
  EXPECT_EQ(status_of([&] {
              openai::parse_chat({{"messages", {{{"role", "user"}, {"content", "x"}}}},
                                  {"parallel_tool_calls", "no"}});
            }),
            400);
}

TEST(ErrorBodies, FollowEachDialect) {
  const Json openai_body =
      error_body(Dialect::openai, ApiError(400, "bad", "context_length_exceeded", "messages"));
  EXPECT_EQ(openai_body["error"]["type"], "invalid_request_error");
  EXPECT_EQ(openai_body["error"]["code"], "context_length_exceeded");
  EXPECT_EQ(openai_body["error"]["message"], "bad");
  const Json anthropic_body = error_body(Dialect::anthropic, 401, "no");
  EXPECT_EQ(anthropic_body["type"], "error");
  EXPECT_EQ(anthropic_body["error"]["type"], "authentication_error");
  EXPECT_EQ(error_type(Dialect::anthropic, 429), "rate_limit_error");
  EXPECT_EQ(error_type(Dialect::openai, 503), "unavailable_error");
}

std::vector<Json> data_frames(const std::string& sse) {
  std::vector<Json> frames;
  size_t at = 0;
  while ((at = sse.find("data: ", at)) != std::string::npos) {
    const size_t end = sse.find("\n\n", at);
    const std::string payload = sse.substr(at + 6, end - at - 6);
    if (payload != "[DONE]") frames.push_back(Json::parse(payload));
    at = end;
  }
  return frames;
}

TEST(SseFraming, OpenAiChunksCarryToolCallIndexAndUsage) {
  ChatRequest request;
  request.model = "m";
  request.include_usage = true;
  auto stream = openai::chat_stream(request, "chatcmpl-1");
  std::string sse = stream->start({});
  sse += stream->events({{OutputEvent::Kind::kReasoning, "think", 0},
                         {OutputEvent::Kind::kContent, "hi", 0},
                         {OutputEvent::Kind::kToolCallStart, "f", 0},
                         {OutputEvent::Kind::kToolCallArguments, "{}", 0},
                         {OutputEvent::Kind::kToolCallEnd, "", 0}});
  GenerationSummary summary;
  summary.finish = Finish::tool_calls;
  summary.usage = {10, 4, 5, 2};
  sse += stream->finish(summary);
  EXPECT_EQ(sse.substr(sse.size() - 14), "data: [DONE]\n\n");
  const auto frames = data_frames(sse);
  ASSERT_EQ(frames.size(), 7u);
  EXPECT_EQ(frames[0]["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(frames[1]["choices"][0]["delta"]["reasoning_content"], "think");
  EXPECT_EQ(frames[3]["choices"][0]["delta"]["tool_calls"][0]["index"], 0);
  EXPECT_EQ(frames[3]["choices"][0]["delta"]["tool_calls"][0]["function"]["name"], "f");
  EXPECT_EQ(frames[5]["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_TRUE(frames[6]["choices"].empty());
  EXPECT_EQ(frames[6]["usage"]["prompt_tokens_details"]["cached_tokens"], 4);
  EXPECT_EQ(frames[6]["usage"]["total_tokens"], 15);
  for (const auto& frame : frames) EXPECT_EQ(frame["id"], "chatcmpl-1");
}

TEST(SseFraming, AnthropicBlocksAreDenseAndClosedBeforeTheNext) {
  ChatRequest request;
  request.model = "m";
  auto stream = anthropic::messages_stream(request, "msg_1");
  std::string sse = stream->start({12, 4, 0, 0});
  sse += stream->events({{OutputEvent::Kind::kReasoning, "a", 0},
                         {OutputEvent::Kind::kContent, "b", 0},
                         {OutputEvent::Kind::kReasoning, "c", 0},
                         {OutputEvent::Kind::kToolCallStart, "f", 0},
                         {OutputEvent::Kind::kToolCallArguments, "{\"x\":1}", 0},
                         {OutputEvent::Kind::kToolCallEnd, "", 0}});
  GenerationSummary summary;
  summary.finish = Finish::tool_calls;
  summary.usage = {12, 4, 9, 0};
  sse += stream->finish(summary);
  std::vector<std::string> names;
  std::vector<Json> frames;
  size_t at = 0;
  while ((at = sse.find("event: ", at)) != std::string::npos) {
    const size_t newline = sse.find('\n', at);
    names.push_back(sse.substr(at + 7, newline - at - 7));
    const size_t end = sse.find("\n\n", newline);
    frames.push_back(Json::parse(sse.substr(newline + 7, end - newline - 7)));
    EXPECT_EQ(frames.back()["type"], names.back());
    at = end;
  }
  EXPECT_EQ(frames[0]["message"]["usage"]["input_tokens"], 8);
  EXPECT_EQ(frames[0]["message"]["usage"]["cache_read_input_tokens"], 4);
  int open = -1, next = 0;
  bool saw_signature = false;
  for (const auto& frame : frames) {
    if (frame["type"] == "content_block_start") {
      EXPECT_EQ(open, -1);
      EXPECT_EQ(frame["index"], next);
      open = frame["index"];
    } else if (frame["type"] == "content_block_delta") {
      EXPECT_EQ(frame["index"], open);
      if (frame["delta"]["type"] == "signature_delta") saw_signature = true;
    } else if (frame["type"] == "content_block_stop") {
      EXPECT_EQ(frame["index"], open);
      open = -1;
      ++next;
    }
  }
  EXPECT_EQ(next, 4);  // thinking, text, thinking, tool_use
  EXPECT_TRUE(saw_signature);
  EXPECT_EQ(names[names.size() - 2], "message_delta");
  EXPECT_EQ(frames[frames.size() - 2]["delta"]["stop_reason"], "tool_use");
  EXPECT_EQ(names.back(), "message_stop");
}

TEST(Metrics, RendersPrometheusHistograms) {
  Metrics metrics;
  RequestRecord record;
  record.endpoint = "/v1/chat/completions";
  record.finish = "stop";
  record.prompt_tokens = 5;
  record.ttft_seconds = 0.02;
  metrics.record(record);
  const std::string text = metrics.render({{"dspark_resident_memory_bytes", 1}});
  EXPECT_NE(text.find("dspark_requests_total{endpoint=\"/v1/chat/completions\",status=\"200\"} 1"),
            std::string::npos);
  EXPECT_NE(text.find("dspark_time_to_first_token_seconds_bucket{le=\"0.025\"} 1"),
            std::string::npos);
  EXPECT_NE(text.find("dspark_time_to_first_token_seconds_count 1"), std::string::npos);
  EXPECT_NE(text.find("dspark_prompt_tokens_total 5"), std::string::npos);
  EXPECT_EQ(text.find("dspark_slot_requests_total{"), std::string::npos) << "no slot ran it";
}

// A refused request's path (any bytes, a newline among them) never reaches the exposition text.
TEST(Metrics, UnroutedPathsShareOneLabel) {
  EXPECT_EQ(endpoint_label("/chat/completions/"), "/v1/chat/completions");
  EXPECT_EQ(endpoint_label("/v1/messages/count_tokens"), "/v1/messages/count_tokens");
  EXPECT_EQ(endpoint_label("/v1/health"), "/health");
  EXPECT_EQ(endpoint_label("/"), "/");
  // llama.cpp's utility routes are served without the prefix only.
  EXPECT_EQ(endpoint_label("/tokenize/"), "/tokenize");
  EXPECT_EQ(endpoint_label("/v1/tokenize"), "other");
  EXPECT_EQ(endpoint_label("/v1/"), "other");
  Metrics metrics;
  for (const char* path : {"/x\ninjected 1\n#", "/a\"b\\", "/v1/chat/\xff", "/v2/models"}) {
    RequestRecord record;
    record.endpoint = path;
    record.status = 404;
    metrics.record(record);
  }
  const std::string text = metrics.render({});
  EXPECT_NE(text.find("dspark_requests_total{endpoint=\"other\",status=\"404\"} 4"),
            std::string::npos);
  EXPECT_EQ(text.find("injected"), std::string::npos);
  EXPECT_EQ(text.find('\xff'), std::string::npos);
}

TEST(Metrics, SlotSeriesCarryTheSlotLabel) {
  Metrics metrics;
  for (int slot : {1, 1, 0}) {
    RequestRecord record;
    record.endpoint = "/v1/messages";
    record.slot = slot;
    record.completion_tokens = 10;
    record.seconds_per_token = 0.004;
    record.ttft_seconds = slot == 0 ? 0.3 : -1.0;
    metrics.record(record);
  }
  const std::string text = metrics.render({});
  for (const char* line : {
           "dspark_slot_requests_total{slot=\"0\"} 1\n",
           "dspark_slot_requests_total{slot=\"1\"} 2\n",
           "dspark_slot_generated_tokens_total{slot=\"1\"} 20\n",
           "dspark_slot_time_per_output_token_seconds_bucket{slot=\"1\",le=\"+Inf\"} 2\n",
           "dspark_slot_time_per_output_token_seconds_count{slot=\"1\"} 2\n",
           "dspark_slot_time_per_output_token_seconds_sum{slot=\"0\"} 0.004\n",
           "dspark_slot_time_to_first_token_seconds_count{slot=\"0\"} 1\n",
           "dspark_slot_time_to_first_token_seconds_count{slot=\"1\"} 0\n",
           "# TYPE dspark_slot_time_to_first_token_seconds histogram\n",
       }) {
    EXPECT_NE(text.find(line), std::string::npos) << line;
  }
  // One HELP / TYPE header per family, however many slots.
  size_t headers = 0;
  for (size_t at = text.find("# TYPE dspark_slot_time_per_output_token_seconds ");
       at != std::string::npos;
       at = text.find("# TYPE dspark_slot_time_per_output_token_seconds ", at + 1)) {
    ++headers;
  }
  EXPECT_EQ(headers, 1u);
}

// The server registers each route through route_pattern, so a path it answers is one that
// endpoint_label names: every table entry, with a trailing slash and, where listed, under /v1.
TEST(Metrics, EveryServedRouteIsRegisteredAsItIsLabelled) {
  for (const ServedRoute& route : kServedRoutes) {
    const std::regex pattern(route_pattern(route.path));
    const std::string path(route.path);
    EXPECT_TRUE(std::regex_match(path, pattern)) << path;
    EXPECT_EQ(endpoint_label(path), route.label);
    if (path == "/") continue;
    EXPECT_TRUE(std::regex_match(path + "/", pattern)) << path;
    EXPECT_EQ(std::regex_match("/v1" + path, pattern), route.under_v1) << path;
    EXPECT_EQ(endpoint_label("/v1" + path), route.under_v1 ? std::string(route.label) : "other");
  }
  EXPECT_THROW(route_pattern("/unlisted"), dspark::Error);
}

}  // namespace
}  // namespace dspark::server
