#include "engine/output_text.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace dspark {
namespace {

const Tokenizer& qwen3() {
  static const Tokenizer tokenizer =
      Tokenizer::from_file(std::string(DSPARK_PUBLIC_FIXTURES) + "/qwen3/tokenizer.json");
  return tokenizer;
}

struct Shown {
  std::string text;
  bool stopped = false;
  std::string matched;
};

Shown show(const std::string& written, bool skip_special, const std::vector<std::string>& stops) {
  OutputText output(qwen3(), skip_special, {}, stops);
  Shown shown;
  for (const int32_t id : qwen3().encode(written, false)) {
    const OutputText::Step step = output.push(id);
    shown.text += step.shown.emit;
    if (step.shown.stopped) {
      shown.stopped = true;
      shown.matched = step.shown.matched;
      return shown;
    }
  }
  shown.text += output.finish();
  return shown;
}

TEST(OutputText, AStopStringSpellingASkippedSpecialTokenStopsAtIt) {
  const std::string written = "Hello<|im_start|>user\nmore";
  for (const bool skip : {true, false}) {
    const Shown shown = show(written, skip, {"<|im_start|>"});
    EXPECT_EQ(shown.text, "Hello") << skip;
    EXPECT_TRUE(shown.stopped);
    EXPECT_EQ(shown.matched, "<|im_start|>");
  }
  // Without the stop, the skipped token is simply not shown.
  EXPECT_EQ(show(written, true, {}).text, "Hellouser\nmore");
  EXPECT_EQ(show(written, false, {}).text, written);
  // A stop string reaching past the special token is matched in the shown text only.
  EXPECT_FALSE(show(written, true, {"<|im_start|>user"}).stopped);
  EXPECT_TRUE(show(written, false, {"<|im_start|>user"}).stopped);
  // An ordinary stop string before the special one still wins.
  const Shown earlier = show(written, true, {"<|im_start|>", "ll"});
  EXPECT_EQ(earlier.text, "He");
  EXPECT_EQ(earlier.matched, "ll");
}

TEST(OutputText, HeldBackTextComesOutAtTheStopAndAtTheEnd) {
  // "a\n" is held back as a possible start of "\n\n"; the special stop releases it.
  Shown shown = show("a\n<|im_start|>b", true, {"\n\n", "<|im_start|>"});
  EXPECT_EQ(shown.text, "a\n");
  EXPECT_EQ(shown.matched, "<|im_start|>");
  // The end of a generation without a stop releases it too.
  shown = show("a\n", true, {"\n\n"});
  EXPECT_EQ(shown.text, "a\n");
  EXPECT_FALSE(shown.stopped);
}

}  // namespace
}  // namespace dspark
