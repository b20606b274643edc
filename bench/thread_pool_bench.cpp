// What one parallel loop costs on the default pool with an empty body: the hand-offs between the
// calling thread and the workers that every parallel loop of a forward pays (the default model's
// forward runs about 180). The pool's size is DSPARK_THREADS or the CPUs this process may use.
//
//   DSPARK_THREADS=2 thread_pool_bench --benchmark_repetitions=5
#include <benchmark/benchmark.h>

#include <cstdint>

#include "base/thread_pool.h"

namespace {

void BM_EmptyParallelFor(benchmark::State& state) {
  dspark::ThreadPool& pool = dspark::default_pool();
  const int64_t grains = state.range(0);
  for (auto _ : state) {
    pool.parallel_for(
        grains, 1, [](int64_t begin, int64_t end, int) { benchmark::DoNotOptimize(begin + end); });
  }
  state.counters["threads"] = pool.num_threads();
}
BENCHMARK(BM_EmptyParallelFor)
    ->ArgName("grains")
    ->Arg(4)
    ->Arg(64)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
