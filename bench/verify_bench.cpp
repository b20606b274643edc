// Speculative verify forwards on the default model (SmolLM2-135M-Instruct, 4-bit, group 32, or
// DSPARK_VERIFY_MODEL):
// one forward of `width` rows after a 64-token context (DSPARK_VERIFY_CONTEXT to change it), logits
// for every row (as the verify step asks), restored after each timing so the context depth stays
// fixed. BM_BatchStep: one batched step of that many sequences, one row each. BM_VerifyAttention:
// the attention calls of such a forward alone. (quant_bench
// --benchmark_filter=smollm2 times the model's quantized products alone at the same widths.)
//
//   scripts/install_default_model.sh   (or DSPARK_VERIFY_MODEL=<checkpoint dir>)
//   verify_bench [--benchmark_repetitions=5 --benchmark_report_aggregates_only=true]
//
// Counters:
//   ms_per_row       forward time divided by the width
//   x_width1         forward time relative to the width-1 forward measured in the same process
//   MB_weights       weight bytes one forward streams (every matrix once, one embedding row)
//   roofline_ms      MB_weights at this machine's measured read bandwidth (all threads): the
//                    floor of any forward, whatever its width, if it is bandwidth-bound
//   bw_GBps          that bandwidth
// and for a model with routed experts (a nemotron_h MoE), from the routing of one more forward of
// the same rows:
//   experts_touched  distinct experts per routed layer, the union over the rows (mean of layers)
//   MB_touched       weight bytes that forward streams: MB_weights with each layer's top_k
//                    experts replaced by that union, one embedding row per row
//   union_roofline_ms  MB_touched at the measured bandwidth
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "base/system_info.h"
#include "base/thread_pool.h"
#include "bench_models.h"
#include "formats/model_store.h"
#include "kernels/bandwidth.h"
#include "kernels/ops.h"
#include "model/model.h"

