#include "server/metrics.h"

#include <fmt/format.h>

#include <algorithm>
#include <tuple>

#include "base/error.h"

namespace dspark::server {
namespace {

const std::vector<double> kLatencyBounds = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                            1,     2.5,  5,     10,   30,  60,   120};
const std::vector<double> kTokenBounds = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                          0.1,   0.25,   0.5,   1.0,  2.5};
const std::vector<double> kAcceptBounds = {1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 12, 16};

void counter(const std::string& name, const std::string& help, double value, std::string& out) {
  out += fmt::format("# HELP {0} {1}\n# TYPE {0} counter\n{0} {2}\n", name, help, value);
}

void gauge(const std::string& name, double value, std::string& out) {
  out += fmt::format("# TYPE {0} gauge\n{0} {1}\n", name, value);
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  const size_t bucket = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  ++counts_[bucket];
  sum_ += value;
  ++count_;
}

void Histogram::render(const std::string& name, const std::string& help, std::string& out) const {
  out += fmt::format("# HELP {0} {1}\n# TYPE {0} histogram\n", name, help);
  render_series(name, "", out);
}

void Histogram::render_series(const std::string& name, const std::string& labels,
                              std::string& out) const {
  const std::string before = labels.empty() ? "" : labels + ",";
  const std::string alone = labels.empty() ? "" : "{" + labels + "}";
  int64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    out += fmt::format("{}_bucket{{{}le=\"{}\"}} {}\n", name, before, bounds_[i], cumulative);
  }
  out += fmt::format("{0}_bucket{{{1}le=\"+Inf\"}} {2}\n{0}_sum{3} {4}\n{0}_count{3} {2}\n", name,
                     before, count_, alone, sum_);
}

Metrics::Slot::Slot() : per_token(kTokenBounds), ttft(kLatencyBounds) {}

Metrics::Metrics()
    : queue_(kLatencyBounds),
      ttft_(kLatencyBounds),
      per_token_(kTokenBounds),
      e2e_(kLatencyBounds),
      accept_per_round_(kAcceptBounds) {}

std::string route_pattern(std::string_view path) {
  for (const ServedRoute& route : kServedRoutes) {
    if (route.path != path) continue;
    if (path == "/") return "/";
    return fmt::format("{}{}/?", route.under_v1 ? "(?:/v1)?" : "", path);
  }
  fail("route_pattern: '{}' is not a served route", path);
}

std::string endpoint_label(std::string_view path) {
  while (path.size() > 1 && path.back() == '/') path.remove_suffix(1);
  const bool under_v1 = path.starts_with("/v1/");
  if (under_v1) path.remove_prefix(3);
  for (const ServedRoute& route : kServedRoutes) {
    if (path == route.path && (!under_v1 || route.under_v1)) return std::string(route.label);
  }
  return "other";
}

void Metrics::record(const RequestRecord& r) {
  std::lock_guard lock(mutex_);
  ++requests_[{endpoint_label(r.endpoint), r.status}];
  if (!r.finish.empty()) ++finishes_[r.finish];
  prompt_tokens_ += r.prompt_tokens;
  cached_tokens_ += r.cached_tokens;
  completion_tokens_ += r.completion_tokens;
  reasoning_tokens_ += r.reasoning_tokens;
  rounds_ += r.rounds;
  drafted_ += r.drafted;
  accepted_ += r.accepted;
  if (r.queue_seconds >= 0) queue_.observe(r.queue_seconds);
  if (r.ttft_seconds >= 0) ttft_.observe(r.ttft_seconds);
  if (r.seconds_per_token >= 0) per_token_.observe(r.seconds_per_token);
  if (r.e2e_seconds >= 0) e2e_.observe(r.e2e_seconds);
  if (r.rounds > 0) accept_per_round_.observe(double(r.completion_tokens) / r.rounds);
  if (r.slot >= 0) {
    Slot& slot = slots_[r.slot];
    ++slot.requests;
    slot.generated_tokens += r.completion_tokens;
    if (r.seconds_per_token >= 0) slot.per_token.observe(r.seconds_per_token);
    if (r.ttft_seconds >= 0) slot.ttft.observe(r.ttft_seconds);
  }
}

void Metrics::set_queue(int64_t waiting, int64_t running) {
  std::lock_guard lock(mutex_);
  waiting_ = waiting;
  running_ = running;
}

void Metrics::set_prefill(int slot, int64_t done, int64_t total) {
  std::lock_guard lock(mutex_);
  prefill_[slot] = {done, total};
}

void Metrics::count_cancelled() {
  std::lock_guard lock(mutex_);
  ++cancelled_;
}

void Metrics::count_rejected() {
  std::lock_guard lock(mutex_);
  ++rejected_;
}

