#pragma once
// The HTTP front of `dspark serve`: routes (with and without /v1, query strings ignored), CORS
// answered before auth, API-key auth, per-dialect error bodies, SSE streams with keep-alives,
// client-disconnect detection (queued, prefill, decode; streaming or not), metrics and one JSON
// log line per request. The model loads after the server starts listening: until then /health
// answers 503 and generation routes 503.
#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include "server/engine.h"
#include "server/metrics.h"

namespace dspark::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string api_key;  // empty = no auth
  double keepalive_seconds = 10.0;
  size_t max_body_bytes = 8 * 1024 * 1024;
  int http_threads = 0;  // 0 = derived from the queue size
  bool log_requests = true;
};

class Server {
 public:
  explicit Server(ServerOptions options);
  ~Server();

  // Binds (port 0 = an ephemeral port); returns the bound port. Throws when binding fails.
  int bind();
  // Serves until stop(); call from one thread.
  void listen();
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
