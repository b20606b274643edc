#include "server/server.h"

#include <dirent.h>
#include <fmt/format.h>
#include <httplib.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <optional>
#include <thread>

#include "base/error.h"
#include "base/system_info.h"
#include "server/connection_threads.h"
#include "server/dialect.h"
#include "server/json_input.h"
#include "text/tokenizer.h"

namespace dspark::server {
namespace {

using Json = nlohmann::json;

enum class Route { chat, completion, messages, count_tokens, responses };

Dialect dialect_of(Route route) {
  switch (route) {
    case Route::messages:
    case Route::count_tokens:
      return Dialect::anthropic;
    case Route::responses:
      return Dialect::responses;
    default:
      return Dialect::openai;
  }
}

Dialect dialect_of_path(const std::string& path) {
  if (path.find("/messages") != std::string::npos) return Dialect::anthropic;
  if (path.find("/responses") != std::string::npos) return Dialect::responses;
  return Dialect::openai;
}

bool constant_time_equal(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) diff |= a[i] ^ b[i % (b.empty() ? 1 : b.size())];
  return diff == 0 && !b.empty();
}

int port_of(const sockaddr_storage& address) {
  if (address.ss_family == AF_INET)
    return int(ntohs(reinterpret_cast<const sockaddr_in&>(address).sin_port));
  if (address.ss_family == AF_INET6)
    return int(ntohs(reinterpret_cast<const sockaddr_in6&>(address).sin6_port));
  return -1;
}

// Calls `visit(fd, peer_port)` for every connected socket of this process whose local port is
// `local_port`: the server's client connections.
void for_each_client_socket(int local_port, const std::function<bool(int, int)>& visit) {
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return;
  while (dirent* entry = readdir(dir)) {
    const int fd = std::atoi(entry->d_name);
    struct stat st {};
    if (fd <= 2 || fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    sockaddr_storage peer{}, local{};
    socklen_t peer_len = sizeof(peer), local_len = sizeof(local);
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0) continue;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_len) != 0) continue;
    if (port_of(local) == local_port && !visit(fd, port_of(peer))) break;
  }
  closedir(dir);
}

// The socket of the connection a request arrived on, found by its peer address: httplib does not
// expose it, and a disconnect must be seen even while nothing is being written.
int find_client_socket(const httplib::Request& req, int local_port) {
  int found = -1;
  for_each_client_socket(local_port, [&](int fd, int peer_port) {
    if (peer_port != req.remote_port) return true;
    found = fd;
    return false;
  });
  return found;
}

// Why binding host:port fails, asked of the system directly (httplib only says that it failed).
std::string bind_failure_reason(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  if (const int error = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found)) {
    return gai_strerror(error);
  }
  std::string reason = "unknown error";
  for (addrinfo* at = found; at; at = at->ai_next) {
    const int fd = socket(at->ai_family, at->ai_socktype, at->ai_protocol);
    if (fd < 0) {
      reason = std::strerror(errno);
      continue;
    }
    const int yes = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    const bool bound = ::bind(fd, at->ai_addr, at->ai_addrlen) == 0 && ::listen(fd, 1) == 0;
    reason = bound ? "the port was taken meanwhile" : std::strerror(errno);
    close(fd);
    if (!bound) break;
  }
  freeaddrinfo(found);
  return reason;
}

// Iterative '*' glob: no recursion, backtracking only to the last star.
bool glob_match(const std::string& pattern, const std::string& text) {
  size_t p = 0, t = 0, star = std::string::npos, resume = 0;
  while (t < text.size()) {
    if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      resume = t;
    } else if (p < pattern.size() && pattern[p] == text[t]) {
      ++p;
      ++t;
    } else if (star != std::string::npos) {
      p = star + 1;
      t = ++resume;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

// The first part of a request that is not UTF-8 (path, query, header), or "".
std::string invalid_utf8_part(const httplib::Request& req) {
  auto bad = [](const std::string& text) {
    return invalid_utf8_offset(text) != std::string_view::npos;
  };
  if (bad(req.path)) return "the request path";
  for (const auto& [key, value] : req.params) {
    if (bad(key) || bad(value)) return "the query string";
  }
  for (const auto& [key, value] : req.headers) {
    if (bad(key) || bad(value)) return "a request header";
  }
  return "";
}

void log_line(const Json& line) {
  const std::string text = dump_json(line) + "\n";
  std::fwrite(text.data(), 1, text.size(), stderr);
}

std::string exception_text(const std::exception_ptr& ep) {
  try {
    std::rethrow_exception(ep);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
  }
  return "unknown exception";
}

// True once the peer closed the connection (an orderly close or a reset).
bool client_gone(int fd) {
  if (fd < 0) return false;
  char byte;
  const ssize_t n = recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n == 0) return true;
  return n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
}

int64_t current_rss_bytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

const char* finish_name(Finish finish) {
  switch (finish) {
    case Finish::stop:
      return "stop";
    case Finish::length:
      return "length";
    case Finish::stop_sequence:
      return "stop_sequence";
    case Finish::tool_calls:
      return "tool_calls";
    case Finish::cancelled:
      return "cancelled";
    case Finish::error:
      return "error";
  }
  return "";
}

}  // namespace

