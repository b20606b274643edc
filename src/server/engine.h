#pragma once
// The model side of the server: turns a ChatRequest into prompt tokens (template + tokenizer),
// and runs generations in `parallel` slots fed by a bounded FIFO queue. One thread steps every
// slot at once: each step plans each slot's next forward (a prompt chunk, or a decode or verify
// round of its SequenceDecoder), runs them all as one Model::forward_batch (the weights are
// streamed once for every running generation, and each answer stays what it is alone), then
// takes each slot's output. Prompt rows share a budget of one prefill chunk per step, in turns,
// so a long prompt never stalls the others' decoding for more than a chunk. Each job streams
// parsed output events (reasoning, content, tool calls) to the HTTP thread that waits on it, and
// ends with a GenerationSummary. A job whose client went away is cancelled while queued, between
// prefill chunks or between decode rounds; a job that fails ends alone with an error.
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>

#include "constrain/grammar.h"
#include "engine/model_bundle.h"
#include "server/metrics.h"
#include "server/prefix_cache.h"
#include "server/request.h"
#include "speculative/decode.h"
#include "speculative/verify.h"
#include "text/chat_template.h"
#include "text/tool_call_parser.h"

namespace dspark::server {

struct EngineOptions {
  DecodeSetup decode;
  int64_t default_max_tokens = 2048;
  int64_t max_tokens_cap = 32768;
  int64_t context_window = 0;  // 0 = the model's
  std::optional<float> default_temperature;
  std::optional<float> default_top_p;
  std::optional<int> default_top_k;
  std::optional<bool> default_thinking;  // --no-thinking -> false
  int64_t reasoning_budget = 0;          // --reasoning-budget: default thinking budget, 0 = off
  std::string reasoning_budget_message;  // --reasoning-budget-message
  size_t max_queue = 64;
  int parallel = 1;             // slots: generations that run at once
  int64_t prefill_chunk = 512;  // cancellation is checked between chunks
  PrefixCacheOptions prefix_cache;
  // --special-tokens-in-content: message and tool text may yield control tokens (old behaviour).
  bool special_tokens_in_content = false;
};

// A rendered and tokenized request.
struct PreparedPrompt {
  std::vector<int32_t> ids;
  std::string text;
  int64_t stable_boundary = 0;  // tokens shared with the prompt rendered as history
  ChatOutputParser::Config parser;
};

class Job {
 public:
  // Waits up to `timeout` for output; moves what is ready into `events` and, at the end, `done`.
  // Returns true once the summary has been delivered.
  bool wait(std::vector<OutputEvent>& events, std::optional<GenerationSummary>& done,
            std::chrono::milliseconds timeout);
  // Waits up to `timeout` for the worker to take the job up; true once it has, or once the job
  // ended without running (cancelled while queued: finished_unstarted()).
  bool wait_picked_up(std::chrono::milliseconds timeout);
  bool finished_unstarted();
  void cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }

  ChatRequest request;
  PreparedPrompt prompt;
  GenerationConfig config;
  double arrival = 0.0;
  double started = -1.0;
  double first_token = -1.0;
  int slot = -1;  // the slot that ran it; -1 until a worker takes it up

 private:
  friend class Engine;
  void mark_running();
  void push(std::vector<OutputEvent> events);
  void finish(GenerationSummary summary);

  std::mutex mutex_;
  std::condition_variable ready_;
  std::vector<OutputEvent> events_;
  std::optional<GenerationSummary> summary_;
  bool delivered_ = false;
  bool running_ = false;
  bool saw_tool_call_ = false;  // written and read by the worker only
  std::atomic<bool> cancelled_{false};
};

class Engine {
 public:
  Engine(std::unique_ptr<ModelBundle> bundle, EngineOptions options, Metrics& metrics);
  ~Engine();

  // Renders and tokenizes; throws ApiError for requests the template or the context refuse.
  PreparedPrompt prepare(const ChatRequest& request) const;
  // Queues a prepared request; throws ApiError 429 when the queue is full. `abandoned` (the client
  // left, the server is stopping) is polled while a response_format schema compiles, which
  // then ends with ApiError 503.
  std::shared_ptr<Job> submit(ChatRequest request, PreparedPrompt prompt,
                              const std::function<bool()>& abandoned = {});
  // Stops taking work, cancels queued and running jobs, joins the workers.
  void shutdown();

  const ModelBundle& bundle() const { return *bundle_; }
  const EngineOptions& options() const { return options_; }
  int64_t context_window() const { return context_window_; }
  PrefixCache::Counters cache_counters() const { return cache_.counters(); }
  std::string mode_name() const { return decode_mode_name(options_.decode.options.mode); }
  // The /health fields of a ready engine (docs/server-api.md §5.1).
  nlohmann::json health() const;
  int slots() const { return static_cast<int>(running_.size()); }
  // Per slot, whether a generation is running in it (llama.cpp's /slots).
  std::vector<bool> slots_busy();
  // The steps so far.
  StepCounters batch_counters() const;
  // The state pool after the last step: sequences it can hold, open ones (running and cached),
  // and the bytes their states hold.
  struct PoolCounters {
    int capacity = 0;
    int open = 0;
    int64_t bytes = 0;
  };
  PoolCounters pool_counters() const;
  // Nothing queued and nothing running (a shutdown's drain is over).
  bool idle();

 private:
  class SlotRun;
  void step_loop();
  // Moves queued jobs into free slots.
  void admit_queued(std::vector<std::unique_ptr<SlotRun>>& slots);
  void release_slot(int slot);
  GenerationConfig generation_config(const ChatRequest& request, int64_t prompt_tokens) const;
  AnswerConstraintConfig answer_constraint(const ChatRequest& request, const PreparedPrompt& prompt,
                                           const std::function<bool()>& abandoned);
  std::shared_ptr<const constrain::Grammar> schema_grammar(const nlohmann::ordered_json& schema,
                                                           const std::function<bool()>& abandoned);
  void publish_queue();
  // Slots with a generation running; the caller holds mutex_.
  int64_t running_jobs() const;

  std::unique_ptr<ModelBundle> bundle_;
  EngineOptions options_;
  Metrics& metrics_;
  int64_t context_window_;
  std::optional<ChatTemplate> template_;
  // The states of the running generations and of the prefix cache, by sequence id.
  StatePool pool_;
  PrefixCache cache_;
  // The vocabulary as grammars see it (token bytes in a trie), built for the first request with a
  // response_format.
  std::once_flag vocabulary_once_;
  std::shared_ptr<const constrain::TokenVocabulary> vocabulary_;
  // Compiled json_schema grammars by schema text. The vocabulary caches masks by grammar, so
  // requests repeating a schema (the usual case) must share its grammar to share those masks;
  // a grammar per request would instead refill the mask cache to its cap. Cleared when full.
  std::mutex grammars_mutex_;
  std::unordered_map<std::string, std::shared_ptr<const constrain::Grammar>> grammars_;

  mutable std::mutex mutex_;
  std::condition_variable work_;
  std::deque<std::shared_ptr<Job>> queue_;
  std::vector<std::shared_ptr<Job>> running_;  // per slot; null when the slot is free
  bool stopping_ = false;
  StepCounters counters_;
  PoolCounters pool_counters_;
  std::thread stepper_;  // step_loop
};

}  // namespace dspark::server
