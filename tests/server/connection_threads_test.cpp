#include "server/connection_threads.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace dspark::server {
namespace {

using namespace std::chrono_literals;

// Jobs that hold their thread until released, as a slow connection does.
class HeldJobs {
 public:
  std::function<void()> job() {
    return [this] {
      std::unique_lock lock(mutex_);
      ++started_;
      changed_.notify_all();
      changed_.wait(lock, [this] { return released_; });
      ++finished_;
      changed_.notify_all();
    };
  }
  // Waits (up to a generous bound) until `count` jobs have started; returns how many had.
  int wait_started(int count) {
    std::unique_lock lock(mutex_);
    changed_.wait_for(lock, 30s, [&] { return started_ >= count; });
    return started_;
  }
  int wait_finished(int count) {
    std::unique_lock lock(mutex_);
    changed_.wait_for(lock, 30s, [&] { return finished_ >= count; });
    return finished_;
  }
  void release() {
    std::lock_guard lock(mutex_);
    released_ = true;
    changed_.notify_all();
  }
  int started() {
    std::lock_guard lock(mutex_);
    return started_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  int started_ = 0;
  int finished_ = 0;
  bool released_ = false;
};

// Waits (up to a generous bound) until the pool holds `count` threads.
bool wait_for_threads(const ConnectionThreads& pool, size_t count) {
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (pool.threads() != count) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

TEST(ConnectionThreads, ABurstGetsAThreadPerConnectionUpToTheCap) {
  ConnectionThreads pool(12);
  HeldJobs held;
  EXPECT_EQ(pool.threads(), 0u) << "threads start on demand";
  for (int i = 0; i < 15; ++i) pool.enqueue(held.job());
  // Twelve slow connections at once each hold a thread; the last three wait for one.
  EXPECT_EQ(held.wait_started(12), 12);
  EXPECT_EQ(pool.threads(), 12u);
  EXPECT_EQ(pool.waiting_jobs(), 3u);
  EXPECT_EQ(held.started(), 12);
  held.release();
  EXPECT_EQ(held.wait_finished(15), 15);
  EXPECT_LE(pool.threads(), 12u);
}

TEST(ConnectionThreads, IdleThreadsEndDownToTheKeptOnes) {
  ConnectionThreads pool(16, /*kept_threads=*/2, /*idle_exit=*/20ms);
  HeldJobs held;
  for (int i = 0; i < 9; ++i) pool.enqueue(held.job());
  EXPECT_EQ(held.wait_started(9), 9);
  EXPECT_EQ(pool.threads(), 9u);
  held.release();
  EXPECT_EQ(held.wait_finished(9), 9);
  EXPECT_TRUE(wait_for_threads(pool, 2)) << pool.threads() << " threads left";
  // The kept threads serve the next connections without starting more.
  std::atomic<int> ran{0};
  for (int i = 0; i < 50; ++i) pool.enqueue([&ran] { ++ran; });
  pool.shutdown();
  EXPECT_EQ(ran.load(), 50);
}

TEST(ConnectionThreads, ShutdownRunsTheWaitingJobsAndJoins) {
  std::atomic<int> ran{0};
  HeldJobs held;
  {
    ConnectionThreads pool(1);
    pool.enqueue(held.job());
    EXPECT_EQ(held.wait_started(1), 1);
    for (int i = 0; i < 5; ++i) {
      pool.enqueue([&ran] {
        std::this_thread::sleep_for(1ms);
        ++ran;
      });
    }
    EXPECT_EQ(pool.waiting_jobs(), 5u);
    std::thread releaser([&held] {
      std::this_thread::sleep_for(20ms);
      held.release();
    });
    pool.shutdown();
    releaser.join();
    EXPECT_EQ(pool.threads(), 0u);
  }
  EXPECT_EQ(ran.load(), 5);
}

TEST(ConnectionThreads, AThrowingJobLeavesTheThreadServing) {
  ConnectionThreads pool(1);
  std::atomic<int> ran{0};
  pool.enqueue([] { throw std::runtime_error("a handler bug"); });
  pool.enqueue([&ran] { ++ran; });
  pool.shutdown();
  EXPECT_EQ(ran.load(), 1);
}

}  // namespace
}  // namespace dspark::server
