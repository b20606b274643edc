#pragma once
// Shared by the libFuzzer harnesses: splitting one input into parts, and handing bytes to the
// readers that take a path (safetensors, GGUF, checkpoints), which memory-map their file.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <utility>

namespace dspark::fuzz {

inline std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// The input before and after its first NUL byte (the second part is empty without one). Text
// inputs never hold NUL, so a NUL cleanly separates, e.g., a template from its JSON context.
inline std::pair<std::string_view, std::string_view> split_at_nul(std::string_view input) {
  const size_t nul = input.find('\0');
  if (nul == std::string_view::npos) return {input, {}};
  return {input.substr(0, nul), input.substr(nul + 1)};
}

// A directory of this process's own under the temporary directory (tmpfs keeps it cheap),
// created on first use, reused by every run and removed when the process exits normally.
inline const std::filesystem::path& scratch_dir() {
  struct Scratch {
    std::filesystem::path path =
        std::filesystem::temp_directory_path() / ("dspark_fuzz_" + std::to_string(getpid()));
    Scratch() { std::filesystem::create_directories(path); }
    ~Scratch() {
      std::error_code ignored;
      std::filesystem::remove_all(path, ignored);
    }
  };
  static const Scratch scratch;
  return scratch.path;
}

inline void write_file(const std::filesystem::path& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace dspark::fuzz