struct Server::Impl {
  explicit Impl(Server& owner) : owner(owner) {}

  Server& owner;
  httplib::Server http;
  int port = 0;
  std::mutex engine_mutex;
  std::shared_ptr<Engine> engine;
  // Set once a shutdown began: generation routes answer 503 from then on.
  std::atomic<bool> draining{false};
  // Generation requests being handled, streams until their last byte is written: a shutdown
  // waits (briefly) for them to send their endings before it stops listening.
  std::atomic<int> active{0};
  // Generation responses whose handler returned but whose bytes httplib has not written yet: it
  // writes the headers and the body of a plain response after the handler, and a shutdown that
  // closed the sockets in between would cut the body.
  std::atomic<int> unwritten{0};
  // The connection threads of the accept loop (httplib owns them and ends them when the loop
  // returns, after the last handler): /metrics reports them.
  std::atomic<ConnectionThreads*> connection_threads{nullptr};
  // httplib's stop() does nothing until its accept loop runs, so a stop that comes before (a
  // model that fails to load at once) is remembered here and the loop is never entered.
  std::mutex listener_mutex;
  bool listener_stop_requested = false;
  bool listener_entered = false;
  std::atomic<bool> listener_returned{false};

  void stop_listener() {
    {
      std::lock_guard lock(listener_mutex);
      listener_stop_requested = true;
      if (!listener_entered) return;
    }
    // Entered but maybe not yet running: wait for the loop so that stop() reaches it.
    while (!http.is_running() && !listener_returned) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    http.stop();
  }

  // Counts one request in `active` for as long as it lives.
  struct ActiveRequest {
    explicit ActiveRequest(std::atomic<int>& count) : count(count) { ++count; }
    ~ActiveRequest() { --count; }
    ActiveRequest(const ActiveRequest&) = delete;
    ActiveRequest& operator=(const ActiveRequest&) = delete;
    std::atomic<int>& count;
  };

  std::shared_ptr<Engine> current_engine() {
    std::lock_guard lock(engine_mutex);
    return engine;
  }

  void send_error(httplib::Response& res, Dialect dialect, const ApiError& error) {
    res.status = error.status();
    res.set_content(dump_json(error_body(dialect, error)), "application/json");
  }

  void log_request(const std::string& id, const std::string& endpoint, int status, const Job* job,
                   const GenerationSummary* summary, double start, std::string_view error = {}) {
    RequestRecord record;
    record.endpoint = endpoint;
    record.status = status;
    double now = now_seconds();
    record.e2e_seconds = now - start;
    Json line = {{"ts", std::time(nullptr)},
                 {"request_id", id},
                 {"endpoint", endpoint},
                 {"status", status},
                 {"total_ms", std::lround((now - start) * 1000)}};
    if (!error.empty()) line["error"] = error;
    if (job) {
      line["model"] = job->request.model;
      record.slot = job->slot;
      if (job->started >= 0) {
        record.queue_seconds = job->started - job->arrival;
        line["queue_ms"] = std::lround(record.queue_seconds * 1000);
      }
      if (job->first_token >= 0) {
        record.ttft_seconds = job->first_token - job->arrival;
        line["ttft_ms"] = std::lround(record.ttft_seconds * 1000);
      }
    }
    if (summary) {
      record.finish = finish_name(summary->finish);
      record.prompt_tokens = summary->usage.prompt_tokens;
      record.cached_tokens = summary->usage.cached_tokens;
      record.completion_tokens = summary->usage.completion_tokens;
      record.reasoning_tokens = summary->usage.reasoning_tokens;
      const Json& stats = summary->stats;
      if (stats.contains("decode_seconds") && record.completion_tokens > 1) {
        record.seconds_per_token =
            stats["decode_seconds"].get<double>() / (record.completion_tokens - 1);
      }
      record.rounds = stats.value("target_forwards", int64_t{0});
      record.drafted = stats.value("drafted", int64_t{0});
      record.accepted = stats.value("accepted", int64_t{0});
      line["finish"] = record.finish;
      line["cancelled"] = summary->finish == Finish::cancelled;
      line["prompt_tokens"] = record.prompt_tokens;
      line["cached_tokens"] = record.cached_tokens;
      line["completion_tokens"] = record.completion_tokens;
      line["reasoning_tokens"] = record.reasoning_tokens;
      if (stats.contains("mode")) line["mode"] = stats["mode"];
      if (stats.contains("accept_len")) line["accept_len"] = stats["accept_len"];
      if (!summary->error.empty()) line["error"] = summary->error;
    }
    owner.metrics_.record(record);
    if (owner.options_.log_requests) log_line(line);
  }

  // The last resort for an exception no handler caught: logged, and a 500 when nothing was sent.
  void log_exception(const std::string& where, const std::string& path, const std::string& what) {
    log_line({{"ts", std::time(nullptr)},
              {"event", "exception"},
              {"where", where},
              {"endpoint", path},
              {"error", what}});
  }

  static constexpr const char* kShutdownMessage =
      "the server shut down before the generation finished";

