// `dspark doctor`: what this machine offers dspark: CPU features and the kernels chosen for them,
// memory, and measured read bandwidth (the roofline every speed figure is quoted against).
#include <fmt/format.h>

#include "base/system_info.h"
#include "base/thread_pool.h"
#include "cli/commands.h"
#include "formats/model_store.h"
#include "kernels/bandwidth.h"
#include "kernels/quant.h"

namespace dspark::cli {

void add_doctor_command(CLI::App& app) {
  auto* command =
      app.add_subcommand("doctor", "Check this machine: CPU, kernels, bandwidth, models");
  auto dir = std::make_shared<std::string>();
  command->add_option("--models-dir", *dir, "Models directory");
  command->callback([dir] {
    const CpuFeatures& cpu = cpu_features();
    fmt::print("cpu: {}\n", cpu.model_name);
    fmt::print(
        "features: avx2={} fma={} f16c={} avx512f={} avx512bw={} avx512vl={} "
        "avx512vnni={} avx512bf16={}\n",
        cpu.avx2, cpu.fma, cpu.f16c, cpu.avx512f, cpu.avx512bw, cpu.avx512vl, cpu.avx512vnni,
        cpu.avx512bf16);
    fmt::print("kernels: {}\n", kernels::isa_name(kernels::best_isa()));
    fmt::print("threads: {}\n", default_pool().num_threads());
    fmt::print("memory: {:.1f} GiB total, {:.1f} GiB available\n",
               total_memory_bytes() / double(1 << 30), available_memory_bytes() / double(1 << 30));
    fmt::print("read bandwidth: {:.1f} GB/s (1 thread), {:.1f} GB/s ({} threads)\n",
               kernels::measure_read_bandwidth_gbs(1),
               kernels::measure_read_bandwidth_gbs(default_pool().num_threads()),
               default_pool().num_threads());
    fmt::print("gpu: none (dspark was built without CUDA)\n");
    const std::string where = models_dir(*dir);
    const auto models = list_models(where);
    fmt::print("models in {}: {}\n", where, models.empty() ? "none" : "");
    const int64_t available = available_memory_bytes();
    for (const auto& model : models) {
      // Weights are memory-mapped: a model fits when its files fit in available memory with a
      // margin for caches and activations.
      const bool fits = model.bytes + (model.bytes / 10) + (512ll << 20) < available;
      fmt::print("  {:<40} {:<12} {:>9.1f} MB  {}\n", model.name, model.architecture,
                 model.bytes / 1e6, fits ? "fits in memory" : "does NOT fit in available memory");
    }
  });
}

}  // namespace dspark::cli