namespace {

// The context depth before the verified rows: DSPARK_VERIFY_CONTEXT tokens, default 64.
int64_t context_depth() {
  const char* depth = std::getenv("DSPARK_VERIFY_CONTEXT");
  return depth != nullptr ? std::max<int64_t>(1, std::atoll(depth)) : 64;
}
const int64_t kContext = context_depth();

std::string checkpoint_dir() {
  if (const char* dir = std::getenv("DSPARK_VERIFY_MODEL")) return dir;
  return dspark::models_dir() + "/SmolLM2-135M-Instruct";
}

dspark::Model* default_model(benchmark::State& state) {
  return dspark::bench::cached_model(
      state, checkpoint_dir(), "run scripts/install_default_model.sh (or set DSPARK_VERIFY_MODEL)");
}

using dspark::bench::read_bandwidth_gbs;

std::vector<int32_t> synthetic_tokens(int64_t n, int64_t vocab, int64_t seed) {
  std::vector<int32_t> tokens(n);
  for (int64_t i = 0; i < n; ++i) {
    tokens[i] = static_cast<int32_t>((1000 + 7919 * (i + seed)) % vocab);
  }
  return tokens;
}

// Seconds of one forward at each width, from the latest run of each width in this process.
std::map<int64_t, double>& forward_seconds() {
  static std::map<int64_t, double> seconds;
  return seconds;
}

void BM_VerifyForward(benchmark::State& state) {
  dspark::Model* model = default_model(state);
  if (model == nullptr) return;
  const int64_t width = state.range(0);
  read_bandwidth_gbs();
  dspark::ModelState sequence = model->new_state();
  dspark::ForwardOutput out;
  const std::vector<int32_t> context = synthetic_tokens(kContext, model->vocab_size(), 0);
  model->forward(context.data(), kContext, sequence, {kContext - 1}, {}, out);
  // Restored rather than trimmed: a recurrent (Mamba) state cannot be trimmed after a forward of
  // one row, which the verify loop does not record.
  const dspark::StateSnapshot after_context = sequence.snapshot();
  sequence.set_recording(width > 1);
  const std::vector<int32_t> rows = synthetic_tokens(width, model->vocab_size(), kContext);
  std::vector<int64_t> logit_rows(width);
  std::iota(logit_rows.begin(), logit_rows.end(), 0);
  double total = 0;
  for (auto _ : state) {
    const double start = dspark::now_seconds();
    model->forward(rows.data(), width, sequence, logit_rows, {}, out);
    const double elapsed = dspark::now_seconds() - start;
    state.SetIterationTime(elapsed);
    total += elapsed;
    sequence.restore(after_context);
  }
  const double seconds = total / static_cast<double>(state.iterations());
  forward_seconds()[width] = seconds;
  const double bytes = static_cast<double>(model->decode_weight_bytes());
  state.counters["ms_per_row"] = 1e3 * seconds / static_cast<double>(width);
  if (forward_seconds().count(1)) state.counters["x_width1"] = seconds / forward_seconds()[1];
  state.counters["MB_weights"] = bytes / 1e6;
  state.counters["bw_GBps"] = read_bandwidth_gbs();
  state.counters["roofline_ms"] = 1e3 * bytes / (read_bandwidth_gbs() * 1e9);

  dspark::RoutingCounts routing;
  model->set_routing_counts(&routing);
  model->forward(rows.data(), width, sequence, logit_rows, {}, out);
  model->set_routing_counts(nullptr);
  const std::vector<int64_t> distinct = routing.distinct_per_layer();
  if (!distinct.empty()) {
    const double touched = static_cast<double>(model->forward_weight_bytes(routing, width));
    state.counters["experts_touched"] =
        static_cast<double>(std::accumulate(distinct.begin(), distinct.end(), int64_t{0})) /
        static_cast<double>(distinct.size());
    state.counters["MB_touched"] = touched / 1e6;
    state.counters["union_roofline_ms"] = 1e3 * touched / (read_bandwidth_gbs() * 1e9);
  }
}
BENCHMARK(BM_VerifyForward)
    ->ArgName("width")
    ->DenseRange(1, 8)
    ->Arg(16)
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime();

// One batched step (Model::forward_batch, as `serve --parallel` and `benchmark --concurrency` run
// it) of `sequences` sequences, one row each after its own 64-token context, logits for every
// row: beside BM_VerifyForward at the same width, what carrying the rows as separate sequences
// costs (attention and state per sequence). Each state is restored after each timing.
void BM_BatchStep(benchmark::State& state) {
  dspark::Model* model = default_model(state);
  if (model == nullptr) return;
  const int sequences = static_cast<int>(state.range(0));
  dspark::StatePool pool = model->new_pool(sequences);
  std::vector<dspark::SequenceId> ids;
  std::vector<dspark::StateSnapshot> after_context;
  std::vector<int32_t> next(sequences);  // each sequence's one new token
  std::vector<dspark::ForwardOutput> outs(sequences);
  std::vector<dspark::SequenceRun> runs;
  for (int s = 0; s < sequences; ++s) {
    ids.push_back(pool.open());
    const std::vector<int32_t> context = synthetic_tokens(kContext, model->vocab_size(), 97 * s);
    dspark::SequenceRun prompt{context.data(), kContext, ids.back(), {kContext - 1}, {}, &outs[s]};
    model->forward_batch({prompt}, pool);
    after_context.push_back(pool.snapshot(ids.back()));
    next[s] = synthetic_tokens(1, model->vocab_size(), 97 * s + kContext)[0];
    runs.push_back({&next[s], 1, ids.back(), {0}, {}, &outs[s]});
  }
  for (auto _ : state) {
    const double start = dspark::now_seconds();
    model->forward_batch(runs, pool);
    state.SetIterationTime(dspark::now_seconds() - start);
    for (int s = 0; s < sequences; ++s) pool.restore(ids[s], after_context[s]);
  }
}
BENCHMARK(BM_BatchStep)
    ->ArgName("sequences")
    ->Arg(1)
    ->Arg(2)
    ->Arg(4)
    ->Arg(8)
    ->Arg(16)
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime();

// Attention alone at the default model's shapes (9 q heads, 3 kv heads of 64) for `width` new rows
// after the same 64-token context, over all 30 layers' worth of calls.
void BM_VerifyAttention(benchmark::State& state) {
  const int64_t width = state.range(0), q_heads = 9, kv_heads = 3, dim = 64, layers = 30;
  std::vector<float> q(width * q_heads * dim, 0.01f), out(q.size());
  std::vector<float> keys((kContext + width) * kv_heads * dim, 0.02f), values(keys.size(), 0.5f);
  for (auto _ : state) {
    for (int64_t layer = 0; layer < layers; ++layer) {
      dspark::kernels::causal_attention(q.data(), width, q_heads, kv_heads, dim, keys.data(),
                                        values.data(), kContext, 0.125f, out.data());
    }
    benchmark::DoNotOptimize(out.data());
  }
}
BENCHMARK(BM_VerifyAttention)
    ->ArgName("width")
    ->Arg(1)
    ->Arg(8)
    ->Arg(16)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
