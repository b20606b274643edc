#pragma once
// Incremental digests for checking downloads against the hub's metadata: sha256 of the content
// for LFS files, and the git blob id (sha1 of "blob <size>\0" + content) for the others.
#include <cstdint>
#include <memory>
#include <string>

namespace dspark {

class Digest {
 public:
  enum class Kind { kSha256, kGitBlobSha1 };
  // For kGitBlobSha1 the content size is part of the hashed header, so it must be known upfront.
  Digest(Kind kind, int64_t content_size = 0);
  ~Digest();
  Digest(const Digest&) = delete;
  Digest& operator=(const Digest&) = delete;

  void update(const void* data, size_t size);
  // Lowercase hex; the digest cannot be updated afterwards.
  std::string hex();
  // Starts over, as when a server ignores a Range request and sends the whole file again.
  void reset();

  static std::string sha256_hex(const std::string& data);

 private:
  struct State;
  Kind kind_;
  int64_t content_size_;
  std::unique_ptr<State> state_;
};

}  // namespace dspark
