#include "server/engine.h"

#include <fmt/format.h>
#include <malloc.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "base/error.h"
#include "base/system_info.h"
#include "engine/output_text.h"
#include "server/json_input.h"
#include "speculative/decode_report.h"
#include "text/reasoning_parser.h"

namespace dspark::server {

bool Job::wait(std::vector<OutputEvent>& events, std::optional<GenerationSummary>& done,
               std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  ready_.wait_for(lock, timeout, [&] { return !events_.empty() || summary_.has_value(); });
  for (auto& event : events_) events.push_back(std::move(event));
  events_.clear();
  if (summary_ && !delivered_) {
    done = std::move(summary_);
    delivered_ = true;
  }
  return delivered_;
}

bool Job::wait_picked_up(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  return ready_.wait_for(lock, timeout, [&] { return running_ || summary_ || delivered_; });
}

bool Job::finished_unstarted() {
  std::lock_guard lock(mutex_);
  return !running_ && (summary_ || delivered_);
}

void Job::mark_running() {
  std::lock_guard lock(mutex_);
  running_ = true;
  ready_.notify_all();
}

void Job::push(std::vector<OutputEvent> events) {
  if (events.empty()) return;
  std::lock_guard lock(mutex_);
  for (auto& event : events) {
    if (!delivers_event(request, event)) continue;
    if (event.kind == OutputEvent::Kind::kToolCallStart) saw_tool_call_ = true;
    events_.push_back(std::move(event));
  }
  ready_.notify_all();
}

void Job::finish(GenerationSummary summary) {
  std::lock_guard lock(mutex_);
  summary_ = std::move(summary);
  ready_.notify_all();
}

Engine::Engine(std::unique_ptr<ModelBundle> bundle, EngineOptions options, Metrics& metrics)
    : bundle_(std::move(bundle)),
      options_(std::move(options)),
      metrics_(metrics),
      context_window_(options_.context_window > 0
                          ? std::min(options_.context_window, bundle_->model->max_context())
                          : bundle_->model->max_context()),
      // Each slot's running sequence, and the prefix cache's kept ones.
      pool_(bundle_->model->new_pool(std::max(options_.parallel, 1) +
                                     std::max(options_.prefix_cache.slots, 1))),
      cache_(*bundle_->model, pool_, options_.prefix_cache) {
  if (!bundle_->chat_template.empty()) {
    template_.emplace(bundle_->chat_template, bundle_->name + " chat template");
  }
  running_.resize(std::max(options_.parallel, 1));
  pool_counters_.capacity = pool_.capacity();
  stepper_ = std::thread([this] { step_loop(); });
}

Engine::~Engine() {
  shutdown();
}

void Engine::shutdown() {
  {
    std::lock_guard lock(mutex_);
    if (stopping_ && !stepper_.joinable()) return;
    stopping_ = true;
    for (auto& job : queue_) job->cancel();
    for (auto& job : running_) {
      if (job) job->cancel();
    }
  }
  work_.notify_all();
  if (stepper_.joinable()) stepper_.join();
}

PreparedPrompt Engine::prepare(const ChatRequest& request) const {
  PreparedPrompt prepared;
  const Tokenizer& tokenizer = *bundle_->tokenizer;
  if (request.raw_prompt) {
    prepared.text = *request.raw_prompt;
    prepared.ids = tokenizer.encode(prepared.text, /*add_special_tokens=*/true);
    prepared.parser.verbatim = true;
  } else if (request.raw_prompt_ids) {
    for (const int32_t id : *request.raw_prompt_ids)
      check_in_vocabulary(id, bundle_->model->vocab_size(), "prompt");
    prepared.ids = *request.raw_prompt_ids;
    prepared.text = tokenizer.decode(prepared.ids, /*skip_special_tokens=*/false);
    prepared.parser.verbatim = true;
  } else {
    if (!template_) throw ApiError(400, "this model has no chat template; use /v1/completions");
    ChatTemplateInputs inputs;
    inputs.messages = request.messages;
    inputs.tools = request.tools;
    inputs.kwargs = request.template_kwargs;
    if (!inputs.kwargs.contains("enable_thinking")) {
      const std::optional<bool> thinking =
          request.enable_thinking ? request.enable_thinking : options_.default_thinking;
      if (thinking) inputs.kwargs["enable_thinking"] = *thinking;
    }
    if (!bundle_->bos_token.empty()) inputs.bos_token = bundle_->bos_token;
    if (!bundle_->eos_token.empty()) inputs.eos_token = bundle_->eos_token;
    inputs.add_generation_prompt = true;
    if (!options_.special_tokens_in_content) {
      inputs.mark_content = [&tokenizer](std::string_view content) {
        return tokenizer.mark_special_tokens(content);
      };
    }
    try {
      const std::string marked = template_->render(inputs);
      prepared.ids = tokenizer.encode_marked(marked, /*add_special_tokens=*/false);
      prepared.text = Tokenizer::strip_content_marks(marked);
      if (cache_.enabled() && cache_.checkpointed()) {
        // The conversation rendered as history (no generation prompt) is what the next turn
        // will share; checkpointing there lets that turn reuse the state.
        inputs.add_generation_prompt = false;
        const auto history = tokenizer.encode_marked(template_->render(inputs), false);
        prepared.stable_boundary = static_cast<int64_t>(common_prefix(history, prepared.ids));
      }
    } catch (const Error& e) {
      throw ApiError(400, fmt::format("could not apply chat template: {}", e.what()));
    }
    prepared.parser = ChatOutputParser::configure(
        template_->source(), prepared.text,
        request.parse_tool_calls ? request.tools : nlohmann::ordered_json());
  }
  const int64_t n = static_cast<int64_t>(prepared.ids.size());
  if (n == 0) throw ApiError(400, "the prompt is empty", "", "prompt");
  if (n >= context_window_) {
    const std::string message =
        request.dialect == Dialect::anthropic
            ? fmt::format("prompt is too long: {} tokens > {} maximum", n, context_window_ - 1)
            : fmt::format(
                  "This model's maximum context length is {} tokens. However, your messages "
                  "resulted in {} tokens. Please reduce the length of the messages.",
                  context_window_, n);
    ApiError error(400, message, "context_length_exceeded", "messages");
    error.extra = {{"n_prompt_tokens", n}, {"n_ctx", context_window_}};
    throw error;
  }
  return prepared;
}

GenerationConfig Engine::generation_config(const ChatRequest& request,
                                           int64_t prompt_tokens) const {
  GenerationConfig config;
  if (!request.ignore_eos) config.eos_ids = bundle_->eos_ids;
  for (const int32_t id : request.stop_token_ids) {
    check_in_vocabulary(id, bundle_->model->vocab_size(), "stop_token_ids");
    config.eos_ids.push_back(id);
  }
  int64_t max_tokens = request.max_tokens
                           ? std::clamp<int64_t>(*request.max_tokens, 1, options_.max_tokens_cap)
                           : options_.default_max_tokens;
  config.max_tokens = std::max<int64_t>(1, std::min(max_tokens, context_window_ - prompt_tokens));
  SamplingParams& s = config.sampling;
  const auto& defaults = bundle_->generation_defaults;
  const bool config_samples = defaults.is_object() && defaults.value("do_sample", true) &&
                              defaults.contains("temperature") &&
                              defaults["temperature"].is_number();
  auto from_config = [&](const char* key) -> std::optional<double> {
    if (config_samples && defaults.contains(key) && defaults[key].is_number()) {
      return defaults[key].get<double>();
    }
    return std::nullopt;
  };
  const RequestSampling& r = request.sampling;
  if (r.temperature)
    s.temperature = *r.temperature;
  else if (options_.default_temperature)
    s.temperature = *options_.default_temperature;
  else if (auto t = from_config("temperature"))
    s.temperature = static_cast<float>(*t);
  if (r.top_p)
    s.top_p = *r.top_p;
  else if (options_.default_top_p)
    s.top_p = *options_.default_top_p;
  else if (auto p = from_config("top_p"))
    s.top_p = static_cast<float>(*p);
  if (r.top_k)
    s.top_k = *r.top_k;
  else if (options_.default_top_k)
    s.top_k = *options_.default_top_k;
  else if (auto k = from_config("top_k"))
    s.top_k = static_cast<int>(*k);
  if (r.min_p) s.min_p = *r.min_p;
  s.presence_penalty = r.presence_penalty;
  s.frequency_penalty = r.frequency_penalty;
  s.repetition_penalty = r.repetition_penalty;
  s.seed = r.seed ? *r.seed : std::random_device{}();
  s.top_logprobs = r.top_logprobs;
  for (const auto& [id, bias] : r.logit_bias)
    check_in_vocabulary(id, bundle_->model->vocab_size(), "logit_bias");
  s.logit_bias = r.logit_bias;
  if (r.min_tokens > 0) {
    if (r.min_tokens > config.max_tokens) {
      throw ApiError(
          400,
          fmt::format("min_tokens ({}) is more than the tokens this answer may have ({})",
                      r.min_tokens, config.max_tokens),
          "", "min_tokens");
    }
    // A finished JSON answer only allows its end, which min_tokens would forbid.
    if (request.response_format.kind != ResponseFormat::Kind::text) {
      throw ApiError(400, "min_tokens cannot be combined with a JSON response format", "",
                     "min_tokens");
    }
    s.min_tokens = r.min_tokens;
    s.end_ids = config.eos_ids;
  }
  config.logprobs = request.logprobs;
  return config;
}

namespace {

// tool_choice "required" or a named function: the tokens that open the call, forced where the
// answer starts (after the thinking block when the prompt leaves one open).
AnswerPrefixConfig forced_tool_call(const ChatRequest& request,
                                    const ChatOutputParser::Config& parser,
                                    const Tokenizer& tokenizer) {
  AnswerPrefixConfig prefix;
  if (!request.forced_tool_call) return prefix;
  const std::string text = forced_call_prefix(parser.format, *request.forced_tool_call);
  if (text.empty()) {
    throw ApiError(400,
                   "tool_choice cannot force a call: this model's chat template defines no "
                   "tool-call format",
                   "", "tool_choice");
  }
  prefix.ids = tokenizer.encode(text, false);
  if (parser.reasoning && parser.starts_in_reasoning) {
    prefix.starts_in_reasoning = true;
    prefix.closer = parser.reasoning->end;
    prefix.token_text = [&tokenizer](int32_t id) { return tokenizer.decode({id}, false); };
  }
  return prefix;
}

}  // namespace

AnswerConstraintConfig Engine::answer_constraint(const ChatRequest& request,
                                                 const PreparedPrompt& prompt,
                                                 const std::function<bool()>& abandoned) {
  AnswerConstraintConfig config;
  const ResponseFormat& format = request.response_format;
  if (format.kind == ResponseFormat::Kind::text) return config;
  if (request.forced_tool_call) {
    throw ApiError(400, "tool_choice cannot force a call when response_format asks for JSON", "",
                   "response_format");
  }
  std::shared_ptr<const constrain::Grammar> grammar;
  try {
    grammar = format.kind == ResponseFormat::Kind::json_object
                  ? constrain::json_object_grammar()
                  : schema_grammar(format.schema, abandoned);
  } catch (const Error& e) {
    if (abandoned && abandoned())
      throw ApiError(503, "the request was abandoned while its schema compiled");
    throw ApiError(400, fmt::format("response_format: {}", e.what()), "", "response_format");
  }
  std::call_once(vocabulary_once_, [&] {
    vocabulary_ = constrain::TokenVocabulary::from_tokenizer(*bundle_->tokenizer);
  });
  config.grammar.emplace(std::move(grammar), vocabulary_, bundle_->eos_ids);
  if (prompt.parser.reasoning && prompt.parser.starts_in_reasoning) {
    config.starts_in_reasoning = true;
    config.closer = prompt.parser.reasoning->end;
    const Tokenizer& tokenizer = *bundle_->tokenizer;
    config.token_text = [&tokenizer](int32_t id) { return tokenizer.decode({id}, false); };
  }
  return config;
}

std::shared_ptr<const constrain::Grammar> Engine::schema_grammar(
    const nlohmann::ordered_json& schema, const std::function<bool()>& abandoned) {
  // Few enough that even schemas at the compile budget's rule cap stay affordable.
  constexpr size_t kMaxCachedGrammars = 16;
  const std::string key = dump_json(schema);
  {
    std::lock_guard lock(grammars_mutex_);
    const auto found = grammars_.find(key);
    if (found != grammars_.end()) return found->second;
  }
  // Compiled outside the lock: a compile may run up to its deadline.
  constrain::CompileBudget budget = constrain::default_compile_budget();
  budget.cancelled = abandoned;
  std::shared_ptr<const constrain::Grammar> grammar =
      constrain::json_schema_grammar(schema, budget);
  std::lock_guard lock(grammars_mutex_);
  if (grammars_.size() >= kMaxCachedGrammars) grammars_.clear();
  grammars_.emplace(key, grammar);
  return grammar;
}

nlohmann::json Engine::health() const {
  const DecodeOptions& decode = options_.decode.options;
  nlohmann::json max_draft = nullptr;
  if (decode.auto_cap) {
    max_draft = "auto";
  } else if (decode.max_draft) {
    max_draft = *decode.max_draft;
  }
  const std::string source = template_ ? template_->source() : "";
  return {{"status", "ok"},
          {"model", bundle_->name},
          {"architecture", bundle_->model->architecture()},
          {"mode", mode_name()},
          {"max_draft", max_draft},
          {"lookup_drafts", decode.lookup_drafts},
          {"context_window", context_window()},
          {"parallel", slots()},
          {"max_output_tokens", options_.max_tokens_cap},
          {"prefix_cache", options_.prefix_cache.enabled},
          {"thinking_default", options_.default_thinking.value_or(true)},
          {"supports_reasoning_effort", source.find("reasoning_effort") != std::string::npos},
          {"supports_reasoning_budget", detect_reasoning_syntax(source).has_value()},
          {"reasoning_budget", options_.reasoning_budget},
          {"reasoning_budget_message", options_.reasoning_budget_message}};
}

std::shared_ptr<Job> Engine::submit(ChatRequest request, PreparedPrompt prompt,
                                    const std::function<bool()>& abandoned) {
  auto job = std::make_shared<Job>();
  job->arrival = now_seconds();
  job->config = generation_config(request, static_cast<int64_t>(prompt.ids.size()));
  job->config.reasoning_budget = resolve_reasoning_budget(
      request, options_.reasoning_budget, options_.reasoning_budget_message,
      prompt.parser.reasoning, prompt.parser.starts_in_reasoning, *bundle_->tokenizer,
      bundle_->eos_ids);
  job->config.answer_prefix = forced_tool_call(request, prompt.parser, *bundle_->tokenizer);
  job->config.answer_constraint = answer_constraint(request, prompt, abandoned);
  job->request = std::move(request);
  job->prompt = std::move(prompt);
  {
    std::lock_guard lock(mutex_);
    if (stopping_) throw ApiError(503, "the server is shutting down");
    if (queue_.size() >= options_.max_queue) {
      metrics_.count_rejected();
      throw ApiError(
          429, fmt::format("the request queue is full ({} waiting); retry later", queue_.size()));
    }
    queue_.push_back(job);
  }
  publish_queue();
  work_.notify_one();
  return job;
}

std::vector<bool> Engine::slots_busy() {
  std::lock_guard lock(mutex_);
  std::vector<bool> busy;
  for (const auto& job : running_) busy.push_back(job != nullptr);
  return busy;
}

StepCounters Engine::batch_counters() const {
  std::lock_guard lock(mutex_);
  return counters_;
}

Engine::PoolCounters Engine::pool_counters() const {
  std::lock_guard lock(mutex_);
  return pool_counters_;
}

int64_t Engine::running_jobs() const {
  return std::count_if(running_.begin(), running_.end(),
                       [](const auto& job) { return job != nullptr; });
}

bool Engine::idle() {
  std::lock_guard lock(mutex_);
  return queue_.empty() && running_jobs() == 0;
}

void Engine::publish_queue() {
  std::lock_guard lock(mutex_);
  metrics_.set_queue(static_cast<int64_t>(queue_.size()), running_jobs());
}

namespace {

// Counts the generated tokens that belong to reasoning: those before the end marker shows up in
// the raw text (all of them if it never does).
class ReasoningCounter {
 public:
  ReasoningCounter(const ChatOutputParser::Config& config) {
    if (config.reasoning) {
      active_ = true;
      in_reasoning_ = config.starts_in_reasoning;
      start_ = config.reasoning->start;
      end_ = config.reasoning->end;
    }
  }
  void add(const std::string& piece) {
    if (!active_ || done_) return;
    text_ += piece;
    if (!in_reasoning_) {
      // Only a reply that opens with the start marker reasons.
      const size_t first = text_.find_first_not_of(" \t\r\n");
      if (first == std::string::npos) return;
      if (text_.compare(first, start_.size(), start_, 0,
                        std::min(start_.size(), text_.size() - first)) != 0) {
        done_ = true;
        return;
      }
      if (text_.size() - first < start_.size()) return;
      in_reasoning_ = true;
    }
    ++tokens_;
    if (text_.find(end_) != std::string::npos) done_ = true;
  }
  int64_t tokens() const { return tokens_; }