  void handle_generation(const httplib::Request& req, httplib::Response& res, Route route) {
    ActiveRequest counted(active);
    const double start = now_seconds();
    const Dialect dialect = dialect_of(route);
    const std::string id = route == Route::messages     ? random_id("msg_")
                           : route == Route::responses  ? random_id("resp_")
                           : route == Route::completion ? random_id("cmpl-")
                                                        : random_id("chatcmpl-");
    const std::string request_id = random_id("req_");
    res.set_header("request-id", request_id);
    res.set_header("x-request-id", request_id);
    ++unwritten;  // until the logger sees this response written (setup)
    std::shared_ptr<Engine> engine = current_engine();
    std::shared_ptr<Job> job;
    std::vector<std::shared_ptr<Job>> jobs;  // one per choice, or one for greedy choices
    int choices = 1;
    constexpr int kNotLookedUp = -2;
    int fd = kNotLookedUp;
    bool client_left = false;
    try {
      if (draining) throw ApiError(503, "the server is shutting down");
      if (!engine) throw ApiError(503, "Loading model");
      const Json body = parse_json_input(req.body, "the request body");
      ChatRequest request;
      switch (route) {
        case Route::chat:
          request = openai::parse_chat(body);
          break;
        case Route::completion:
          request = openai::parse_completion(body);
          break;
        case Route::messages:
        case Route::count_tokens:
          request = anthropic::parse_messages(body, route == Route::count_tokens);
          break;
        case Route::responses:
          request = responses::parse(body);
          break;
      }
      set_schema_in_order(request.response_format, req.body);
      if (request.model.empty()) request.model = engine->bundle().name;
      PreparedPrompt prompt = engine->prepare(request);
      if (route == Route::count_tokens) {
        res.set_content(dump_json(Json({{"input_tokens", prompt.ids.size()}})), "application/json");
        log_request(request_id, req.path, 200, nullptr, nullptr, start);
        return;
      }
      // A schema compile can take seconds; it stops once the client leaves or a shutdown
      // begins. The socket is looked at every 20 ms at most.
      double next_look = 0.0;
      auto abandoned = [&] {
        if (draining) return true;
        const double now = now_seconds();
        if (!client_left && now >= next_look) {
          if (fd == kNotLookedUp) fd = find_client_socket(req, port);
          next_look = now + 0.02;
          client_left = client_gone(fd);
        }
        return client_left;
      };
      choices = request.n;
      // Sampled choices run side by side, each its own generation; the copies are taken before
      // the first submit moves the request.
      std::optional<std::pair<ChatRequest, PreparedPrompt>> sibling;
      if (choices > 1) sibling.emplace(request, prompt);
      job = engine->submit(std::move(request), std::move(prompt), abandoned);
      jobs.push_back(job);
      const bool greedy = job->config.sampling.temperature <= 0.0f;
      for (int choice = 1; sibling && !greedy && choice < choices; ++choice) {
        ChatRequest copy = sibling->first;
        if (copy.sampling.seed) *copy.sampling.seed += static_cast<uint64_t>(choice);
        try {
          jobs.push_back(engine->submit(std::move(copy), sibling->second, abandoned));
        } catch (...) {
          for (const auto& submitted : jobs) submitted->cancel();
          throw;
        }
      }
    } catch (const ApiError& e) {
      send_error(res, dialect, e);
      log_request(request_id, req.path, client_left ? 499 : e.status(), nullptr, nullptr, start,
                  e.what());
      return;
    } catch (const nlohmann::json::exception& e) {
      send_error(res, dialect, ApiError(400, fmt::format("invalid request: {}", e.what())));
      log_request(request_id, req.path, 400, nullptr, nullptr, start);
      return;
    }
    if (fd == kNotLookedUp) fd = find_client_socket(req, port);
    if (!job->request.stream)
      return respond(req, res, route, jobs, choices, id, request_id, fd, start);
    // A stream's 200 goes out with its first frame, so it waits a while for the worker to take
    // the job up: a job cut while still queued (a shutdown) can then answer 503, which clients
    // retry. Past the keep-alive interval the stream starts anyway, to keep idle-timing proxies
    // in between from dropping it; a cut then ends it with an error event.
    const double stream_by = now_seconds() + owner.options_.keepalive_seconds;
    while (!job->wait_picked_up(std::chrono::milliseconds(100)) && now_seconds() < stream_by) {
      if (client_gone(fd)) {
        client_left = true;
        job->cancel();
      }
    }
    if (job->finished_unstarted()) {
      return respond(req, res, route, {job}, 1, id, request_id, fd, start, client_left);
    }
    stream(req, res, route, job, id, request_id, fd, start);
  }

