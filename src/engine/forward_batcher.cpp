#include "engine/forward_batcher.h"

#include <algorithm>

#include "base/error.h"

namespace dspark {

ForwardBatcher::ForwardBatcher(const Model& model, std::chrono::microseconds grace)
    : model_(model), grace_(grace) {
  thread_ = std::thread([this] { step_loop(); });
}

ForwardBatcher::~ForwardBatcher() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  arrived_.notify_all();
  thread_.join();
}

ForwardBatcher::Membership::Membership(ForwardBatcher& batcher) : batcher_(batcher) {
  std::lock_guard lock(batcher_.mutex_);
  ++batcher_.members_;
}

ForwardBatcher::Membership::~Membership() {
  {
    std::lock_guard lock(batcher_.mutex_);
    --batcher_.members_;
  }
  // A step waiting for this member can go now.
  batcher_.arrived_.notify_all();
}

int ForwardBatcher::members() const {
  std::lock_guard lock(mutex_);
  return members_;
}

void StepCounters::add_step(const std::vector<SequenceRun>& runs, double seconds) {
  const auto width = static_cast<int64_t>(runs.size());
  busy_seconds += seconds;
  ++steps;
  sequence_forwards += width;
  for (const SequenceRun& run : runs) rows += run.n;
  widest = std::max(widest, width);
  if (static_cast<int64_t>(steps_by_width.size()) < width) steps_by_width.resize(width);
  ++steps_by_width[width - 1];
}

StepCounters ForwardBatcher::counters() const {
  std::lock_guard lock(mutex_);
  return counters_;
}

void ForwardBatcher::forward(const int32_t* tokens, int64_t n, ModelState& state,
                             const std::vector<int64_t>& logit_rows,
                             const std::vector<int>& tap_layers, ForwardOutput& out) {
  Request request;
  request.run = SequenceRun{tokens, n, &state, logit_rows, tap_layers, &out};
  model_.check_run(request.run);
  std::unique_lock lock(mutex_);
  if (stopping_) fail("forward: the batcher is shutting down");
  pending_.push_back(&request);
  arrived_.notify_all();
  finished_.wait(lock, [&] { return request.done; });
  if (request.error) std::rethrow_exception(request.error);
}

void ForwardBatcher::step_loop() {
  std::unique_lock lock(mutex_);
  std::vector<Request*> step;
  std::vector<SequenceRun> runs;
  for (;;) {
    arrived_.wait(lock, [&] { return stopping_ || !pending_.empty(); });
    if (pending_.empty()) return;
    arrived_.wait_for(lock, grace_,
                      [&] { return stopping_ || static_cast<int>(pending_.size()) >= members_; });
    step.swap(pending_);
    lock.unlock();
    runs.clear();
    for (const Request* request : step) runs.push_back(request->run);
    std::exception_ptr error;
    const auto start = std::chrono::steady_clock::now();
    try {
      model_.forward_batch(runs);
    } catch (...) {
      error = std::current_exception();
    }
    const std::chrono::duration<double> busy = std::chrono::steady_clock::now() - start;
    lock.lock();
    counters_.add_step(runs, busy.count());
    for (Request* request : step) {
      request->error = error;
      request->done = true;
    }
    step.clear();
    finished_.notify_all();
  }
}

void target_forward(const Model& model, ForwardBatcher* batcher, const int32_t* tokens, int64_t n,
                    ModelState& state, const std::vector<int64_t>& logit_rows,
                    const std::vector<int>& tap_layers, ForwardOutput& out) {
  if (batcher != nullptr) {
    batcher->forward(tokens, n, state, logit_rows, tap_layers, out);
  } else {
    model.forward(tokens, n, state, logit_rows, tap_layers, out);
  }
}

}  // namespace dspark