 private:
  bool active_ = false;
  bool in_reasoning_ = false;
  bool done_ = false;
  std::string start_, end_, text_;
  int64_t tokens_ = 0;
};

// Prompt rows per forward while scoring a prompt: their logits stay in memory together.
constexpr int64_t kScoredRowsPerRun = 64;

// A token's log-prob entry as the dialects report it: the token's text and its alternatives'.
TokenLogprobEntry logprob_entry(const Tokenizer& tokenizer, int32_t id, float logprob,
                                const std::vector<TokenLogprob>& alternatives) {
  TokenLogprobEntry entry{tokenizer.decode({id}, false), logprob, {}};
  for (const TokenLogprob& alt : alternatives)
    entry.top.emplace_back(tokenizer.decode({alt.id}, false), alt.logprob);
  return entry;
}

}  // namespace

// One job in its slot, as the step loop drives it: the prompt's prefill in chunks (cancellation
// points, prefix-cache checkpoints; the drafter fed each chunk's taps), then its SequenceDecoder,
// streaming parsed output as tokens commit, then the summary and the state's return to the
// prefix cache.
class Engine::SlotRun {
 public:
  SlotRun(Engine& engine, std::shared_ptr<Job> job, int slot)
      : engine_(engine),
        job_(std::move(job)),
        slot_(slot),
        scores_prompt_(job_->request.echo && job_->request.logprobs),
        lease_(engine.cache_.acquire(job_->prompt.ids, /*reuse=*/!scores_prompt_)),
        prompt_len_(static_cast<int64_t>(job_->prompt.ids.size())),
        text_(*engine.bundle_->tokenizer, job_->request.skip_special_tokens,
              parser_markers(job_->prompt.parser), job_->request.stop),
        parser_(job_->prompt.parser),
        reasoning_(job_->prompt.parser) {
    job_->started = now_seconds();
    job_->slot = slot;
    summary_.usage.prompt_tokens = prompt_len_;
    summary_.usage.cached_tokens = lease_.cached_tokens;
    if (job_->request.echo) summary_.echo_text = job_->prompt.text;
    if (scores_prompt_) {
      // Nothing precedes the first prompt token: it has no log-prob.
      summary_.prompt_logprobs.push_back(
          {engine.bundle_->tokenizer->decode({job_->prompt.ids[0]}, false), 0.0f, {}});
    }
    prefill_from_ = length();
    // A model drafter reads the target's taps of every prompt row. Its context lives in the pool
    // with the sequence: a cache hit resumes the context that ran with the cached state (cut to
    // the same prefix), a miss starts it empty. This drafter feeds it the prefill's rows; the
    // decoder's own, made by the same factory, continues it.
    setup_ = engine.options_.decode;
    if (setup_.drafter) {
      prefill_drafter_ = setup_.drafter();
      prefill_drafter_->bind_sequence(engine.pool_, lease_.sequence.id());
      taps_ = prefill_drafter_->tap_layers();
    }
    // Checkpoints for the prefix cache: where the conversation as history ends, and every rung.
    const PrefixCache& cache = engine.cache_;
    if (cache.enabled() && cache.checkpointed()) {
      const int64_t boundary = job_->prompt.stable_boundary;
      if (boundary > length() && boundary < prompt_len_) marks_.push_back(boundary);
      const int64_t rung = cache.options().rung_interval;
      for (int64_t at = rung; rung > 0 && at < prompt_len_; at += rung) {
        if (at > length()) marks_.push_back(at);
      }
      std::sort(marks_.begin(), marks_.end());
    }
  }

