#include "engine/stop_strings.h"

#include <algorithm>

namespace dspark {

StopStringMatcher::StopStringMatcher(std::vector<std::string> stops) {
  for (auto& stop : stops) {
    if (!stop.empty()) stops_.push_back(std::move(stop));
  }
}

StopStringMatcher::Result StopStringMatcher::push(std::string_view text, bool armed) {
  Result result;
  if (stopped_) return result;
  pending_.append(text);
  // The earliest complete stop string wins.
  size_t first = std::string::npos;
  for (const auto& stop : stops_) {
    const size_t at = armed ? pending_.find(stop) : std::string::npos;
    if (at != std::string::npos && at < first) {
      first = at;
      result.matched = stop;
    }
  }
  if (first != std::string::npos) {
    result.emit = pending_.substr(0, first);
    result.stopped = true;
    stopped_ = true;
    pending_.clear();
    return result;
  }
  // Hold back the longest suffix that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const auto& stop : stops_) {
    const size_t longest = std::min(stop.size() - 1, pending_.size());
    for (size_t length = longest; length > hold; --length) {
      if (pending_.compare(pending_.size() - length, length, stop, 0, length) == 0) {
        hold = length;
        break;
      }
    }
  }
  result.emit = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return result;
}

std::string StopStringMatcher::flush() {
  std::string rest;
  rest.swap(pending_);
  return rest;
}

}  // namespace dspark
