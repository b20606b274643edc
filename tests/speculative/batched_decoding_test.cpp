// Generations stepped together (decode_together: one batched target forward a step): every
// generation, plain or speculative with any drafter, greedy or sampled, returns exactly what it
// returns alone, while the steps really do carry several sequences at once.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <random>

#include "../sealed_backend.h"
#include "base/error.h"
#include "formats/model_store.h"
#include "spec_models.h"
#include "speculative/cap.h"
#include "speculative/decode.h"
#include "speculative/dspark.h"
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
  StatePool pool = model.new_pool(1);
  GenerationConfig config;
  config.max_tokens = c.max_tokens;
  std::vector<int32_t> full = c.prompt;
  const GenerationResult plain = generate_plain(model, c.prompt, pool, pool.open(), config,
                                                [](const CommittedToken&) { return true; });
  full.insert(full.end(), plain.tokens.begin(), plain.tokens.end());
  return full;
}

// A fixed cap that remembers the most generations the loop said were sharing the steps.
class LoadRecordingCap : public FixedCap {
 public:
  LoadRecordingCap(int cap, int& most) : FixedCap(cap), most_(most) {}
  void on_load(int sequences) override { most_ = std::max(most_, sequences); }

 private:
  int& most_;
};

int most_load = 0;

// One case's generation as run_generation would run it, on a sequence of `pool`, to run alone
// (run_to_end) or stepped with others of the pool (decode_together). `full`: the prompt and its
// plain continuation, for the always-right drafter. `adjust` changes the setup before the
// generation is set up.
struct CaseRun {
  CaseRun(const Model& model, StatePool& pool, const Case& c, const std::vector<int32_t>& full,
          const std::function<void(DecodeSetup&)>& adjust = {})
      : sequence(pool) {
    config.max_tokens = c.max_tokens;
    config.sampling.temperature = c.temperature;
    config.sampling.seed = 1234 + c.max_tokens;
    if (c.drafter >= 0) {
      setup.options.mode = DecodeMode::dspark;
      setup.options.max_draft = c.cap;
      setup.cap_policy = [cap = c.cap](const DecodeOptions&) -> std::unique_ptr<CapPolicy> {
        return std::make_unique<LoadRecordingCap>(cap, most_load);
      };
      setup.drafter = [&model, full, kind = c.drafter, cap = c.cap] {
        return testing::make_drafter(kind, full, model.vocab_size(), 77, cap);
      };
    }
    if (adjust) adjust(setup);
    decoding =
        std::make_unique<Decoding>(model, c.prompt, pool, sequence.id(), config, setup, keep_going);
  }
  SequenceDecoder& decoder() { return decoding->decoder(); }

  GenerationConfig config;
  DecodeSetup setup;
  OwnedSequence sequence;
  TokenCallback keep_going = [](const CommittedToken&) { return true; };
  std::unique_ptr<Decoding> decoding;
};

