// nemotron_h decode and prefill speed at Nemotron-3 Nano's real layer shapes, on the synthetic
// 4-bit checkpoint that scripts/make_synthetic_nano.py writes (its first 8 layers, MEMEM*EM).
//
//   python scripts/make_synthetic_nano.py /tmp/dspark_synthetic_nano
//   DSPARK_SYNTHETIC_NANO=/tmp/dspark_synthetic_nano decode_bench
//
// Counters (per generated / prefilled token):
//   tok_s, MB_tok          measured on the checkpoint as it is
//   tok_s_52L, MB_tok_52L  scaled to Nano's 52 layers (23 M, 23 E, 6 *): the measured time and
//                          bytes of the non-layer work plus 23 / 23 / 6 times the measured mean of
//                          each layer kind
//   GBps, bw_GBps          weight bytes streamed per second vs. this machine's measured read
//                          bandwidth (all threads); roofline = GBps / bw_GBps
//   roofline_tok_s_52L     the 52-layer decode rate if every weight byte came at bw_GBps
//   ms_layer_M/E/A         mean time of one Mamba / MoE / attention layer
//   peak_RSS_MB            of the whole process (the mapped weights it touched included)
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "base/system_info.h"
#include "base/thread_pool.h"
#include "bench_models.h"
#include "kernels/bandwidth.h"
#include "kernels/ops.h"
#include "model/model.h"

