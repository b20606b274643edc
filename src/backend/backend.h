#pragma once
// The memory contract between the decoding step and whatever runs the model: a Backend owns the
// memory of every sequence's state (KV caches, conv windows, SSM states, rollback records and the
// snapshots a prefix cache keeps) and hands it out as Buffers. Code outside the backend holds
// Buffers but never reads or writes their bytes: it moves them with the backend's copy, fill,
// upload and download, and the model's layers (the backend's own code) reach them only inside a
// ComputeSection. So a device backend (CUDA) can keep the same Buffers in device memory without
// any change above the model layer (docs/architecture.md, "Backend memory").
//
// The CPU backend's buffers are 64-byte aligned host memory and its sections cost nothing; the
// tests run the same decoders on a backend that seals its memory outside sections, so a stray
// host access faults (tests/sealed_backend.h).
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace dspark::backend {

class Backend;

// Bytes of backend memory, owned: freed by the backend that allocated them when destroyed.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Buffer&& other) noexcept { *this = static_cast<Buffer&&>(other); }
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { reset(); }

  int64_t bytes() const { return bytes_; }
  bool empty() const { return bytes_ == 0; }
  Backend* backend() const { return backend_; }
  // The address the backend's code uses, valid only inside a ComputeSection of its backend (a
  // device backend's address is not host memory).
  std::byte* data() const { return data_; }
  template <typename T>
  T* as() const {
    return reinterpret_cast<T*>(data_);
  }
  // Frees the memory now.
  void reset();

 private:
  friend class Backend;
  Backend* backend_ = nullptr;
  std::byte* data_ = nullptr;
  int64_t bytes_ = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;

  // `bytes` of zeroed memory (an empty Buffer for 0); throws naming the size when it cannot.
  Buffer allocate(int64_t bytes);
  // A copy of src's [offset, offset + bytes) in a new buffer of `bytes` (device to device).
  Buffer duplicate(const Buffer& src, int64_t offset, int64_t bytes);

  // dst[dst_offset ..] = src[src_offset ..], `bytes` bytes; the ranges may not overlap. Every
  // range is checked against its buffer (throws naming the operation).
  void copy(const Buffer& src, int64_t src_offset, Buffer& dst, int64_t dst_offset, int64_t bytes);
  void fill_zero(Buffer& dst, int64_t offset, int64_t bytes);
  // Host memory to and from backend memory.
  void upload(const void* host, Buffer& dst, int64_t offset, int64_t bytes);
  void download(const Buffer& src, int64_t offset, int64_t bytes, void* host);

 protected:
  friend class Buffer;
  friend class ComputeSection;
  virtual std::byte* allocate_bytes(int64_t bytes) = 0;  // zeroed; null when out of memory
  virtual void release_bytes(std::byte* data, int64_t bytes) = 0;
  // The transfers on addresses of this backend's memory, ranges already checked.
  virtual void copy_bytes(const std::byte* src, std::byte* dst, int64_t bytes) = 0;
  virtual void fill_zero_bytes(std::byte* dst, int64_t bytes) = 0;
  virtual void upload_bytes(const void* host, std::byte* dst, int64_t bytes) = 0;
  virtual void download_bytes(const std::byte* src, int64_t bytes, void* host) = 0;
  // While a section is open the backend's code may use Buffer::data(); sections nest.
  virtual void begin_compute() = 0;
  virtual void end_compute() = 0;

 private:
  void check_range(const Buffer& buffer, int64_t offset, int64_t bytes, const char* what) const;
};

// The scope in which a backend's own code (the model's layers, a rollback's rebuild) reads and
// writes its buffers through Buffer::data().
class ComputeSection {
 public:
  explicit ComputeSection(Backend& backend) : backend_(backend) { backend_.begin_compute(); }
  ~ComputeSection() { backend_.end_compute(); }
  ComputeSection(const ComputeSection&) = delete;
  ComputeSection& operator=(const ComputeSection&) = delete;

 private:
  Backend& backend_;
};

// The process's CPU backend (host memory), which every model and pool uses unless given another.
Backend& cpu_backend();

}  // namespace dspark::backend