  bool ended() const { return ended_; }
  bool prefilling() const { return !decoding_ && length() < prompt_len_ - 1; }

  // The slot's next forward, of at most `prefill_rows` prompt rows while it prefills; nothing
  // when the job has ended (end() is then due) or, while prefilling, when prefill_rows is 0.
  std::optional<SequenceRun> next_run(int64_t prefill_rows) {
    if (ended_) return std::nullopt;
    const std::vector<int32_t>& prompt = job_->prompt.ids;
    if (prefilling() && !job_->cancelled()) {
      // All but the last prompt token run here; the decoder runs the last one.
      const int64_t start = length();
      engine_.metrics_.set_prefill(slot_, start - prefill_from_, prompt_len_ - prefill_from_);
      if (prefill_rows <= 0) return std::nullopt;
      // Scoring keeps every row's logits, so its chunks stay small.
      if (scores_prompt_) prefill_rows = std::min(prefill_rows, kScoredRowsPerRun);
      int64_t end = std::min(start + prefill_rows, prompt_len_ - 1);
      if (next_mark_ < marks_.size()) end = std::min(end, marks_[next_mark_]);
      prefill_rows_.assign(prompt.begin() + start, prompt.begin() + end);
      std::vector<int64_t> logit_rows;
      if (scores_prompt_) {
        logit_rows.resize(prefill_rows_.size());
        std::iota(logit_rows.begin(), logit_rows.end(), 0);
      }
      return SequenceRun{prefill_rows_.data(),  end - start, lease_.sequence.id(),
                         std::move(logit_rows), taps_,       &scratch_};
    }
    if (!decoding_) {
      engine_.metrics_.set_prefill(slot_, 0, 0);
      prefill_manual_ = now_seconds() - job_->started;
      if (job_->cancelled()) {
        summary_.finish = Finish::cancelled;
        ended_ = true;
        return std::nullopt;
      }
      decoding_ = std::make_unique<Decoding>(
          *engine_.bundle_->model, prompt, engine_.pool_, lease_.sequence.id(), job_->config,
          setup_, [this](const CommittedToken& token) { return on_token(token); });
    }
    std::optional<SequenceRun> run = decoding_->decoder().next_run();
    if (!run) complete();
    return run;
  }

