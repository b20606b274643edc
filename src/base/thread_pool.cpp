#include "base/thread_pool.h"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <system_error>

#include "base/error.h"

namespace dspark {
namespace {

inline void cpu_relax() {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#endif
}

// How long an idle worker spins before it sleeps. The gaps between the loops of one decode step
// (norms, sampling, detokenizing) reach hundreds of µs, and waking a sleeping worker costs a futex
// call and tens of µs, more on a busy VM. Measured on the default model (2 threads, 200 tokens,
// AVX2 VM): with 1,500 pauses (20-70 µs) the worker fell asleep about 20 times per token
// (4,500-6,900 futex calls); 250 µs, 934; 1 ms, 233. Decode ran 1.22x faster in a minute when
// the VM lost half its time to other guests (median of 8 pairs), 1.01x on the quiet VM (6 pairs).
// A clock, not a count of pauses, since a pause costs 10-150 cycles depending on the CPU.
constexpr auto kSpinBeforeSleep = std::chrono::microseconds(1000);
constexpr int kPausesPerClockRead = 64;
constexpr int kSpinBeforeYield = 200;
// A range claims 1 / (kGuidedShares · threads) of the grains left. Equal ranges, 4 per thread,
// left the thread that finished first waiting for up to one range: 8.5-9.8 % of the calling
// thread's samples in a decode (default model, 2 threads, Zen 3 VM), where a vCPU's speed varies.
constexpr int64_t kGuidedShares = 2;

}  // namespace

ThreadPool::ThreadPool(int num_threads) {
  num_threads = std::max(1, num_threads);
  try {
    for (int i = 1; i < num_threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
  } catch (const std::system_error& e) {
    const size_t started = workers_.size();
    stop_workers();
    fail("could not start worker thread {} of {}: {}", started + 1, num_threads - 1, e.what());
  }
}

ThreadPool::~ThreadPool() {
  stop_workers();
}

void ThreadPool::stop_workers() {
  {
    std::lock_guard<std::mutex> lock(sleep_mutex_);
    stopping_.store(true, std::memory_order_release);
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();
  for (auto& worker : workers_) worker.join();
  workers_.clear();
}

void ThreadPool::work_on(Job& job, int thread_index) {
  int64_t first = job.next.load(std::memory_order_relaxed);
  for (;;) {
    if (first >= job.grains) return;
    // Guided: a share of what is left, so the ranges shrink towards the end and the last ones
    // are single grains, which is all a thread that finishes first can be left waiting for.
    const int64_t take = std::max<int64_t>(1, (job.grains - first) / job.share_divisor);
    if (!job.next.compare_exchange_weak(first, first + take, std::memory_order_relaxed)) continue;
    const int64_t begin = first * job.grain;
    const int64_t end = std::min(job.n, (first + take) * job.grain);
    (*job.body)(begin, end, thread_index);
    job.done.fetch_add(take, std::memory_order_release);
    first = job.next.load(std::memory_order_relaxed);
  }
}

void ThreadPool::parallel_for(int64_t n, int64_t grain,
                              const std::function<void(int64_t, int64_t, int)>& body) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  if (workers_.empty() || n <= grain) {
    body(0, n, 0);
    return;
  }
  std::lock_guard<std::mutex> call_lock(call_mutex_);
  Job job;
  job.body = &body;
  job.n = n;
  job.grain = grain;
  job.grains = (n + grain - 1) / grain;
  job.share_divisor = kGuidedShares * num_threads();
  job_.store(&job, std::memory_order_release);
  {
    std::lock_guard<std::mutex> lock(sleep_mutex_);
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();
  work_on(job, 0);
  for (int spin = 0; job.done.load(std::memory_order_acquire) < job.grains; ++spin) {
    if (spin < kSpinBeforeYield) {
      cpu_relax();
    } else {
      std::this_thread::yield();
    }
  }
  // No worker may still hold the job (it lives on this stack) once we return. This store and
  // the load of active_ pair with the worker's increment of active_ and its load of job_: with
  // release/acquire alone each side may read the other's old value (x86 lets a load pass an
  // earlier store), so a worker waking late could take this job after we returned. seq_cst
  // forbids that outcome.
  job_.store(nullptr, std::memory_order_seq_cst);
  while (active_.load(std::memory_order_seq_cst) != 0) std::this_thread::yield();
}

void ThreadPool::worker_loop(int index) {
  // Generations count from 0 at construction; starting from 0 (not from a fresh load) means a
  // worker that starts late still sees every loop and the shutdown that happened before it ran.
  uint64_t seen = 0;
  for (;;) {
    uint64_t current = generation_.load(std::memory_order_acquire);
    const auto idle_since = std::chrono::steady_clock::now();
    for (int spin = 1; current == seen; ++spin) {
      cpu_relax();
      current = generation_.load(std::memory_order_acquire);
      if (spin % kPausesPerClockRead == 0 &&
          std::chrono::steady_clock::now() - idle_since > kSpinBeforeSleep) {
        break;
      }
    }
    if (current == seen) {
      std::unique_lock<std::mutex> lock(sleep_mutex_);
      wake_.wait(lock, [&] {
        return generation_.load(std::memory_order_acquire) != seen ||
               stopping_.load(std::memory_order_acquire);
      });
      current = generation_.load(std::memory_order_acquire);
    }
    seen = current;
    if (stopping_.load(std::memory_order_acquire)) return;
    active_.fetch_add(1, std::memory_order_seq_cst);
    if (Job* job = job_.load(std::memory_order_seq_cst)) work_on(*job, index);
    active_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

namespace {
std::mutex default_pool_mutex;
std::unique_ptr<ThreadPool> default_pool_instance;

int threads_from_environment() {
  if (const char* value = std::getenv("DSPARK_THREADS")) {
    int parsed = std::atoi(value);
    if (parsed > 0) return std::min(parsed, max_threads());
  }
  return available_cpus();
}
}  // namespace

int available_cpus() {
  // The CPUs this process may run on, not all online ones: in a container or under taskset the
  // two differ, and spinning workers on CPUs we cannot use only steal time from each other.
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof(allowed), &allowed) == 0) return std::max(1, CPU_COUNT(&allowed));
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

int max_threads() {
  return 4 * available_cpus();
}

ThreadPool& default_pool() {
  std::lock_guard<std::mutex> lock(default_pool_mutex);
  if (!default_pool_instance) {
    default_pool_instance = std::make_unique<ThreadPool>(threads_from_environment());
  }
  return *default_pool_instance;
}

void set_default_threads(int num_threads) {
  if (num_threads < 1 || num_threads > max_threads()) {
    fail("{} threads: the count must be in [1, {}] (4 x the {} CPUs this process may use)",
         num_threads, max_threads(), available_cpus());
  }
  std::lock_guard<std::mutex> lock(default_pool_mutex);
  default_pool_instance = std::make_unique<ThreadPool>(num_threads);
}

}  // namespace dspark
