#include "hub/cache.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "hub/download.h"

namespace dspark {
namespace {

namespace fs = std::filesystem;

const std::string kCommit = "0123456789abcdef0123456789abcdef01234567";
const std::string kEtag = "a94a8fe5ccb19ba61c4c0873d391e987982fbbd3";

class HubCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("dspark_hub_cache_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  static void write(const fs::path& path, const std::string& text) {
    fs::create_directories(path.parent_path());
    std::ofstream(path, std::ios::binary) << text;
  }
  static std::string read(const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  fs::path dir_;
};

TEST_F(HubCacheTest, LaysOutPathsLikeHuggingfaceHub) {
  EXPECT_EQ(repo_folder_name("mlx-community/Qwen3-4B-8bit"),
            "models--mlx-community--Qwen3-4B-8bit");
  const HubCache cache(dir_.string(), "org/name");
  EXPECT_EQ(cache.repo_dir(), dir_ / "models--org--name");
  EXPECT_EQ(cache.blob_path(kEtag), dir_ / "models--org--name" / "blobs" / kEtag);
  EXPECT_EQ(cache.incomplete_path(kEtag),
            dir_ / "models--org--name" / "blobs" / (kEtag + ".incomplete"));
  EXPECT_EQ(cache.lock_path(kEtag), dir_ / ".locks" / "models--org--name" / (kEtag + ".lock"));
  EXPECT_EQ(cache.snapshot_dir(kCommit), dir_ / "models--org--name" / "snapshots" / kCommit);
}

TEST_F(HubCacheTest, RefsMapRevisionsToCommits) {
  const HubCache cache(dir_.string(), "org/name");
  EXPECT_FALSE(cache.commit_for("main"));
  EXPECT_EQ(cache.commit_for(kCommit), kCommit);  // a commit names itself

  cache.write_ref("main", kCommit);
  EXPECT_EQ(read(cache.repo_dir() / "refs" / "main"), kCommit);  // no newline
  EXPECT_EQ(cache.commit_for("main"), kCommit);

  cache.write_ref("refs/pr/3", kCommit);  // nested revision names are nested files
  EXPECT_EQ(read(cache.repo_dir() / "refs" / "refs" / "pr" / "3"), kCommit);

  write(cache.repo_dir() / "refs" / "v1", kCommit + "\n");  // hand-written, with a newline
  EXPECT_EQ(cache.commit_for("v1"), kCommit);
  write(cache.repo_dir() / "refs" / "broken", "not a commit");
  EXPECT_FALSE(cache.commit_for("broken"));

  cache.write_ref(kCommit, kCommit);  // commits get no ref
  EXPECT_FALSE(fs::exists(cache.repo_dir() / "refs" / kCommit));
}

TEST_F(HubCacheTest, SnapshotEntriesAreRelativeLinksToBlobs) {
  const HubCache cache(dir_.string(), "org/name");
  write(cache.blob_path(kEtag), "{\"model_type\": \"llama\"}");
  cache.link_snapshot_file(kCommit, "config.json", kEtag);
  cache.link_snapshot_file(kCommit, "sub/dir/config.json", kEtag);
  const fs::path top = cache.snapshot_dir(kCommit) / "config.json";
  const fs::path nested = cache.snapshot_dir(kCommit) / "sub" / "dir" / "config.json";
  ASSERT_TRUE(fs::is_symlink(top));
  EXPECT_EQ(fs::read_symlink(top), fs::path("../../blobs") / kEtag);
  EXPECT_EQ(fs::read_symlink(nested), fs::path("../../../../blobs") / kEtag);
  EXPECT_EQ(read(nested), "{\"model_type\": \"llama\"}");

  // Relinking replaces the entry, and the cache still works after being moved.
  cache.link_snapshot_file(kCommit, "config.json", kEtag);
  const fs::path moved = dir_.string() + "_moved";
  fs::rename(dir_, moved);
  EXPECT_EQ(read(moved / "models--org--name" / "snapshots" / kCommit / "config.json"),
            "{\"model_type\": \"llama\"}");
  fs::rename(moved, dir_);
}

TEST_F(HubCacheTest, MissingModelFilesFollowTheIndex) {
  const fs::path model = dir_ / "model";
  fs::create_directories(model);
  EXPECT_EQ(missing_model_files(model), (std::vector<std::string>{"config.json", "*.safetensors"}));
  write(model / "config.json", "{}");
  write(model / "model.safetensors.index.json",
        R"({"weight_map": {"a": "model-00001-of-00002.safetensors",
                           "b": "model-00002-of-00002.safetensors"}})");
  write(model / "model-00001-of-00002.safetensors", "x");
  EXPECT_EQ(missing_model_files(model),
            (std::vector<std::string>{"model-00002-of-00002.safetensors"}));
  write(model / "model-00002-of-00002.safetensors", "x");
  EXPECT_TRUE(missing_model_files(model).empty());

  const fs::path single = dir_ / "single";
  write(single / "config.json", "{}");
  fs::create_symlink("../nowhere/weights.safetensors", single / "weights.safetensors");
  EXPECT_EQ(missing_model_files(single), (std::vector<std::string>{"*.safetensors"}));
  write(single / "weights2.safetensors", "x");
  EXPECT_TRUE(missing_model_files(single).empty());
}

TEST(ModelFilesTest, OnlyConfigTokenizerAndTemplateFilesAreMetadata) {
  for (const char* wanted :
       {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
        "special_tokens_map.json", "chat_template.jinja"}) {
    EXPECT_TRUE(is_model_metadata_file(wanted)) << wanted;
  }
  for (const char* unwanted : {"README.md", "pytorch_model.bin", ".gitattributes",
                               "model.safetensors", "original/config.json"}) {
    EXPECT_FALSE(is_model_metadata_file(unwanted)) << unwanted;
  }
}

}  // namespace
}  // namespace dspark