  // The answer of `jobs` as one body. Each job is a choice; with OpenAI `n` > 1 and greedy
  // decoding one job ran, and its answer is every choice. Any choice that failed or was cut makes
  // the whole answer an error: a short success is never sent.
  void respond(const httplib::Request& req, httplib::Response& res, Route route,
               const std::vector<std::shared_ptr<Job>>& jobs, int choices, const std::string& id,
               const std::string& request_id, int fd, double start, bool client_left = false) {
    std::vector<std::vector<OutputEvent>> events(jobs.size());
    std::vector<std::optional<GenerationSummary>> summaries(jobs.size());
    for (size_t i = 0; i < jobs.size(); ++i) {
      while (!jobs[i]->wait(events[i], summaries[i], std::chrono::milliseconds(100))) {
        if (client_gone(fd)) {
          client_left = true;
          for (const auto& job : jobs) job->cancel();
        }
      }
    }
    const Dialect dialect = dialect_of(route);
    for (size_t i = 0; i < jobs.size(); ++i) {
      const GenerationSummary& summary = *summaries[i];
      if (summary.finish == Finish::error) {
        send_error(res, dialect, ApiError(500, summary.error));
        log_request(request_id, req.path, 500, jobs[i].get(), &summary, start);
        return;
      }
      if (summary.finish == Finish::cancelled) {
        // Nothing was sent yet: a cut answer is an error, never a short success.
        send_error(res, dialect, ApiError(503, kShutdownMessage));
        log_request(request_id, req.path, client_left ? 499 : 503, jobs[i].get(), &summary, start);
        return;
      }
    }
    Json body;
    GenerationSummary logged = *summaries[0];
    for (int choice = 0; choice < choices; ++choice) {
      const size_t i = jobs.size() == 1 ? 0 : static_cast<size_t>(choice);
      const ChatRequest& request = jobs[i]->request;
      const GenerationSummary& summary = *summaries[i];
      const ParsedOutput output = collect_events(events[i]);
      Json answer;
      switch (route) {
        case Route::chat:
          answer = openai::chat_response(request, output, summary, id);
          break;
        case Route::completion:
          answer = openai::completion_response(request, output, summary, id);
          break;
        case Route::responses:
          answer = responses::response(request, output, summary, id);
          break;
        default:
          answer = anthropic::messages_response(request, output, summary, id);
          break;
      }
      if (choice == 0) {
        body = std::move(answer);
        continue;
      }
      // OpenAI usage covers every choice; the prompt counts once.
      logged.usage.completion_tokens += summary.usage.completion_tokens;
      logged.usage.reasoning_tokens += summary.usage.reasoning_tokens;
      answer["choices"][0]["index"] = choice;
      body["choices"].push_back(std::move(answer["choices"][0]));
    }
    if (choices > 1) body["usage"] = openai::usage_json(logged.usage);
    res.set_content(dump_json(body), "application/json");
    log_request(request_id, req.path, 200, jobs[0].get(), &logged, start);
  }

  void stream(const httplib::Request& req, httplib::Response& res, Route route,
              const std::shared_ptr<Job>& job, const std::string& id, const std::string& request_id,
              int fd, double start) {
    std::shared_ptr<StreamSerializer> serializer;
    switch (route) {
      case Route::chat:
        serializer = openai::chat_stream(job->request, id);
        break;
      case Route::completion:
        serializer = openai::completion_stream(job->request, id);
        break;
      case Route::responses:
        serializer = responses::stream(job->request, id);
        break;
      default:
        serializer = anthropic::messages_stream(job->request, id);
        break;
    }
    res.set_header("Cache-Control", "no-cache");
    struct StreamState {
      bool started = false;
      bool client_left = false;
      double last_write = 0.0;
      std::optional<GenerationSummary> summary;
    };
    auto state = std::make_shared<StreamState>();
    auto counted = std::make_shared<ActiveRequest>(active);
    const double keepalive = owner.options_.keepalive_seconds;
    const std::string path = req.path;
    // HTTP/1.0 has no chunked encoding: the stream is delimited by closing the connection.
    const bool close_delimited = req.version == "HTTP/1.0";
    auto provider = [this, job, serializer, state, fd, keepalive, path, counted](
                        size_t, httplib::DataSink& sink) {
      auto write = [&](const std::string& text) {
        if (text.empty()) return true;
        state->last_write = now_seconds();
        return sink.write(text.data(), text.size());
      };
      auto client_left = [&] {
        state->client_left = true;
        job->cancel();
        return false;
      };
      try {
        if (!state->started) {
          state->started = true;
          Usage usage;
          usage.prompt_tokens = static_cast<int64_t>(job->prompt.ids.size());
          if (!write(serializer->start(usage))) return client_left();
        }
        std::vector<OutputEvent> events;
        const bool done = job->wait(events, state->summary, std::chrono::milliseconds(100));
        if (!events.empty() && !write(serializer->events(events))) return client_left();
        if (done) {
          const GenerationSummary& summary = *state->summary;
          const std::string tail =
              summary.finish == Finish::error       ? serializer->error(500, summary.error)
              : summary.finish == Finish::cancelled ? serializer->error(503, kShutdownMessage)
                                                    : serializer->finish(summary);
          write(tail);
          sink.done();
          return true;
        }
        if (client_gone(fd)) return client_left();
        if (now_seconds() - state->last_write >= keepalive && !write(serializer->keepalive())) {
          return client_left();
        }
        return true;
      } catch (const std::exception& e) {
        log_exception("stream", path, e.what());
        job->cancel();
        write(serializer->error(500, fmt::format("internal error: {}", e.what())));
        sink.done();
        return true;
      }
    };
    auto releaser = [this, job, state, path, request_id, start, fd, close_delimited](bool) {
      try {
        // The stream ended (completed or the client left): wait for the job to settle so the
        // log line and metrics see the final numbers.
        if (!state->summary) {
          job->cancel();
          std::vector<OutputEvent> ignored;
          while (!job->wait(ignored, state->summary, std::chrono::milliseconds(100))) {
          }
        }
        if (close_delimited && fd >= 0) ::shutdown(fd, SHUT_RDWR);
        const Finish finish = state->summary->finish;
        const int status = state->client_left            ? 499
                           : finish == Finish::cancelled ? 503
                           : finish == Finish::error     ? 500
                                                         : 200;
        log_request(request_id, path, status, job.get(), &*state->summary, start);
      } catch (const std::exception& e) {
        log_exception("stream end", path, e.what());
      }
    };
    if (close_delimited) {
      res.set_header("Connection", "close");
      res.set_content_provider("text/event-stream", provider, releaser);
    } else {
      res.set_chunked_content_provider("text/event-stream", provider, releaser);
    }
  }

