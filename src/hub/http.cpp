#include "hub/http.h"

#include <httplib.h>

#include <cctype>
#include <exception>

namespace dspark {
namespace {

constexpr int kMaxRedirects = 10;
constexpr size_t kMaxErrorBody = 64 * 1024;
constexpr int kConnectTimeoutSeconds = 10;
constexpr int kReadTimeoutSeconds = 30;

bool is_redirect(int status) {
  return status == 301 || status == 302 || status == 303 || status == 307 || status == 308;
}

bool is_transient(int status) {
  return status == 408 || status == 429 || status >= 500;
}

struct Exchange {
  int status = -1;
  httplib::Headers headers;
  std::string url;  // the URL that gave the final answer
  httplib::Error error = httplib::Error::Success;
  std::string error_body;
};

// One GET, following redirects; `on_success` sees a 2xx answer's headers before its body goes
// to `on_data`. Exceptions from the callbacks are carried past httplib and rethrown here.
Exchange get(const HubSettings& settings, std::string url, const httplib::Headers& extra_headers,
             const std::function<void(const Exchange&)>& on_success,
             const std::function<bool(const char*, size_t)>& on_data,
             const std::function<bool()>& stop) {
  const std::string hub_origin = parse_url(settings.endpoint).origin();
  for (int hop = 0; hop <= kMaxRedirects; ++hop) {
    const Url parsed = parse_url(url);
    httplib::Client client(parsed.origin());
    client.set_connection_timeout(kConnectTimeoutSeconds);
    client.set_read_timeout(kReadTimeoutSeconds);
    client.set_follow_location(false);
    client.set_url_encode(false);
    client.set_decompress(false);
    client.set_keep_alive(false);

    httplib::Headers headers = extra_headers;
    headers.emplace("User-Agent", "dspark/0.1");
    // Sizes and ranges must be those of the file itself, never of a compressed rendition.
    headers.emplace("Accept-Encoding", "identity");
    if (!settings.token.empty() && parsed.origin() == hub_origin) {
      headers.emplace("Authorization", "Bearer " + settings.token);
    }

    Exchange exchange;
    exchange.url = url;
    std::exception_ptr callback_error;
    auto on_response = [&](const httplib::Response& response) {
      exchange.status = response.status;
      exchange.headers = response.headers;
      if (response.status / 100 == 2 && on_success) {
        try {
          on_success(exchange);
        } catch (...) {
          callback_error = std::current_exception();
          return false;
        }
      }
      return true;
    };
    auto on_body = [&](const char* data, size_t size) {
      if (exchange.status / 100 != 2) {
        if (exchange.error_body.size() < kMaxErrorBody) exchange.error_body.append(data, size);
        return true;
      }
      if (stop && stop()) return false;
      try {
        return on_data(data, size);
      } catch (...) {
        callback_error = std::current_exception();
        return false;
      }
    };
    const httplib::Result result = client.Get(parsed.target, headers, on_response, on_body);
    if (callback_error) std::rethrow_exception(callback_error);
    exchange.error = result.error();
    if (exchange.error != httplib::Error::Success) return exchange;
    if (!is_redirect(exchange.status)) return exchange;
    const auto location = exchange.headers.find("Location");
    if (location == exchange.headers.end()) return exchange;
    url = resolve_location(url, location->second);
  }
  fail_hub(HubErrorKind::kNetwork, "more than {} redirects starting from {}", kMaxRedirects, url);
}

// httplib's error names, in words that say what happened to the transfer.
std::string describe(httplib::Error error) {
  switch (error) {
    case httplib::Error::Connection:
      return "connection failed";
    case httplib::Error::ConnectionTimeout:
      return "connection timed out";
    case httplib::Error::Read:
      return "connection dropped or timed out while reading";
    case httplib::Error::Write:
      return "connection dropped while sending";
    case httplib::Error::SSLConnection:
      return "TLS handshake failed";
    default:
      return httplib::to_string(error);
  }
}

std::string header(const Exchange& exchange, const std::string& name) {
  const auto found = exchange.headers.find(name);
  return found == exchange.headers.end() ? "" : found->second;
}

HubFailure failure_of(const Exchange& exchange) {
  return {exchange.status, header(exchange, "X-Error-Code"), header(exchange, "X-Error-Message"),
          exchange.url};
}

[[noreturn]] void fail_unreachable(const HubSettings& settings, const Exchange& exchange,
                                   const std::string& what) {
  if (exchange.error == httplib::Error::SSLServerVerification) {
    fail_hub(HubErrorKind::kNetwork,
             "{}: the TLS certificate of {} could not be verified (if a proxy re-signs traffic, "
             "point SSL_CERT_FILE at its CA bundle)",
             what, parse_url(exchange.url).host);
  }
  fail_hub(HubErrorKind::kNetwork,
           "{}: cannot reach {} ({}); check the network, or set HF_HUB_OFFLINE=1 to use only "
           "models already in the cache ({})",
           what, exchange.url, describe(exchange.error), settings.cache_dir);
}

}  // namespace

std::string Url::origin() const {
  return scheme + "://" + host + ":" + std::to_string(port);
}

Url parse_url(const std::string& url) {
  Url parsed;
  const size_t scheme_end = url.find("://");
  if (scheme_end == std::string::npos) {
    fail_hub(HubErrorKind::kInvalid, "'{}' is not an absolute http(s) URL", url);
  }
  parsed.scheme = url.substr(0, scheme_end);
  for (char& c : parsed.scheme) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (parsed.scheme != "http" && parsed.scheme != "https") {
    fail_hub(HubErrorKind::kInvalid, "'{}': only http and https URLs are supported", url);
  }
  const size_t authority_start = scheme_end + 3;
  size_t target_start = url.find_first_of("/?#", authority_start);
  if (target_start == std::string::npos) target_start = url.size();
  std::string authority = url.substr(authority_start, target_start - authority_start);
  if (const size_t at = authority.rfind('@'); at != std::string::npos) {
    authority = authority.substr(at + 1);  // user:password@ never reaches the server here
  }
  size_t port_colon = authority.rfind(':');
  if (port_colon != std::string::npos && authority.find(']', port_colon) != std::string::npos) {
    port_colon = std::string::npos;  // a colon inside an [IPv6] literal
  }
  parsed.host = authority.substr(0, port_colon);
  parsed.port = parsed.scheme == "https" ? 443 : 80;
  if (port_colon != std::string::npos) {
    const std::string port = authority.substr(port_colon + 1);
    if (port.empty() || port.size() > 5 ||
        port.find_first_not_of("0123456789") != std::string::npos || std::stoi(port) > 65535) {
      fail_hub(HubErrorKind::kInvalid, "'{}': invalid port '{}'", url, port);
    }
    parsed.port = std::stoi(port);
  }
  if (parsed.host.empty()) fail_hub(HubErrorKind::kInvalid, "'{}': no host", url);
  parsed.target = url.substr(target_start);
  if (const size_t fragment = parsed.target.find('#'); fragment != std::string::npos) {
    parsed.target.resize(fragment);
  }
  if (parsed.target.empty() || parsed.target.front() != '/') parsed.target = "/" + parsed.target;
  return parsed;
}

std::string resolve_location(const std::string& base_url, const std::string& location) {
  if (location.find("://") != std::string::npos) return location;
  const Url base = parse_url(base_url);
  if (location.rfind("//", 0) == 0) return base.scheme + ":" + location;
  // scheme://authority of the base, exactly as written.
  const size_t authority_start = base_url.find("://") + 3;
  const std::string origin =
      base_url.substr(0, std::min(base_url.find_first_of("/?#", authority_start), base_url.size()));
  if (!location.empty() && location.front() == '/') return origin + location;
  // A relative reference replaces the last segment of the base path.
  std::string path = base.target.substr(0, base.target.find('?'));
  path = path.substr(0, path.rfind('/') + 1);
  return origin + path + location;
}

std::string percent_encode(const std::string& text, bool keep_slash) {
  static const char* kHex = "0123456789ABCDEF";
  std::string encoded;
  for (unsigned char c : text) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' ||
        (keep_slash && c == '/')) {
      encoded += static_cast<char>(c);
    } else {
      encoded += '%';
      encoded += kHex[c >> 4];
      encoded += kHex[c & 15];
    }
  }
  return encoded;
}

