#include "base/thread_pool.h"

#include <algorithm>
#include <cstdlib>
#include <memory>

namespace dspark {

ThreadPool::ThreadPool(int num_threads) {
  num_threads = std::max(1, num_threads);
  for (int i = 1; i < num_threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();
  for (auto& worker : workers_) worker.join();
}

void ThreadPool::run_share(int index) {
  const int64_t threads = num_threads();
  const int64_t chunks = (n_ + grain_ - 1) / grain_;
  const int64_t begin_chunk = chunks * index / threads;
  const int64_t end_chunk = chunks * (index + 1) / threads;
  const int64_t begin = begin_chunk * grain_;
  const int64_t end = std::min(n_, end_chunk * grain_);
  if (begin < end) (*body_)(begin, end, index);
}

void ThreadPool::parallel_for(int64_t n, int64_t grain,
                              const std::function<void(int64_t, int64_t, int)>& body) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  if (workers_.empty() || n <= grain) {
    body(0, n, 0);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    body_ = &body;
    n_ = n;
    grain_ = grain;
    pending_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();
  run_share(0);
  while (pending_.load(std::memory_order_acquire) != 0) {
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
  }
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    uint64_t current = generation_.load(std::memory_order_acquire);
    for (int spin = 0; current == seen && spin < 20000; ++spin) {
#if defined(__x86_64__)
      __builtin_ia32_pause();
#endif
      current = generation_.load(std::memory_order_acquire);
    }
    if (current == seen) {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
      current = generation_.load(std::memory_order_acquire);
    }
    seen = current;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopping_) return;
    }
    run_share(index);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

namespace {
std::mutex default_pool_mutex;
std::unique_ptr<ThreadPool> default_pool_instance;

int threads_from_environment() {
  if (const char* value = std::getenv("DSPARK_THREADS")) {
    int parsed = std::atoi(value);
    if (parsed > 0) return parsed;
  }
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}
}  // namespace

ThreadPool& default_pool() {
  std::lock_guard<std::mutex> lock(default_pool_mutex);
  if (!default_pool_instance) {
    default_pool_instance = std::make_unique<ThreadPool>(threads_from_environment());
  }
  return *default_pool_instance;
}

void set_default_threads(int num_threads) {
  std::lock_guard<std::mutex> lock(default_pool_mutex);
  default_pool_instance = std::make_unique<ThreadPool>(num_threads);
}

}  // namespace dspark
