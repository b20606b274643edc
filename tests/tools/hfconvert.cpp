// dspark_tool_hfconvert <hf dir> <output dir> [bits=N] [group=N] [dtype=NAME] [max_shard_bytes=N]:
// runs dspark's Hugging Face -> MLX converter and prints its summary as one JSON line.
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "base/error.h"
#include "convert/hf_to_mlx.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr,
                 "usage: dspark_tool_hfconvert <hf dir> <output dir> [bits=N] [group=N] "
                 "[dtype=NAME] [max_shard_bytes=N]\n");
    return 2;
  }
  try {
    dspark::HfConversionOptions options;
    for (int i = 3; i < argc; ++i) {
      const std::string arg = argv[i];
      const auto equals = arg.find('=');
      const std::string key = arg.substr(0, equals);
      const std::string value = equals == std::string::npos ? "" : arg.substr(equals + 1);
      if (key == "bits") {
        options.bits = std::stoi(value);
      } else if (key == "group") {
        options.group_size = std::stoi(value);
      } else if (key == "dtype") {
        options.dtype = value;
      } else if (key == "max_shard_bytes") {
        options.max_shard_bytes = std::stoll(value);
      } else {
        std::fprintf(stderr, "unknown argument '%s'\n", arg.c_str());
        return 2;
      }
    }
    const auto summary = dspark::convert_hf_to_mlx(argv[1], argv[2], options);
    const nlohmann::json report = {{"architecture", summary.architecture},
                                   {"dtype", summary.dtype},
                                   {"tensors", summary.tensors},
                                   {"quantized_modules", summary.quantized_modules},
                                   {"unquantized_modules", summary.unquantized_modules},
                                   {"output_bytes", summary.output_bytes},
                                   {"shards", summary.shards}};
    std::printf("%s\n", report.dump().c_str());
    return 0;
  } catch (const dspark::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
