#pragma once
// The files a download writes: a partial blob (<etag>.incomplete) that is appended to, resumed
// and finally renamed into place, the cross-process lock guarding it (the same lock file that
// huggingface_hub takes), and the free-space check made before a download starts.
#include <cstdint>
#include <functional>
#include <string>

namespace dspark {

class Digest;

class PartialBlob {
 public:
  // Opens (creating if needed) for appending; keeps what an earlier run left.
  explicit PartialBlob(const std::string& path);
  ~PartialBlob();
  PartialBlob(const PartialBlob&) = delete;
  PartialBlob& operator=(const PartialBlob&) = delete;

  const std::string& path() const { return path_; }
  int64_t size() const { return size_; }
  // Throws HubError(kDiskFull) when the disk or quota is full.
  void append(const char* data, size_t size);
  void truncate(int64_t size);
  // Feeds the bytes already in the file to `digest` (when resuming).
  void hash_contents(Digest& digest) const;
  // Flushes to disk and closes; the file can then be renamed into place.
  void sync_and_close();

 private:
  std::string path_;
  int fd_ = -1;
  int64_t size_ = 0;
};

// An exclusive flock on `path` (created if needed), waited for in short polls so that `stop`
// can abandon the wait.
class BlobLock {
 public:
  BlobLock(const std::string& path, const std::function<bool()>& stop);
  ~BlobLock();
  BlobLock(const BlobLock&) = delete;
  BlobLock& operator=(const BlobLock&) = delete;
  bool held() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

// Throws HubError(kDiskFull) when the filesystem holding `dir` has fewer than `bytes` free.
void check_free_space(const std::string& dir, int64_t bytes);

}  // namespace dspark
