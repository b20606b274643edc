// Cost of constrained decoding per generated token: the logit mask of a JSON grammar over a real
// vocabulary. SmolLM2 (49152 ids, the default model) and Qwen3 (151669 ids, the size class of
// Nemotron's 131072) from the test fixtures (tests/fixtures/public);
// DSPARK_CONSTRAIN_TOKENIZER=<tokenizer.json> adds one more ("custom").
//
//   constrain_bench --benchmark_filter=Cold
//
// Cold: the first mask in a state (not cached yet: the whole trie walk), inside a string value
// and at a value's start after a key. WarmStep: one decoding step whose state was seen before
// (copy, accept one token, cache hit, mask). MaskOnly: applying an already known allowed set to a
// row of logits. Vocabulary: building the byte trie, once per tokenizer.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "constrain/grammar.h"
#include "constrain/token_constraint.h"
#include "text/tokenizer.h"

namespace {

using dspark::constrain::TokenConstraint;
using dspark::constrain::TokenVocabulary;

// The repository root, found from this file's own path at build time.
const std::string kSourceDir = std::filesystem::path(__FILE__).parent_path().parent_path().string();

std::string tokenizer_path(const std::string& name) {
  if (name == "custom") return std::getenv("DSPARK_CONSTRAIN_TOKENIZER");
  return kSourceDir + "/tests/fixtures/public/" + name + "/tokenizer.json";
}

struct Setup {
  std::unique_ptr<dspark::Tokenizer> tokenizer;
  std::shared_ptr<const TokenVocabulary> vocabulary;
  std::vector<int32_t> end_ids;
};

const Setup& setup(const std::string& name) {
  static std::map<std::string, Setup> loaded;
  Setup& slot = loaded[name];
  if (!slot.tokenizer) {
    slot.tokenizer =
        std::make_unique<dspark::Tokenizer>(dspark::Tokenizer::from_file(tokenizer_path(name)));
    slot.vocabulary = TokenVocabulary::from_tokenizer(*slot.tokenizer);
    const std::optional<int32_t> end = slot.tokenizer->token_to_id("<|im_end|>");
    if (end) {
      slot.end_ids = {*end};
    } else if (slot.tokenizer->eos_id()) {
      slot.end_ids = {*slot.tokenizer->eos_id()};
    }
  }
  return slot;
}

TokenConstraint constraint_after(const Setup& s, const std::string& prefix,
                                 std::shared_ptr<const dspark::constrain::Grammar> grammar =
                                     dspark::constrain::json_object_grammar()) {
  TokenConstraint constraint(std::move(grammar), s.vocabulary, s.end_ids);
  for (const int32_t id : s.tokenizer->encode(prefix, false)) constraint.accept(id);
  return constraint;
}

void Cold(benchmark::State& state, const std::string& name, const std::string& prefix) {
  const Setup& s = setup(name);
  std::vector<float> logits(static_cast<size_t>(s.vocabulary->size()), 0.0f);
  for (auto _ : state) {
    state.PauseTiming();
    // A grammar of its own (any object, like json_object) has no cached sets yet.
    const TokenConstraint constraint = constraint_after(
        s, prefix, dspark::constrain::json_schema_grammar(nlohmann::json{{"type", "object"}}));
    state.ResumeTiming();
    constraint.mask_logits(logits.data(), static_cast<int64_t>(logits.size()));
    benchmark::DoNotOptimize(logits.data());
  }
  state.counters["vocab"] = s.vocabulary->size();
}

void WarmStep(benchmark::State& state, const std::string& name) {
  const Setup& s = setup(name);
  std::vector<float> logits(static_cast<size_t>(s.vocabulary->size()), 0.0f);
  const TokenConstraint base = constraint_after(s, "{\"name\": \"Ada");
  const int32_t next = s.tokenizer->encode(" Lovelace", false).front();
  TokenConstraint warm = base;
  warm.accept(next);
  warm.mask_logits(logits.data(), static_cast<int64_t>(logits.size()));
  for (auto _ : state) {
    TokenConstraint step = base;
    step.accept(next);
    step.mask_logits(logits.data(), static_cast<int64_t>(logits.size()));
    benchmark::DoNotOptimize(logits.data());
  }
}

void MaskOnly(benchmark::State& state, const std::string& name) {
  const Setup& s = setup(name);
  std::vector<float> logits(static_cast<size_t>(s.vocabulary->size()), 0.0f);
  const TokenConstraint constraint = constraint_after(s, "{\"name\": \"Ada");
  constraint.mask_logits(logits.data(), static_cast<int64_t>(logits.size()));
  for (auto _ : state) {
    constraint.mask_logits(logits.data(), static_cast<int64_t>(logits.size()));
    benchmark::DoNotOptimize(logits.data());
  }
}

void Vocabulary(benchmark::State& state, const std::string& name) {
  const Setup& s = setup(name);
  for (auto _ : state) benchmark::DoNotOptimize(TokenVocabulary::from_tokenizer(*s.tokenizer));
}

void register_all(const std::string& name) {
  benchmark::RegisterBenchmark(("Cold/String/" + name).c_str(), Cold, name, "{\"name\": \"Ada")
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark(("Cold/AfterKey/" + name).c_str(), Cold, name, "{\"name\": ")
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark(("WarmStep/String/" + name).c_str(), WarmStep, name)
      ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark(("MaskOnly/" + name).c_str(), MaskOnly, name)
      ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark(("Vocabulary/" + name).c_str(), Vocabulary, name)
      ->Unit(benchmark::kMillisecond);
}

}  // namespace

int main(int argc, char** argv) {
  register_all("smollm2");
  register_all("qwen3");
  if (std::getenv("DSPARK_CONSTRAIN_TOKENIZER")) register_all("custom");
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
