#include "hub/repo_ref.h"

#include <gtest/gtest.h>

#include "hub/hub_error.h"

namespace dspark {
namespace {

TEST(RepoRefTest, ParsesOrgNameAndRevision) {
  const auto plain = parse_repo_ref("mlx-community/Qwen3-4B-8bit");
  ASSERT_TRUE(plain);
  EXPECT_EQ(plain->repo_id, "mlx-community/Qwen3-4B-8bit");
  EXPECT_EQ(plain->revision, "main");
  EXPECT_EQ(plain->org(), "mlx-community");
  EXPECT_EQ(plain->name(), "Qwen3-4B-8bit");
  EXPECT_EQ(plain->display(), "mlx-community/Qwen3-4B-8bit");

  const auto pinned = parse_repo_ref("org/model.v2_x@refs/pr/3");
  ASSERT_TRUE(pinned);
  EXPECT_EQ(pinned->repo_id, "org/model.v2_x");
  EXPECT_EQ(pinned->revision, "refs/pr/3");
  EXPECT_EQ(pinned->display(), "org/model.v2_x@refs/pr/3");
}

TEST(RepoRefTest, TextThatIsNotShapedLikeARepoIdIsNotOne) {
  EXPECT_FALSE(parse_repo_ref("SmolLM2-135M-Instruct"));
  EXPECT_FALSE(parse_repo_ref("/abs/path/model"));
  EXPECT_FALSE(parse_repo_ref("a/b/c"));
  EXPECT_FALSE(parse_repo_ref("./model"));
  EXPECT_FALSE(parse_repo_ref("../model"));
  EXPECT_FALSE(parse_repo_ref("~/model"));
  EXPECT_FALSE(parse_repo_ref("org/"));
  EXPECT_FALSE(parse_repo_ref("/name"));
}

TEST(RepoRefTest, RefusesNamesTheHubRefuses) {
  for (const char* bad : {"org/na me", "org/a--b", "org/a..b", "org/-name", "org/name.",
                          "org/name@", "org/name@../../etc", "org/name@/abs", "or$g/name"}) {
    try {
      parse_repo_ref(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const HubError& e) {
      EXPECT_EQ(e.kind(), HubErrorKind::kInvalid) << bad;
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(parse_repo_ref("org/" + std::string(97, 'x')), HubError);
}

TEST(RepoRefTest, CommitHashesAreFortyLowercaseHexDigits) {
  EXPECT_TRUE(is_commit_hash("0123456789abcdef0123456789abcdef01234567"));
  EXPECT_FALSE(is_commit_hash("0123456789abcdef0123456789abcdef0123456"));
  EXPECT_FALSE(is_commit_hash("0123456789ABCDEF0123456789abcdef01234567"));
  EXPECT_FALSE(is_commit_hash("main"));
}

}  // namespace
}  // namespace dspark
