#pragma once
// Stop strings over streamed text. Text that could still be the start of a stop string is held
// back, so a client never sees part of a stop string; when one completes, everything before it is
// released and generation ends.
#include <string>
#include <string_view>
#include <vector>

namespace dspark {

class StopStringMatcher {
 public:
  explicit StopStringMatcher(std::vector<std::string> stops);

  struct Result {
    std::string emit;      // text safe to show now
    bool stopped = false;  // a stop string completed; `emit` ends right before it
    std::string matched;   // the stop string that completed
  };

  // Adds newly decoded text. While `armed` is false (vLLM's min_tokens not yet reached) a stop
  // string that completes is shown as text; one that completes once armed stops, even when it
  // began before.
  Result push(std::string_view text, bool armed = true);
  // End of generation without a stop: releases what was held back.
  std::string flush();

 private:
  std::vector<std::string> stops_;
  std::string pending_;
  bool stopped_ = false;
};

}  // namespace dspark