namespace {

// The batched steps (the engine's step loop): totals, and how many sequences the steps carried.
void render_batch(const StepCounters& batch, std::string& out) {
  counter("dspark_batch_steps_total", "Batched target forwards run.", double(batch.steps), out);
  counter("dspark_batch_sequence_forwards_total",
          "Sequence forwards the batched steps served (above the step count once requests "
          "overlap).",
          double(batch.sequence_forwards), out);
  counter("dspark_batch_rows_total", "Token rows the batched steps ran.", double(batch.rows), out);
  gauge("dspark_batch_widest", double(batch.widest), out);
  out +=
      "# HELP dspark_batch_sequences Sequences per batched step.\n"
      "# TYPE dspark_batch_sequences histogram\n";
  int64_t cumulative = 0;
  size_t width = 0;
  for (int64_t bound : {1, 2, 4, 8, 16, 32}) {
    for (; width < batch.steps_by_width.size() && int64_t(width) < bound; ++width) {
      cumulative += batch.steps_by_width[width];
    }
    out += fmt::format("dspark_batch_sequences_bucket{{le=\"{}\"}} {}\n", bound, cumulative);
  }
  out += fmt::format(
      "dspark_batch_sequences_bucket{{le=\"+Inf\"}} {}\ndspark_batch_sequences_sum {}\n"
      "dspark_batch_sequences_count {}\n",
      batch.steps, batch.sequence_forwards, batch.steps);
}

}  // namespace

void Metrics::render_slots(std::string& out) const {
  const std::tuple<const char*, const char*, int64_t Slot::*> counters[] = {
      {"dspark_slot_requests_total", "Requests each slot generated for.", &Slot::requests},
      {"dspark_slot_generated_tokens_total", "Tokens each slot generated.",
       &Slot::generated_tokens}};
  for (const auto& [name, help, count] : counters) {
    out += fmt::format("# HELP {0} {1}\n# TYPE {0} counter\n", name, help);
    for (const auto& [slot, figures] : slots_) {
      out += fmt::format("{}{{slot=\"{}\"}} {}\n", name, slot, figures.*count);
    }
  }
  const std::tuple<const char*, const char*, Histogram Slot::*> histograms[] = {
      {"dspark_slot_time_per_output_token_seconds", "Decode time per generated token, by slot.",
       &Slot::per_token},
      {"dspark_slot_time_to_first_token_seconds", "Time from arrival to the first token, by slot.",
       &Slot::ttft}};
  for (const auto& [name, help, histogram] : histograms) {
    out += fmt::format("# HELP {0} {1}\n# TYPE {0} histogram\n", name, help);
    for (const auto& [slot, figures] : slots_) {
      (figures.*histogram).render_series(name, fmt::format("slot=\"{}\"", slot), out);
    }
  }
}

std::string Metrics::render(const std::map<std::string, double>& gauges,
                            const StepCounters* batch) const {
  std::lock_guard lock(mutex_);
  std::string out;
  out +=
      "# HELP dspark_requests_total Requests answered, by endpoint and HTTP status.\n"
      "# TYPE dspark_requests_total counter\n";
  for (const auto& [key, count] : requests_) {
    out += fmt::format("dspark_requests_total{{endpoint=\"{}\",status=\"{}\"}} {}\n", key.first,
                       key.second, count);
  }
  out +=
      "# HELP dspark_finished_total Generations by finish reason.\n"
      "# TYPE dspark_finished_total counter\n";
  for (const auto& [finish, count] : finishes_) {
    out += fmt::format("dspark_finished_total{{reason=\"{}\"}} {}\n", finish, count);
  }
  counter("dspark_prompt_tokens_total", "Prompt tokens, cached ones included.", prompt_tokens_,
          out);
  counter("dspark_cached_prompt_tokens_total", "Prompt tokens served from the prefix cache.",
          cached_tokens_, out);
  counter("dspark_generated_tokens_total", "Generated tokens, reasoning included.",
          completion_tokens_, out);
  counter("dspark_reasoning_tokens_total", "Generated reasoning tokens.", reasoning_tokens_, out);
  counter("dspark_speculative_rounds_total", "Verify rounds with a draft.", rounds_, out);
  counter("dspark_drafted_tokens_total", "Drafted tokens.", drafted_, out);
  counter("dspark_accepted_tokens_total", "Accepted draft tokens.", accepted_, out);
  counter("dspark_cancelled_total", "Requests cancelled by a client disconnect.", cancelled_, out);
  counter("dspark_rejected_total", "Requests refused because the queue was full.", rejected_, out);
  gauge("dspark_requests_waiting", waiting_, out);
  gauge("dspark_requests_running", running_, out);
  int64_t prefill_done = 0, prefill_total = 0;
  for (const auto& [slot, progress] : prefill_) {
    prefill_done += progress.first;
    prefill_total += progress.second;
  }
  gauge("dspark_prefill_tokens_done", prefill_done, out);
  gauge("dspark_prefill_tokens_total", prefill_total, out);
  for (const auto& [name, value] : gauges) gauge(name, value, out);
  if (batch != nullptr) render_batch(*batch, out);
  queue_.render("dspark_queue_seconds", "Time from arrival to the start of generation.", out);
  ttft_.render("dspark_time_to_first_token_seconds", "Time from arrival to the first token.", out);
  per_token_.render("dspark_time_per_output_token_seconds", "Decode time per generated token.",
                    out);
  e2e_.render("dspark_request_seconds", "Time from arrival to the last token.", out);
  accept_per_round_.render("dspark_tokens_per_round", "Committed tokens per target forward.", out);
  render_slots(out);
  return out;
}

}  // namespace dspark::server
