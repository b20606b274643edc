// The HTTP front without a model (it answers before one loads): what it refuses before routing,
// and how it binds. The live-model cases are in tests/oracle/test_server_hardening.py.
#include "server/server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "base/error.h"

namespace dspark::server {
namespace {

using Json = nlohmann::json;

struct Reply {
  int status = 0;
  std::string head;
  Json body;
};

// Sends `request` raw and reads one response (headers, then Content-Length bytes of body).
Reply http_exchange(int port, const std::string& request) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  timeval timeout{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  Reply reply;
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    close(fd);
    return reply;
  }
  send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string data;
  char buffer[4096];
  while (true) {
    const size_t end = data.find("\r\n\r\n");
    if (end != std::string::npos) {
      const size_t at = data.find("Content-Length: ");
      const size_t length = at == std::string::npos ? 0 : std::stoul(data.substr(at + 16));
      if (data.size() >= end + 4 + length) {
        reply.head = data.substr(0, end);
        reply.status = std::stoi(data.substr(9, 3));
        if (length > 0) reply.body = Json::parse(data.substr(end + 4, length));
        break;
      }
    }
    const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
    if (n <= 0) break;
    data.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  return reply;
}

class ServerFront : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions options;
    options.port = 0;
    options.log_requests = false;
    options.cors_origins = {"https://app.example"};
    server_ = std::make_unique<Server>(options);
    port_ = server_->bind();
    thread_ = std::thread([this] { server_->listen(); });
    // Ready once /health answers (503: no model).
    for (int i = 0; i < 100 && http_exchange(port_, "GET /health HTTP/1.1\r\n\r\n").status != 503;
         ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  void TearDown() override {
    server_->shutdown(0);
    thread_.join();
  }
  Reply get(const std::string& target, const std::string& headers = "") {
    return http_exchange(port_, "GET " + target + " HTTP/1.1\r\nHost: x\r\n" + headers + "\r\n");
  }
  void expect_alive() { EXPECT_EQ(get("/health").body["status"], "loading"); }

  std::unique_ptr<Server> server_;
  int port_ = 0;
  std::thread thread_;
};

TEST_F(ServerFront, InvalidUtf8OutsideTheBodyIs400InTheDialectsShape) {
  Reply reply = get("/%ff");
  EXPECT_EQ(reply.status, 400);
  EXPECT_EQ(reply.body["error"]["message"], "the request path is not valid UTF-8");
  reply = get("/v1/messages/%ff");
  EXPECT_EQ(reply.status, 400);
  EXPECT_EQ(reply.body["type"], "error");
  reply = get("/health?q=%c3%28");
  EXPECT_EQ(reply.status, 400);
  EXPECT_EQ(reply.body["error"]["message"], "the query string is not valid UTF-8");
  reply = get("/health", "X-Name: \xff\r\n");
  EXPECT_EQ(reply.status, 400);
  expect_alive();
}

TEST_F(ServerFront, CorsIsForLoopbackAndListedOriginsOnly) {
  Reply reply = get("/v1/models");
  EXPECT_EQ(reply.status, 200);
  EXPECT_EQ(reply.head.find("Access-Control-Allow-Origin"), std::string::npos);
  reply = get("/v1/models", "Origin: https://evil.example\r\n");
  EXPECT_EQ(reply.status, 403);
  EXPECT_EQ(reply.head.find("Access-Control-Allow-Origin"), std::string::npos);
  for (const std::string origin : {"http://localhost:3000", "https://app.example"}) {
    reply = http_exchange(port_, "OPTIONS /v1/chat/completions HTTP/1.1\r\nOrigin: " + origin +
                                     "\r\nAccess-Control-Request-Method: POST\r\n\r\n");
    EXPECT_EQ(reply.status, 204);
    EXPECT_NE(reply.head.find("Access-Control-Allow-Origin: " + origin), std::string::npos);
  }
  expect_alive();
}

TEST_F(ServerFront, PostWithoutContentLengthIs411AtOnce) {
  const auto start = std::chrono::steady_clock::now();
  const Reply reply = http_exchange(
      port_, "POST /v1/chat/completions HTTP/1.1\r\nContent-Type: application/json\r\n\r\n{}");
  // Not the 60 s read timeout a body-less POST once waited for (loose for a busy sanitizer build).
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
  EXPECT_EQ(reply.status, 411);
  EXPECT_EQ(reply.body["error"]["message"], "a POST needs a Content-Length header");
  expect_alive();
}

TEST_F(ServerFront, ABusyPortIsAnErrorNotASharedListener) {
  ServerOptions options;
  options.port = port_;
  Server second(options);
  try {
    second.bind();
    FAIL() << "bound a busy port";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Address already in use"), std::string::npos) << e.what();
  }
  expect_alive();
}

TEST(ServerBind, PortsOutsideTheRangeAreRefused) {
  ServerOptions options;
  options.port = 99999;
  Server server(options);
  EXPECT_THROW(server.bind(), Error);
}

// A model that fails to load stops the server from another thread, often before listen() has
// started httplib's accept loop; the stop must not be lost in between (it once hung the process).
TEST(ServerBind, AStopBeforeOrWhileListenStartsEndsTheListener) {
  for (int attempt = 0; attempt < 200; ++attempt) {
    ServerOptions options;
    options.port = 0;
    Server server(options);
    server.bind();
    std::thread stopper([&] {
      if (attempt % 2 == 1) std::this_thread::sleep_for(std::chrono::microseconds(attempt * 5));
      server.shutdown(0);
    });
    auto listened = std::async(std::launch::async, [&] { server.listen(); });
    if (listened.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
      std::fprintf(stderr, "listen() outlived a stop on attempt %d\n", attempt);
      std::_Exit(1);  // the listener never returns, so neither would this test's teardown
    }
    stopper.join();
  }
}

}  // namespace
}  // namespace dspark::server
