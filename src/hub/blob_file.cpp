#include "hub/blob_file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>
#include <vector>

#include "hub/checksum.h"
#include "hub/hub_error.h"
#include "hub/progress.h"

namespace dspark {
namespace {

[[noreturn]] void fail_io(const std::string& action, const std::string& path, int error) {
  if (error == ENOSPC || error == EDQUOT) {
    fail_hub(HubErrorKind::kDiskFull,
             "disk full while {} {}; free some space and run again (the partial download is kept "
             "and resumes)",
             action, path);
  }
  fail_hub(HubErrorKind::kInvalid, "cannot {} {}: {}", action, path, std::strerror(error));
}

}  // namespace

PartialBlob::PartialBlob(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  if (fd_ < 0) fail_io("open", path, errno);
  struct stat info {};
  if (::fstat(fd_, &info) != 0) fail_io("stat", path, errno);
  // /dev/full and other devices report 0; regular files their length.
  size_ = S_ISREG(info.st_mode) ? info.st_size : 0;
  if (S_ISREG(info.st_mode) && ::lseek(fd_, 0, SEEK_END) < 0) fail_io("seek in", path, errno);
}

PartialBlob::~PartialBlob() {
  if (fd_ >= 0) ::close(fd_);
}

void PartialBlob::append(const char* data, size_t size) {
  while (size > 0) {
    const ssize_t written = ::write(fd_, data, size);
    if (written < 0) {
      if (errno == EINTR) continue;  // Ctrl-C arrives while writing; the flag is read elsewhere
      fail_io("writing", path_, errno);
    }
    data += written;
    size -= static_cast<size_t>(written);
    size_ += written;
  }
}

void PartialBlob::truncate(int64_t size) {
  if (::ftruncate(fd_, size) != 0) fail_io("truncate", path_, errno);
  if (::lseek(fd_, size, SEEK_SET) < 0) fail_io("seek in", path_, errno);
  size_ = size;
}

void PartialBlob::hash_contents(Digest& digest) const {
  std::vector<char> buffer(1 << 20);
  int64_t offset = 0;
  while (offset < size_) {
    const ssize_t got = ::pread(fd_, buffer.data(), buffer.size(), offset);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) fail_io("read back", path_, got < 0 ? errno : EIO);
    digest.update(buffer.data(), static_cast<size_t>(got));
    offset += got;
  }
}

void PartialBlob::sync_and_close() {
  if (::fsync(fd_) != 0 && errno != EINVAL) fail_io("flush", path_, errno);
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail_io("close", path_, errno);
}

BlobLock::BlobLock(const std::string& path, const std::function<bool()>& stop) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  if (fd < 0) fail_io("open the lock file", path, errno);
  while (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK && errno != EINTR) {
      const int error = errno;
      ::close(fd);
      fail_io("lock", path, error);
    }
    if (stop()) {
      ::close(fd);
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  fd_ = fd;
}

BlobLock::~BlobLock() {
  if (fd_ >= 0) ::close(fd_);  // closing releases the flock
}

void check_free_space(const std::string& dir, int64_t bytes) {
  struct statvfs info {};
  if (::statvfs(dir.c_str(), &info) != 0) fail_io("inspect the filesystem of", dir, errno);
  const int64_t available =
      static_cast<int64_t>(info.f_bavail) * static_cast<int64_t>(info.f_frsize);
  if (bytes > available) {
    fail_hub(HubErrorKind::kDiskFull,
             "not enough disk space in {}: the download needs {} more, {} "
             "is free",
             dir, human_bytes(bytes), human_bytes(available));
  }
}

}  // namespace dspark
