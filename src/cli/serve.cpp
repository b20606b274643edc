// `dspark serve`: the OpenAI- and Anthropic-compatible HTTP server (docs/server-api.md). The server
// listens first and loads the model after, so /health answers 503 while loading. SIGINT and
// SIGTERM drain it: new generations get 503, queued and running ones may finish within
// --shutdown-grace seconds (a second signal cuts the wait short), then what is left is cancelled
// with honest endings (503, or an error event in a stream) and the process exits.
#include <fmt/format.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <thread>

#include "base/error.h"
#include "base/system_info.h"
#include "base/thread_pool.h"
#include "cli/commands.h"
#include "cli/decode_flags.h"
#include "cli/memory_check.h"
#include "engine/model_bundle.h"
#include "hub/resolve.h"
#include "model/memory_fit.h"
#include "server/server.h"

namespace dspark::cli {
namespace {

struct ServeOptions {
  std::string model;
  std::string models_dir;
  DecodeFlags decode;
  server::ServerOptions http;
  int64_t default_max_tokens = 2048;
  int64_t max_tokens_cap = 32768;
  int64_t context_window = 0;
  std::optional<float> default_temperature;
  std::optional<float> default_top_p;
  std::optional<int> default_top_k;
  bool no_thinking = false;
  int64_t reasoning_budget = 0;
  std::string reasoning_budget_message;
  bool no_prefix_cache = false;
  int prefix_cache_slots = 2;
  int64_t prefix_cache_rungs = 8192;
  size_t max_queue = 64;
  int parallel = 0;  // 0: as many slots as memory allows, at most kDefaultSlots
  double max_body_mb = 8.0;
  int threads = 0;
  double shutdown_grace = 5.0;
  std::string cors_origins;
  bool force = false;
};

// llama-server's default slot count.
constexpr int kDefaultSlots = 4;

constexpr size_t kMaxHttpThreads = 65536;

// Every connection holds a descriptor, and the soft limit is often 1024: lift it toward the hard
// limit, as servers do, so that the connection threads' cap, not accept() failing, bounds the
// connections served at once.
void raise_descriptor_limit(rlim_t wanted) {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur >= wanted) return;
  limit.rlim_cur = std::min(wanted, limit.rlim_max);
  if (setrlimit(RLIMIT_NOFILE, &limit) != 0) return;  // the old limit stays: still a working server
}

// --parallel, or by default up to kDefaultSlots slots, fewer when the states of that many full
// contexts do not fit in available memory beside the model's working set.
int serve_slots(int requested, const Model& model, int64_t context) {
  if (requested > 0) return requested;
  const MemoryEstimate one = estimate_memory(model, context);
  const int64_t spare = available_memory_bytes() - one.working_set();
  const int64_t more = one.state_bytes > 0 ? spare / one.state_bytes : kDefaultSlots;
  return static_cast<int>(std::clamp<int64_t>(1 + more, 1, kDefaultSlots));
}

std::vector<std::string> split_origins(const std::string& list) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= list.size()) {
    size_t end = list.find(',', start);
    if (end == std::string::npos) end = list.size();
    std::string item = list.substr(start, end - start);
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (!item.empty()) out.push_back(item);
    start = end + 1;
  }
  return out;
}