// Steps the runs together and returns the steps' counters.
StepCounters step_together(const Model& model, std::vector<std::unique_ptr<CaseRun>>& runs) {
  std::vector<SequenceDecoder*> decoders;
  for (auto& run : runs) decoders.push_back(&run->decoder());
  StepCounters counters;
  decode_together(model, runs.front()->sequence.pool(), decoders, &counters);
  return counters;
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
  StatePool pool = model->new_pool(16);
  const std::vector<Case> cases = mixed_cases(model->vocab_size());
  most_load = 0;
  std::vector<std::vector<int32_t>> alone, full;
  for (const Case& c : cases) {
    full.push_back(plain_continuation(*model, c));
    CaseRun run(*model, pool, c, full.back());
    run.decoder().run_to_end();
    alone.push_back(run.decoder().result().tokens);
  }
  EXPECT_EQ(most_load, 0) << "alone, nothing reports a load";

  std::vector<std::unique_ptr<CaseRun>> runs;
  for (size_t i = 0; i < cases.size(); ++i) {
    runs.push_back(std::make_unique<CaseRun>(*model, pool, cases[i], full[i]));
  }
  const StepCounters counters = step_together(*model, runs);
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::vector<int32_t>& together = runs[i]->decoder().result().tokens;
    EXPECT_EQ(together, alone[i]) << "generation " << i;
    EXPECT_EQ(static_cast<int64_t>(together.size()), cases[i].max_tokens) << "generation " << i;
  }
  // The loop reports the load to the cap policy (which the derived cap and the controller use).
  EXPECT_EQ(most_load, static_cast<int>(cases.size()));
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
  StatePool pool = model->new_pool(16);
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
  std::vector<std::unique_ptr<CaseRun>> runs;
  for (size_t i = 0; i < cases.size(); ++i) {
    runs.push_back(
        std::make_unique<CaseRun>(*model, pool, cases[i], full[i], [&, i](DecodeSetup& setup) {
          setup.options.max_draft.reset();
          setup.cap_policy = caps;
          setup.drafter = [&, i] {
            return testing::make_drafter(cases[i].drafter, full[i], model->vocab_size(), 77, 7);
          };
        }));
  }
  step_together(*model, runs);
  std::vector<GenerationResult> results;
  std::vector<DecodeStats> stats;
  for (auto& run : runs) {
    results.push_back(run->decoder().result());
    stats.push_back(run->decoding->stats());
  }
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
  auto model = testing::load_default_model();
  StatePool pool = model->new_pool(16);
  Case c;
  c.prompt = {504, 2365, 314, 260, 2365, 314, 260, 2365, 314, 260, 2365};
  c.max_tokens = 24;
  const std::vector<int32_t> full = plain_continuation(*model, c);
  const std::vector<int32_t> plain(full.begin() + c.prompt.size(), full.end());
  // cap: -1 no pre-step policy; else a LookupRecordingCap of that cap.
  auto make_run = [&](int cap, LookupRecord& record) {
    return std::make_unique<CaseRun>(*model, pool, c, full, [&, cap](DecodeSetup& setup) {
      setup.options.mode = DecodeMode::dspark;
      setup.options.max_draft = 2;
      setup.options.lookup_drafts = true;
      setup.cap_policy = nullptr;
      setup.drafter = [&] { return testing::make_drafter(2, full, model->vocab_size(), 3, 2); };
      if (cap >= 0) {
        setup.lookup_cap_policy = [cap,
                                   &record](const DecodeOptions&) -> std::unique_ptr<CapPolicy> {
          return std::make_unique<LookupRecordingCap>(cap, record);
        };
      }
    });
  };
  auto run_alone = [&](int cap, LookupRecord& record) {
    std::unique_ptr<CaseRun> run = make_run(cap, record);
    run->decoder().run_to_end();
    EXPECT_EQ(run->decoder().result().tokens, plain) << "pre-step cap " << cap;
    return run->decoder().stats();
  };
  LookupRecord alone;
  EXPECT_GT(run_alone(-1, alone).lookup_rounds, 0) << "the prompt repeats: lookup hits";
  EXPECT_EQ(run_alone(0, alone).lookup_rounds, 0);
  EXPECT_EQ(alone.verified, 0);
  EXPECT_EQ(alone.most_load, 0) << "alone, nothing reports a load";

  LookupRecord records[2];
  std::vector<std::unique_ptr<CaseRun>> runs;
  for (LookupRecord& record : records) runs.push_back(make_run(2, record));
  step_together(*model, runs);
  for (auto& run : runs) EXPECT_EQ(run->decoder().result().tokens, plain);
  const SpeculativeStats& stats = runs[0]->decoder().stats();
  const LookupRecord& first = records[0];
  EXPECT_GT(stats.lookup_rounds, 0);
  EXPECT_EQ(first.verified, stats.lookup_rounds);
  EXPECT_EQ(first.most_drafted, 2);
  EXPECT_EQ(first.most_load, 2);
}

// The committed DSpark head drafting for the default model, its generations' states and drafter
// contexts in a backend whose memory faults outside its compute sections: alone and stepped
// together, every greedy answer equals plain decoding, so the drafter's backbone, like the target,
// reaches its per-sequence rows only through the backend.
TEST(DSparkHeadDefaultModel, GenerationsOnSealedStatesEqualPlain) {
  auto model = testing::load_default_model();
  const auto head = std::make_shared<const DSparkHead>(
      std::string(DSPARK_SOURCE_DIR) + "/data/dspark_head/SmolLM2-135M-Instruct-DSpark", *model,
      DrafterLoadOptions{});
  testing::SealedBackend sealed;
  StatePool pool = model->new_pool(3, sealed);
  const std::vector<std::vector<int32_t>> prompts = {
      {1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198},
      {1, 4093, 198, 11865, 253, 28050, 563, 253, 1341, 30, 2, 198, 1, 520, 9531, 198},
      {504, 2365, 314, 260, 2365, 314, 260, 2365, 314, 260, 2365}};
  std::vector<Case> cases;
  std::vector<std::vector<int32_t>> plain;
  for (const auto& prompt : prompts) {
    Case c;
    c.prompt = prompt;
    c.max_tokens = 20;
    const std::vector<int32_t> full = plain_continuation(*model, c);
    plain.emplace_back(full.begin() + static_cast<int64_t>(c.prompt.size()), full.end());
    cases.push_back(c);
  }
  auto make_run = [&](const Case& c) {
    return std::make_unique<CaseRun>(*model, pool, c, c.prompt, [&](DecodeSetup& setup) {
      setup.options.mode = DecodeMode::dspark;
      setup.options.max_draft = 3;
      setup.cap_policy = [](const DecodeOptions&) -> std::unique_ptr<CapPolicy> {
        return std::make_unique<FixedCap>(3);
      };
      setup.drafter = dspark_drafter_factory(head, 0.0f);
    });
  };
  int64_t accepted = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    std::unique_ptr<CaseRun> run = make_run(cases[i]);
    run->decoder().run_to_end();
    EXPECT_EQ(run->decoder().result().tokens, plain[i]) << "alone, prompt " << i;
    accepted += run->decoder().stats().accepted;
  }
  EXPECT_GT(accepted, 0) << "the head's drafts were verified and some accepted";
  std::vector<std::unique_ptr<CaseRun>> runs;
  for (const Case& c : cases) runs.push_back(make_run(c));
  step_together(*model, runs);
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(runs[i]->decoder().result().tokens, plain[i]) << "together, prompt " << i;
  }
  EXPECT_GT(sealed.sections(), 0);
}

