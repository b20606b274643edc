#include "hub/checksum.h"

#include <gtest/gtest.h>

#include <string>

namespace dspark {
namespace {

TEST(DigestTest, Sha256MatchesTheFipsVectors) {
  EXPECT_EQ(Digest::sha256_hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Digest::sha256_hex(""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST(DigestTest, GitBlobSha1MatchesGitHashObject) {
  // `printf 'hello\n' | git hash-object --stdin` and the empty blob's well-known id.
  Digest hello(Digest::Kind::kGitBlobSha1, 6);
  hello.update("hello\n", 6);
  EXPECT_EQ(hello.hex(), "ce013625030ba8dba906f756967f9e9ca394464a");
  Digest empty(Digest::Kind::kGitBlobSha1, 0);
  EXPECT_EQ(empty.hex(), "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391");
}

TEST(DigestTest, ChunkedUpdatesAndResetGiveTheSameDigest) {
  const std::string data(100000, 'x');
  Digest chunked(Digest::Kind::kSha256);
  chunked.update("garbage", 7);
  chunked.reset();
  for (size_t at = 0; at < data.size(); at += 777) {
    chunked.update(data.data() + at, std::min<size_t>(777, data.size() - at));
  }
  EXPECT_EQ(chunked.hex(), Digest::sha256_hex(data));

  Digest git(Digest::Kind::kGitBlobSha1, 6);
  git.update("junk", 4);
  git.reset();  // the "blob <size>\0" header is hashed again
  git.update("hel", 3);
  git.update("lo\n", 3);
  EXPECT_EQ(git.hex(), "ce013625030ba8dba906f756967f9e9ca394464a");
}

}  // namespace
}  // namespace dspark