void run_serve(const ServeOptions& options) {
  // Signals go to one waiting thread, not to whichever thread happens to run; every thread made
  // from here on (compute pool, HTTP pool) inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
  // glibc gives threads their own malloc arenas (up to 8 per core), and each arena keeps the
  // high-water mark of the requests its connection threads served, so RSS crept up with uptime
  // (+8 % in a 5-minute soak). The connection threads allocate little; two arenas serve them.
  mallopt(M_ARENA_MAX, 2);
  if (options.threads > 0) set_default_threads(options.threads);
  server::EngineOptions engine_options;
  cap_options(options.decode);  // a bad --max-draft fails before the server listens
  engine_options.default_max_tokens = options.default_max_tokens;
  engine_options.max_tokens_cap = options.max_tokens_cap;
  engine_options.context_window = options.context_window;
  engine_options.default_temperature = options.default_temperature;
  engine_options.default_top_p = options.default_top_p;
  engine_options.default_top_k = options.default_top_k;
  if (options.no_thinking) engine_options.default_thinking = false;
  engine_options.reasoning_budget = options.reasoning_budget;
  engine_options.special_tokens_in_content = options.decode.special_tokens_in_content;
  engine_options.reasoning_budget_message = options.reasoning_budget_message;
  engine_options.max_queue = options.max_queue;
  engine_options.prefix_cache.enabled = !options.no_prefix_cache;
  engine_options.prefix_cache.slots = options.prefix_cache_slots;
  engine_options.prefix_cache.rung_interval = options.prefix_cache_rungs;

  server::ServerOptions http = options.http;
  http.max_body_bytes = static_cast<size_t>(options.max_body_mb * 1024 * 1024);
  if (http.http_threads == 0) {
    // Each queued generation holds its connection's thread; the rest serve everything else.
    http.http_threads =
        static_cast<int>(std::clamp<size_t>(options.max_queue + 64, 1024, kMaxHttpThreads));
  }
  raise_descriptor_limit(static_cast<rlim_t>(http.http_threads) + 64);
  http.cors_origins = split_origins(options.cors_origins);
  server::Server server(http);
  const int port = server.bind();
  fmt::print(stderr, "dspark serve: listening on http://{}:{} (loading the model)\n", http.host,
             port);
  std::fflush(stderr);

  std::atomic<bool> stopping{false};
  std::atomic<bool> loader_done{false};
  std::string load_error;  // written by the loader, read after joining it
  // Shared with the exit watchdog, which may outlive this frame.
  auto http_done = std::make_shared<std::atomic<bool>>(false);
  std::thread signal_thread([&] {
    int received = 0;
    sigwait(&signals, &received);
    stopping = true;
    if (loader_done && !load_error.empty()) {
      server.shutdown(0);  // the loader's own signal: nothing to drain
      return;
    }
    fmt::print(stderr, "dspark serve: signal {} received, shutting down (grace {} s)\n", received,
               options.shutdown_grace);
    std::fflush(stderr);
    // The exit is promised within the grace period plus a second. What can outlast it is a
    // forward pass that cannot be interrupted (one prefill chunk of a big model) or a slow
    // teardown; past the promise the process ends anyway, exit status 1 if answers were pending.
    std::thread([http_done, deadline = options.shutdown_grace + 0.95] {
      std::this_thread::sleep_for(std::chrono::duration<double>(deadline));
      const bool answered = *http_done;
      fmt::print(stderr, "dspark serve: forced exit after the grace period ({})\n",
                 answered ? "every answer was sent" : "some answers were still pending");
      std::fflush(stderr);
      std::_Exit(answered ? 0 : 1);
    }).detach();
    // A second signal ends the grace period early.
    const timespec no_wait{0, 0};
    server.shutdown(options.shutdown_grace,
                    [&] { return sigtimedwait(&signals, nullptr, &no_wait) > 0; });
  });
  std::thread loader([&] {
    try {
      ResolveOptions resolve;
      resolve.models_dir = options.models_dir;
      const std::string dir = resolve_model_or_download(options.model, resolve);
      auto bundle = load_model_bundle(dir);
      const int64_t context = options.context_window > 0
                                  ? std::min(options.context_window, bundle->model->max_context())
                                  : bundle->model->max_context();
      check_memory_fit(*bundle->model, bundle->name, context, options.force);
      // The mode, drafter and cap policy are resolved once here; every request shares them.
      std::string explanation;
      server::EngineOptions loaded = engine_options;
      loaded.decode = resolve_decode_flags(options.decode, options.model, options.models_dir,
                                           *bundle, explanation);
      loaded.parallel = serve_slots(options.parallel, *bundle->model, context);
      fmt::print(stderr, "dspark serve: model {} ({}) ready, {} slot{}, {}\n", bundle->name,
                 bundle->model->architecture(), loaded.parallel, loaded.parallel == 1 ? "" : "s",
                 explanation);
      std::fflush(stderr);
      if (!stopping) {
        server.set_engine(
            std::make_unique<server::Engine>(std::move(bundle), loaded, server.metrics()));
      }
    } catch (const std::exception& e) {
      load_error = e.what();
      loader_done = true;
      kill(getpid(), SIGTERM);
    }
    loader_done = true;
  });
  server.listen();
  *http_done = true;
  if (!stopping) kill(getpid(), SIGTERM);  // listening ended by itself: release the signal thread
  signal_thread.join();
  if (!loader_done) {
    // Still loading (or downloading, which resumes next time): waiting for it would break the
    // promise to exit within the grace period, and nothing of it needs saving.
    fmt::print(stderr, "dspark serve: stopped while loading the model\n");
    std::fflush(stderr);
    std::_Exit(0);
  }
  loader.join();
  if (!load_error.empty()) fail("could not load the model: {}", load_error);
  fmt::print(stderr, "dspark serve: stopped\n");
}

}  // namespace

