#pragma once
// A read-only memory map of a whole file. Weights are read through these maps and never copied.
#include <cstddef>
#include <cstdint>
#include <string>

namespace dspark {

class MappedFile {
 public:
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// Drops the resident pages that lie wholly inside [data, data + bytes), which must be part of a
// MappedFile: they stop counting toward the process's memory and are read from the file again
// when next touched. For data the process has copied elsewhere.
void release_resident_pages(const void* data, size_t bytes);

}  // namespace dspark