  // A JSON-bodied utility route: parse the body, answer with `handler`'s JSON or an error in the
  // OpenAI shape (503 while loading, 400 for bad input).
  void json_route(std::string_view path,
                  std::function<Json(Engine&, const Json&, const httplib::Request&)> handler,
                  bool post) {
    auto respond = [this, handler](const httplib::Request& req, httplib::Response& res) {
      try {
        std::shared_ptr<Engine> engine = current_engine();
        if (!engine) throw ApiError(503, "Loading model");
        Json body = Json::object();
        if (!req.body.empty()) {
          body = parse_json_input(req.body, "the request body");
          if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object");
        }
        res.set_content(dump_json(handler(*engine, body, req)), "application/json");
      } catch (const ApiError& e) {
        send_error(res, Dialect::openai, e);
      } catch (const nlohmann::json::exception& e) {
        send_error(res, Dialect::openai,
                   ApiError(400, fmt::format("invalid request: {}", e.what())));
      }
    };
    if (post) {
      http.Post(route_pattern(path), respond);
    } else {
      http.Get(route_pattern(path), respond);
    }
  }

  // llama.cpp's utility routes, which some clients probe: /tokenize, /detokenize,
  // /apply-template, /props, /slots.
  void add_llama_cpp_routes() {
    json_route(
        "/tokenize",
        [](Engine& engine, const Json& body, const httplib::Request&) {
          const std::string content = json_string(body.value("content", Json()), "content");
          const bool add_special =
              body.contains("add_special") && json_bool(body["add_special"], "add_special");
          const bool with_pieces =
              body.contains("with_pieces") && json_bool(body["with_pieces"], "with_pieces");
          const Tokenizer& tokenizer = *engine.bundle().tokenizer;
          Json tokens = Json::array();
          for (int32_t id : tokenizer.encode(content, add_special)) {
            if (with_pieces) {
              tokens.push_back({{"id", id}, {"piece", tokenizer.decode({id}, false)}});
            } else {
              tokens.push_back(id);
            }
          }
          return Json({{"tokens", tokens}});
        },
        true);
    json_route(
        "/detokenize",
        [](Engine& engine, const Json& body, const httplib::Request&) {
          const Json& tokens = body.value("tokens", Json());
          if (!tokens.is_array()) throw ApiError(400, "'tokens' must be a list of token ids");
          const Tokenizer& tokenizer = *engine.bundle().tokenizer;
          std::vector<int32_t> ids;
          for (const Json& token : tokens) {
            const int64_t id = json_int(token, "tokens");
            check_in_vocabulary(id, tokenizer.vocab_size(), "tokens");
            ids.push_back(static_cast<int32_t>(id));
          }
          return Json({{"content", tokenizer.decode(ids, false)}});
        },
        true);
    json_route(
        "/apply-template",
        [](Engine& engine, const Json& body, const httplib::Request&) {
          return Json({{"prompt", engine.prepare(openai::parse_chat(body)).text}});
        },
        true);
    json_route(
        "/props",
        [](Engine& engine, const Json&, const httplib::Request&) {
          return Json({{"default_generation_settings", {{"n_ctx", engine.context_window()}}},
                       {"n_ctx", engine.context_window()},
                       {"total_slots", engine.slots()},
                       {"model_path", engine.bundle().path},
                       {"model_alias", engine.bundle().name},
                       {"chat_template", engine.bundle().chat_template},
                       {"build_info", "dspark-0.1.0"}});
        },
        false);
    json_route(
        "/slots",
        [](Engine& engine, const Json&, const httplib::Request& req) {
          const std::vector<bool> busy = engine.slots_busy();
          if (std::all_of(busy.begin(), busy.end(), [](bool b) { return b; }) &&
              req.get_param_value("fail_on_no_slot") == "1") {
            throw ApiError(503, "no slot available");
          }
          Json slots = Json::array();
          for (size_t id = 0; id < busy.size(); ++id) {
            slots.push_back(
                {{"id", id}, {"n_ctx", engine.context_window()}, {"is_processing", busy[id]}});
          }
          return slots;
        },
        false);
  }

