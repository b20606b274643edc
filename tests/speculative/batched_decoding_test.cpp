// Concurrent generations through one ForwardBatcher: every generation, plain or speculative with
// any drafter, greedy or sampled, returns exactly what it returns alone, while the steps really do
// carry several sequences at once.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <functional>
#include <latch>
#include <random>
#include <thread>

#include "engine/forward_batcher.h"
#include "formats/model_store.h"
#include "spec_models.h"
#include "speculative/cap.h"
#include "speculative/decode.h"
#include "test_drafters.h"

namespace dspark {
namespace {

struct Case {
  std::vector<int32_t> prompt;
  int64_t max_tokens = 0;
  float temperature = 0.0f;
  int drafter = -1;  // -1 plain, else testing::make_drafter's kind
  int cap = 0;
};

std::vector<Case> mixed_cases(int64_t vocab) {
  std::mt19937 rng(5);
  std::vector<Case> cases;
  const int drafters[] = {-1, -1, 0, 1, 2, 3, 0, -1};
  for (int i = 0; i < 8; ++i) {
    Case c;
    for (int t = 0; t < 4 + 3 * i; ++t) c.prompt.push_back(static_cast<int32_t>(rng() % vocab));
    if (i == 5) c.prompt = {5, 6, 7, 8, 5, 6, 7, 8, 5, 6};  // lookup drafts hit
    c.max_tokens = 9 + 3 * i;
    c.temperature = i % 3 == 1 ? 1.0f : 0.0f;
    c.drafter = drafters[i];
    c.cap = 1 + i % 4;
    cases.push_back(std::move(c));
  }
  return cases;
}

// The plain continuation the always-right drafter proposes.
std::vector<int32_t> plain_continuation(const Model& model, const Case& c) {
  ModelState state = model.new_state();
  GenerationConfig config;
  config.max_tokens = c.max_tokens;
  std::vector<int32_t> full = c.prompt;
  const GenerationResult plain =
      generate_plain(model, c.prompt, state, config, [](const CommittedToken&) { return true; });
  full.insert(full.end(), plain.tokens.begin(), plain.tokens.end());
  return full;
}

// A fixed cap that remembers the most generations the loop said were sharing the steps.
class LoadRecordingCap : public FixedCap {
 public:
  LoadRecordingCap(int cap, std::atomic<int>& most) : FixedCap(cap), most_(most) {}
  void on_load(int sequences) override {
    int seen = most_.load();
    while (sequences > seen && !most_.compare_exchange_weak(seen, sequences)) {
    }
  }

 private:
  std::atomic<int>& most_;
};

std::atomic<int> most_load{0};

// Runs body(0 .. n-1) on n threads, each a member of `batcher` from before any of them starts.
void run_together(ForwardBatcher& batcher, size_t n, const std::function<void(size_t)>& body) {
  std::latch joined(static_cast<std::ptrdiff_t>(n));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      ForwardBatcher::Membership membership(batcher);
      joined.arrive_and_wait();
      body(i);
    });
  }
  for (std::thread& thread : threads) thread.join();
}

// `full`: the prompt and its plain continuation, for the always-right drafter.
std::vector<int32_t> generate_case(const Model& model, const Case& c,
                                   const std::vector<int32_t>& full, ForwardBatcher* batcher) {
  GenerationConfig config;
  config.max_tokens = c.max_tokens;
  config.sampling.temperature = c.temperature;
  config.sampling.seed = 1234 + c.max_tokens;
  DecodeSetup setup;
  setup.batcher = batcher;
  if (c.drafter >= 0) {
    setup.options.mode = DecodeMode::dspark;
    setup.options.max_draft = c.cap;
    setup.cap_policy = [&c](const DecodeOptions&) -> std::unique_ptr<CapPolicy> {
      return std::make_unique<LoadRecordingCap>(c.cap, most_load);
    };
    setup.drafter = [&, full] {
      return testing::make_drafter(c.drafter, full, model.vocab_size(), 77, c.cap);
    };
  }
  ModelState state = model.new_state();
  return run_generation(model, c.prompt, state, config, setup,
                        [](const CommittedToken&) { return true; })
      .tokens;
}

class BatchedDecoding : public ::testing::TestWithParam<std::string> {};