void add_serve_command(CLI::App& app) {
  auto* command =
      app.add_subcommand("serve", "Serve the OpenAI- and Anthropic-compatible HTTP API");
  auto options = std::make_shared<ServeOptions>();
  command->add_option("--model,-m", options->model,
                      "Model directory, GGUF, name or hub repo id (default: the default model)");
  command->add_option("--models-dir", options->models_dir, "Models directory");
  command->add_option("--host", options->http.host, "Address to listen on")->capture_default_str();
  command->add_option("--port", options->http.port, "Port (0 = any free port)")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535));
  command->add_option("--api-key", options->http.api_key,
                      "Require this key (Authorization: Bearer or x-api-key)");
  command->add_option("--cors-origins", options->cors_origins,
                      "Browser origins allowed besides loopback ones, comma-separated; '*' is a "
                      "wildcard (\"*\" = any origin)");
  command
      ->add_option("--shutdown-grace", options->shutdown_grace,
                   "Seconds SIGTERM / SIGINT let running and queued requests finish before "
                   "cancelling them")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 3600.0));
  add_decode_flags(*command, options->decode);
  command
      ->add_option("--default-max-tokens", options->default_max_tokens,
                   "max_tokens when a request gives none")
      ->capture_default_str();
  command->add_option("--max-tokens-cap", options->max_tokens_cap, "Ceiling on max_tokens")
      ->capture_default_str();
  command->add_option("--context-window", options->context_window,
                      "Longest prompt + output (default: the model's)");
  add_force_flag(command, &options->force);
  command
      ->add_option("--default-temperature", options->default_temperature,
                   "Temperature for requests that give none (before generation_config.json)")
      ->check(finite_range(0.0, 100.0));
  command->add_option("--default-top-p", options->default_top_p, "Default top_p")
      ->check(finite_range(0.0, 1.0));
  command->add_option("--default-top-k", options->default_top_k, "Default top_k")
      ->check(CLI::NonNegativeNumber);
  command->add_flag("--no-thinking", options->no_thinking, "Default enable_thinking = false");
  command
      ->add_option("--reasoning-budget", options->reasoning_budget,
                   "Default thinking tokens before the block is closed for the model (0 = off)")
      ->check(CLI::NonNegativeNumber);
  command->add_option("--reasoning-budget-message", options->reasoning_budget_message,
                      "Text injected before the forced </think> (default: none)");
  command->add_flag("--no-prefix-cache", options->no_prefix_cache,
                    "Do not reuse state across requests");
  command
      ->add_option("--prefix-cache-slots", options->prefix_cache_slots, "Conversations kept (LRU)")
      ->check(CLI::Range(0, 256))
      ->capture_default_str();
  command
      ->add_option("--prefix-cache-rungs", options->prefix_cache_rungs,
                   "Hybrid models: checkpoint every N prompt tokens (0 = off)")
      ->capture_default_str();
  command->add_option("--max-queue", options->max_queue, "Waiting requests before 429")
      ->capture_default_str();
  command
      ->add_option("--parallel", options->parallel,
                   "Generations decoded at once, their forwards batched (default: up to 4, as "
                   "memory allows)")
      ->check(CLI::Range(1, 64));
  command
      ->add_option("--http-threads", options->http.http_threads,
                   "Connections served at once, a thread each, started on demand (default: "
                   "1024, or --max-queue + 64 when more)")
      ->check(CLI::Range(1, static_cast<int>(kMaxHttpThreads)));
  command->add_option("--max-body-mb", options->max_body_mb, "Largest request body (MiB)")
      ->capture_default_str();
  command
      ->add_option("--keepalive", options->http.keepalive_seconds,
                   "Seconds of stream silence before a keep-alive")
      ->capture_default_str();
  command->add_flag("!--no-log", options->http.log_requests, "No per-request log lines");
  command->add_option("--threads", options->threads, "Compute threads (default: all CPUs)")
      ->check(thread_count());
  command->callback([options] { run_serve(*options); });
}

}  // namespace dspark::cli
