#pragma once
// A persistent pool of worker threads for the kernels' parallel loops.
//
// parallel_for cuts [0, n) into ranges (multiples of `grain`) that the calling thread and the
// workers claim from a shared counter, so a worker the OS has not scheduled yet (a busy or
// oversubscribed machine) never stalls the loop: whoever runs takes the next range. Ranges shrink
// as the loop proceeds (guided scheduling), so threads finish within about a grain of each other.
// Workers spin for 1 ms after a loop before they sleep, since decode issues hundreds of small
// parallel loops per token with serial gaps between them, and a futex wake costs tens of
// microseconds.
//
// One parallel_for at a time per pool (calls are serialised); bodies must not call parallel_for
// on the same pool.
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
  // Throws dspark::Error when the system refuses to start a worker thread.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls body(begin, end, thread_index) over disjoint ranges covering [0, n); each range is a
  // multiple of `grain` except the last, and thread_index < num_threads() identifies the calling
  // thread (for per-thread scratch). Returns when every range is done.
  void parallel_for(int64_t n, int64_t grain,
                    const std::function<void(int64_t, int64_t, int)>& body);

 private:
  struct Job {
    const std::function<void(int64_t, int64_t, int)>* body = nullptr;
    int64_t n = 0;
    int64_t grain = 1;
    int64_t grains = 0;
    int64_t share_divisor = 1;
    std::atomic<int64_t> next{0};  // the first grain no range has claimed
    std::atomic<int64_t> done{0};  // grains whose ranges have run
  };

  void worker_loop(int index);
  void stop_workers();
  static void work_on(Job& job, int thread_index);

  std::vector<std::thread> workers_;
  std::mutex call_mutex_;
  std::mutex sleep_mutex_;
  std::condition_variable wake_;
  std::atomic<Job*> job_{nullptr};
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> active_{0};  // workers currently holding a Job pointer
  std::atomic<bool> stopping_{false};
};

// The process-wide pool used by kernels. Its size defaults to the CPUs this process may run on and
// can be set (before first use, or again later) with set_default_threads or DSPARK_THREADS.
ThreadPool& default_pool();
// Throws dspark::Error for a count outside [1, max_threads()].
void set_default_threads(int num_threads);
// The CPUs this process may run on (its affinity mask), and the most threads a pool may have:
// 4x that, beyond which more threads only contend for the same CPUs.
int available_cpus();
int max_threads();

}  // namespace dspark