TEST_P(BatchedDecoding, EveryGenerationEqualsItsLoneRun) {
  testing::TinyCheckpoint checkpoint(41);
  if (GetParam() == "llama") {
    testing::fill_llama(checkpoint);
  } else {
    testing::fill_nemotron(checkpoint, GetParam());
  }
  const std::string dir = testing::write_stored(checkpoint, testing::Storage::q4, "batched");
  auto model = load_model(dir);
  const std::vector<Case> cases = mixed_cases(model->vocab_size());
  most_load = 0;
  std::vector<std::vector<int32_t>> alone, full;
  for (const Case& c : cases) {
    full.push_back(plain_continuation(*model, c));
    alone.push_back(generate_case(*model, c, full.back(), nullptr));
  }
  EXPECT_EQ(most_load.load(), 0) << "alone, nothing reports a load";

  // A grace long enough that every step waits for every member: the steps are then as wide as
  // the running generations, whatever the scheduling.
  ForwardBatcher batcher(*model, std::chrono::seconds(30));
  std::vector<std::vector<int32_t>> together(cases.size());
  run_together(batcher, cases.size(),
               [&](size_t i) { together[i] = generate_case(*model, cases[i], full[i], &batcher); });
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(together[i], alone[i]) << "generation " << i;
    EXPECT_EQ(static_cast<int64_t>(together[i].size()), cases[i].max_tokens) << "generation " << i;
  }
  // The loop reports the load to the cap policy (which the derived cap and the controller use).
  EXPECT_EQ(most_load.load(), static_cast<int>(cases.size()));
  const StepCounters counters = batcher.counters();
  EXPECT_EQ(counters.widest, static_cast<int64_t>(cases.size()));
  EXPECT_GT(counters.sequence_forwards, 3 * counters.steps);
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Models, BatchedDecoding, ::testing::Values("M*EMEM-", "llama"));

// Under load the derived caps come from one draft scheduler (speculative/draft_scheduler.h). On
// costs where a verify row costs a twentieth of a step, a draft pays while its survival is above
// about a tenth: the always-right drafters draft nearly the full block every step, the random
// ones, once their misses show, a draft now and then; every answer still equals its lone run.
TEST(ScheduledCaps, ConfidentGenerationsTakeTheDraftBudget) {
  testing::TinyCheckpoint checkpoint(43);
  testing::fill_nemotron(checkpoint, "M*EM");
  auto model = load_model(checkpoint.write());
  CostCurves curves;
  for (int w = 1; w <= 16; ++w) curves.verify_ms.push_back(10.0 + 0.5 * (w - 1));
  const CapPolicyFactory caps = make_cap_policy_factory(curves, 7, false);
  std::mt19937 rng(9);
  const int kinds[] = {0, 2, 0, 2};
  std::vector<Case> cases;
  std::vector<std::vector<int32_t>> full;
  for (int kind : kinds) {
    Case c;
    for (int t = 0; t < 6; ++t)
      c.prompt.push_back(static_cast<int32_t>(rng() % model->vocab_size()));
    c.max_tokens = 60;
    c.drafter = kind;
    full.push_back(plain_continuation(*model, c));
    cases.push_back(std::move(c));
  }
  ForwardBatcher batcher(*model, std::chrono::seconds(30));
  std::vector<GenerationResult> results(cases.size());
  std::vector<DecodeStats> stats(cases.size());
  run_together(batcher, cases.size(), [&](size_t i) {
    GenerationConfig config;
    config.max_tokens = cases[i].max_tokens;
    DecodeSetup setup;
    setup.batcher = &batcher;
    setup.options.mode = DecodeMode::dspark;
    setup.cap_policy = caps;
    setup.drafter = [&, i] {
      return testing::make_drafter(cases[i].drafter, full[i], model->vocab_size(), 77, 7);
    };
    ModelState state = model->new_state();
    results[i] = run_generation(
        *model, cases[i].prompt, state, config, setup, [](const CommittedToken&) { return true; },
        &stats[i]);
  });
  double confident = 0.0, doubtful = 0.0;  // the most drafts per target step of each kind
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::vector<int32_t> plain(full[i].begin() + cases[i].prompt.size(), full[i].end());
    EXPECT_EQ(results[i].tokens, plain) << "generation " << i;
    const SpeculativeStats& s = stats[i].speculative;
    const double per_step = double(s.drafted) / double(s.rounds + s.plain_steps);
    double& most = cases[i].drafter == 0 ? confident : doubtful;
    most = std::max(most, per_step);
  }
  EXPECT_GT(confident, 4 * doubtful) << confident << " vs " << doubtful;
}

// The --lookup-drafts pre-step's own policy: told the load and each verified lookup round, it
// caps the lookup drafts (0 skips the pre-step), and the answer stays plain decoding's.
struct LookupRecord {
  int most_load = 0, verified = 0, most_drafted = 0;
};

class LookupRecordingCap : public FixedCap {
 public:
  LookupRecordingCap(int cap, LookupRecord& record) : FixedCap(cap), record_(record) {}
  void on_load(int sequences) override {
    record_.most_load = std::max(record_.most_load, sequences);
  }
  void on_verified(int drafted, int accepted) override {
    ++record_.verified;
    record_.most_drafted = std::max(record_.most_drafted, drafted);
    EXPECT_LE(accepted, drafted);
  }

