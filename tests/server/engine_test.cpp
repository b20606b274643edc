// The engine's step loop on the default model: a generation that fails (its drafter throws while
// the slot plans its forward, or while it takes the forward's output) ends alone with an error,
// while the generations stepped beside it answer exactly what they answer alone, and the engine
// keeps serving.
#include "server/engine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "formats/model_store.h"
#include "server/metrics.h"

namespace dspark::server {
namespace {

// A drafter that drafts nothing and fails once the target has fed it a poison token:
// `feed_poison` at once, in the feed; `proposal_poison` at the next proposal. Each generation gets
// its own, which sees only that generation's tokens.
class PoisonedDrafter : public Drafter {
 public:
  PoisonedDrafter(int32_t feed_poison, int32_t proposal_poison)
      : feed_poison_(feed_poison), proposal_poison_(proposal_poison) {}
  std::string name() const override { return "poisoned"; }
  void on_target_rows(const int32_t* tokens, int64_t n, const float*) override {
    if (std::find(tokens, tokens + n, feed_poison_) != tokens + n) {
      throw std::runtime_error("poisoned feed");
    }
    if (std::find(tokens, tokens + n, proposal_poison_) != tokens + n) poisoned_ = true;
  }
  Draft propose(const DraftRequest&) override {
    if (poisoned_) throw std::runtime_error("poisoned proposal");
    return {};
  }

 private:
  int32_t feed_poison_, proposal_poison_;
  bool poisoned_ = false;
};

struct Answer {
  Finish finish = Finish::stop;
  std::string text;
  std::string error;
};

class EngineDefaultModel : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string dir = (std::filesystem::path(models_dir()) / kDefaultModelName).string();
    ASSERT_TRUE(std::filesystem::exists(dir + "/config.json"))
        << "the default model is not installed at " << dir
        << "; run scripts/install_default_model.sh";
    bundle_ = load_model_bundle(dir);
  }

  // An engine of `slots` slots whose drafters fail on the token of `feed_poison` (in the feed)
  // or of `proposal_poison` (at the next proposal).
  std::unique_ptr<Engine> engine(int slots, int32_t feed_poison, int32_t proposal_poison) {
    EngineOptions options;
    options.parallel = slots;
    options.decode.options.mode = DecodeMode::dspark;
    options.decode.options.max_draft = 2;
    options.decode.drafter = [feed_poison, proposal_poison]() -> std::unique_ptr<Drafter> {
      return std::make_unique<PoisonedDrafter>(feed_poison, proposal_poison);
    };
    return std::make_unique<Engine>(load_model_bundle(bundle_->path), options, metrics_);
  }

  ChatRequest request(const std::string& content) const {
    ChatRequest r;
    r.messages = nlohmann::ordered_json::array({{{"role", "user"}, {"content", content}}});
    r.max_tokens = 12;
    r.sampling.temperature = 0.0f;
    return r;
  }

  static Answer wait(Job& job) {
    Answer answer;
    std::vector<OutputEvent> events;
    std::optional<GenerationSummary> done;
    while (!job.wait(events, done, std::chrono::milliseconds(100))) {
    }
    for (const OutputEvent& event : events) answer.text += event.text;
    answer.finish = done->finish;
    answer.error = done->error;
    return answer;
  }

  // The one token of `word` (with its leading space) in the model's vocabulary.
  int32_t token_of(const std::string& word) const {
    const std::vector<int32_t> ids = bundle_->tokenizer->encode(" " + word, false);
    EXPECT_EQ(ids.size(), 1u) << word;
    return ids.empty() ? -1 : ids.front();
  }

  std::unique_ptr<ModelBundle> bundle_;
  Metrics metrics_;
};

TEST_F(EngineDefaultModel, AFailingGenerationEndsAloneAndTheOthersAnswerAsAlone) {
  const int32_t feed_poison = token_of("zebra"), proposal_poison = token_of("volcano");
  const std::vector<std::string> healthy = {"Name three colours.", "Count from one to five.",
                                            "Say hello politely.", "Write a short greeting."};
  const std::string fails_in_feed = "Tell me about the zebra.";
  const std::string fails_in_proposal = "Tell me about the volcano.";

  // Every request at once on 4 slots: the two poisoned ones share steps with healthy ones.
  std::vector<std::string> contents = {healthy[0],        fails_in_feed, healthy[1],
                                       fails_in_proposal, healthy[2],    healthy[3]};
  std::vector<Answer> together;
  {
    std::unique_ptr<Engine> busy = engine(4, feed_poison, proposal_poison);
    std::vector<std::shared_ptr<Job>> jobs;
    for (const std::string& content : contents) {
      ChatRequest r = request(content);
      PreparedPrompt prompt = busy->prepare(r);
      const bool poisoned = content == fails_in_feed || content == fails_in_proposal;
      const int32_t poison = content == fails_in_feed ? feed_poison : proposal_poison;
      ASSERT_EQ(std::count(prompt.ids.begin(), prompt.ids.end(), poison) > 0, poisoned) << content;
      if (!poisoned) {
        ASSERT_EQ(std::count(prompt.ids.begin(), prompt.ids.end(), feed_poison), 0) << content;
        ASSERT_EQ(std::count(prompt.ids.begin(), prompt.ids.end(), proposal_poison), 0) << content;
      }
      jobs.push_back(busy->submit(std::move(r), std::move(prompt)));
    }
    for (auto& job : jobs) together.push_back(wait(*job));
    // The engine still serves after the failures.
    ChatRequest again = request(healthy[0]);
    PreparedPrompt prompt = busy->prepare(again);
    const Answer after = wait(*busy->submit(std::move(again), std::move(prompt)));
    EXPECT_EQ(after.finish, Finish::length);
    EXPECT_EQ(after.text, together[0].text);
    EXPECT_GE(busy->batch_counters().widest, 2) << "the generations never shared a step";
  }

  // The same requests alone, one slot, one at a time.
  std::unique_ptr<Engine> lone = engine(1, feed_poison, proposal_poison);
  for (size_t i = 0; i < contents.size(); ++i) {
    ChatRequest r = request(contents[i]);
    PreparedPrompt prompt = lone->prepare(r);
    const Answer alone = wait(*lone->submit(std::move(r), std::move(prompt)));
    EXPECT_EQ(together[i].finish, alone.finish) << contents[i];
    EXPECT_EQ(together[i].text, alone.text) << contents[i];
    if (contents[i] == fails_in_feed || contents[i] == fails_in_proposal) {
      EXPECT_EQ(together[i].finish, Finish::error) << contents[i];
      const std::string expected =
          contents[i] == fails_in_feed ? "poisoned feed" : "poisoned proposal";
      EXPECT_NE(together[i].error.find("generation failed: " + expected), std::string::npos)
          << together[i].error;
    } else {
      EXPECT_EQ(together[i].finish, Finish::length) << contents[i];
      EXPECT_FALSE(together[i].text.empty()) << contents[i];
    }
  }
}

}  // namespace
}  // namespace dspark::server
