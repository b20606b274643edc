// A JSON Schema from untrusted bytes compiled to a grammar (with a short deadline), then bytes
// from untrusted input through the byte matcher and, as token ids, through the token constraint
// over a small vocabulary (every byte plus multi-byte JSON pieces), as constrained decoding runs
// them: mask, pick an allowed id, accept, until the answer is finished.
// Input: schema JSON, a NUL byte, the bytes to feed.
#include <chrono>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "base/error.h"
#include "constrain/grammar.h"
#include "constrain/token_constraint.h"
#include "fuzz_input.h"

namespace {

using dspark::constrain::TokenVocabulary;

std::shared_ptr<const TokenVocabulary> vocabulary() {
  static const std::shared_ptr<const TokenVocabulary> shared = [] {
    std::vector<std::optional<std::string>> bytes;
    for (int b = 0; b < 256; ++b) bytes.push_back(std::string(1, static_cast<char>(b)));
    for (const char* piece : {"{\"", "\": ", ", ", "\"}", "true", "false", "null", "[]", "{}",
                              "\"name", "123", "-0.5e+7", "\\u00e9", "\xc3\xa9", "\xe2\x82"}) {
      bytes.push_back(std::string(piece));
    }
    bytes.push_back(std::nullopt);  // a special token: never allowed
    bytes.push_back(std::nullopt);  // the end-of-sequence id, allowed when the text is complete
    return std::make_shared<const TokenVocabulary>(std::move(bytes));
  }();
  return shared;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto [schema_text, feed] = dspark::fuzz::split_at_nul(dspark::fuzz::as_text(data, size));
  nlohmann::ordered_json schema;
  try {
    schema = nlohmann::ordered_json::parse(schema_text);
  } catch (const nlohmann::json::exception&) {
    return 0;  // the server refuses unparsable bodies before any schema code runs
  }
  // The server refuses deeper JSON in the body before the compiler sees it (server/json_input.h).
  if (dspark::constrain::json_nested_deeper_than(schema, 128)) return 0;
  std::shared_ptr<const dspark::constrain::Grammar> grammar;
  try {
    dspark::constrain::CompileBudget budget = dspark::constrain::default_compile_budget();
    budget.deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    grammar = dspark::constrain::json_schema_grammar(schema, budget);
  } catch (const dspark::Error&) {
    return 0;
  }
  dspark::constrain::Matcher matcher(grammar);
  for (char c : feed) {
    if (!matcher.advance(static_cast<uint8_t>(c))) break;
    (void)matcher.complete();
    (void)matcher.can_continue();
  }
  const std::shared_ptr<const TokenVocabulary> vocab = vocabulary();
  const int32_t end_id = vocab->size() - 1;
  dspark::constrain::TokenConstraint constraint(grammar, vocab, {end_id});
  std::vector<float> logits(static_cast<size_t>(vocab->size()));
  for (char c : feed) {
    if (constraint.finished()) break;
    std::fill(logits.begin(), logits.end(), 0.0f);
    constraint.mask_logits(logits.data(), static_cast<int64_t>(logits.size()));
    // The byte picks a start; the first id the mask leaves open from there is taken.
    const size_t start = static_cast<uint8_t>(c) % logits.size();
    std::optional<int32_t> pick;
    for (size_t k = 0; k < logits.size() && !pick; ++k) {
      const size_t id = (start + k) % logits.size();
      if (logits[id] != -std::numeric_limits<float>::infinity()) pick = static_cast<int32_t>(id);
    }
    if (!pick) break;
    if (!constraint.allows(*pick)) __builtin_trap();  // the mask and allows() must agree
    constraint.accept(*pick);
  }
  return 0;
}
