// A request body from untrusted bytes through everything the server does with it before the
// model runs: the body checks (UTF-8, nesting, non-finite numbers), every dialect's translator
// (OpenAI chat and completions, Anthropic messages and count_tokens, Responses), the schema read
// again in key order and compiled, and the conversation rendered through a real chat template
// (Qwen3's: tools, tool calls, reasoning). Refusals are ApiError (a 400) or nlohmann's exceptions
// (which the server answers with a 400 too); anything else escaping is a finding.
#include <chrono>
#include <cstdint>
#include <fstream>
#include <iterator>

#include "base/error.h"
#include "constrain/grammar.h"
#include "fuzz_input.h"
#include "server/dialect.h"
#include "server/json_input.h"
#include "text/chat_template.h"

namespace {

using dspark::server::ChatRequest;
using Json = nlohmann::json;

const dspark::ChatTemplate& chat_template() {
  static const dspark::ChatTemplate loaded = [] {
    std::ifstream in(std::string(DSPARK_SOURCE_DIR) + "/tests/fuzz/corpus/jinja/qwen3.jinja");
    const std::string seed((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return dspark::ChatTemplate(dspark::fuzz::split_at_nul(seed).first, "qwen3 chat template");
  }();
  return loaded;
}

// What Engine::prepare and Engine::answer_constraint do with a translated request, short of
// tokenizing.
void prepare(ChatRequest& request, const std::string& body) {
  dspark::server::set_schema_in_order(request.response_format, body);
  if (request.response_format.kind == dspark::server::ResponseFormat::Kind::json_schema) {
    dspark::constrain::CompileBudget budget = dspark::constrain::default_compile_budget();
    budget.deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    try {
      (void)dspark::constrain::json_schema_grammar(request.response_format.schema, budget);
    } catch (const dspark::Error&) {
    }
  }
  if (request.raw_prompt) return;
  dspark::ChatTemplateInputs inputs;
  inputs.messages = request.messages;
  inputs.tools = request.tools;
  inputs.kwargs = request.template_kwargs;
  if (request.enable_thinking) inputs.kwargs["enable_thinking"] = *request.enable_thinking;
  inputs.add_generation_prompt = true;
  try {
    (void)chat_template().render(inputs);
  } catch (const dspark::Error&) {
  }
}

template <typename Translate>
void translate(const Json& body, const std::string& text, Translate&& parse) {
  try {
    ChatRequest request = parse(body);
    prepare(request, text);
  } catch (const dspark::server::ApiError&) {
  } catch (const nlohmann::json::exception&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(dspark::fuzz::as_text(data, size));
  Json body;
  try {
    body = dspark::server::parse_json_input(text, "the request body");
  } catch (const dspark::server::ApiError&) {
    return 0;
  }
  namespace server = dspark::server;
  translate(body, text, [](const Json& b) { return server::openai::parse_chat(b); });
  translate(body, text, [](const Json& b) { return server::openai::parse_completion(b); });
  translate(body, text, [](const Json& b) { return server::anthropic::parse_messages(b, false); });
  translate(body, text, [](const Json& b) { return server::anthropic::parse_messages(b, true); });
  translate(body, text, [](const Json& b) { return server::responses::parse(b); });
  return 0;
}
