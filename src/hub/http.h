#pragma once
// The HTTP side of the hub: URLs, the hub's JSON API and streaming file bodies, with redirects
// followed by hand so that the token never leaves the hub's origin (CDN redirects carry signed
// URLs of their own), and with the hub's status codes turned into HubErrors that say what to do.
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "hub/hub_error.h"
#include "hub/settings.h"

namespace dspark {

struct Url {
  std::string scheme;  // "http" or "https"
  std::string host;
  int port = 0;
  std::string target;  // path and query, starting with '/'

  std::string origin() const;  // "scheme://host:port"
};

// Throws HubError(kInvalid) naming the URL when it is not an absolute http(s) URL.
Url parse_url(const std::string& url);
// The absolute URL a redirect's Location names, relative to the URL that answered.
std::string resolve_location(const std::string& base_url, const std::string& location);
// Percent-encodes everything but RFC 3986 unreserved characters (and '/' when keep_slash).
std::string percent_encode(const std::string& text, bool keep_slash);
// The rel="next" URL of a Link header (the hub's pagination), if any.
std::optional<std::string> next_page_link(const std::string& link_header);

// The hub's answer to a failed request, as huggingface_hub reads it: the status plus the
// X-Error-Code / X-Error-Message headers.
struct HubFailure {
  int status = 0;
  std::string error_code;
  std::string error_message;
  std::string url;
};

// The error a failure means for `what` (a repo id, with the revision or file concerned).
HubError hub_error_for(const HubFailure& failure, const std::string& what,
                       const HubSettings& settings);

class HubHttp {
 public:
  explicit HubHttp(HubSettings settings) : settings_(std::move(settings)) {}

  // GETs a hub API URL and parses its JSON; `next_page` receives the pagination link, if any.
  // `what` names the repo (and revision) in error messages.
  nlohmann::json get_json(const std::string& url, const std::string& what,
                          std::optional<std::string>* next_page = nullptr) const;

  struct StreamHandler {
    // Called once the body starts, with the byte offset its first byte has in the file: the
    // requested offset for a 206 answer, 0 when the server ignored the Range and sent it all.
    std::function<void(int64_t start)> begin;
    // Receives the body; returns false to stop.
    std::function<bool(const char* data, size_t size)> data;
    // Polled between chunks: true stops the transfer.
    std::function<bool()> stop;
  };
  enum class StreamOutcome { kComplete, kDropped, kStopped };
  struct StreamResult {
    StreamOutcome outcome = StreamOutcome::kComplete;
    std::string detail;  // why a transfer was dropped
  };
  // Streams a file from byte `offset` (a Range request when > 0). A dropped connection, a
  // timeout or a 5xx/429 answer comes back as kDropped for the caller to resume; other failures
  // throw.
  StreamResult stream(const std::string& url, int64_t offset, const std::string& what,
                      const StreamHandler& handler) const;

  const HubSettings& settings() const { return settings_; }

 private:
  HubSettings settings_;
};

}  // namespace dspark
