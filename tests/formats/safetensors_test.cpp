#include "formats/safetensors.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "base/error.h"
#include "formats/checkpoint.h"

namespace dspark {
namespace {

namespace fs = std::filesystem;

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("dspark_st_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Writes a file from a header text and a data buffer, with an explicit header length field.
  std::string write_raw(const std::string& name, const std::string& header, const std::string& data,
                        int64_t header_length_override = -1) {
    const std::string path = (dir_ / name).string();
    std::ofstream out(path, std::ios::binary);
    uint64_t length = header_length_override >= 0 ? header_length_override : header.size();
    for (int i = 0; i < 8; ++i) out.put(static_cast<char>(length >> (8 * i)));
    out << header << data;
    return path;
  }

  // Expects opening `path` to fail with a message containing every fragment.
  void expect_error(const std::string& path, const std::vector<std::string>& fragments) {
    try {
      SafetensorsFile file(path);
      FAIL() << "expected an error for " << path;
    } catch (const Error& e) {
      const std::string message = e.what();
      for (const auto& fragment : fragments) {
        EXPECT_NE(message.find(fragment), std::string::npos)
            << "message '" << message << "' lacks '" << fragment << "'";
      }
    }
  }

  fs::path dir_;
};

TEST_F(SafetensorsTest, RoundTripsEveryDtypeAndUnalignedData) {
  std::vector<float> floats = {1.5f, -2.25f, 3.0f};
  std::vector<uint16_t> halves = {0x3c00, 0xc000};
  std::vector<uint8_t> bytes = {7};
  std::vector<uint32_t> words = {0xdeadbeef, 1, 2, 3};
  std::vector<int64_t> longs = {-5, 1ll << 40};
  const std::string path = (dir_ / "a.safetensors").string();
  write_safetensors(path,
                    {{"byte", DType::U8, {1}, bytes.data(), 1},
                     {"f32", DType::F32, {3}, floats.data(), 12},
                     {"f16", DType::F16, {2}, halves.data(), 4},
                     {"bf16", DType::BF16, {1, 2}, halves.data(), 4},
                     {"u32", DType::U32, {2, 2}, words.data(), 16},
                     {"i64", DType::I64, {2}, longs.data(), 16}},
                    {{"format", "mlx"}});
  SafetensorsFile file(path);
  ASSERT_EQ(file.tensors().size(), 6u);
  EXPECT_EQ(file.metadata().at("format"), "mlx");
  const TensorView& f32 = file.tensors().at("f32");
  // "byte" comes first, so every later tensor starts at an odd offset: loads must not assume
  // alignment.
  EXPECT_EQ(f32.load<float>(1), -2.25f);
  EXPECT_EQ(file.tensors().at("f16").load_float(1), -2.0f);
  EXPECT_EQ(file.tensors().at("bf16").shape, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(file.tensors().at("u32").load<uint32_t>(0), 0xdeadbeefu);
  EXPECT_EQ(file.tensors().at("i64").load<int64_t>(1), 1ll << 40);
}

TEST_F(SafetensorsTest, RejectsTruncatedFile) {
  expect_error(write_raw("short.safetensors", "", "", 0).substr(0), {});
  const std::string path = (dir_ / "tiny.safetensors").string();
  std::ofstream(path, std::ios::binary) << "abc";
  expect_error(path, {"tiny.safetensors", "truncated"});
}

TEST_F(SafetensorsTest, RejectsHeaderLengthPastEnd) {
  auto path = write_raw("h.safetensors", "{}", "", 4096);
  expect_error(path, {"h.safetensors", "header length 4096", "past the end"});
}

TEST_F(SafetensorsTest, RejectsBadJson) {
  auto path = write_raw("j.safetensors", "{\"a\": [", "");
  expect_error(path, {"j.safetensors", "not valid JSON"});
}

TEST_F(SafetensorsTest, RejectsUnknownDtype) {
  auto path = write_raw("d.safetensors",
                        R"({"w":{"dtype":"Q4_K","shape":[2],"data_offsets":[0,2]}})", "ab");
  expect_error(path, {"d.safetensors", "'w'", "unknown dtype 'Q4_K'"});
}

TEST_F(SafetensorsTest, RejectsShapeByteCountMismatch) {
  auto path = write_raw("s.safetensors",
                        R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", "12345678");
  expect_error(path, {"s.safetensors", "'w'", "needs 12 bytes", "give 8"});
}

TEST_F(SafetensorsTest, RejectsOffsetsPastData) {
  auto path = write_raw("o.safetensors",
                        R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", "1234");
  expect_error(path, {"o.safetensors", "'w'", "run past the end", "truncated"});
}

TEST_F(SafetensorsTest, RejectsOverlappingTensors) {
  auto path = write_raw("v.safetensors",
                        R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                        R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                        "123456789012");
  expect_error(path, {"v.safetensors", "'a'", "'b'", "overlap"});
}

TEST_F(SafetensorsTest, RejectsNegativeOrReversedOffsets) {
  auto reversed = write_raw("r.safetensors",
                            R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}})", "1234");
  expect_error(reversed, {"r.safetensors", "'w'", "end before begin"});
  auto negative =
      write_raw("n.safetensors", R"({"w":{"dtype":"U8","shape":[2],"data_offsets":[-2,0]}})", "12");
  expect_error(negative, {"n.safetensors", "'w'", "non-negative"});
}

TEST_F(SafetensorsTest, ShardedCheckpointFollowsIndex) {
  std::vector<float> a = {1, 2}, b = {3, 4, 5};
  fs::create_directories(dir_ / "model");
  write_safetensors((dir_ / "model/model-00001-of-00002.safetensors").string(),
                    {{"a", DType::F32, {2}, a.data(), 8}});
  write_safetensors((dir_ / "model/model-00002-of-00002.safetensors").string(),
                    {{"b", DType::F32, {3}, b.data(), 12}});
  std::ofstream(dir_ / "model/model.safetensors.index.json")
      << R"({"metadata":{"total_size":20},"weight_map":{"a":"model-00001-of-00002.safetensors",)"
      << R"("b":"model-00002-of-00002.safetensors"}})";
  std::ofstream(dir_ / "model/config.json") << R"({"model_type":"llama"})";
  Checkpoint checkpoint((dir_ / "model").string());
  EXPECT_EQ(checkpoint.names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(checkpoint.tensor("b").load<float>(2), 5.0f);
  EXPECT_EQ(checkpoint.config()["model_type"], "llama");
  EXPECT_EQ(checkpoint.total_bytes(), 20);
  try {
    checkpoint.tensor("a", {3});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'a' has shape [2], expected [3]"), std::string::npos);
  }
  try {
    checkpoint.tensor("c");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing tensor 'c'"), std::string::npos);
  }
}

TEST_F(SafetensorsTest, IndexMustMatchShards) {
  std::vector<float> a = {1, 2};
  fs::create_directories(dir_ / "m");
  write_safetensors((dir_ / "m/s1.safetensors").string(), {{"a", DType::F32, {2}, a.data(), 8}});
  std::ofstream(dir_ / "m/model.safetensors.index.json")
      << R"({"weight_map":{"a":"s1.safetensors","z":"s1.safetensors"}})";
  try {
    Checkpoint checkpoint((dir_ / "m").string());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'z' is indexed in 's1.safetensors'"), std::string::npos)
        << e.what();
  }
  std::ofstream(dir_ / "m/model.safetensors.index.json")
      << R"({"weight_map":{"a":"s2.safetensors"}})";
  try {
    Checkpoint checkpoint((dir_ / "m").string());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("shard 's2.safetensors' listed in the index is missing"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace dspark