// The backbone's last layer runs queries, o_proj and the MLP for the rows a drafter asks for alone
// (the block's other rows lend their keys and values): any run of a block's rows, asked alone or
// beside another block's, equals those rows of the whole block bit for bit; and so a DSpark
// draft's logits and confidences are the same at every cap.
TEST(DSparkHeadDefaultModel, RowsAskedAloneEqualTheWholeBlocksRows) {
  auto model = testing::load_default_model();
  const auto head = std::make_shared<const DSparkHead>(
      std::string(DSPARK_SOURCE_DIR) + "/data/dspark_head/SmolLM2-135M-Instruct-DSpark", *model,
      DrafterLoadOptions{});
  const DrafterBackbone& backbone = head->backbone();
  const int64_t H = backbone.config().hidden, width = backbone.config().block_size;
  for (const std::vector<int32_t>& prompt :
       {std::vector<int32_t>{1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520,
                             9531, 198},
        std::vector<int32_t>{504, 2365, 314, 260, 2365, 314, 260, 2365, 314, 260, 2365}}) {
    DSparkDrafter drafter(head, 0.0f);
    ModelState state = model->new_state();
    ForwardOutput output;
    const auto n = static_cast<int64_t>(prompt.size());
    model->forward(prompt.data(), n, state, {n - 1}, drafter.tap_layers(), output);
    drafter.on_target_rows(prompt.data(), n, output.taps.data());
    std::vector<int32_t> committed = prompt;
    committed.push_back(argmax(output.logits.data(), model->vocab_size()));

    DrafterContext context = backbone.new_context();
    backbone.append_context(output.taps.data(), n, context);
    std::vector<float> block(width * H), whole(width * H);
    head->embed_block(committed.back(), width, block.data());
    const DrafterContext* one[] = {&context};
    const int64_t all[] = {width};
    backbone.run_blocks(block.data(), all, 0, all, one, whole.data());
    std::vector<float> two_blocks(2 * width * H);
    std::copy_n(block.data(), width * H, two_blocks.data());
    std::copy_n(block.data(), width * H, two_blocks.data() + width * H);
    const DrafterContext* both[] = {&context, &context};
    const int64_t widths[] = {width, width};
    for (int64_t first = 0; first < width; ++first) {
      for (int64_t count = 0; first + count <= width; ++count) {
        const int64_t asked[] = {count};
        std::vector<float> rows(count * H);
        backbone.run_blocks(block.data(), all, first, asked, one, rows.data());
        EXPECT_EQ(std::memcmp(rows.data(), whole.data() + first * H, count * H * sizeof(float)), 0)
            << "rows " << first << " + " << count;
        const int64_t beside[] = {count, width - first};
        std::vector<float> together((width - first + count) * H);
        backbone.run_blocks(two_blocks.data(), widths, first, beside, both, together.data());
        EXPECT_EQ(std::memcmp(together.data(), rows.data(), count * H * sizeof(float)), 0);
        EXPECT_EQ(std::memcmp(together.data() + count * H, whole.data() + first * H,
                              (width - first) * H * sizeof(float)),
                  0)
            << "the second block, rows " << first << " on";
      }
    }
    const int64_t beyond[] = {width};
    EXPECT_THROW(backbone.run_blocks(block.data(), all, 1, beyond, one, whole.data()), Error);

    SamplingParams greedy;
    Rng rng(0);
    const int widest = head->max_drafts();
    const Draft drafts = drafter.propose(DraftRequest{committed, widest, greedy, rng});
    const std::vector<float> logits = drafter.last_logits();
    const std::vector<float> confidences = drafter.last_confidences();
    ASSERT_EQ(confidences.size(), static_cast<size_t>(widest));
    const size_t row = logits.size() / widest;
    for (int cap = 1; cap < widest; ++cap) {
      const Draft draft = drafter.propose(DraftRequest{committed, cap, greedy, rng});
      EXPECT_EQ(draft.tokens,
                std::vector<int32_t>(drafts.tokens.begin(), drafts.tokens.begin() + cap));
      ASSERT_EQ(drafter.last_logits().size(), cap * row);
      EXPECT_EQ(std::memcmp(drafter.last_logits().data(), logits.data(), cap * row * sizeof(float)),
                0)
          << "cap " << cap;
      EXPECT_EQ(
          std::memcmp(drafter.last_confidences().data(), confidences.data(), cap * sizeof(float)),
          0)
          << "cap " << cap;
    }
  }
}

}  // namespace
}  // namespace dspark
