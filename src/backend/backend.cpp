#include "backend/backend.h"

#include <cstdlib>
#include <cstring>

#include "base/error.h"

namespace dspark::backend {

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    reset();
    backend_ = other.backend_;
    data_ = other.data_;
    bytes_ = other.bytes_;
    other.backend_ = nullptr;
    other.data_ = nullptr;
    other.bytes_ = 0;
  }
  return *this;
}

void Buffer::reset() {
  if (backend_ != nullptr && data_ != nullptr) backend_->release_bytes(data_, bytes_);
  backend_ = nullptr;
  data_ = nullptr;
  bytes_ = 0;
}

Buffer Backend::allocate(int64_t bytes) {
  if (bytes < 0) fail("{} backend: cannot allocate {} bytes", name(), bytes);
  Buffer buffer;
  buffer.backend_ = this;
  if (bytes == 0) return buffer;
  buffer.data_ = allocate_bytes(bytes);
  if (buffer.data_ == nullptr) {
    fail("{} backend: out of memory allocating {} bytes", name(), bytes);
  }
  buffer.bytes_ = bytes;
  return buffer;
}

Buffer Backend::duplicate(const Buffer& src, int64_t offset, int64_t bytes) {
  Buffer copy_of = allocate(bytes);
  copy(src, offset, copy_of, 0, bytes);
  return copy_of;
}

void Backend::check_range(const Buffer& buffer, int64_t offset, int64_t bytes,
                          const char* what) const {
  if (bytes < 0 || offset < 0 || offset > buffer.bytes() - bytes) {
    fail("{} backend: {} of bytes [{}, {}) outside a buffer of {}", name(), what, offset,
         offset + bytes, buffer.bytes());
  }
  if (bytes > 0 && buffer.backend() != this) {
    fail("{} backend: {} on a buffer of another backend", name(), what);
  }
}

void Backend::copy(const Buffer& src, int64_t src_offset, Buffer& dst, int64_t dst_offset,
                   int64_t bytes) {
  check_range(src, src_offset, bytes, "copy");
  check_range(dst, dst_offset, bytes, "copy");
  if (bytes > 0) copy_bytes(src.data() + src_offset, dst.data() + dst_offset, bytes);
}

void Backend::fill_zero(Buffer& dst, int64_t offset, int64_t bytes) {
  check_range(dst, offset, bytes, "fill");
  if (bytes > 0) fill_zero_bytes(dst.data() + offset, bytes);
}

void Backend::upload(const void* host, Buffer& dst, int64_t offset, int64_t bytes) {
  check_range(dst, offset, bytes, "upload");
  if (bytes > 0) upload_bytes(host, dst.data() + offset, bytes);
}

void Backend::download(const Buffer& src, int64_t offset, int64_t bytes, void* host) {
  check_range(src, offset, bytes, "download");
  if (bytes > 0) download_bytes(src.data() + offset, bytes, host);
}

namespace {

// Host memory, 64-byte aligned (a cache line: the kernels' vector loads never split one).
class CpuBackend final : public Backend {
 public:
  std::string_view name() const override { return "cpu"; }

 protected:
  std::byte* allocate_bytes(int64_t bytes) override {
    constexpr size_t kAlignment = 64;
    const size_t rounded = (static_cast<size_t>(bytes) + kAlignment - 1) / kAlignment * kAlignment;
    void* data = std::aligned_alloc(kAlignment, rounded);
    if (data != nullptr) std::memset(data, 0, rounded);
    return static_cast<std::byte*>(data);
  }
  void release_bytes(std::byte* data, int64_t) override { std::free(data); }
  void copy_bytes(const std::byte* src, std::byte* dst, int64_t bytes) override {
    std::memcpy(dst, src, static_cast<size_t>(bytes));
  }
  void fill_zero_bytes(std::byte* dst, int64_t bytes) override {
    std::memset(dst, 0, static_cast<size_t>(bytes));
  }
  void upload_bytes(const void* host, std::byte* dst, int64_t bytes) override {
    std::memcpy(dst, host, static_cast<size_t>(bytes));
  }
  void download_bytes(const std::byte* src, int64_t bytes, void* host) override {
    std::memcpy(host, src, static_cast<size_t>(bytes));
  }
  void begin_compute() override {}
  void end_compute() override {}
};

}  // namespace

Backend& cpu_backend() {
  static CpuBackend backend;
  return backend;
}

}  // namespace dspark::backend
