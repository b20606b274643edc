#pragma once
// The threads that serve HTTP connections. cpp-httplib holds one thread per connection for as long
// as the connection lives, and its own pool has a fixed size: a few dozen connections that send
// their headers a byte at a time (or idle clients holding keep-alive connections) kept every
// thread busy, so even /health waited. These threads start on demand instead, up to a cap in the
// hundreds, and go again after a spell of idleness, so a quiet server holds a handful.
// Connections past the cap wait for a thread, as with the fixed pool.
#include <httplib.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

namespace dspark::server {

class ConnectionThreads final : public httplib::TaskQueue {
 public:
  // At most `max_threads` run at once; a thread idle for `idle_exit` ends while more than
  // `kept_threads` are left.
  explicit ConnectionThreads(size_t max_threads, size_t kept_threads = 4,
                             std::chrono::milliseconds idle_exit = std::chrono::seconds(30));
  ConnectionThreads(const ConnectionThreads&) = delete;
  ConnectionThreads& operator=(const ConnectionThreads&) = delete;
  ~ConnectionThreads() override;

  void enqueue(std::function<void()> job) override;
  // Runs the jobs still waiting, then joins every thread.
  void shutdown() override;

  size_t threads() const;
  size_t waiting_jobs() const;

 private:
  void work();
  void join_finished(std::unique_lock<std::mutex>& lock);

  const size_t max_threads_;
  const size_t kept_threads_;
  const std::chrono::milliseconds idle_exit_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;   // a job, or shutdown
  std::condition_variable ended_;  // a thread left work()
  std::deque<std::function<void()>> jobs_;
  std::map<std::thread::id, std::thread> running_;
  std::vector<std::thread> finished_;  // left work(), not joined yet
  size_t idle_ = 0;
  bool stopping_ = false;
};

}  // namespace dspark::server