namespace {

const std::map<char, int> kNanoLayerCounts = {{'M', 23}, {'E', 23}, {'*', 6}};

std::string checkpoint_dir() {
  const char* dir = std::getenv("DSPARK_SYNTHETIC_NANO");
  return dir ? dir : "/tmp/dspark_synthetic_nano";
}

dspark::Model* synthetic_model(benchmark::State& state) {
  return dspark::bench::cached_model(
      state, checkpoint_dir(), "run scripts/make_synthetic_nano.py (or set DSPARK_SYNTHETIC_NANO)");
}

using dspark::bench::read_bandwidth_gbs;

// Per-token seconds and bytes, as measured and as scaled to Nano's 52 layers.
struct Scaled {
  double seconds = 0, seconds_52 = 0;
  double bytes = 0, bytes_52 = 0;
  std::map<char, double> layer_ms;  // mean milliseconds of one layer of each kind
};

Scaled scale_to_nano(const dspark::Model& model, const std::vector<double>& layer_seconds,
                     double total_seconds, double tokens, bool decode) {
  const std::string& kinds = model.config().layer_kinds;
  std::map<char, double> kind_seconds, kind_bytes;
  std::map<char, int> kind_count;
  double layers_seconds = 0;
  for (size_t l = 0; l < kinds.size(); ++l) {
    kind_seconds[kinds[l]] += layer_seconds[l];
    kind_bytes[kinds[l]] += static_cast<double>(model.layer_decode_weight_bytes(l));
    ++kind_count[kinds[l]];
    layers_seconds += layer_seconds[l];
  }
  Scaled s;
  for (const auto& [kind, count] : kind_count) {
    s.layer_ms[kind] = 1e3 * kind_seconds[kind] / count / tokens;
  }
  s.seconds = total_seconds / tokens;
  s.seconds_52 = (total_seconds - layers_seconds) / tokens;
  s.bytes = static_cast<double>(model.decode_weight_bytes());
  s.bytes_52 = static_cast<double>(model.shared_decode_weight_bytes());
  for (const auto& [kind, count] : kNanoLayerCounts) {
    if (kind_count[kind] == 0) continue;
    s.seconds_52 += count * kind_seconds[kind] / kind_count[kind] / tokens;
    s.bytes_52 += count * kind_bytes[kind] / kind_count[kind];
  }
  if (!decode) s.bytes = s.bytes_52 = 0;  // prefill reuses weights across tokens
  return s;
}

void report(benchmark::State& state, const Scaled& s) {
  state.counters["tok_s"] = 1.0 / s.seconds;
  state.counters["tok_s_52L"] = 1.0 / s.seconds_52;
  if (s.bytes > 0) {
    const double bw = read_bandwidth_gbs();
    state.counters["MB_tok"] = s.bytes / 1e6;
    state.counters["MB_tok_52L"] = s.bytes_52 / 1e6;
    state.counters["GBps"] = s.bytes / s.seconds / 1e9;
    state.counters["bw_GBps"] = bw;
    state.counters["roofline"] = s.bytes / s.seconds / 1e9 / bw;
    state.counters["roofline_tok_s_52L"] = bw * 1e9 / s.bytes_52;
  }
  for (const auto& [kind, ms] : s.layer_ms) {
    state.counters[std::string("ms_layer_") + (kind == '*' ? 'A' : kind)] = ms;
  }
  state.counters["peak_RSS_MB"] = static_cast<double>(dspark::peak_rss_bytes()) / 1e6;
}

std::vector<int32_t> prompt_tokens(int64_t n) {
  std::vector<int32_t> tokens(n);
  for (int64_t i = 0; i < n; ++i) tokens[i] = static_cast<int32_t>((1000 + 7919 * i) % 131072);
  return tokens;
}

void BM_Decode(benchmark::State& state) {
  dspark::Model* model = synthetic_model(state);
  if (model == nullptr) return;
  read_bandwidth_gbs();
  dspark::ModelState sequence = model->new_state();
  dspark::ForwardOutput out;
  const std::vector<int32_t> prompt = prompt_tokens(32);
  model->forward(prompt.data(), 32, sequence, {31}, {}, out);
  std::vector<double> layer_seconds(model->num_layers(), 0.0);
  model->set_layer_timing(&layer_seconds);
  int32_t token = 17;
  const double start = dspark::now_seconds();
  for (auto _ : state) {
    model->forward(&token, 1, sequence, {0}, {}, out);
    token = static_cast<int32_t>((token * 31 + 7) % 131072);
  }
  const double total = dspark::now_seconds() - start;
  model->set_layer_timing(nullptr);
  report(state, scale_to_nano(*model, layer_seconds, total, static_cast<double>(state.iterations()),
                              true));
}
BENCHMARK(BM_Decode)->Unit(benchmark::kMillisecond)->Iterations(24)->UseRealTime();

void BM_Prefill(benchmark::State& state) {
  dspark::Model* model = synthetic_model(state);
  if (model == nullptr) return;
  const int64_t n = state.range(0);
  const std::vector<int32_t> prompt = prompt_tokens(n);
  std::vector<double> layer_seconds(model->num_layers(), 0.0);
  dspark::ForwardOutput out;
  double total = 0;
  for (auto _ : state) {
    dspark::ModelState sequence = model->new_state();
    model->set_layer_timing(&layer_seconds);
    const double start = dspark::now_seconds();
    model->forward(prompt.data(), n, sequence, {n - 1}, {}, out);
    total += dspark::now_seconds() - start;
    model->set_layer_timing(nullptr);
  }
  report(state, scale_to_nano(*model, layer_seconds, total,
                              static_cast<double>(n * state.iterations()), false));
}
BENCHMARK(BM_Prefill)
    ->Arg(64)
    ->Arg(256)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(1)
    ->UseRealTime();

// The model's own (non-quantized) decode work at Nano's shapes, with synthetic inputs: one SSM
// step of one Mamba layer (the state is 2 MiB, read and written) and one attention layer over a
// KV cache of `range(0)` tokens. Counter GBps: state or KV bytes touched per second.
void BM_SsdStep(benchmark::State& state) {
  const dspark::kernels::SsmDims dims{64, 64, 8, 128};
  const int64_t rows = state.range(0);
  std::vector<float> ssm(64 * 64 * 128, 0.01f), x(rows * 64 * 64, 0.5f), B(rows * 8 * 128, 0.1f),
      C(rows * 8 * 128, 0.1f), dt(rows * 64, 0.05f), A(64, -1.0f), D(64, 1.0f), y(rows * 64 * 64);
  const bool chunked = state.range(1) != 0;
  for (auto _ : state) {
    if (chunked) {
      dspark::kernels::ssd_chunked(dims, ssm.data(), x.data(), B.data(), C.data(), dt.data(),
                                   A.data(), D.data(), rows, 128, y.data());
    } else {
      dspark::kernels::ssd_sequential(dims, ssm.data(), x.data(), B.data(), C.data(), dt.data(),
                                      A.data(), D.data(), rows, y.data());
    }
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["tok_s"] =
      benchmark::Counter(static_cast<double>(rows), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_SsdStep)
    ->ArgNames({"rows", "chunked"})
    ->Args({1, 0})
    ->Args({16, 0})
    ->Args({256, 0})
    ->Args({256, 1})
    ->UseRealTime();

void BM_AttentionDecode(benchmark::State& state) {
  const int64_t context = state.range(0), q_heads = 32, kv_heads = 2, dim = 128;
  std::vector<float> q(q_heads * dim, 0.01f), out(q_heads * dim);
  std::vector<float> keys(context * kv_heads * dim, 0.02f), values(context * kv_heads * dim, 0.5f);
  for (auto _ : state) {
    dspark::kernels::causal_attention(q.data(), 1, q_heads, kv_heads, dim, keys.data(),
                                      values.data(), context - 1, 0.088f, out.data());
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["GBps"] = benchmark::Counter(2.0 * context * kv_heads * dim * sizeof(float),
                                              benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_AttentionDecode)->Arg(4096)->Arg(32768)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
