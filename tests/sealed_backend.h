#pragma once
// A backend for tests whose memory is sealed (PROT_NONE) except inside its compute sections and
// its own transfers: code above the model that reads or writes a state's bytes directly, as if
// backend memory were host memory, faults instead of passing. Running the decoders, the batched
// step and the prefix cache on it checks that they hold states only through the pool and the
// backend (backend/backend.h), the contract a device backend relies on.
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <mutex>

#include "backend/backend.h"

namespace dspark::testing {

class SealedBackend final : public backend::Backend {
 public:
  std::string_view name() const override { return "sealed"; }
  // Compute sections opened so far (the model's layers and rollbacks run in them).
  int64_t sections() const {
    std::lock_guard lock(mutex_);
    return sections_;
  }
  int64_t live_buffers() const {
    std::lock_guard lock(mutex_);
    return static_cast<int64_t>(mappings_.size());
  }

 protected:
  std::byte* allocate_bytes(int64_t bytes) override {
    std::lock_guard lock(mutex_);
    const size_t length = page_rounded(bytes);
    void* data =
        mmap(nullptr, length, depth_ > 0 ? kOpen : PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (data == MAP_FAILED) return nullptr;
    mappings_[static_cast<std::byte*>(data)] = length;
    return static_cast<std::byte*>(data);
  }
  void release_bytes(std::byte* data, int64_t) override {
    std::lock_guard lock(mutex_);
    munmap(data, mappings_.at(data));
    mappings_.erase(data);
  }
  void copy_bytes(const std::byte* src, std::byte* dst, int64_t bytes) override {
    Unsealed open(*this);
    std::memcpy(dst, src, static_cast<size_t>(bytes));
  }
  void fill_zero_bytes(std::byte* dst, int64_t bytes) override {
    Unsealed open(*this);
    std::memset(dst, 0, static_cast<size_t>(bytes));
  }
  void upload_bytes(const void* host, std::byte* dst, int64_t bytes) override {
    Unsealed open(*this);
    std::memcpy(dst, host, static_cast<size_t>(bytes));
  }
  void download_bytes(const std::byte* src, int64_t bytes, void* host) override {
    Unsealed open(*this);
    std::memcpy(host, src, static_cast<size_t>(bytes));
  }
  void begin_compute() override {
    std::lock_guard lock(mutex_);
    ++sections_;
    if (depth_++ == 0) protect_all(kOpen);
  }
  void end_compute() override {
    std::lock_guard lock(mutex_);
    if (--depth_ == 0) protect_all(PROT_NONE);
  }

 private:
  static constexpr int kOpen = PROT_READ | PROT_WRITE;

  // The backend's own transfers see its memory, like a section that is not counted.
  struct Unsealed {
    explicit Unsealed(SealedBackend& backend) : backend(backend) {
      std::lock_guard lock(backend.mutex_);
      if (backend.depth_++ == 0) backend.protect_all(kOpen);
    }
    ~Unsealed() {
      std::lock_guard lock(backend.mutex_);
      if (--backend.depth_ == 0) backend.protect_all(PROT_NONE);
    }
    SealedBackend& backend;
  };

  static size_t page_rounded(int64_t bytes) {
    const auto page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    return (static_cast<size_t>(bytes) + page - 1) / page * page;
  }
  void protect_all(int protection) {
    for (const auto& [data, length] : mappings_) mprotect(data, length, protection);
  }

  mutable std::mutex mutex_;
  std::map<std::byte*, size_t> mappings_;
  int depth_ = 0;
  int64_t sections_ = 0;
};

}  // namespace dspark::testing
