#pragma once
// The HTTP front of `dspark serve`: routes (with and without /v1, query strings ignored), CORS
// for loopback origins (others on request) answered before auth, API-key auth, per-dialect error
// bodies, SSE streams with keep-alives, client-disconnect detection (queued, prefill, decode;
// streaming or not), metrics and one JSON log line per request. Untrusted input is checked before
// anything recursive touches it (json_input.h) and no exception leaves a handler. The model loads
// after the server starts listening: until then /health answers 503 and generation routes 503.
// A shutdown drains for a grace period, then cancels; cut answers say so (503 or an error event).
#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "server/engine.h"
#include "server/metrics.h"

namespace dspark::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string api_key;  // empty = no auth
  double keepalive_seconds = 10.0;
  size_t max_body_bytes = 8 * 1024 * 1024;
  int http_threads = 0;  // connections served at once (server/connection_threads.h); 0 = 1024
  bool log_requests = true;
  // Browser origins allowed besides loopback ones (http://localhost:*, 127.0.0.1, [::1]): exact
  // origins or patterns with '*' wildcards ("*" = any). A request from any other origin gets 403.
  std::vector<std::string> cors_origins;
};

// Whether a browser Origin may use the server: loopback origins always, others when they match
// one of `allowed` ('*' matches any run of characters).
bool origin_allowed(const std::string& origin, const std::vector<std::string>& allowed);

class Server {
 public:
  explicit Server(ServerOptions options);
  ~Server();

  // Binds (port 0 = an ephemeral port); returns the bound port. Throws when binding fails.
  int bind();
  // Serves until stop() or shutdown(), returning at once when one came first; call from one
  // thread.
  void listen();
  // Refuses new generations (503), lets queued and running ones finish for up to `grace_seconds`
  // (less once `hurry` says so), cancels what is left, lets the cut answers go out (at most about
  // half a second) and stops listening.
  void shutdown(double grace_seconds, const std::function<bool()>& hurry = nullptr);
  // Cancels everything and stops listening at once.
  void stop();

  // Hands the loaded engine over; from then on the server is ready.
  void set_engine(std::unique_ptr<Engine> engine);
  Metrics& metrics() { return metrics_; }

 private:
  struct Impl;
  ServerOptions options_;
  Metrics metrics_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dspark::server
