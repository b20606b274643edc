#pragma once
// One function per subcommand; each adds its CLI11 subcommand and the callback that runs it.
#include <CLI/CLI.hpp>

namespace dspark::cli {

void add_doctor_command(CLI::App& app);
void add_convert_command(CLI::App& app);
void add_models_command(CLI::App& app);
void add_generate_command(CLI::App& app);
void add_benchmark_command(CLI::App& app);
void add_serve_command(CLI::App& app);

}  // namespace dspark::cli
