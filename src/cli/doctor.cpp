// `dspark doctor`: what this machine offers dspark: CPU features and the kernels chosen for them,
// memory, and measured read bandwidth (the roofline every speed figure is quoted against).
#include <fmt/format.h>

#include <filesystem>
#include <optional>

#include "base/system_info.h"
#include "base/thread_pool.h"
#include "cli/commands.h"
#include "formats/checkpoint.h"
#include "formats/model_store.h"
#include "kernels/bandwidth.h"
#include "kernels/quant.h"
#include "model/memory_fit.h"
#include "speculative/drafter_loader.h"

namespace dspark::cli {
namespace {

// A drafter checkpoint's packaging, or nothing for any other directory. A drafter lacks the
// target's embedding and head, so opening it as a model would report it broken.
std::optional<DrafterPackaging> drafter_packaging(const std::string& path) {
  try {
    const std::string config = (std::filesystem::path(path) / "config.json").string();
    return detect_drafter_packaging(read_json_file(config), config);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// The memory estimate of the model at `path` against this machine (the check generate and serve
// run), or why it cannot be opened. Opening maps the weights without reading them.
std::string memory_line(const std::string& path, int64_t context) {
  if (const auto packaging = drafter_packaging(path)) {
    return fmt::format("a {} drafter: runs beside its target (--drafter, or --mode auto)",
                       drafter_packaging_name(*packaging));
  }
  try {
    const auto model = load_model(path);
    const MemoryVerdict verdict = judge_memory(estimate_memory(*model, context),
                                               total_memory_bytes(), available_memory_bytes());
    const char* fit = verdict.fit == MemoryFit::fits ? "fits in memory"
                      : verdict.fit == MemoryFit::page_cache
                          ? "does NOT fit: would stream weights from disk (--force)"
                          : "does NOT fit, not even one token's weights (--force)";
    return fmt::format("{}: {}", fit, verdict.summary);
  } catch (const std::exception& e) {
    return fmt::format("cannot be opened: {}", e.what());
  }
}

}  // namespace

void add_doctor_command(CLI::App& app) {
  auto* command =
      app.add_subcommand("doctor", "Check this machine: CPU, kernels, bandwidth, models");
  auto dir = std::make_shared<std::string>();
  auto model_dir = std::make_shared<std::string>();
  auto context = std::make_shared<int64_t>(4096);
  command->add_option("--models-dir", *dir, "Models directory");
  command->add_option("--model,-m", *model_dir, "Also check this model directory");
  command->add_option("--context", *context, "Context tokens the memory estimates assume")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  command->callback([dir, model_dir, context] {
    const CpuFeatures& cpu = cpu_features();
    fmt::print("cpu: {}\n", cpu.model_name);
    fmt::print(
        "features: avx2={} fma={} f16c={} avxvnni={} avx512f={} avx512bw={} avx512vl={} "
        "avx512vnni={} avx512bf16={}\n",
        cpu.avx2, cpu.fma, cpu.f16c, cpu.avxvnni, cpu.avx512f, cpu.avx512bw, cpu.avx512vl,
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
    const std::string where = models_dir(*dir);
    const auto models = list_models(where);
    fmt::print("models in {}: {}\n", where, models.empty() ? "none" : "");
    for (const auto& model : models) {
      fmt::print("  {:<40} {:<12} {:>9.1f} MB  {}\n", model.name, model.architecture,
                 model.bytes / 1e6, memory_line(model.path, *context));
    }
    if (!model_dir->empty()) {
      fmt::print("model {}: {}\n", *model_dir, memory_line(*model_dir, *context));
    }
  });
}

}  // namespace dspark::cli
