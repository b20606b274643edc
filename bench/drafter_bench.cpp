// What one speculative round costs on the CPU at Nemotron-3 Nano's width: the DSpark drafter's
// block for a cap of 1..7 drafts vs. the target's verify forward of 1..8 rows, on the synthetic
// 4-bit Nano checkpoint (scripts/make_synthetic_nano.py, its first 8 layers) and a one-layer
// DSpark head of Nano width in the Nemotron packaging (causal block of 8, sinks, window 1024,
// Markov rank 512, the target's embedding and lm_head), random bf16 weights quantized at load to
// 4-bit like --drafter-bits 4. The head is written once to $DSPARK_BENCH_DRAFTER (default
// /tmp/dspark_bench_nano_dspark).
//
//   python scripts/make_synthetic_nano.py /tmp/dspark_synthetic_nano
//   DSPARK_SYNTHETIC_NANO=/tmp/dspark_synthetic_nano drafter_bench
//
// Time is per call (real time). Verify counters: ms (the forward alone, without the state
// restore) and ms_52L: that forward scaled to Nano's 52 layers (non-layer time plus 23 / 23 / 6
// times the mean of each layer kind). BM_DrafterLmHead and BM_MarkovStep split the drafter's
// block cost.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/sampler.h"
#include "formats/safetensors.h"
#include "model/model.h"
#include "speculative/dspark.h"
#include "tensor/dtype.h"

namespace {

namespace fs = std::filesystem;

constexpr int64_t kHidden = 2688, kVocab = 131072, kHeads = 32, kKvHeads = 8, kHeadDim = 128;
constexpr int64_t kIntermediate = 8064, kRank = 512, kBlock = 8, kContext = 64;
const std::vector<int> kTaps = {1, 3, 5};
const std::map<char, int> kNanoLayerCounts = {{'M', 23}, {'E', 23}, {'*', 6}};

std::string env_or(const char* name, const char* fallback) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : fallback;
}

// Random bf16 tensors of scale 1/sqrt(fan_in), from a fast xorshift (speed only, no quality).
class BenchWriter {
 public:
  void matrix(const std::string& name, int64_t rows, int64_t cols, float scale) {
    std::vector<uint8_t> bytes(static_cast<size_t>(rows * cols) * 2);
    for (int64_t i = 0; i < rows * cols; ++i) {
      state_ ^= state_ << 13, state_ ^= state_ >> 7, state_ ^= state_ << 17;
      const float uniform = static_cast<float>(state_ >> 40) / static_cast<float>(1 << 24);
      const uint16_t half = dspark::f32_to_bf16((2.0f * uniform - 1.0f) * scale);
      std::memcpy(bytes.data() + 2 * i, &half, 2);
    }
    add(name, {rows, cols}, std::move(bytes));
  }
  void linear(const std::string& path, int64_t out, int64_t in) {
    matrix(path + ".weight", out, in, 1.7f / std::sqrt(static_cast<float>(in)));
  }
  void ones(const std::string& name, int64_t n) {
    std::vector<uint8_t> bytes(static_cast<size_t>(n) * 2);
    const uint16_t one = dspark::f32_to_bf16(1.0f);
    for (int64_t i = 0; i < n; ++i) std::memcpy(bytes.data() + 2 * i, &one, 2);
    add(name, {n}, std::move(bytes));
  }
  void write(const std::string& path) {
    std::vector<dspark::TensorToWrite> list;
    for (const auto& [name, entry] : tensors_) {
      list.push_back(
          {name, dspark::DType::BF16, entry.first, entry.second.data(), entry.second.size()});
    }
    dspark::write_safetensors(path, list, {{"format", "mlx"}});
  }

 private:
  void add(const std::string& name, std::vector<int64_t> shape, std::vector<uint8_t> bytes) {
    tensors_[name] = {std::move(shape), std::move(bytes)};
  }
  uint64_t state_ = 0x9e3779b97f4a7c15ull;
  std::map<std::string, std::pair<std::vector<int64_t>, std::vector<uint8_t>>> tensors_;
};

