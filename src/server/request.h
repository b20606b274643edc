#pragma once
// The one request type every dialect (OpenAI chat / completions, Anthropic messages, Responses)
// is translated into, the errors a request can fail with, and what a finished generation reports
// back. Dialect translators live at the edge (openai.h, anthropic.h, responses.h).
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/reasoning_budget.h"
#include "engine/sampler.h"
#include "text/reasoning_parser.h"
#include "text/tool_call_parser.h"

namespace dspark::server {

enum class Dialect { openai, anthropic, responses };

// A request the server refuses: the HTTP status and the error type of the dialect's error body.
class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string message, std::string code = "", std::string param = "")
      : std::runtime_error(message),
        status_(status),
        code_(std::move(code)),
        param_(std::move(param)) {}
  int status() const { return status_; }
  const std::string& code() const { return code_; }
  const std::string& param() const { return param_; }
  // Extra machine-readable fields for the OpenAI body (n_prompt_tokens, n_ctx).
  nlohmann::json extra = nlohmann::json::object();

 private:
  int status_;
  std::string code_;
  std::string param_;
};

// The error body for `status` in the dialect's shape (docs/server-api.md §1.8, §2.6).
nlohmann::json error_body(Dialect dialect, int status, const std::string& message,
                          const std::string& code = "", const std::string& param = "",
                          const nlohmann::json& extra = nlohmann::json::object());
nlohmann::json error_body(Dialect dialect, const ApiError& error);
// The Anthropic / OpenAI error type name for an HTTP status.
std::string error_type(Dialect dialect, int status);

// Sampling fields as the request gave them; unset ones fall back to server defaults, then to
// generation_config.json (see resolve_sampling).
struct RequestSampling {
  std::optional<float> temperature;
  std::optional<float> top_p;
  std::optional<int> top_k;
  std::optional<float> min_p;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;
  std::optional<uint64_t> seed;
  int top_logprobs = 0;
  std::vector<std::pair<int32_t, float>> logit_bias;  // ids checked against the vocabulary later
  int64_t min_tokens = 0;  // vLLM's: no end of turn or stop token id before this many tokens
};

// The answer's shape: OpenAI response_format, Responses text.format, Anthropic
// output_config.format.
struct ResponseFormat {
  enum class Kind { text, json_object, json_schema };
  Kind kind = Kind::text;
  // json_schema: properties are generated in the order the schema lists them, so the schema is
  // read again from the body in order (set_schema_in_order); `pointer` says where it is.
  nlohmann::ordered_json schema;
  std::string pointer;
};

struct ChatRequest {
  Dialect dialect = Dialect::openai;
  std::string model;  // echoed back
  // Chat: messages in the template's (transformers') shape; empty for a raw completion.
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  std::optional<std::string> raw_prompt;  // /v1/completions: no template
  // /v1/completions given token ids instead of text (what lm-evaluation-harness sends).
  std::optional<std::vector<int32_t>> raw_prompt_ids;
  // /v1/completions: the prompt's text comes back before the completion's, and with logprobs
  // every prompt token after the first gets its log-prob (prompt scoring).
  bool echo = false;
  nlohmann::ordered_json tools;  // null = no tools
  // "none" still renders the tools but parses no calls; a named function keeps only that tool.
  bool parse_tool_calls = true;
  // "required" (empty name) or a named function: the opening of a call is forced where the answer
  // starts (engine/forced_tokens.h); the model writes the rest.
  std::optional<std::string> forced_tool_call;
  // OpenAI parallel_tool_calls / Anthropic disable_parallel_tool_use: false keeps only the first
  // call the model writes.
  bool parallel_tool_calls = true;
  nlohmann::ordered_json template_kwargs = nlohmann::ordered_json::object();
  // enable_thinking as the request decided it (kwargs > effort / thinking.type); nullopt = server
  // default.
  std::optional<bool> enable_thinking;
  bool drop_reasoning = false;  // Anthropic thinking: disabled
  std::optional<int64_t> max_tokens;
  // Thinking tokens before the block is forced closed (docs/server-api.md §3.5); nullopt = the
  // server default, 0 = off.
  std::optional<int64_t> reasoning_budget;
  std::optional<std::string> reasoning_budget_message;  // nullopt = the server default
  std::vector<std::string> stop;
  ResponseFormat response_format;
  RequestSampling sampling;
  bool logprobs = false;
  // OpenAI `n` (chat and completions, not streamed): choices per request. A greedy request
  // computes one and repeats it; a sampled one runs n generations side by side, the i-th seeded
  // with seed + i when a seed is given.
  int n = 1;
  // vLLM's field: special tokens the model writes are left out of the text (the parser's markers
  // excepted); false spells them out.
  bool skip_special_tokens = true;
  // vLLM's (and llama-server's) benchmark fields: end-of-turn tokens do not stop the generation
  // (it runs to max_tokens); more token ids that stop it, unshown, like an end of turn.
  bool ignore_eos = false;
  std::vector<int32_t> stop_token_ids;
  bool stream = false;
  bool include_usage = false;
};