std::optional<std::string> next_page_link(const std::string& link_header) {
  size_t start = 0;
  while (start < link_header.size()) {
    // Entries are "<url>; rel=\"next\"" separated by commas; URLs are inside <>.
    const size_t open = link_header.find('<', start);
    if (open == std::string::npos) break;
    const size_t close = link_header.find('>', open);
    if (close == std::string::npos) break;
    const size_t end = std::min(link_header.find(",", close), link_header.size());
    const std::string params = link_header.substr(close + 1, end - close - 1);
    if (params.find("rel=\"next\"") != std::string::npos ||
        params.find("rel=next") != std::string::npos) {
      return link_header.substr(open + 1, close - open - 1);
    }
    start = end + 1;
  }
  return std::nullopt;
}

HubError hub_error_for(const HubFailure& failure, const std::string& what,
                       const HubSettings& settings) {
  const bool has_token = !settings.token.empty();
  const std::string& code = failure.error_code;
  auto error = [](HubErrorKind kind, const std::string& message) {
    return HubError(kind, message);
  };
  if (code == "RevisionNotFound") {
    return error(HubErrorKind::kNotFound,
                 fmt::format("{}: revision not found on {}", what, settings.endpoint));
  }
  if (code == "EntryNotFound") {
    return error(HubErrorKind::kNotFound,
                 fmt::format("{}: file not found ({})", what, failure.url));
  }
  if (code == "GatedRepo") {
    return error(HubErrorKind::kGated,
                 fmt::format("{} is a gated repo: request access on its page on {}, then set "
                             "HF_TOKEN to a token of an account that has access{}",
                             what, settings.endpoint,
                             has_token ? " (the current HF_TOKEN's account has no access)" : ""));
  }
  if (failure.status == 401 &&
      failure.error_message == "Invalid credentials in Authorization header") {
    return error(HubErrorKind::kUnauthorized,
                 fmt::format("{}: the hub rejected HF_TOKEN (invalid credentials); set HF_TOKEN "
                             "to a valid token, or unset it for public repos",
                             what));
  }
  if (code == "RepoNotFound" || failure.status == 404) {
    return error(HubErrorKind::kNotFound,
                 fmt::format("{}: repository not found on {}{}", what, settings.endpoint,
                             has_token ? " (or HF_TOKEN has no access to it)"
                                       : " (if it is private or gated, set HF_TOKEN)"));
  }
  if (failure.status == 401 || failure.status == 403) {
    const std::string detail = failure.error_message.empty() ? "" : ": " + failure.error_message;
    return error(HubErrorKind::kUnauthorized,
                 fmt::format("{}: access denied (HTTP {}{}); {}", what, failure.status, detail,
                             has_token ? "HF_TOKEN's account has no access to this repo"
                                       : "set HF_TOKEN to a token with access to this repo"));
  }
  if (is_transient(failure.status)) {
    return error(HubErrorKind::kNetwork, fmt::format("{}: the hub answered HTTP {} for {}; try "
                                                     "again later",
                                                     what, failure.status, failure.url));
  }
  return error(HubErrorKind::kInvalid,
               fmt::format("{}: unexpected HTTP {} from {}{}", what, failure.status, failure.url,
                           failure.error_message.empty() ? "" : ": " + failure.error_message));
}

