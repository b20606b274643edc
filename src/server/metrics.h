#pragma once
// Server counters, gauges and latency histograms, rendered in the Prometheus text format
// (names prefixed dspark_). Thread-safe.
#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "speculative/verify.h"

namespace dspark::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double value);
  // Appends the HELP / TYPE header and the _bucket / _sum / _count lines of metric `name`.
  void render(const std::string& name, const std::string& help, std::string& out) const;
  // The _bucket / _sum / _count lines alone, each carrying `labels` (e.g. slot="0") first.
  void render_series(const std::string& name, const std::string& labels, std::string& out) const;

 private:
  std::vector<double> bounds_;
  std::vector<int64_t> counts_;  // per bound, non-cumulative; last = +Inf
  double sum_ = 0.0;
  int64_t count_ = 0;
};

// A route the server serves: its path, whether it also answers under /v1, and its label in
// /metrics. One table for the routes the server registers (route_pattern) and the labels requests
// get (endpoint_label), so that the two cannot drift apart.
struct ServedRoute {
  std::string_view path;
  bool under_v1;
  std::string_view label;
};
inline constexpr std::array<ServedRoute, 14> kServedRoutes = {{
    {"/chat/completions", true, "/v1/chat/completions"},
    {"/completions", true, "/v1/completions"},
    {"/messages", true, "/v1/messages"},
    {"/messages/count_tokens", true, "/v1/messages/count_tokens"},
    {"/responses", true, "/v1/responses"},
    {"/models", true, "/v1/models"},
    {"/health", true, "/health"},
    {"/metrics", true, "/metrics"},
    // llama.cpp's utility routes, which some clients probe.
    {"/tokenize", false, "/tokenize"},
    {"/detokenize", false, "/detokenize"},
    {"/apply-template", false, "/apply-template"},
    {"/props", false, "/props"},
    {"/slots", false, "/slots"},
    {"/", false, "/"},
}};

// The pattern the server registers for a kServedRoutes path: a trailing slash allowed, and the
// /v1 prefix where the table says so. Throws for a path the table does not list.
std::string route_pattern(std::string_view path);

// The endpoint label of a request path: the label of the route that serves it
// ("/v1/chat/completions" for "/chat/completions/" too), or "other" for every path no route
// serves, so that a client can neither add series at will nor write into the exposition text.
std::string endpoint_label(std::string_view path);

struct RequestRecord {
  std::string endpoint;  // the request path
  int slot = -1;         // the slot that generated it; -1 when none did
  int status = 200;
  std::string finish;  // "" when the request never generated
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t reasoning_tokens = 0;
  double queue_seconds = -1.0;
  double ttft_seconds = -1.0;
  double seconds_per_token = -1.0;
  double e2e_seconds = -1.0;
  int64_t rounds = 0;
  int64_t drafted = 0;
  int64_t accepted = 0;
};

class Metrics {
 public:
  Metrics();
  void record(const RequestRecord& record);
  // Queue gauges, kept by the engine.
  void set_queue(int64_t waiting, int64_t running);
  // Prompt tokens the generation in `slot` has prefilled so far, of those it must prefill (the
  // prefix cache's tokens excluded); 0 / 0 between prefills. Rendered summed over the slots.
  void set_prefill(int slot, int64_t done, int64_t total);
  void count_cancelled();
  void count_rejected();

  // Extra gauges rendered as given (name -> value), e.g. memory and prefix-cache figures, and the
  // batched steps' counters and width histogram when `batch` is given.
  std::string render(const std::map<std::string, double>& gauges,
                     const StepCounters* batch = nullptr) const;

 private:
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, int>, int64_t> requests_;  // (endpoint, status)
  std::map<std::string, int64_t> finishes_;
  int64_t prompt_tokens_ = 0;
  int64_t cached_tokens_ = 0;
  int64_t completion_tokens_ = 0;
  int64_t reasoning_tokens_ = 0;
  int64_t rounds_ = 0;
  int64_t drafted_ = 0;
  int64_t accepted_ = 0;
  int64_t cancelled_ = 0;
  int64_t rejected_ = 0;
  int64_t waiting_ = 0;
  int64_t running_ = 0;
  std::map<int, std::pair<int64_t, int64_t>> prefill_;  // slot -> (done, total)
  Histogram queue_;
  Histogram ttft_;
  Histogram per_token_;
  Histogram e2e_;
  Histogram accept_per_round_;
  // Per slot: requests, generated tokens, and the decode time per token and time to first token
  // of its generations (a slow or stuck slot shows against the others).
  struct Slot {
    int64_t requests = 0;
    int64_t generated_tokens = 0;
    Histogram per_token;
    Histogram ttft;
    Slot();
  };
  std::map<int, Slot> slots_;
  void render_slots(std::string& out) const;
};

}  // namespace dspark::server