  void set_load(int sequences) {
    if (decoding_) decoding_->decoder().set_load(sequences);
  }

  // The slot's decoder while it decodes (for draft_together); null while it prefills or once
  // it has ended.
  SequenceDecoder* decoder() { return ended_ || !decoding_ ? nullptr : &decoding_->decoder(); }

  // Takes the output of the forward next_run planned.
  void finish_run() {
    if (decoding_) return decoding_->decoder().finish_run();
    const int64_t start = length() - static_cast<int64_t>(prefill_rows_.size());
    if (scores_prompt_) score_prompt_rows(start);
    if (prefill_drafter_) {
      prefill_drafter_->on_target_rows(job_->prompt.ids.data() + start,
                                       static_cast<int64_t>(prefill_rows_.size()),
                                       scratch_.taps.data());
    }
    if (next_mark_ < marks_.size() && length() == marks_[next_mark_]) {
      lease_.checkpoints.push_back(engine_.pool_.snapshot(lease_.sequence.id()));
      ++next_mark_;
    }
  }

  // The generation failed: its state may be half-updated, so every cached state goes.
  void fail(const std::exception& e) {
    engine_.cache_.clear();
    failed_ = true;
    ended_ = true;
    summary_.finish = Finish::error;
    summary_.error = fmt::format("generation failed: {}", e.what());
  }

