#include "server/connection_threads.h"

#include <fmt/format.h>

#include <algorithm>
#include <exception>

namespace dspark::server {

ConnectionThreads::ConnectionThreads(size_t max_threads, size_t kept_threads,
                                     std::chrono::milliseconds idle_exit)
    : max_threads_(std::max<size_t>(max_threads, 1)),
      kept_threads_(kept_threads),
      idle_exit_(idle_exit) {}

ConnectionThreads::~ConnectionThreads() {
  shutdown();
}

void ConnectionThreads::enqueue(std::function<void()> job) {
  std::unique_lock lock(mutex_);
  join_finished(lock);
  jobs_.push_back(std::move(job));
  // Idle threads that were woken but have not taken their job yet still count as idle, so a
  // burst of connections compares against the jobs waiting, not against one.
  if (jobs_.size() > idle_ && running_.size() < max_threads_) {
    std::thread thread([this] { work(); });
    const std::thread::id id = thread.get_id();
    running_.emplace(id, std::move(thread));  // work() waits for the lock held here
  } else {
    wake_.notify_one();
  }
}

void ConnectionThreads::shutdown() {
  std::unique_lock lock(mutex_);
  stopping_ = true;
  wake_.notify_all();
  ended_.wait(lock, [this] { return running_.empty(); });
  join_finished(lock);
}

size_t ConnectionThreads::threads() const {
  std::lock_guard lock(mutex_);
  return running_.size();
}

size_t ConnectionThreads::waiting_jobs() const {
  std::lock_guard lock(mutex_);
  return jobs_.size();
}

void ConnectionThreads::work() {
  std::unique_lock lock(mutex_);
  while (true) {
    ++idle_;
    const bool woken =
        wake_.wait_for(lock, idle_exit_, [this] { return !jobs_.empty() || stopping_; });
    --idle_;
    if (jobs_.empty()) {
      if (stopping_ || (!woken && running_.size() > kept_threads_)) break;
      continue;
    }
    std::function<void()> job = std::move(jobs_.front());
    jobs_.pop_front();
    lock.unlock();
    try {
      job();
    } catch (const std::exception& e) {
      // httplib's connection jobs catch their handlers' exceptions; this is a last guard, since
      // an exception leaving a thread would end the process.
      fmt::print(stderr, "dspark serve: a connection thread failed: {}\n", e.what());
    } catch (...) {
      fmt::print(stderr, "dspark serve: a connection thread failed\n");
    }
    lock.lock();
  }
  // A thread cannot join itself: the next enqueue or the shutdown joins it.
  auto self = running_.find(std::this_thread::get_id());
  finished_.push_back(std::move(self->second));
  running_.erase(self);
  ended_.notify_all();
}

void ConnectionThreads::join_finished(std::unique_lock<std::mutex>& lock) {
  std::vector<std::thread> finished = std::move(finished_);
  finished_.clear();
  lock.unlock();
  for (std::thread& thread : finished) thread.join();
  lock.lock();
}

}  // namespace dspark::server
