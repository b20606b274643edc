#include "hub/blob_file.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>

#include "hub/checksum.h"
#include "hub/hub_error.h"

namespace dspark {
namespace {

namespace fs = std::filesystem;

class BlobFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("dspark_hub_blob_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(BlobFileTest, PartialBlobsResumeWhereTheyStopped) {
  const std::string path = (dir_ / "x.incomplete").string();
  {
    PartialBlob blob(path);
    EXPECT_EQ(blob.size(), 0);
    blob.append("hello ", 6);
  }  // dropped without closing cleanly, like an interrupted run
  PartialBlob resumed(path);
  EXPECT_EQ(resumed.size(), 6);
  resumed.append("world", 5);
  Digest digest(Digest::Kind::kSha256);
  resumed.hash_contents(digest);
  EXPECT_EQ(digest.hex(), Digest::sha256_hex("hello world"));
  resumed.truncate(5);
  resumed.append("!", 1);
  resumed.sync_and_close();
  EXPECT_EQ(fs::file_size(path), 6u);
  Digest again(Digest::Kind::kSha256);
  PartialBlob(path).hash_contents(again);
  EXPECT_EQ(again.hex(), Digest::sha256_hex("hello!"));
}

TEST_F(BlobFileTest, AFullDiskIsReportedAsSuch) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full on this system";
  PartialBlob blob("/dev/full");
  try {
    blob.append("data", 4);
    FAIL() << "writing to /dev/full succeeded";
  } catch (const HubError& e) {
    EXPECT_EQ(e.kind(), HubErrorKind::kDiskFull);
    EXPECT_NE(std::string(e.what()).find("disk full"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("/dev/full"), std::string::npos) << e.what();
  }
}

TEST_F(BlobFileTest, FreeSpaceIsCheckedBeforeDownloading) {
  EXPECT_NO_THROW(check_free_space(dir_.string(), 1));
  try {
    check_free_space(dir_.string(), int64_t{1} << 60);
    FAIL() << "an exabyte fitted";
  } catch (const HubError& e) {
    EXPECT_EQ(e.kind(), HubErrorKind::kDiskFull);
    EXPECT_NE(std::string(e.what()).find("not enough disk space"), std::string::npos);
  }
}

TEST_F(BlobFileTest, BlobLocksExcludeOtherHoldersAndGiveUpWhenStopped) {
  const std::string path = (dir_ / ".locks" / "repo" / "etag.lock").string();
  {
    BlobLock first(path, [] { return false; });
    ASSERT_TRUE(first.held());
    // flock locks belong to open file descriptions: a second open conflicts, as it does for
    // another process (huggingface_hub's filelock uses the same call).
    const int other = ::open(path.c_str(), O_RDWR);
    EXPECT_NE(::flock(other, LOCK_EX | LOCK_NB), 0);
    ::close(other);
    const auto start = std::chrono::steady_clock::now();
    int polls = 0;
    BlobLock second(path, [&] { return ++polls >= 3; });
    EXPECT_FALSE(second.held());
    EXPECT_GE(polls, 3);
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  }
  BlobLock after(path, [] { return true; });
  EXPECT_TRUE(after.held());
}

}  // namespace
}  // namespace dspark
