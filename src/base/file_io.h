#pragma once
// Whole-file reads for the small text files around a checkpoint (configs, templates, refs).
// Weights never come through here: they are memory-mapped (mapped_file.h).
#include <string>

namespace dspark {

// The file's bytes; throws naming the path when it cannot be opened or read.
std::string read_file(const std::string& path);

}  // namespace dspark