nlohmann::json drafter_config() {
  return {{"architectures", {"Qwen3DSparkModel"}},
          {"model_type", "qwen3"},
          {"hidden_size", kHidden},
          {"vocab_size", kVocab},
          {"num_hidden_layers", 1},
          {"intermediate_size", kIntermediate},
          {"num_attention_heads", kHeads},
          {"num_key_value_heads", kKvHeads},
          {"head_dim", kHeadDim},
          {"rms_norm_eps", 1e-6},
          {"rope_theta", 1000000.0},
          {"attention_bias", false},
          {"block_size", kBlock},
          {"mask_token_id", 4},
          {"markov_rank", kRank},
          {"markov_head_type", "vanilla"},
          {"enable_confidence_head", true},
          {"confidence_head_with_markov", true},
          {"target_layer_ids", kTaps},
          {"dflash_query_causal", true},
          {"sliding_window", 1024},
          {"attention_sink_bias", true},
          {"sample_from_anchor", false},
          {"has_lm_head", false}};
}

std::string ensure_drafter() {
  const std::string dir = env_or("DSPARK_BENCH_DRAFTER", "/tmp/dspark_bench_nano_dspark");
  const nlohmann::json config = drafter_config();
  if (fs::exists(dir + "/model.safetensors") && fs::exists(dir + "/config.json")) {
    std::ifstream file(dir + "/config.json");
    if (nlohmann::json::parse(file, nullptr, false) == config) return dir;
  }
  fs::create_directories(dir);
  BenchWriter w;
  const int64_t H = kHidden, q = kHeads * kHeadDim, kv = kKvHeads * kHeadDim;
  w.linear("fc", H, static_cast<int64_t>(kTaps.size()) * H);
  w.ones("hidden_norm.weight", H);
  w.ones("norm.weight", H);
  w.ones("layers.0.input_layernorm.weight", H);
  w.ones("layers.0.post_attention_layernorm.weight", H);
  w.linear("layers.0.self_attn.q_proj", q, H);
  w.linear("layers.0.self_attn.k_proj", kv, H);
  w.linear("layers.0.self_attn.v_proj", kv, H);
  w.linear("layers.0.self_attn.o_proj", H, q);
  w.ones("layers.0.self_attn.q_norm.weight", kHeadDim);
  w.ones("layers.0.self_attn.k_norm.weight", kHeadDim);
  w.ones("layers.0.self_attn.attention_sink_bias", kHeads);
  w.linear("layers.0.mlp.gate_proj", kIntermediate, H);
  w.linear("layers.0.mlp.up_proj", kIntermediate, H);
  w.linear("layers.0.mlp.down_proj", H, kIntermediate);
  w.matrix("markov_head.markov_w1.weight", kVocab, kRank, 1.0f);
  w.linear("markov_head.markov_w2", kVocab, kRank);
  w.linear("confidence_head.proj", 1, H + kRank);
  w.ones("confidence_head.proj.bias", 1);
  w.write(dir + "/model.safetensors");
  std::ofstream(dir + "/config.json") << config.dump(2);
  return dir;
}

// The target after a kContext-token prefill, the drafter head, and a drafter fed the prefill.
struct Setup {
  std::unique_ptr<dspark::Model> model;
  std::shared_ptr<const dspark::DSparkHead> head;
  std::unique_ptr<dspark::DSparkDrafter> drafter;
  dspark::ModelState state;
  dspark::StateSnapshot after_prefill;
  std::vector<int32_t> committed;
};