 private:
  LookupRecord& record_;
};

// The default model continues a repeating prompt with the repetition, so lookup drafts hit.
TEST(LookupPreStepDefaultModel, ItsPolicyCapsTheLookupDraftsUnderLoad) {
  const std::string dir = (std::filesystem::path(models_dir()) / kDefaultModelName).string();
  ASSERT_TRUE(std::filesystem::exists(dir + "/config.json"))
      << "the default model is not installed at " << dir
      << "; run scripts/install_default_model.sh";
  auto model = load_model(dir);
  Case c;
  c.prompt = {504, 2365, 314, 260, 2365, 314, 260, 2365, 314, 260, 2365};
  c.max_tokens = 24;
  const std::vector<int32_t> full = plain_continuation(*model, c);
  const std::vector<int32_t> plain(full.begin() + c.prompt.size(), full.end());
  // cap: -1 no pre-step policy; else a LookupRecordingCap of that cap.
  auto run = [&](int cap, ForwardBatcher* batcher, LookupRecord& record) {
    GenerationConfig config;
    config.max_tokens = c.max_tokens;
    DecodeSetup setup;
    setup.batcher = batcher;
    setup.options.mode = DecodeMode::dspark;
    setup.options.max_draft = 2;
    setup.options.lookup_drafts = true;
    setup.drafter = [&] { return testing::make_drafter(2, full, model->vocab_size(), 3, 2); };
    if (cap >= 0) {
      setup.lookup_cap_policy = [cap, &record](const DecodeOptions&) -> std::unique_ptr<CapPolicy> {
        return std::make_unique<LookupRecordingCap>(cap, record);
      };
    }
    ModelState state = model->new_state();
    DecodeStats stats;
    const GenerationResult result = run_generation(
        *model, c.prompt, state, config, setup, [](const CommittedToken&) { return true; }, &stats);
    EXPECT_EQ(result.tokens, plain) << "pre-step cap " << cap;
    return stats.speculative;
  };
  LookupRecord alone;
  EXPECT_GT(run(-1, nullptr, alone).lookup_rounds, 0) << "the prompt repeats: lookup hits";
  EXPECT_EQ(run(0, nullptr, alone).lookup_rounds, 0);
  EXPECT_EQ(alone.verified, 0);
  EXPECT_EQ(alone.most_load, 0) << "alone, nothing reports a load";

  ForwardBatcher batcher(*model, std::chrono::seconds(30));
  LookupRecord records[2];
  SpeculativeStats stats;
  run_together(batcher, 2, [&](size_t i) {
    const SpeculativeStats mine = run(2, &batcher, records[i]);
    if (i == 0) stats = mine;
  });
  const LookupRecord& first = records[0];
  EXPECT_GT(stats.lookup_rounds, 0);
  EXPECT_EQ(first.verified, stats.lookup_rounds);
  EXPECT_EQ(first.most_drafted, 2);
  EXPECT_EQ(first.most_load, 2);
}

// A forward the model refuses fails only its own caller; the step goes on for the others.
TEST(BatchedDecodingErrors, ARefusedForwardFailsOnlyItsCaller) {
  testing::TinyCheckpoint checkpoint(42);
  testing::fill_nemotron(checkpoint, "M*E");
  auto model = load_model(checkpoint.write());
  Case c;
  c.prompt = {1, 2, 3, 4};
  c.max_tokens = 12;
  const std::vector<int32_t> alone = generate_case(*model, c, {}, nullptr);
  ForwardBatcher batcher(*model, std::chrono::seconds(30));
  std::vector<int32_t> together;
  std::string refused;
  std::latch joined(2);
  std::thread good([&] {
    ForwardBatcher::Membership membership(batcher);
    joined.arrive_and_wait();
    together = generate_case(*model, c, {}, &batcher);
  });
  std::thread bad([&] {
    ForwardBatcher::Membership membership(batcher);
    joined.arrive_and_wait();
    ModelState state = model->new_state();
    const std::vector<int32_t> tokens = {1, static_cast<int32_t>(model->vocab_size())};
    ForwardOutput out;
    try {
      batcher.forward(tokens.data(), 2, state, {1}, {}, out);
    } catch (const std::exception& e) {
      refused = e.what();
    }
  });
  good.join();
  bad.join();
  EXPECT_EQ(together, alone);
  EXPECT_NE(refused.find("outside the vocabulary"), std::string::npos) << refused;
}

}  // namespace
}  // namespace dspark
