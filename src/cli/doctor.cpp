// `dspark doctor`: what this machine offers dspark: CPU features and the kernels chosen for them,
// memory, and measured read bandwidth (the roofline every speed figure is quoted against).
#include <fmt/format.h>

#include "base/system_info.h"
#include "base/thread_pool.h"
#include "cli/commands.h"
#include "kernels/bandwidth.h"
#include "kernels/quant.h"

namespace dspark::cli {

void add_doctor_command(CLI::App& app) {
  auto* command = app.add_subcommand("doctor", "Check this machine: CPU, kernels, bandwidth");
  command->callback([] {
    const CpuFeatures& cpu = cpu_features();
    fmt::print("cpu: {}\n", cpu.model_name);
    fmt::print("features: avx2={} fma={} f16c={} avx512f={} avx512bw={} avx512vl={} "
               "avx512vnni={} avx512bf16={}\n",
               cpu.avx2, cpu.fma, cpu.f16c, cpu.avx512f, cpu.avx512bw, cpu.avx512vl,
               cpu.avx512vnni, cpu.avx512bf16);
    fmt::print("kernels: {}\n", kernels::isa_name(kernels::best_isa()));
    fmt::print("threads: {}\n", default_pool().num_threads());
    fmt::print("memory: {:.1f} GiB total, {:.1f} GiB available\n",
               total_memory_bytes() / double(1 << 30), available_memory_bytes() / double(1 << 30));
    fmt::print("read bandwidth: {:.1f} GB/s (1 thread), {:.1f} GB/s ({} threads)\n",
               kernels::measure_read_bandwidth_gbs(1),
               kernels::measure_read_bandwidth_gbs(default_pool().num_threads()),
               default_pool().num_threads());
    fmt::print("gpu: none (dspark was built without CUDA)\n");
  });
}

}  // namespace dspark::cli