// What one finished generation reports to the dialect serialisers.
enum class Finish { stop, length, stop_sequence, tool_calls, cancelled, error };

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t reasoning_tokens = 0;
};

struct TokenLogprobEntry {
  std::string token;
  float logprob = 0.0f;
  std::vector<std::pair<std::string, float>> top;
};

struct GenerationSummary {
  Finish finish = Finish::stop;
  std::string stop_sequence;  // the stop string that matched
  Usage usage;
  nlohmann::json stats = nlohmann::json::object();  // the x_dspark block
  std::vector<TokenLogprobEntry> logprobs;
  // echo: the prompt as text, and with logprobs one entry per prompt token (the first token's
  // log-prob and alternatives are not defined: nothing precedes it).
  std::string echo_text;
  std::vector<TokenLogprobEntry> prompt_logprobs;
  std::string error;  // Finish::error
};

// Reads a JSON value as a number / integer / bool / string or throws a 400 naming the field.
float json_float(const nlohmann::json& value, const char* field);
int64_t json_int(const nlohmann::json& value, const char* field);
bool json_bool(const nlohmann::json& value, const char* field);
std::string json_string(const nlohmann::json& value, const char* field);
// A token id: a non-negative integer in int32's range, or a 400 naming `field`.
int32_t json_token_id(const nlohmann::json& value, const char* field);
// Throws a 400 naming `field` unless `id` is one of a vocabulary's `vocab` ids.
void check_in_vocabulary(int64_t id, int64_t vocab, const char* field);
// temperature, top_p, top_k, min_p, seed and logit_bias, in every dialect: finite, in range, the
// right type, or a 400 naming the field.
void parse_core_sampling(const nlohmann::json& body, RequestSampling& sampling);
// A string or a list of strings (OpenAI `stop`).
std::vector<std::string> json_string_list(const nlohmann::json& value, const char* field);
// Applies tool_choice: `choice` is "auto", "none", "required" or a function name (`named`);
// throws 400 for an unknown choice or a name that is not among the request's tools.
void apply_tool_choice(ChatRequest& request, const std::string& choice, bool named);
// Reads `reasoning_budget` (a non-negative integer: bools, fractions and negatives are a 400) and
// `reasoning_budget_message` (a string) when present and not null. Every dialect takes them.
void parse_reasoning_budget(const nlohmann::json& body, ChatRequest& request);

// The budget a generation runs with: the request's fields over the server's defaults; off when
// the template has no thinking markers (`syntax` empty).
ReasoningBudgetConfig resolve_reasoning_budget(const ChatRequest& request, int64_t default_budget,
                                               const std::string& default_message,
                                               const std::optional<ReasoningSyntax>& syntax,
                                               bool starts_in_reasoning, const Tokenizer& tokenizer,
                                               const std::vector<int32_t>& eos_ids);

// Reads a format object: {"type": "text" | "json_object" | "json_schema"} with the schema under
// "json_schema"."schema" (OpenAI) or "schema" (Responses, Anthropic, llama.cpp's json_object with
// a schema). A 400 naming `field` for anything else.
// `pointer` is the JSON pointer of `value` in the body ("/response_format").
ResponseFormat parse_response_format(const nlohmann::json& value, const std::string& field,
                                     const std::string& pointer);
// Replaces a json_schema format's schema with the same one read from the raw body with its keys
// in the client's order (the body is parsed sorted elsewhere).
void set_schema_in_order(ResponseFormat& format, const std::string& body);
// Whether an output event reaches the client: with parallel_tool_calls off, the events of every
// call after the first are dropped.
bool delivers_event(const ChatRequest& request, const OutputEvent& event);
// "prefix" + 24 random hex digits.
std::string random_id(const std::string& prefix);

}  // namespace dspark::server
