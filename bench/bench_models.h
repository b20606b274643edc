#pragma once
// What the model benchmarks share: one model per process, loaded on first use (a missing
// checkpoint skips the benchmark with the way to make it), and the read bandwidth that their
// rooflines divide by, measured once.
#include <benchmark/benchmark.h>

#include <filesystem>
#include <memory>
#include <string>

#include "base/thread_pool.h"
#include "kernels/bandwidth.h"
#include "model/model.h"

namespace dspark::bench {

inline Model* cached_model(benchmark::State& state, const std::string& dir,
                           const std::string& how_to_make) {
  static std::unique_ptr<Model> model;
  static std::string error;
  if (!model && error.empty()) {
    if (!std::filesystem::exists(dir + "/config.json")) {
      error = "no checkpoint at " + dir + ": " + how_to_make;
    } else {
      try {
        model = load_model(dir);
      } catch (const std::exception& e) {
        error = e.what();
      }
    }
  }
  if (!model) state.SkipWithError(error.c_str());
  return model.get();
}

inline double read_bandwidth_gbs() {
  static const double gbs = kernels::measure_read_bandwidth_gbs(default_pool().num_threads());
  return gbs;
}

}  // namespace dspark::bench