  // Delivers the summary and gives the state back to the prefix cache.
  void end() {
    engine_.metrics_.set_prefill(slot_, 0, 0);
    PrefixCache& cache = engine_.cache_;
    if (!failed_) {
      try {
        if (cache.enabled() && cache.checkpointed() && length() > 0) {
          lease_.checkpoints.push_back(engine_.pool_.snapshot(lease_.sequence.id()));
        }
        std::vector<int32_t> tokens = job_->prompt.ids;
        tokens.insert(tokens.end(), generated_.begin(), generated_.end());
        cache.release(std::move(lease_), std::move(tokens));
      } catch (const std::exception&) {
        cache.clear();  // the answer stands; only its state is not kept
      }
    }
    if (summary_.finish == Finish::cancelled) engine_.metrics_.count_cancelled();
    job_->finish(std::move(summary_));
  }

 private:
  // Tokens the slot's sequence holds.
  int64_t length() const { return engine_.pool_.length(lease_.sequence.id()); }

  // Echo with logprobs: each prefill row's logits give the next prompt token's log-prob, as a
  // decode step's give a generated token's (the same rows, bit for bit: the kernels are row
  // invariant). The rows start at prompt position `start`.
  void score_prompt_rows(int64_t start) {
    const Tokenizer& tokenizer = *engine_.bundle_->tokenizer;
    const std::vector<int32_t>& prompt = job_->prompt.ids;
    const int64_t vocab = engine_.bundle_->model->vocab_size();
    for (size_t row = 0; row < prefill_rows_.size(); ++row) {
      const int32_t next = prompt[static_cast<size_t>(start) + row + 1];
      const LogSoftmax log_softmax(scratch_.logits.data() + static_cast<int64_t>(row) * vocab,
                                   vocab);
      summary_.prompt_logprobs.push_back(
          logprob_entry(tokenizer, next, log_softmax.of(next),
                        log_softmax.top(job_->request.sampling.top_logprobs)));
    }
  }

