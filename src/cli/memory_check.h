#pragma once
// The memory check `generate`, `serve` and `benchmark` run after opening a model and before its
// first forward (model/memory_fit.h). A model that does not fit is refused, as Ollama refuses one,
// rather than run at disk speed the way a plain mmap would (llama.cpp's default); `--force` runs
// it anyway from the page cache, with a warning.
#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

#include "model/model.h"

namespace dspark::cli {

void add_force_flag(CLI::App* command, bool* force);

// Fails (naming the model, the estimate and --force) when the model does not fit and force is
// false; warns on standard error when it does not fit and force is true; silent when it fits.
void check_memory_fit(const Model& model, const std::string& name, int64_t context, bool force);

}  // namespace dspark::cli
