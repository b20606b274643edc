// dspark: the command-line entry point. Each subcommand lives in its own file (cli/<name>.cpp)
// and registers itself with CLI11 through the functions declared in cli/commands.h.
#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>

#include "base/error.h"
#include "cli/commands.h"
#include "hub/hub_error.h"

int main(int argc, char** argv) {
  // A client that hangs up must not kill the process: writes then fail with EPIPE instead.
  std::signal(SIGPIPE, SIG_IGN);
  CLI::App app{"dspark: fast, lossless speculative decoding for MLX checkpoints"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "dspark 0.1.0");
  dspark::cli::add_generate_command(app);
  dspark::cli::add_benchmark_command(app);
  dspark::cli::add_serve_command(app);
  dspark::cli::add_convert_command(app);
  dspark::cli::add_models_command(app);
  dspark::cli::add_doctor_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const dspark::HubError& e) {
    std::fprintf(stderr, "dspark: error: %s\n", e.what());
    return e.kind() == dspark::HubErrorKind::kInterrupted ? 130 : 1;
  } catch (const dspark::Error& e) {
    std::fprintf(stderr, "dspark: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
