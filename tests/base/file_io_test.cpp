#include "base/file_io.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "base/error.h"

namespace dspark {
namespace {

TEST(ReadFile, ReturnsEveryByteAndNamesAMissingFile) {
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() / "dspark_read_file_test.bin";
  const std::string bytes("a\0b\r\n\xff", 6);
  std::ofstream(path, std::ios::binary) << bytes;
  EXPECT_EQ(read_file(path.string()), bytes);
  std::filesystem::remove(path);
  try {
    read_file(path.string());
    FAIL() << "a missing file must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path.string() + ": cannot open"), std::string::npos);
  }
}

}  // namespace
}  // namespace dspark