  // What is wrong with the declared body length that must be answered before the body is read,
  // if anything: a Content-Length that is not one decimal count (repeats must agree), or one past
  // --max-body-mb that the client asks leave to send (Expect: 100-continue) or that is too large
  // to read and discard (past kDiscardedBodyLimit times the limit: 1e12 bytes would be read until
  // the read timeout). A body past the limit but within that is read and discarded by httplib
  // before its 413, so that a client that sends its whole body before reading the answer gets
  // the 413 and not a reset connection.
  static constexpr uint64_t kDiscardedBodyLimit = 16;
  std::optional<ApiError> body_length_problem(const httplib::Request& req) const {
    const size_t count = req.get_header_value_count("Content-Length");
    if (count == 0) return std::nullopt;
    const std::string value = req.get_header_value("Content-Length");
    for (size_t i = 1; i < count; ++i) {
      if (req.get_header_value("Content-Length", i) != value) {
        return ApiError(400, "the request has conflicting Content-Length headers");
      }
    }
    const bool digits =
        !value.empty() && value.size() <= 19 &&
        std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (!digits)
      return ApiError(400, fmt::format("Content-Length '{}' is not a byte count", value));
    const uint64_t length = std::stoull(value), limit = owner.options_.max_body_bytes;
    const bool expecting = req.has_header("Expect");
    if (length > limit && (expecting || length / kDiscardedBodyLimit > limit)) {
      return ApiError(413, fmt::format("the request body ({} bytes) is larger than the {}-byte "
                                       "limit (--max-body-mb)",
                                       length, limit));
    }
    return std::nullopt;
  }

  // Refuses a request whose body length is wrong, before its body is read, with Connection:
  // close; Unhandled when the length is fine.
  httplib::Server::HandlerResponse refuse_body_length(const httplib::Request& req,
                                                      httplib::Response& res) {
    const std::optional<ApiError> problem = body_length_problem(req);
    if (!problem) return httplib::Server::HandlerResponse::Unhandled;
    res.set_header("Connection", "close");
    return refuse(req, res, *problem);
  }

  // Answers `error` from the pre-routing stage and logs it.
  httplib::Server::HandlerResponse refuse(const httplib::Request& req, httplib::Response& res,
                                          const ApiError& error) {
    send_error(res, dialect_of_path(req.path), error);
    log_request("", req.path, error.status(), nullptr, nullptr, now_seconds(), error.what());
    return httplib::Server::HandlerResponse::Handled;
  }

  // Checks every request before routing: UTF-8 everywhere outside the body, the browser origin
  // (CORS), a declared body length, then the API key. Unhandled = go on to the route.
  httplib::Server::HandlerResponse pre_route(const httplib::Request& req, httplib::Response& res) {
    using Handler = httplib::Server::HandlerResponse;
    if (req.method != "GET" && req.method != "HEAD") {
      // A Range header means something for GET only (RFC 9110 §14.2); httplib would answer a
      // POST with a slice of its JSON under 206. The request is httplib's own, not a const
      // object: only the handler's view of it is const.
      const_cast<httplib::Request&>(req).ranges.clear();
    }
    const std::string bad_part = invalid_utf8_part(req);
    if (!bad_part.empty()) {
      return refuse(req, res, ApiError(400, fmt::format("{} is not valid UTF-8", bad_part)));
    }
    const std::string origin = req.get_header_value("Origin");
    if (!origin.empty()) {
      // A web page may only drive the server from an allowed origin; anything else is refused
      // outright, since a browser sends some cross-origin POSTs without asking first.
      if (!origin_allowed(origin, owner.options_.cors_origins)) {
        return refuse(req, res,
                      ApiError(403, fmt::format("origin '{}' is not allowed; start the server with "
                                                "--cors-origins to allow it",
                                                origin)));
      }
      res.set_header("Access-Control-Allow-Origin", origin);
      res.set_header("Vary", "Origin");
    }
    if (req.method == "OPTIONS") {
      if (!origin.empty()) {
        res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS, HEAD");
        res.set_header("Access-Control-Allow-Headers",
                       "authorization, content-type, x-api-key, anthropic-version, "
                       "anthropic-beta, x-stainless-arch, x-stainless-lang, "
                       "x-stainless-os, x-stainless-package-version, x-stainless-retry-count, "
                       "x-stainless-runtime, x-stainless-runtime-version, "
                       "x-stainless-timeout, anthropic-dangerous-direct-browser-access");
        res.set_header("Access-Control-Max-Age", "600");
      }
      res.status = 204;
      return Handler::Handled;
    }
    if (refuse_body_length(req, res) == Handler::Handled) return Handler::Handled;
    if (req.method == "POST" && !req.has_header("Content-Length")) {
      std::string encoding = req.get_header_value("Transfer-Encoding");
      for (auto& c : encoding) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      if (encoding.find("chunked") == std::string::npos) {
        // Without a length the body would be read until the client closes (or the read timeout).
        return refuse(req, res, ApiError(411, "a POST needs a Content-Length header"));
      }
    }
    if (endpoint_label(req.path) == "/health" || owner.options_.api_key.empty()) {
      return Handler::Unhandled;
    }
    std::string key = req.get_header_value("x-api-key");
    const std::string auth = req.get_header_value("Authorization");
    if (auth.rfind("Bearer ", 0) == 0) key = auth.substr(7);
    if (constant_time_equal(key, owner.options_.api_key)) return Handler::Unhandled;
    return refuse(req, res, ApiError(401, "invalid api key"));
  }

