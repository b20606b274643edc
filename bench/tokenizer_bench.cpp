// Encode and decode throughput of dspark's tokenizer on the committed tokenizer corpus
// (tests/data/tokenizer_corpus.jsonl), one thread, word cache warm after the first pass.
// bench/tokenizer_hf_bench.py measures HF tokenizers on the same corpus for comparison.
//
//   tokenizer_bench --benchmark_filter=Encode
//
// Counters: bytes_per_second (corpus UTF-8 bytes encoded, or decoded text bytes produced) and
// tokens_per_second.
#include <benchmark/benchmark.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "text/tokenizer.h"

namespace {

// The repository root, found from this file's own path at build time.
const std::string kSourceDir = std::filesystem::path(__FILE__).parent_path().parent_path().string();

std::string tokenizer_path(const std::string& name) {
  if (name == "nemotron_tiny") return kSourceDir + "/tests/fixtures/nemotron-tiny/tokenizer.json";
  return kSourceDir + "/tests/fixtures/public/" + name + "/tokenizer.json";
}

const std::vector<std::string>& corpus() {
  static const std::vector<std::string> texts = [] {
    std::vector<std::string> out;
    std::ifstream in(kSourceDir + "/tests/data/tokenizer_corpus.jsonl");
    for (std::string line; std::getline(in, line);) {
      out.push_back(nlohmann::json::parse(line).get<std::string>());
    }
    return out;
  }();
  return texts;
}

const dspark::Tokenizer& tokenizer(const std::string& name) {
  static std::map<std::string, std::unique_ptr<dspark::Tokenizer>> loaded;
  auto& slot = loaded[name];
  if (!slot)
    slot = std::make_unique<dspark::Tokenizer>(dspark::Tokenizer::from_file(tokenizer_path(name)));
  return *slot;
}

void Encode(benchmark::State& state, const std::string& name) {
  const dspark::Tokenizer& tok = tokenizer(name);
  const auto& texts = corpus();
  int64_t bytes = 0;
  for (const auto& text : texts) bytes += static_cast<int64_t>(text.size());
  int64_t tokens = 0;
  for (auto _ : state) {
    tokens = 0;
    for (const auto& text : texts) tokens += static_cast<int64_t>(tok.encode(text, false).size());
  }
  state.SetBytesProcessed(bytes * state.iterations());
  state.counters["tokens_per_second"] = benchmark::Counter(
      static_cast<double>(tokens * state.iterations()), benchmark::Counter::kIsRate);
}

void Decode(benchmark::State& state, const std::string& name) {
  const dspark::Tokenizer& tok = tokenizer(name);
  std::vector<std::vector<int32_t>> encoded;
  int64_t tokens = 0;
  for (const auto& text : corpus()) {
    encoded.push_back(tok.encode(text, false));
    tokens += static_cast<int64_t>(encoded.back().size());
  }
  int64_t bytes = 0;
  for (auto _ : state) {
    bytes = 0;
    for (const auto& ids : encoded) bytes += static_cast<int64_t>(tok.decode(ids, false).size());
  }
  state.SetBytesProcessed(bytes * state.iterations());
  state.counters["tokens_per_second"] = benchmark::Counter(
      static_cast<double>(tokens * state.iterations()), benchmark::Counter::kIsRate);
}

BENCHMARK_CAPTURE(Encode, qwen3, std::string("qwen3"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(Encode, smollm2, std::string("smollm2"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(Encode, nemotron_tiny, std::string("nemotron_tiny"))
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(Decode, qwen3, std::string("qwen3"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(Decode, nemotron_tiny, std::string("nemotron_tiny"))
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
