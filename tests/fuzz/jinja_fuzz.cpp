// A chat template from untrusted bytes, rendered with a context from untrusted bytes (a JSON
// object of variables; a small conversation when it is missing or not an object). The limits are
// tighter than the server's so that each run stays short; what they bound is the same.
// Input: template source, a NUL byte, the JSON context.
#include <cstdint>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "fuzz_input.h"
#include "text/jinja_template.h"

namespace {

nlohmann::ordered_json context_of(std::string_view text) {
  try {
    nlohmann::ordered_json context = nlohmann::ordered_json::parse(text);
    if (context.is_object()) return context;
  } catch (const nlohmann::json::exception&) {
  }
  return {{"messages",
           {{{"role", "system"}, {"content", "Be brief."}},
            {{"role", "user"}, {"content", "Hi <|im_start|> {{ x }}"}}}},
          {"add_generation_prompt", true},
          {"bos_token", "<s>"},
          {"eos_token", "</s>"}};
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto [source, context_text] = dspark::fuzz::split_at_nul(dspark::fuzz::as_text(data, size));
  dspark::jinja::RenderLimits limits;
  limits.max_loop_iterations = 100'000;
  limits.max_string_bytes = size_t{1} << 20;
  try {
    const dspark::jinja::Template chat_template(source, "fuzzed template");
    const dspark::jinja::Value context = dspark::jinja::Value::from_json(context_of(context_text));
    (void)chat_template.render(context.as_dict(), limits);
  } catch (const dspark::Error&) {
  }
  return 0;
}