  void setup() {
    http.set_payload_max_length(owner.options_.max_body_bytes);
    // A body the pre-routing checks would refuse is not invited: httplib answers 100 Continue
    // before routing, so the client would send it all first.
    http.set_expect_100_continue_handler(
        [this](const httplib::Request& req, httplib::Response& res) {
          if (refuse_body_length(req, res) == httplib::Server::HandlerResponse::Unhandled)
            return 100;
          return res.status;  // httplib sends this response instead, and no body is read
        });
    http.set_read_timeout(60, 0);
    http.set_write_timeout(600, 0);
    http.set_keep_alive_timeout(2);
    http.set_keep_alive_max_count(1000);
    // httplib's default sets SO_REUSEPORT, which lets a second server bind the same busy port
    // and share its connections; SO_REUSEADDR alone only allows rebinding past TIME_WAIT.
    // httplib calls its logger once a response is written (or its write failed): a generation
    // response, the one kind carrying x-request-id, is then no longer in flight.
    http.set_logger([this](const httplib::Request&, const httplib::Response& res) {
      if (res.has_header("x-request-id")) --unwritten;
    });
    http.set_socket_options([](socket_t sock) {
      const int yes = 1;
      setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    });
    const size_t threads = owner.options_.http_threads > 0 ? owner.options_.http_threads : 1024;
    http.new_task_queue = [this, threads] {
      auto* queue = new ConnectionThreads(threads);
      connection_threads = queue;
      return queue;
    };
    http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      return pre_route(req, res);
    });
    // Runs outside httplib's exception guard, so it must not throw.
    http.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;
      try {
        const Dialect dialect = dialect_of_path(req.path);
        std::string message = res.status == 404
                                  ? fmt::format("unknown route {} {}", req.method, req.path)
                              : res.status == 413 ? "the request body is too large"
                                                  : fmt::format("HTTP error {}", res.status);
        res.set_content(dump_json(error_body(dialect, res.status, message)), "application/json");
      } catch (const std::exception& e) {
        log_exception("error handler", "", e.what());
        res.set_content(R"({"error":{"message":"internal error","type":"server_error"}})",
                        "application/json");
      }
    });
    http.set_exception_handler(
        [this](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
          const std::string message = exception_text(ep);
          res.status = 500;
          try {
            log_exception("handler", req.path, message);
            res.set_content(dump_json(error_body(dialect_of_path(req.path), 500,
                                                 fmt::format("internal error: {}", message))),
                            "application/json");
          } catch (...) {
            res.set_content(R"({"error":{"message":"internal error","type":"server_error"}})",
                            "application/json");
          }
        });

    auto route = [this](std::string_view path, Route kind) {
      http.Post(route_pattern(path),
                [this, kind](const httplib::Request& req, httplib::Response& res) {
                  handle_generation(req, res, kind);
                });
    };
    route("/chat/completions", Route::chat);
    route("/completions", Route::completion);
    route("/messages", Route::messages);
    route("/messages/count_tokens", Route::count_tokens);
    route("/responses", Route::responses);

    http.Get(route_pattern("/health"), [this](const httplib::Request&, httplib::Response& res) {
      auto engine = current_engine();
      if (!engine || draining) {
        const char* status = draining ? "shutting_down" : "loading";
        const char* message = draining ? "the server is shutting down" : "Loading model";
        res.status = 503;
        res.set_content(
            dump_json(Json(
                {{"status", status},
                 {"error", {{"code", 503}, {"message", message}, {"type", "unavailable_error"}}}})),
            "application/json");
        return;
      }
      res.set_content(dump_json(engine->health()), "application/json");
    });
    http.Get(route_pattern("/models"), [this](const httplib::Request&, httplib::Response& res) {
      auto engine = current_engine();
      Json data = Json::array();
      if (engine) {
        data.push_back({{"id", engine->bundle().name},
                        {"object", "model"},
                        {"created", std::time(nullptr)},
                        {"owned_by", "dspark"},
                        {"context_window", engine->context_window()},
                        {"max_model_len", engine->context_window()},
                        {"display_name", fmt::format("{} (dspark {})", engine->bundle().name,
                                                     engine->mode_name())}});
      }
      res.set_content(dump_json(Json({{"object", "list"}, {"data", data}})), "application/json");
    });
    http.Get(route_pattern("/metrics"), [this](const httplib::Request&, httplib::Response& res) {
      std::optional<StepCounters> batch;
      std::map<std::string, double> gauges = {
          {"dspark_resident_memory_bytes", double(current_rss_bytes())},
          {"dspark_peak_resident_memory_bytes", double(peak_rss_bytes())},
          {"dspark_model_ready", current_engine() ? 1.0 : 0.0}};
      // This handler runs on one of them, so they exist.
      if (const ConnectionThreads* threads = connection_threads.load()) {
        gauges["dspark_http_threads"] = double(threads->threads());
        gauges["dspark_http_connections_waiting"] = double(threads->waiting_jobs());
      }
      if (auto engine = current_engine()) {
        const auto cache = engine->cache_counters();
        gauges["dspark_prefix_cache_lookups"] = double(cache.lookups);
        gauges["dspark_prefix_cache_hits"] = double(cache.hits);
        gauges["dspark_prefix_cache_entries"] = double(cache.entries);
        gauges["dspark_prefix_cache_bytes"] = double(cache.bytes);
        gauges["dspark_context_window_tokens"] = double(engine->context_window());
        gauges["dspark_slots"] = double(engine->slots());
        const auto pool = engine->pool_counters();
        gauges["dspark_state_pool_capacity"] = double(pool.capacity);
        gauges["dspark_state_pool_sequences"] = double(pool.open);
        gauges["dspark_state_pool_bytes"] = double(pool.bytes);
        batch = engine->batch_counters();
      }
      res.set_content(owner.metrics_.render(gauges, batch ? &*batch : nullptr),
                      "text/plain; version=0.0.4");
    });
    add_llama_cpp_routes();
    http.Get(route_pattern("/"), [](const httplib::Request&, httplib::Response& res) {
      res.set_content(dump_json(Json({{"status", "ok"}, {"server", "dspark"}})),
                      "application/json");
    });
  }
};

