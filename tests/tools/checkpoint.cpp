// dspark_tool_checkpoint: reads a checkpoint through dspark's reader and writes what it read.
//   copy <checkpoint dir or .safetensors> <out.safetensors>   every tensor, byte for byte
//   config <checkpoint dir>                                  prints the parsed config.json
#include "formats/checkpoint.h"

#include <cstdio>
#include <string>
#include <vector>

#include "base/error.h"

int main(int argc, char** argv) {
  try {
    if (argc == 4 && std::string(argv[1]) == "copy") {
      dspark::Checkpoint checkpoint(argv[2]);
      std::vector<dspark::TensorToWrite> tensors;
      for (const auto& name : checkpoint.names()) {
        const dspark::TensorView& view = checkpoint.tensor(name);
        tensors.push_back({name, view.dtype, view.shape, view.data, view.nbytes});
      }
      dspark::write_safetensors(argv[3], tensors, {{"format", "mlx"}});
      return 0;
    }
    if (argc == 3 && std::string(argv[1]) == "config") {
      dspark::Checkpoint checkpoint(argv[2]);
      std::printf("%s\n", checkpoint.config().dump().c_str());
      return 0;
    }
    std::fprintf(stderr, "usage: dspark_tool_checkpoint copy <checkpoint> <out> | config <dir>\n");
    return 2;
  } catch (const dspark::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
