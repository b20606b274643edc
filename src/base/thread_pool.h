#pragma once
// A persistent pool of worker threads. parallel_for splits [0, n) into contiguous chunks, one per
// thread, and the caller's thread takes a share too. Workers spin briefly before sleeping, since
// decode issues hundreds of small parallel regions per token and a futex wake costs tens of µs.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace dspark {

class ThreadPool {
 public:
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls body(begin, end, thread_index) over disjoint ranges covering [0, n); each range is a
  // multiple of `grain` except the last. Returns when every range is done.
  void parallel_for(int64_t n, int64_t grain,
                    const std::function<void(int64_t, int64_t, int)>& body);

 private:
  void worker_loop(int index);
  void run_share(int index);

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  const std::function<void(int64_t, int64_t, int)>* body_ = nullptr;
  int64_t n_ = 0;
  int64_t grain_ = 1;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  bool stopping_ = false;
};

// The process-wide pool used by kernels. Its size defaults to the number of online CPUs and can be
// set (before first use, or again later) with set_default_threads or DSPARK_THREADS.
ThreadPool& default_pool();
void set_default_threads(int num_threads);

}  // namespace dspark
