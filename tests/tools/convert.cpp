// dspark_tool_convert gguf <file.gguf> <output dir>: runs dspark's GGUF -> MLX converter.
#include <cstdio>
#include <string>

#include "base/error.h"
#include "convert/gguf_to_mlx.h"

int main(int argc, char** argv) {
  if (argc != 4 || std::string(argv[1]) != "gguf") {
    std::fprintf(stderr, "usage: dspark_tool_convert gguf <file.gguf> <output dir>\n");
    return 2;
  }
  try {
    auto summary = dspark::convert_gguf_to_mlx(argv[2], argv[3]);
    std::printf("%s %lld tensors (%lld quantized), %lld bytes\n", summary.architecture.c_str(),
                static_cast<long long>(summary.tensors),
                static_cast<long long>(summary.quantized_tensors),
                static_cast<long long>(summary.output_bytes));
    return 0;
  } catch (const dspark::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
