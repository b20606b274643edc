#pragma once
// The shared main of the tools that take an input and an output path: a wrong argument count is
// a usage line and exit status 2, an error is one line on stderr and exit status 1.
#include <cstdio>
#include <exception>

namespace dspark::tools {

template <class Run>
int run_with_two_paths(int argc, char** argv, const char* usage, Run run) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s\n", usage);
    return 2;
  }
  try {
    return run(argv[1], argv[2]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}

}  // namespace dspark::tools