  bool on_token(const CommittedToken& token) {
    Job& job = *job_;
    const Tokenizer& tokenizer = *engine_.bundle_->tokenizer;
    if (job.first_token < 0) job.first_token = now_seconds();
    generated_.push_back(token.id);
    const auto& eos = job.config.eos_ids;
    if (std::find(eos.begin(), eos.end(), token.id) != eos.end()) return true;
    // vLLM's min_tokens holds stop strings off as it holds the end ids off (sampler.h).
    const bool stops_armed =
        static_cast<int64_t>(generated_.size()) > job.request.sampling.min_tokens;
    OutputText::Step step = text_.push(token.id, stops_armed);
    reasoning_.add(step.decoded);
    if (job.request.logprobs) {
      summary_.logprobs.push_back(
          logprob_entry(tokenizer, token.id, token.logprob, token.alternatives));
    }
    deliver(step.shown.emit);
    if (step.shown.stopped) {
      stopped_by_string_ = true;
      summary_.stop_sequence = step.shown.matched;
      return false;
    }
    return !job.cancelled();
  }

  void deliver(const std::string& text) {
    if (!text.empty()) job_->push(parser_.feed(text));
  }

  // The decoder has finished: the rest of the text, and the summary's figures.
  void complete() {
    ended_ = true;
    Job& job = *job_;
    const GenerationResult& result = decoding_->decoder().result();
    if (!stopped_by_string_) deliver(text_.finish());
    job.push(parser_.finish());
    const bool has_tool_calls = job.saw_tool_call_;
    summary_.usage.completion_tokens = static_cast<int64_t>(result.tokens.size());
    summary_.usage.reasoning_tokens = reasoning_.tokens();
    if (job.cancelled())
      summary_.finish = Finish::cancelled;
    else if (stopped_by_string_)
      summary_.finish = Finish::stop_sequence;
    else if (result.finish_reason == FinishReason::length)
      summary_.finish = Finish::length;
    else
      summary_.finish = has_tool_calls ? Finish::tool_calls : Finish::stop;
    // Prefill ran here (all but the last prompt token) and in the decoder (the last one).
    GenerationStats st = result.stats;
    st.cached_prompt_tokens = lease_.cached_tokens;
    st.prefill_seconds += prefill_manual_;
    const double total = now_seconds() - job.started;
    nlohmann::json& stats = summary_.stats;
    stats = decode_stats_json(decoding_->stats(), st);
    stats["cached_tokens"] = lease_.cached_tokens;
    stats["completion_tokens"] = st.generated_tokens;
    stats["ttft_seconds"] = job.first_token >= 0 ? job.first_token - job.arrival : 0.0;
    // The reference's names (x_mlx_dspark) for the figures its clients read.
    stats["accept_len"] = stats["accept"];
    stats["tokens_per_sec"] = total > 0 ? st.generated_tokens / total : 0.0;
    stats["decode_tokens_per_sec"] = st.decode_tokens_per_second();
    // The reasoning budget closed the thinking block (engine/reasoning_budget.h).
    stats["budget_forced"] = result.budget_forced;
    if (prompt_len_ - lease_.cached_tokens >= 16 && st.prefill_seconds > 0) {
      stats["prefill_tokens_per_sec"] = st.prefill_tokens_per_second();
    }
  }

