#pragma once
// What each API dialect provides: its request translator, its non-streaming response body and
// its stream serialiser. The serialisers turn the engine's output events into the dialect's SSE
// frames, keeping the per-stream state (open block, block indices, tool-call indices).
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "server/request.h"
#include "text/tool_call_parser.h"

namespace dspark::server {

class StreamSerializer {
 public:
  virtual ~StreamSerializer() = default;
  // The frames sent before any output.
  virtual std::string start(const Usage& prompt_usage) = 0;
  virtual std::string events(const std::vector<OutputEvent>& events) = 0;
  virtual std::string finish(const GenerationSummary& summary) = 0;
  virtual std::string keepalive() = 0;
  // An error after the stream started (HTTP 200 already sent).
  virtual std::string error(int status, const std::string& message) = 0;
};

// SSE framing.
std::string sse_data(const nlohmann::json& data);
std::string sse_event(const std::string& name, const nlohmann::json& data);

namespace openai {
ChatRequest parse_chat(const nlohmann::json& body);
ChatRequest parse_completion(const nlohmann::json& body);
nlohmann::json chat_response(const ChatRequest& request, const ParsedOutput& output,
                             const GenerationSummary& summary, const std::string& id);
nlohmann::json completion_response(const ChatRequest& request, const ParsedOutput& output,
                                   const GenerationSummary& summary, const std::string& id);
std::unique_ptr<StreamSerializer> chat_stream(const ChatRequest& request, const std::string& id);
std::unique_ptr<StreamSerializer> completion_stream(const ChatRequest& request,
                                                    const std::string& id);
const char* finish_reason(Finish finish);
nlohmann::json usage_json(const Usage& usage);
}  // namespace openai

namespace anthropic {
ChatRequest parse_messages(const nlohmann::json& body, bool count_only = false);
nlohmann::json messages_response(const ChatRequest& request, const ParsedOutput& output,
                                 const GenerationSummary& summary, const std::string& id);
std::unique_ptr<StreamSerializer> messages_stream(const ChatRequest& request,
                                                  const std::string& id);
const char* stop_reason(Finish finish);
}  // namespace anthropic

namespace responses {
ChatRequest parse(const nlohmann::json& body);
nlohmann::json response(const ChatRequest& request, const ParsedOutput& output,
                        const GenerationSummary& summary, const std::string& id);
std::unique_ptr<StreamSerializer> stream(const ChatRequest& request, const std::string& id);
}  // namespace responses

}  // namespace dspark::server