Server::Server(ServerOptions options)
    : options_(std::move(options)), impl_(std::make_unique<Impl>(*this)) {
  impl_->setup();
}

Server::~Server() {
  stop();
  std::shared_ptr<Engine> engine;
  {
    std::lock_guard lock(impl_->engine_mutex);
    engine = std::move(impl_->engine);
  }
  if (engine) engine->shutdown();
}

int Server::bind() {
  if (options_.port < 0 || options_.port > 65535) {
    fail("port {} is outside 0..65535 (0 = any free port)", options_.port);
  }
  if (options_.port == 0) {
    impl_->port = impl_->http.bind_to_any_port(options_.host);
  } else if (impl_->http.bind_to_port(options_.host, options_.port)) {
    impl_->port = options_.port;
  } else {
    impl_->port = -1;
  }
  if (impl_->port <= 0) {
    fail("could not listen on {}:{}: {}", options_.host, options_.port,
         bind_failure_reason(options_.host, options_.port));
  }
  return impl_->port;
}

void Server::listen() {
  {
    std::lock_guard lock(impl_->listener_mutex);
    if (impl_->listener_stop_requested) return;
    impl_->listener_entered = true;
  }
  impl_->http.listen_after_bind();
  impl_->listener_returned = true;
}

void Server::shutdown(double grace_seconds, const std::function<bool()>& hurry) {
  const double deadline = now_seconds() + grace_seconds;
  std::shared_ptr<Engine> engine;
  {
    std::lock_guard lock(impl_->engine_mutex);
    impl_->draining = true;
    engine = impl_->engine;
  }
  while (engine && !engine->idle() && now_seconds() < deadline && !(hurry && hurry())) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // Cancels what is left; each handler notices within its 100 ms wait and sends a cut answer.
  if (engine) engine->shutdown();
  const double flush_deadline = now_seconds() + 0.5;
  while ((impl_->active > 0 || impl_->unwritten > 0) && now_seconds() < flush_deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  impl_->stop_listener();
  // Idle keep-alive connections and half-sent requests would hold their threads (and the exit)
  // for the keep-alive or read timeout; closing them ends those threads now.
  for_each_client_socket(impl_->port, [](int fd, int) {
    ::shutdown(fd, SHUT_RDWR);
    return true;
  });
}

void Server::stop() {
  {
    std::lock_guard lock(impl_->engine_mutex);
    if (impl_->engine) impl_->engine->shutdown();
  }
  impl_->stop_listener();
}

void Server::set_engine(std::unique_ptr<Engine> engine) {
  std::lock_guard lock(impl_->engine_mutex);
  if (impl_->draining) {
    engine->shutdown();  // loaded after a shutdown began: never serves
    return;
  }
  impl_->engine = std::move(engine);
}

bool origin_allowed(const std::string& origin, const std::vector<std::string>& allowed) {
  for (const char* loopback : {"http://localhost", "https://localhost", "http://127.0.0.1",
                               "https://127.0.0.1", "http://[::1]", "https://[::1]"}) {
    const std::string base = loopback;
    if (origin == base ||
        (origin.rfind(base + ":", 0) == 0 && origin.size() > base.size() + 1 &&
         origin.find_first_not_of("0123456789", base.size() + 1) == std::string::npos)) {
      return true;
    }
  }
  for (const auto& pattern : allowed) {
    if (glob_match(pattern, origin)) return true;
  }
  return false;
}

}  // namespace dspark::server