nlohmann::json HubHttp::get_json(const std::string& url, const std::string& what,
                                 std::optional<std::string>* next_page) const {
  std::string body;
  const Exchange exchange = get(
      settings_, url, {}, nullptr,
      [&](const char* data, size_t size) {
        body.append(data, size);
        return true;
      },
      nullptr);
  if (exchange.error != httplib::Error::Success) fail_unreachable(settings_, exchange, what);
  if (exchange.status != 200) throw hub_error_for(failure_of(exchange), what, settings_);
  if (next_page != nullptr) *next_page = next_page_link(header(exchange, "Link"));
  try {
    return nlohmann::json::parse(body);
  } catch (const nlohmann::json::exception& e) {
    fail_hub(HubErrorKind::kInvalid, "{}: invalid JSON from {}: {}", what, exchange.url, e.what());
  }
}

HubHttp::StreamResult HubHttp::stream(const std::string& url, int64_t offset,
                                      const std::string& what, const StreamHandler& handler) const {
  httplib::Headers headers;
  if (offset > 0) headers.emplace("Range", "bytes=" + std::to_string(offset) + "-");
  auto on_success = [&](const Exchange& exchange) {
    int64_t start = 0;
    if (exchange.status == 206) {
      // "bytes <first>-<last>/<total>": data must continue exactly where the file stops.
      const std::string range = header(exchange, "Content-Range");
      const size_t space = range.find(' ');
      const size_t dash = range.find('-');
      if (space == std::string::npos || dash == std::string::npos ||
          std::stoll(range.substr(space + 1, dash - space - 1)) != offset) {
        fail_hub(HubErrorKind::kCorrupt, "{}: asked {} for bytes {}- but got '{}'", what,
                 exchange.url, offset, range);
      }
      start = offset;
    }
    handler.begin(start);
  };
  const Exchange exchange = get(settings_, url, headers, on_success, handler.data, handler.stop);
  StreamResult result;
  if (exchange.error == httplib::Error::Canceled) {
    result.outcome = StreamOutcome::kStopped;
    return result;
  }
  if (exchange.error != httplib::Error::Success) {
    // Failing to connect at all is not something retrying a range will cure quickly, but a
    // flaky link is: the caller retries a few times either way.
    result.outcome = StreamOutcome::kDropped;
    result.detail = describe(exchange.error);
    if (exchange.status < 0 && exchange.error != httplib::Error::Read &&
        exchange.error != httplib::Error::Write) {
      result.detail += " connecting to " + exchange.url;
    }
    return result;
  }
  if (exchange.status / 100 == 2) return result;
  if (is_transient(exchange.status)) {
    result.outcome = StreamOutcome::kDropped;
    result.detail = "HTTP " + std::to_string(exchange.status) + " from " + exchange.url;
    return result;
  }
  if (exchange.status == 416) {
    fail_hub(HubErrorKind::kCorrupt,
             "{}: {} holds fewer than {} bytes, less than the hub's listing says", what,
             exchange.url, offset);
  }
  throw hub_error_for(failure_of(exchange), what, settings_);
}

}  // namespace dspark
