#pragma once
// Errors from the hub module carry a kind, so that callers can tell "this repo does not exist"
// (a drafter that is simply not published) from failures the user must fix or retry.
#include <string>

#include "base/error.h"

namespace dspark {

enum class HubErrorKind {
  kNotFound,      // the repo, revision or file does not exist (or is hidden without a token)
  kUnauthorized,  // 401/403: missing or rejected HF_TOKEN
  kGated,         // the repo requires accepting its conditions
  kOffline,       // not in the cache and HF_HUB_OFFLINE forbids the network
  kNetwork,       // endpoint unreachable, connection dropped too often, server errors
  kCorrupt,       // size or checksum differs from the hub's metadata
  kDiskFull,
  kNoWeights,    // the repo holds nothing dspark can load
  kInterrupted,  // Ctrl-C or a caller's cancel flag
  kInvalid,      // malformed repo id, revision, URL or hub answer
};

class HubError : public Error {
 public:
  HubError(HubErrorKind kind, const std::string& message) : Error(message), kind_(kind) {}
  HubErrorKind kind() const { return kind_; }

 private:
  HubErrorKind kind_;
};

template <typename... Args>
[[noreturn]] void fail_hub(HubErrorKind kind, fmt::format_string<Args...> format, Args&&... args) {
  throw HubError(kind, fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace dspark
