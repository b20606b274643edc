#include "cli/memory_check.h"

#include <fmt/format.h>

#include "base/error.h"
#include "base/system_info.h"
#include "model/memory_fit.h"

namespace dspark::cli {

void add_force_flag(CLI::App* command, bool* force) {
  command->add_flag("--force", *force,
                    "Run a model that does not fit in available memory (it then streams its "
                    "weights from disk through the page cache, far slower)");
}

void check_memory_fit(const Model& model, const std::string& name, int64_t context, bool force) {
  const MemoryVerdict verdict =
      judge_memory(estimate_memory(model, context), total_memory_bytes(), available_memory_bytes());
  if (verdict.fit == MemoryFit::fits) return;
  const std::string consequence =
      verdict.fit == MemoryFit::page_cache
          ? "its weights would be reread from disk through the page cache as tokens route to "
            "evicted experts"
          : "not even the weights of one token fit, so every token would reread them from disk";
  if (!force) {
    fail("{} does not fit in memory: {}; {}. Pass --force to run it anyway", name, verdict.summary,
         consequence);
  }
  fmt::print(stderr, "warning: {} does not fit in memory: {}; running anyway (--force): {}\n", name,
             verdict.summary, consequence);
}

}  // namespace dspark::cli
