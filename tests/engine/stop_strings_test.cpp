#include "engine/stop_strings.h"

#include <gtest/gtest.h>

#include <random>

namespace dspark {
namespace {

// Streams `text` in random pieces and returns what a client would see.
std::pair<std::string, bool> stream(const std::string& text, const std::vector<std::string>& stops,
                                    std::mt19937& rng) {
  StopStringMatcher matcher(stops);
  std::string shown;
  size_t at = 0;
  while (at < text.size()) {
    const size_t piece = 1 + rng() % 4;
    auto result = matcher.push(std::string_view(text).substr(at, piece));
    at += piece;
    shown += result.emit;
    // A partial stop string is never visible.
    for (const auto& stop : stops) {
      EXPECT_EQ(shown.find(stop), std::string::npos);
    }
    if (result.stopped) return {shown, true};
  }
  return {shown + matcher.flush(), false};
}

TEST(StopStrings, HoldsBackPartialsAndStopsAtTheEarliest) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 200; ++trial) {
    auto [shown, stopped] = stream("Hello wor</s>ld<|im_end|>tail", {"<|im_end|>", "</s>"}, rng);
    EXPECT_TRUE(stopped);
    EXPECT_EQ(shown, "Hello wor");
    auto [all, none] = stream("a <b c <|im_", {"<|im_end|>"}, rng);
    EXPECT_FALSE(none);
    EXPECT_EQ(all, "a <b c <|im_");
  }
}

// vLLM's min_tokens: a stop string completed before the minimum is text; the first one completed
// after it stops, even one that began before.
TEST(StopStrings, UnarmedStopsAreShownAsText) {
  StopStringMatcher matcher({"END", "e"});
  auto early = matcher.push("one END. Th", false);
  EXPECT_FALSE(early.stopped);
  EXPECT_EQ(early.emit, "one END. Th");
  auto straddling = matcher.push("EN", false);
  EXPECT_FALSE(straddling.stopped);
  EXPECT_EQ(straddling.emit, "");  // "EN" could still become "END"
  auto armed = matcher.push("D then", true);
  EXPECT_TRUE(armed.stopped);
  EXPECT_EQ(armed.matched, "END");
  EXPECT_EQ(armed.emit, "");
}

}  // namespace
}  // namespace dspark