  Engine& engine_;
  std::shared_ptr<Job> job_;
  const int slot_;
  const bool scores_prompt_;
  CacheLease lease_;
  const int64_t prompt_len_;
  DecodeSetup setup_;
  std::unique_ptr<Drafter> prefill_drafter_;
  std::vector<int> taps_;
  std::vector<int64_t> marks_;
  size_t next_mark_ = 0;
  int64_t prefill_from_ = 0;
  std::vector<int32_t> prefill_rows_;
  ForwardOutput scratch_;
  double prefill_manual_ = 0.0;
  OutputText text_;
  ChatOutputParser parser_;
  ReasoningCounter reasoning_;
  bool stopped_by_string_ = false;
  std::vector<int32_t> generated_;
  std::unique_ptr<Decoding> decoding_;
  GenerationSummary summary_;
  bool ended_ = false;
  bool failed_ = false;
};

void Engine::admit_queued(std::vector<std::unique_ptr<SlotRun>>& slots) {
  for (;;) {
    std::shared_ptr<Job> job;
    int slot = -1;
    {
      std::lock_guard lock(mutex_);
      if (queue_.empty()) return;
      for (size_t s = 0; s < running_.size() && slot < 0; ++s) {
        if (!running_[s]) slot = static_cast<int>(s);
      }
      if (slot < 0) return;
      job = queue_.front();
      queue_.pop_front();
      running_[slot] = job;
    }
    publish_queue();
    if (job->cancelled()) {
      GenerationSummary summary;
      summary.finish = Finish::cancelled;
      summary.usage.prompt_tokens = static_cast<int64_t>(job->prompt.ids.size());
      release_slot(slot);
      job->finish(std::move(summary));
      continue;
    }
    job->mark_running();
    try {
      slots[slot] = std::make_unique<SlotRun>(*this, job, slot);
    } catch (const std::exception& e) {
      // Nothing ran yet, but a cache lease may have been taken and lost on the way.
      cache_.clear();
      GenerationSummary summary;
      summary.finish = Finish::error;
      summary.error = fmt::format("generation failed: {}", e.what());
      summary.usage.prompt_tokens = static_cast<int64_t>(job->prompt.ids.size());
      release_slot(slot);
      job->finish(std::move(summary));
    }
  }
}

void Engine::release_slot(int slot) {
  {
    std::lock_guard lock(mutex_);
    running_[slot].reset();
  }
  publish_queue();
}

void Engine::step_loop() {
  const Model& model = *bundle_->model;
  std::vector<std::unique_ptr<SlotRun>> slots(running_.size());
  std::vector<SequenceRun> runs;
  std::vector<SlotRun*> members, drafting;
  std::vector<SequenceDecoder*> decoders;
  const int64_t chunk = std::max<int64_t>(options_.prefill_chunk, 1);
  size_t first_prefill = 0;  // turns among prefilling slots, for fairness
  for (;;) {
    admit_queued(slots);
    const auto active = static_cast<int>(std::count_if(
        slots.begin(), slots.end(), [](const auto& slot) { return slot != nullptr; }));
    if (active == 0) {
      std::unique_lock lock(mutex_);
      work_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_ && queue_.empty()) return;
      continue;
    }
    // One step: every decoding slot's round, and prompt rows of prefilling slots up to one chunk
    // in all, so that a long prompt never stalls the others for more than a chunk.
    runs.clear();
    members.clear();
    // The decoding slots' drafter calls first, answered together: drafters of one head read its
    // weights once a step, however many slots draft.
    decoders.clear();
    drafting.clear();
    for (const auto& slot : slots) {
      if (slot == nullptr) continue;
      slot->set_load(active);
      if (SequenceDecoder* decoder = slot->decoder()) {
        decoders.push_back(decoder);
        drafting.push_back(slot.get());
      }
    }
    const std::vector<std::exception_ptr> errors = draft_together(decoders);
    for (size_t k = 0; k < errors.size(); ++k) {
      if (!errors[k]) continue;
      try {
        std::rethrow_exception(errors[k]);
      } catch (const std::exception& e) {
        drafting[k]->fail(e);
      }
    }
    int64_t prefill_budget = chunk;
    for (size_t i = 0; i < slots.size(); ++i) {
      const size_t s = (first_prefill + i) % slots.size();
      SlotRun* slot = slots[s].get();
      if (slot == nullptr) continue;
      try {
        const bool prefilling = slot->prefilling();
        std::optional<SequenceRun> run = slot->next_run(prefilling ? prefill_budget : 0);
        if (run) {
          model.check_run(*run, pool_);
          if (prefilling) prefill_budget -= run->n;
          runs.push_back(std::move(*run));
          members.push_back(slot);
        }
      } catch (const std::exception& e) {
        slot->fail(e);
      }
    }
    ++first_prefill;
    if (!runs.empty()) {
      const double start = now_seconds();
      try {
        model.forward_batch(runs, pool_);
        std::lock_guard lock(mutex_);
        counters_.add_step(runs, now_seconds() - start);
      } catch (const std::exception& e) {
        for (SlotRun* member : members) member->fail(e);
        members.clear();
      }
      decoders.clear();
      for (SlotRun* member : members) {
        if (SequenceDecoder* decoder = member->decoder()) decoders.push_back(decoder);
      }
      accept_together(decoders);
      for (SlotRun* member : members) {
        try {
          member->finish_run();
        } catch (const std::exception& e) {
          member->fail(e);
        }
      }
    }
    // Slots whose jobs ended (finished, failed, cancelled) free the slot, then deliver: a client
    // that asks for /slots once it has its answer finds the slot free.
    for (size_t s = 0; s < slots.size(); ++s) {
      if (slots[s] == nullptr || !slots[s]->ended()) continue;
      std::unique_ptr<SlotRun> ended = std::move(slots[s]);
      release_slot(static_cast<int>(s));
      ended->end();
      ended.reset();
      // Hands the pages the generation freed (its scratch, a dropped cache state) back to the
      // system, so the server's RSS follows what it holds rather than its high-water mark.
      malloc_trim(0);
    }
    // The pool's figures, taken here: only this thread changes its states.
    const PoolCounters pool{pool_.capacity(), pool_.open_count(), pool_.bytes()};
    std::lock_guard lock(mutex_);
    pool_counters_ = pool;
  }
}

}  // namespace dspark::server
