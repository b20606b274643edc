#pragma once
// Concurrent generations sharing their target forwards. Each generation runs on its own thread
// and calls forward as usual; the batcher holds each call until every joined generation has one
// waiting (or a short grace has passed since the first arrived), then runs them all as one
// Model::forward_batch on its own thread. The weights are streamed once per step for all the
// sequences, and every row's result is bit-identical to the sequence's lone forward (the kernels
// are row invariant), so batching never changes an answer: greedy output under load equals the
// output of the same request alone.
//
// A generation's other kernel work (a model drafter's step, a rollback's rebuild) may run beside a
// step: the kernels' thread pool runs one parallel loop at a time and the kernels keep no shared
// scratch.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "model/model.h"

namespace dspark {

// What batched steps (Model::forward_batch) have carried.
struct StepCounters {
  int64_t steps = 0;                    // batched forwards run
  int64_t sequence_forwards = 0;        // forwards the steps served (> steps once requests overlap)
  int64_t rows = 0;                     // token rows the steps ran
  int64_t widest = 0;                   // most sequences in one step
  std::vector<int64_t> steps_by_width;  // [w - 1]: steps that carried w sequences
  double busy_seconds = 0.0;            // inside the steps' forwards

  // One step over `runs` that took `seconds`.
  void add_step(const std::vector<SequenceRun>& runs, double seconds);
};

class ForwardBatcher {
 public:
  // `grace`: how long a step waits for joined generations that have not sent their forward yet
  // (they are sampling, drafting or detokenizing) before it runs without them.
  explicit ForwardBatcher(const Model& model,
                          std::chrono::microseconds grace = std::chrono::microseconds(2000));
  ~ForwardBatcher();
  ForwardBatcher(const ForwardBatcher&) = delete;
  ForwardBatcher& operator=(const ForwardBatcher&) = delete;

  // Model::forward, run in the next step. A run the model refuses throws here, to its caller
  // only, before it joins a step.
  void forward(const int32_t* tokens, int64_t n, ModelState& state,
               const std::vector<int64_t>& logit_rows, const std::vector<int>& tap_layers,
               ForwardOutput& out);

  // A generation that will send forwards: steps wait (up to the grace) for every member.
  // Threads that never join are batched with whoever is waiting and never wait for others.
  class Membership {
   public:
    explicit Membership(ForwardBatcher& batcher);
    ~Membership();
    Membership(const Membership&) = delete;
    Membership& operator=(const Membership&) = delete;

   private:
    ForwardBatcher& batcher_;
  };

  // Generations joined now (Membership).
  int members() const;

  StepCounters counters() const;

 private:
  struct Request {
    SequenceRun run;
    bool done = false;
    std::exception_ptr error;
  };
  void step_loop();

  const Model& model_;
  const std::chrono::microseconds grace_;
  mutable std::mutex mutex_;
  std::condition_variable arrived_;
  std::condition_variable finished_;
  std::vector<Request*> pending_;
  int members_ = 0;
  bool stopping_ = false;
  StepCounters counters_;
  std::thread thread_;
};

// A generation's way to its target: through `batcher` when there is one, else straight to the
// model.
void target_forward(const Model& model, ForwardBatcher* batcher, const int32_t* tokens, int64_t n,
                    ModelState& state, const std::vector<int64_t>& logit_rows,
                    const std::vector<int>& tap_layers, ForwardOutput& out);

}  // namespace dspark