Setup* setup(benchmark::State& state) {
  static std::unique_ptr<Setup> shared;
  static std::string error;
  if (!shared && error.empty()) {
    const std::string nano = env_or("DSPARK_SYNTHETIC_NANO", "/tmp/dspark_synthetic_nano");
    try {
      if (!fs::exists(nano + "/config.json")) {
        throw std::runtime_error(
            "no checkpoint at " + nano +
            ": run scripts/make_synthetic_nano.py (or set DSPARK_SYNTHETIC_NANO)");
      }
      auto model = dspark::load_model(nano);
      auto head = std::make_shared<const dspark::DSparkHead>(ensure_drafter(), *model,
                                                             dspark::DrafterLoadOptions{4});
      auto drafter = std::make_unique<dspark::DSparkDrafter>(head, 0.0f);
      dspark::ModelState target_state = model->new_state();
      std::vector<int32_t> prompt(kContext);
      for (int64_t i = 0; i < kContext; ++i)
        prompt[i] = static_cast<int32_t>((i * 7919 + 11) % kVocab);
      dspark::ForwardOutput out;
      model->forward(prompt.data(), kContext, target_state, {kContext - 1}, drafter->tap_layers(),
                     out);
      drafter->on_target_rows(prompt.data(), kContext, out.taps.data());
      shared = std::make_unique<Setup>(
          Setup{std::move(model), head, std::move(drafter), std::move(target_state), {}, prompt});
      shared->after_prefill = shared->state.snapshot();
      shared->committed.push_back(static_cast<int32_t>(dspark::argmax(out.logits.data(), kVocab)));
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  if (!shared) state.SkipWithError(error.c_str());
  return shared.get();
}

void BM_DrafterBlock(benchmark::State& state) {
  Setup* s = setup(state);
  if (s == nullptr) return;
  const int cap = static_cast<int>(state.range(0));
  dspark::SamplingParams sampling;
  dspark::Rng rng(1);
  size_t drafts = 0;
  for (auto _ : state) {
    const dspark::Draft draft = s->drafter->propose({s->committed, cap, sampling, rng});
    drafts = draft.tokens.size();
    benchmark::DoNotOptimize(draft.tokens.data());
  }
  state.counters["drafts"] = static_cast<double>(drafts);
  state.counters["block_rows"] = static_cast<double>(s->head->block_width(cap));
}
BENCHMARK(BM_DrafterBlock)->DenseRange(1, kBlock - 1)->Unit(benchmark::kMillisecond)->UseRealTime();

// The parts of a block whose cost grows with the cap: the target's raw lm_head on `rows` drafter
// rows, and one step of the Markov chain (W1 gather + the [vocab, rank] W2 product).
void BM_DrafterLmHead(benchmark::State& state) {
  Setup* s = setup(state);
  if (s == nullptr) return;
  const int64_t rows = state.range(0);
  std::vector<float> hidden(rows * kHidden, 0.01f), logits(rows * kVocab);
  for (auto _ : state) {
    s->head->base_logits(hidden.data(), rows, logits.data());
    benchmark::DoNotOptimize(logits.data());
  }
}
BENCHMARK(BM_DrafterLmHead)->Arg(1)->Arg(4)->Arg(7)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_MarkovStep(benchmark::State& state) {
  Setup* s = setup(state);
  if (s == nullptr) return;
  std::vector<float> embedding(kRank), bias(kVocab);
  int32_t token = 17;
  for (auto _ : state) {
    s->head->markov_embedding(token, embedding.data());
    s->head->markov_bias(embedding.data(), 1, bias.data());
    token = (token + 1) % static_cast<int32_t>(kVocab);
    benchmark::DoNotOptimize(bias.data());
  }
}
BENCHMARK(BM_MarkovStep)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_TargetVerify(benchmark::State& state) {
  Setup* s = setup(state);
  if (s == nullptr) return;
  const int64_t width = state.range(0);
  std::vector<int32_t> rows(width);
  std::vector<int64_t> logit_rows(width);
  for (int64_t i = 0; i < width; ++i) {
    rows[i] = static_cast<int32_t>((i * 31 + 5) % kVocab);
    logit_rows[i] = i;
  }
  const std::vector<int> taps = s->drafter->tap_layers();
  std::vector<double> layer_seconds(s->model->num_layers(), 0.0);
  double total = 0;
  dspark::ForwardOutput out;
  for (auto _ : state) {
    state.PauseTiming();
    s->state.restore(s->after_prefill);
    s->state.set_recording(width > 1);
    state.ResumeTiming();
    s->model->set_layer_timing(&layer_seconds);
    const auto start = std::chrono::steady_clock::now();
    s->model->forward(rows.data(), width, s->state, logit_rows, taps, out);
    total += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    s->model->set_layer_timing(nullptr);
  }
  s->state.set_recording(false);
  const std::string& kinds = s->model->config().layer_kinds;
  std::map<char, double> kind_seconds;
  std::map<char, int> kind_count;
  double layers = 0;
  for (size_t l = 0; l < kinds.size(); ++l) {
    kind_seconds[kinds[l]] += layer_seconds[l];
    ++kind_count[kinds[l]];
    layers += layer_seconds[l];
  }
  double scaled = total - layers;
  for (const auto& [kind, count] : kNanoLayerCounts) {
    if (kind_count[kind] > 0) scaled += count * kind_seconds[kind] / kind_count[kind];
  }
  const double n = static_cast<double>(state.iterations());
  state.counters["ms"] = 1e3 * total / n;
  state.counters["ms_52L"] = 1e3 * scaled / n;
}
BENCHMARK(BM_TargetVerify)->DenseRange(1, kBlock)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
