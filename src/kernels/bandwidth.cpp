#include "kernels/bandwidth.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <vector>

#include "base/error.h"
#include "base/system_info.h"
#include "base/thread_pool.h"
#include "kernels/cpu/quant_impl.h"
#include "kernels/quant.h"

namespace dspark::kernels {
namespace {

constexpr int64_t kBufferBytes = int64_t{1} << 30;
constexpr int kPasses = 7;

class MappedBuffer {
 public:
  explicit MappedBuffer(int64_t bytes) : bytes_(bytes) {
    void* mapped = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mapped == MAP_FAILED) fail("read bandwidth probe: cannot map {} bytes", bytes);
    data_ = static_cast<uint8_t*>(mapped);
  }
  ~MappedBuffer() { munmap(data_, bytes_); }
  MappedBuffer(const MappedBuffer&) = delete;
  MappedBuffer& operator=(const MappedBuffer&) = delete;
  uint8_t* data() const { return data_; }

 private:
  uint8_t* data_ = nullptr;
  int64_t bytes_ = 0;
};

}  // namespace

double measure_read_bandwidth_gbs(int threads) {
  threads = std::max(1, threads);
  ThreadPool pool(threads);
  MappedBuffer buffer(kBufferBytes);
  // Each thread touches its own slice first, so pages are really backed (not the shared zero
  // page) and local to the thread that reads them.
  const int64_t slice = kBufferBytes / threads / 256 * 256;
  pool.parallel_for(threads, 1, [&](int64_t begin, int64_t end, int) {
    for (int64_t t = begin; t < end; ++t) {
      uint8_t* start = buffer.data() + t * slice;
      for (int64_t offset = 0; offset < slice; offset += 4096)
        start[offset] = static_cast<uint8_t>(offset >> 12);
    }
  });
  const auto& table = cpu::kernel_table(best_isa());
  std::atomic<uint64_t> sink{0};
  std::vector<double> rates;
  for (int pass = 0; pass < kPasses; ++pass) {
    const double start = now_seconds();
    pool.parallel_for(threads, 1, [&](int64_t begin, int64_t end, int) {
      for (int64_t t = begin; t < end; ++t) {
        sink.fetch_add(table.read_sweep(buffer.data() + t * slice, slice),
                       std::memory_order_relaxed);
      }
    });
    const double seconds = now_seconds() - start;
    rates.push_back(static_cast<double>(slice * threads) / seconds / 1e9);
  }
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

}  // namespace dspark::kernels
