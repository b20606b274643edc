#include "speculative/verify.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "../sealed_backend.h"
#include "constrain/grammar.h"
#include "formats/model_store.h"
#include "spec_models.h"
#include "speculative/cap.h"
#include "speculative/decode.h"
#include "speculative/draft_scheduler.h"
#include "speculative/lookup.h"
#include "test_curves.h"
#include "test_drafters.h"

namespace dspark {
namespace {

using testing::make_drafter;
using testing::OracleDrafter;
using testing::RandomDrafter;
using testing::Storage;

template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

bool same_state(const StateContents& a, const StateContents& b) {
  if (a.length != b.length || a.kv_type != b.kv_type || a.keys.size() != b.keys.size() ||
      a.ssm.size() != b.ssm.size()) {
    return false;
  }
  for (size_t l = 0; l < a.keys.size(); ++l) {
    if (!same_bits(a.keys[l], b.keys[l]) || !same_bits(a.values[l], b.values[l])) return false;
  }
  for (size_t l = 0; l < a.ssm.size(); ++l) {
    if (!same_bits(a.conv[l], b.conv[l]) || !same_bits(a.ssm[l], b.ssm[l])) return false;
  }
  return true;
}

// One generation's sequence, alone in its pool.
struct LoneSequence {
  explicit LoneSequence(const Model& model, backend::Backend& backend = backend::cpu_backend())
      : pool(model.new_pool(1, backend)), id(pool.open()) {}
  ModelState& state() { return pool.state(id); }
  StatePool pool;
  SequenceId id;
};

// Plain greedy decoding, keeping the state snapshot after every forward (indexed by length).
struct PlainRun {
  std::vector<int32_t> tokens;
  std::map<int64_t, StateContents> states;
};

PlainRun plain_run(const Model& model, const std::vector<int32_t>& prompt, int64_t max_tokens) {
  PlainRun run;
  ModelState state = model.new_state();
  ForwardOutput out;
  model.forward(prompt.data(), prompt.size(), state, {static_cast<int64_t>(prompt.size()) - 1}, {},
                out);
  run.states[state.length()] = state.contents();
  for (int64_t i = 0; i < max_tokens; ++i) {
    const int32_t next = argmax(out.logits.data(), model.vocab_size());
    run.tokens.push_back(next);
    if (i + 1 == max_tokens) break;
    model.forward(&next, 1, state, {0}, {}, out);
    run.states[state.length()] = state.contents();
  }
  return run;
}

// A speculative generation of `max_tokens` whose state after every round must equal plain
// decoding's at the same length.
GenerationResult generate_checking_states(const Model& model, Drafter& drafter, CapPolicy& policy,
                                          const std::vector<int32_t>& prompt, const PlainRun& plain,
                                          int64_t max_tokens, SpeculativeStats& stats) {
  SpeculativeOptions options;
  options.after_round = [&](const ModelState& state) {
    auto expected = plain.states.find(state.length());
    ASSERT_NE(expected, plain.states.end());
    EXPECT_TRUE(same_state(state.contents(), expected->second));
  };
  SpeculativeGenerator generator(model, drafter, policy, options);
  LoneSequence state(model);
  GenerationConfig config;
  config.max_tokens = max_tokens;
  GenerationResult result = generator.generate(prompt, state.pool, state.id, config,
                                               [](const CommittedToken&) { return true; });
  stats = generator.stats();
  return result;
}

struct Counts {
  int generations = 0;
  int state_checks = 0;
};

// Speculative greedy output equals plain greedy output, and the state after every round equals
// plain decoding's at the same length, for every drafter kind and cap 1..8.
void check_lossless_greedy(const Model& model, const std::vector<std::vector<int32_t>>& prompts,
                           int64_t max_tokens, const std::vector<int>& caps, Counts& counts,
                           backend::Backend& backend = backend::cpu_backend()) {
  for (const auto& prompt : prompts) {
    const PlainRun plain = plain_run(model, prompt, max_tokens);
    {
      // generate_plain (what `dspark generate` runs) agrees with the hand-rolled plain loop.
      LoneSequence state(model, backend);
      GenerationConfig config;
      config.max_tokens = max_tokens;
      auto result = generate_plain(model, prompt, state.pool, state.id, config,
                                   [](const CommittedToken&) { return true; });
      ASSERT_EQ(result.tokens, plain.tokens);
    }
    std::vector<int32_t> full = prompt;
    full.insert(full.end(), plain.tokens.begin(), plain.tokens.end());
    for (int kind = 0; kind < 4; ++kind) {
      for (int cap : caps) {
        std::unique_ptr<Drafter> drafter =
            make_drafter(kind, full, model.vocab_size(), 100 + cap, cap);
        FixedCap fixed(cap);
        SpeculativeOptions options;
        options.after_round = [&](const ModelState& state) {
          auto expected = plain.states.find(state.length());
          ASSERT_NE(expected, plain.states.end()) << "no plain state at length " << state.length();
          EXPECT_TRUE(same_state(state.contents(), expected->second))
              << drafter->name() << " cap " << cap << ": state differs at length "
              << state.length();
          ++counts.state_checks;
        };
        SpeculativeGenerator generator(model, *drafter, fixed, options);
        LoneSequence state(model, backend);
        GenerationConfig config;
        config.max_tokens = max_tokens;
        auto result = generator.generate(prompt, state.pool, state.id, config,
                                         [](const CommittedToken&) { return true; });
        EXPECT_EQ(result.tokens, plain.tokens) << drafter->name() << " cap " << cap;
        EXPECT_EQ(static_cast<int64_t>(result.tokens.size()), max_tokens);
        if (kind == 0) {
          EXPECT_GT(generator.stats().accepted, 0) << "cap " << cap;
        }
        if (kind == 1) {
          EXPECT_EQ(generator.stats().accepted, 0) << "cap " << cap;
        }
        ++counts.generations;
      }
    }
  }
}

std::vector<std::vector<int32_t>> test_prompts(int64_t vocab) {
  std::mt19937 rng(77);
  std::vector<std::vector<int32_t>> prompts;
  for (int p = 0; p < 3; ++p) {
    std::vector<int32_t> prompt;
    for (int i = 0; i < 6 + 3 * p; ++i) prompt.push_back(static_cast<int32_t>(rng() % vocab));
    prompts.push_back(prompt);
  }
  // A repetitive prompt, so lookup drafts hit.
  prompts.push_back({5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7, 8, 5, 6});
  return prompts;
}

class LosslessGreedy : public ::testing::TestWithParam<Storage> {};

TEST_P(LosslessGreedy, TinyNemotronEqualsPlainForEveryDrafterAndCap) {
  testing::TinyCheckpoint checkpoint(31);
  testing::fill_nemotron(checkpoint, "M*EMEM-");
  const std::string dir =
      testing::write_stored(checkpoint, GetParam(), GetParam() == Storage::bf16 ? "bf16" : "q4");
  auto model = load_model(dir);
  Counts counts;
  check_lossless_greedy(*model, test_prompts(model->vocab_size()), 20, {1, 2, 3, 4, 5, 6, 7, 8},
                        counts);
  EXPECT_EQ(counts.generations, 4 * 4 * 8);
  EXPECT_GT(counts.state_checks, counts.generations);
  std::filesystem::remove_all(dir);
}

// The same with every sequence's state in a backend whose memory faults outside its compute
// sections: plain and speculative decoding, drafts, rollbacks and the per-round state checks hold
// states only through the pool and the backend (the contract a device backend relies on).
TEST(LosslessGreedy, DecodersOnSealedStatesEqualPlain) {
  testing::TinyCheckpoint checkpoint(31);
  testing::fill_nemotron(checkpoint, "M*EMEM-");
  const std::string dir = testing::write_stored(checkpoint, Storage::q4, "sealed");
  auto model = load_model(dir);
  testing::SealedBackend sealed;
  Counts counts;
  check_lossless_greedy(*model, test_prompts(model->vocab_size()), 12, {1, 3, 8}, counts, sealed);
  EXPECT_EQ(counts.generations, 4 * 4 * 3);
  EXPECT_GT(counts.state_checks, counts.generations);
  EXPECT_GT(sealed.sections(), counts.generations);
  EXPECT_EQ(sealed.live_buffers(), 0);
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Storages, LosslessGreedy, ::testing::Values(Storage::bf16, Storage::q4),
                         [](const auto& info) {
                           return info.param == Storage::bf16 ? "bf16" : "q4";
                         });

// At the end of the context every decoder stops where plain decoding does: the last forward fills
// the context's last position and its token is the last committed, whatever the drafts.
TEST(LosslessGreedy, EveryDecoderRunsToTheEndOfTheContext) {
  testing::TinyCheckpoint checkpoint(43);
  testing::fill_nemotron(checkpoint, "M*EM");
  constexpr int64_t kContext = 24;
  checkpoint.config["max_position_embeddings"] = kContext;
  auto model = load_model(checkpoint.write());
  ASSERT_EQ(model->max_context(), kContext);
  for (const auto& prompt : test_prompts(model->vocab_size())) {
    const int64_t fits = kContext - static_cast<int64_t>(prompt.size()) + 1;
    const PlainRun plain = plain_run(*model, prompt, fits);
    GenerationConfig config;
    config.max_tokens = 1000;
    auto keep_going = [](const CommittedToken&) { return true; };
    LoneSequence plain_state(*model);
    const GenerationResult alone =
        generate_plain(*model, prompt, plain_state.pool, plain_state.id, config, keep_going);
    EXPECT_EQ(alone.tokens, plain.tokens);
    EXPECT_EQ(alone.finish_reason, FinishReason::length);
    EXPECT_EQ(plain_state.state().length(), kContext);
    std::vector<int32_t> full = prompt;
    full.insert(full.end(), plain.tokens.begin(), plain.tokens.end());
    for (int kind = 0; kind < 4; ++kind) {
      for (int cap : {1, 3, 8}) {
        std::unique_ptr<Drafter> drafter = make_drafter(kind, full, model->vocab_size(), 7, cap);
        FixedCap fixed(cap);
        LoneSequence state(*model);
        const GenerationResult result =
            SpeculativeGenerator(*model, *drafter, fixed)
                .generate(prompt, state.pool, state.id, config, keep_going);
        EXPECT_EQ(result.tokens, plain.tokens) << drafter->name() << " cap " << cap;
        EXPECT_EQ(result.finish_reason, FinishReason::length);
        EXPECT_EQ(state.state().length(), kContext) << drafter->name() << " cap " << cap;
      }
    }
  }
}

// One thread steps many generations through decode_together, one forward_batch a step: each,
// plain or with any drafter, greedy or sampled, with penalties or a reasoning budget, returns what
// it returns alone, and its state after every round equals its lone state after the same round,
// bit for bit.
TEST(DecodeTogether, EveryGenerationEqualsItsLoneRunStateByState) {
  testing::TinyCheckpoint checkpoint(47);
  testing::fill_nemotron(checkpoint, "M*EMEM-");
  const std::string dir = testing::write_stored(checkpoint, Storage::q4, "together");
  auto model = load_model(dir);
  const int64_t vocab = model->vocab_size();
  struct Case {
    std::vector<int32_t> prompt, full;
    GenerationConfig config;
    int kind = -1;  // -1: plain, else make_drafter's kind
    int cap = 0;
  };
  std::mt19937 rng(3);
  const int kinds[] = {-1, 0, 1, 2, 3, -1, 0, 2, 3, 1};
  std::vector<Case> cases;
  for (int i = 0; i < 10; ++i) {
    Case c;
    for (int t = 0; t < 3 + 4 * i; ++t) c.prompt.push_back(static_cast<int32_t>(rng() % vocab));
    if (i == 8) c.prompt = {5, 6, 7, 8, 5, 6, 7, 8, 5, 6};  // lookup drafts hit
    c.config.max_tokens = 8 + 3 * i;
    c.config.sampling.temperature = i % 3 == 1 ? 1.0f : 0.0f;
    c.config.sampling.seed = 100 + i;
    if (i == 4 || i == 5) {
      c.config.sampling.repetition_penalty = 1.3f;
      c.config.sampling.logit_bias = {{3, 2.5f}};
    }
    if (i == 6 || i == 9) {
      c.config.reasoning_budget.budget = 3;
      c.config.reasoning_budget.forced_ids = {3, 4, 5};
      c.config.reasoning_budget.starts_in_reasoning = true;
      c.config.reasoning_budget.token_text = [](int32_t) { return std::string("x"); };
    }
    c.kind = kinds[i];
    c.cap = c.kind < 0 ? 0 : 1 + i % 4;
    c.full = c.prompt;
    const PlainRun plain = plain_run(*model, c.prompt, c.config.max_tokens);
    c.full.insert(c.full.end(), plain.tokens.begin(), plain.tokens.end());
    cases.push_back(std::move(c));
  }
  auto keep_going = [](const CommittedToken&) { return true; };
  auto drafter_for = [&](const Case& c) -> std::unique_ptr<Drafter> {
    if (c.kind < 0) return std::make_unique<NoDrafts>();
    return make_drafter(c.kind, c.full, vocab, 11, c.cap);
  };

  std::vector<GenerationResult> alone;
  std::vector<std::vector<StateContents>> alone_states(cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    std::unique_ptr<Drafter> drafter = drafter_for(cases[i]);
    FixedCap cap(cases[i].cap);
    SpeculativeOptions options;
    options.after_round = [&](const ModelState& state) {
      alone_states[i].push_back(state.contents());
    };
    LoneSequence state(*model);
    alone.push_back(
        SpeculativeGenerator(*model, *drafter, cap, options)
            .generate(cases[i].prompt, state.pool, state.id, cases[i].config, keep_going));
  }

  std::vector<std::unique_ptr<Drafter>> drafters;
  std::vector<std::unique_ptr<FixedCap>> caps;
  std::vector<SpeculativeOptions> options(cases.size());
  // The batch's states in a backend whose memory faults outside its compute sections: the step
  // reaches them only through the pool and the backend.
  testing::SealedBackend sealed;
  StatePool pool = model->new_pool(static_cast<int>(cases.size()), sealed);
  std::vector<std::unique_ptr<SequenceDecoder>> decoders;
  std::vector<SequenceDecoder*> together;
  std::vector<size_t> rounds(cases.size(), 0);
  int state_checks = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    drafters.push_back(drafter_for(cases[i]));
    caps.push_back(std::make_unique<FixedCap>(cases[i].cap));
  }
  for (size_t i = 0; i < cases.size(); ++i) {
    options[i].after_round = [&, i](const ModelState& state) {
      const size_t round = rounds[i]++;
      ASSERT_LT(round, alone_states[i].size()) << "generation " << i;
      EXPECT_TRUE(same_state(state.contents(), alone_states[i][round]))
          << "generation " << i << " round " << round;
      ++state_checks;
    };
    decoders.push_back(std::make_unique<SequenceDecoder>(*model, *drafters[i], *caps[i], options[i],
                                                         cases[i].prompt, pool, pool.open(),
                                                         cases[i].config, keep_going));
    together.push_back(decoders.back().get());
  }
  decode_together(*model, pool, together);
  int with_drafts = 0, forced = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    ASSERT_TRUE(decoders[i]->finished());
    EXPECT_EQ(decoders[i]->result().tokens, alone[i].tokens) << "generation " << i;
    EXPECT_EQ(decoders[i]->result().finish_reason, alone[i].finish_reason) << "generation " << i;
    EXPECT_EQ(rounds[i], alone_states[i].size()) << "generation " << i;
    with_drafts += decoders[i]->stats().accepted > 0;
    forced += decoders[i]->stats().forced_forwards > 0;
  }
  EXPECT_GT(state_checks, 100);
  EXPECT_GE(with_drafts, 3);
  EXPECT_EQ(forced, 2);
  std::filesystem::remove_all(dir);
}

// Another drafter's drafts with survival estimates attached (survival[i] = certainty^(i + 1)), as
// a DSpark head's confidence head reports them.
class SurvivalDrafter : public Drafter {
 public:
  SurvivalDrafter(Drafter& drafts, double certainty) : drafts_(drafts), certainty_(certainty) {}
  std::string name() const override { return drafts_.name() + " with survival"; }
  Draft propose(const DraftRequest& request) override {
    Draft draft = drafts_.propose(request);
    double survival = 1.0;
    for (size_t i = 0; i < draft.tokens.size(); ++i)
      draft.survival.push_back(survival *= certainty_);
    return draft;
  }

 private:
  Drafter& drafts_;
  double certainty_;
};

// Confidence-scheduled verification (drafts_to_verify of the derived cap and of the auto
// controller): drafts their survival says are hopeless are never verified (every round is a plain
// step), sure ones are all verified, and either way the output and every state equal plain
// decoding's. Right and wrong drafts alike: the schedule trusts the estimates, and losslessness
// never depends on them.
TEST(ConfidenceSchedule, VerifiesOnlyWhatSurvivalPaysForAndStaysLossless) {
  testing::TinyCheckpoint checkpoint(37);
  testing::fill_nemotron(checkpoint, "M*EMEM-");
  const std::string dir = testing::write_stored(checkpoint, Storage::bf16, "survival");
  auto model = load_model(dir);
  const CostCurves curves = testing::curves_of({10, 10, 11, 12, 13, 14, 15, 16});
  auto scheduler = std::make_shared<DraftScheduler>(curves, 7);
  for (const auto& prompt : test_prompts(model->vocab_size())) {
    const PlainRun plain = plain_run(*model, prompt, 16);
    std::vector<int32_t> full = prompt;
    full.insert(full.end(), plain.tokens.begin(), plain.tokens.end());
    for (bool wrong : {false, true}) {
      for (double certainty : {0.0, 0.99}) {
        for (bool auto_cap : {false, true}) {
          OracleDrafter oracle(full, wrong, model->vocab_size());
          SurvivalDrafter drafter(oracle, certainty);
          std::unique_ptr<CapPolicy> policy_owner;
          if (auto_cap) {
            policy_owner = std::make_unique<AutoCapController>(curves, 7);
          } else {
            policy_owner = std::make_unique<DerivedCap>(scheduler);
          }
          SpeculativeStats stats;
          const auto result =
              generate_checking_states(*model, drafter, *policy_owner, prompt, plain, 16, stats);
          EXPECT_EQ(result.tokens, plain.tokens)
              << "wrong " << wrong << " certainty " << certainty << " auto " << auto_cap;
          if (certainty == 0.0) {
            EXPECT_EQ(stats.drafted, 0);
            EXPECT_GT(stats.unverified, 0);
          } else {
            EXPECT_EQ(stats.unverified, 0);
            EXPECT_GT(stats.drafted, 0);
            if (!wrong) {
              EXPECT_GT(stats.accepted, 0);
            }
          }
        }
      }
    }
  }
  std::filesystem::remove_all(dir);
}

// Standalone lookup with its survival-priced cap (LookupLoadCap) on the default model: on curves
// where a row costs a fifth of a step, some proposals are verified in part and some not at all,
// and every answer and every state still equal plain decoding's.
TEST(LookupSurvivalCapDefaultModel, VerifiesPartOfItsProposalsAndEqualsPlain) {
  auto model = testing::load_default_model();
  const CostCurves curves = testing::curves_of({10, 12, 14, 16, 18, 20, 22, 24});
  // A chat-formatted question, and a phrase the model goes on repeating.
  const std::vector<std::vector<int32_t>> prompts = {
      {1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198},
      {504, 2365, 314, 260, 2365, 314, 260, 2365, 314, 260, 2365}};
  int64_t unverified = 0, accepted = 0;
  for (const auto& prompt : prompts) {
    const PlainRun plain = plain_run(*model, prompt, 32);
    LookupDrafter drafter(LookupParams{3, 4, 6, 6});
    LookupLoadCap policy(curves, 6);
    SpeculativeStats stats;
    EXPECT_EQ(generate_checking_states(*model, drafter, policy, prompt, plain, 32, stats).tokens,
              plain.tokens);
    unverified += stats.unverified;
    accepted += stats.accepted;
  }
  EXPECT_GT(unverified, 0);
  EXPECT_GT(accepted, 0);
}

TEST(LosslessGreedyDefaultModel, SmolLM2EqualsPlain) {
  auto model = testing::load_default_model();
  Counts counts;
  // Token ids of chat-formatted prompts would do as well; fixed ids keep the test independent of
  // the tokenizer. The last one repeats, so lookup drafts hit.
  const std::vector<std::vector<int32_t>> prompts = {
      {1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198},
      {1, 4093, 198, 11865, 253, 28050, 563, 253, 1341, 30, 2, 198, 1, 520, 9531, 198},
      {504, 2365, 314, 260, 2365, 314, 260, 2365, 314, 260, 2365}};
  check_lossless_greedy(*model, prompts, 24, {1, 3, 5, 8}, counts);
  EXPECT_EQ(counts.generations, 3 * 4 * 4);
}

TEST(LookupIndex, IncrementalEqualsBulkAndFindsLatestLongest) {
  const std::vector<int32_t> tokens = {1, 2, 3, 4, 9, 1, 2, 3, 5, 7, 2, 3, 4, 1, 2, 3};
  NGramIndex bulk(LookupParams{2, 3, 4, 0});
  bulk.extend(tokens.data(), tokens.size());
  NGramIndex incremental(LookupParams{2, 3, 4, 0});
  for (int32_t id : tokens) incremental.extend(&id, 1);
  EXPECT_EQ(bulk.propose(false).tokens, incremental.propose(false).tokens);
  // Suffix "1 2 3" last occurred ending at index 8 (tokens 5..7): copy from there. The match runs
  // back 3 tokens (9 before the one, nothing before the other).
  EXPECT_EQ(bulk.propose(false).tokens, (std::vector<int32_t>{5, 7, 2, 3}));
  EXPECT_EQ(bulk.propose(false).match, 3);
  NGramIndex none(LookupParams{2, 3, 4, 0});
  const std::vector<int32_t> unique = {1, 2, 3, 4};
  none.extend(unique.data(), unique.size());
  EXPECT_TRUE(none.propose(false).tokens.empty());
}

TEST(LookupIndex, LongDraftsScaleWithTheMatch) {
  std::vector<int32_t> tokens;
  for (int i = 0; i < 20; ++i) tokens.push_back(100 + i);
  tokens.push_back(1);
  for (int i = 0; i < 12; ++i) tokens.push_back(100 + i);  // re-emits a 12-token run
  NGramIndex index(LookupParams{3, 4, 6, 32});
  index.extend(tokens.data(), tokens.size());
  EXPECT_EQ(index.propose(false).tokens.size(), 6u);
  EXPECT_EQ(index.propose(false).match, 12);
  // The match extends back 12 tokens: up to 2 x 12 = 24, limited by what follows (8 + 1 + 12).
  EXPECT_EQ(index.propose(true).tokens.size(), 21u);
}

TEST(SlotSurvival, CountsReachedAndMatchedSlotsFromPriorsAndForgets) {
  SlotSurvival slots(0.5, 0.8);
  EXPECT_EQ(slots.survival(3), (std::vector<double>{0.5, 0.5 * 0.8, 0.5 * 0.8 * 0.8}));
  // Slot 0 matched, slot 1 reached and missed, slot 2 never reached.
  slots.start();
  slots.observe(0, true);
  slots.observe(1, false);
  const std::vector<double> once = slots.survival(3);
  EXPECT_DOUBLE_EQ(once[0], 2.0 / 3.0);
  // The later slots' pooled rate: (0 + 2 * 0.8) / (1 + 2); slot 1 shrinks toward it.
  const double continuation = 1.6 / 3.0;
  EXPECT_DOUBLE_EQ(once[1], once[0] * (2 * continuation) / 3.0);
  EXPECT_DOUBLE_EQ(once[2], once[1] * continuation);
  slots.start();  // the earlier evidence now weighs 0.95
  slots.observe(0, false);
  EXPECT_DOUBLE_EQ(slots.survival(1)[0], (0.95 + 1.0) / (1.95 + 2.0));
  // Runs that continue teach every later slot at once through the pooled rate.
  for (int i = 0; i < 100; ++i) {
    slots.start();
    for (int slot = 0; slot < 4; ++slot) slots.observe(slot, true);
  }
  EXPECT_GT(slots.survival(12)[11], 0.5);
  for (int i = 0; i < 200; ++i) {
    slots.start();
    slots.observe(0, false);
  }
  EXPECT_LT(slots.survival(1)[0], 0.1);
}

// A lookup proposal's outcome is read off the tokens committed after it, verified or not, and
// feeds the survival estimates of later proposals whose match is of the same length class.
TEST(LookupDrafter, SurvivalFollowsWhatWasCommittedAfterEachProposal) {
  LookupDrafter drafter(LookupParams{2, 2, 3, 0});
  SamplingParams greedy;
  Rng rng(1);
  std::vector<int32_t> committed = {7, 1, 2, 3, 4, 5, 9, 1, 2};
  const Draft first = drafter.propose(DraftRequest{committed, 3, greedy, rng});
  EXPECT_EQ(first.tokens, (std::vector<int32_t>{3, 4, 5}));
  const std::vector<double> prior = drafter.survival(2, 3);
  EXPECT_EQ(first.survival, prior);
  // Its first token committed (verified or not): its first slot counts at once.
  committed.push_back(3);
  const Draft second = drafter.propose(DraftRequest{committed, 3, greedy, rng});
  EXPECT_GT(second.survival.front(), prior[0]);
  // The other two committed: both proposals match on.
  committed.insert(committed.end(), {4, 5});
  drafter.propose(DraftRequest{committed, 3, greedy, rng});
  const std::vector<double> after_hit = drafter.survival(2, 3);
  EXPECT_GT(after_hit[2], second.survival[2]);
  // Only this class moved: a 12-token match has its own evidence, and a likelier prior.
  const std::vector<double> long_match = drafter.survival(12, 3);
  EXPECT_EQ(long_match, SlotSurvival(0.95, 0.95).survival(3));
  EXPECT_GT(long_match[0], prior[0]);
  // That call proposed "9 1 2" (after "4 5"); "1 2" comes instead: a miss at the first slot.
  committed.insert(committed.end(), {1, 2});
  drafter.propose(DraftRequest{committed, 3, greedy, rng});
  EXPECT_LT(drafter.survival(2, 3)[0], after_hit[0]);
}

// A drafter that samples from a fixed, deliberately wrong distribution (favouring the tokens the
// target likes least) and reports it, for the lossless sampling test.
class SkewedDrafter : public Drafter {
 public:
  explicit SkewedDrafter(int64_t vocab) {
    for (int32_t id = 0; id < vocab; id += 7) {
      q_.ids.push_back(id);
      q_.probs.push_back(0.0f);
    }
    float total = 0;
    for (size_t i = 0; i < q_.ids.size(); ++i)
      total += q_.probs[i] = 1.0f + static_cast<float>(i % 3);
    for (float& p : q_.probs) p /= total;
  }
  std::string name() const override { return "skewed"; }
  Draft propose(const DraftRequest& request) override {
    Draft draft;
    for (int i = 0; i < request.cap; ++i) {
      draft.tokens.push_back(sample_from(q_, request.rng.uniform()));
      draft.proposals.push_back(q_);
    }
    return draft;
  }

 private:
  TokenDistribution q_;
};

double chi_square_critical(int df) {  // p = 0.001, Wilson-Hilferty
  const double z = 3.090232, k = df;
  const double term = 1.0 - 2.0 / (9.0 * k) + z * std::sqrt(2.0 / (9.0 * k));
  return k * term * term * term;
}

// Pearson's chi-square of observed pair counts against expected probabilities, over cells with an
// expected count of at least 5; the rest pooled into one cell.
struct ChiSquare {
  double statistic = 0.0;
  int cells = 0;
};
template <typename Key>
ChiSquare chi_square(const std::map<Key, double>& expected, const std::map<Key, int>& observed,
                     int samples) {
  ChiSquare fit;
  double pooled_expected = 0, pooled_observed = 0;
  for (const auto& [pair, p] : expected) {
    const double e = p * samples;
    const auto found = observed.find(pair);
    const double o = found != observed.end() ? found->second : 0;
    if (e >= 5) {
      fit.statistic += (o - e) * (o - e) / e;
      ++fit.cells;
    } else {
      pooled_expected += e;
      pooled_observed += o;
    }
  }
  if (pooled_expected > 0) {
    fit.statistic +=
        (pooled_observed - pooled_expected) * (pooled_observed - pooled_expected) / pooled_expected;
    ++fit.cells;
  }
  return fit;
}

// The exact joint distribution of the first `count` tokens after `prompt` under plain sampling.
std::map<std::vector<int32_t>, double> first_tokens(const Model& model,
                                                    const SamplingParams& sampling,
                                                    const std::vector<int32_t>& prompt,
                                                    size_t count) {
  const int64_t vocab = model.vocab_size();
  std::map<std::vector<int32_t>, double> expected;
  ModelState state = model.new_state();
  ForwardOutput out;
  model.forward(prompt.data(), prompt.size(), state, {static_cast<int64_t>(prompt.size()) - 1}, {},
                out);
  std::vector<int32_t> tokens;
  // Depth first over every token the sampling keeps at each step.
  const std::function<void(double)> extend = [&](double probability) {
    const TokenDistribution next = target_distribution(sampling, out.logits.data(), vocab);
    const StateSnapshot here = state.snapshot();
    for (size_t i = 0; i < next.ids.size(); ++i) {
      tokens.push_back(next.ids[i]);
      if (tokens.size() == count) {
        expected[tokens] = probability * next.probs[i];
      } else {
        state.restore(here);
        model.forward(&next.ids[i], 1, state, {0}, {}, out);
        extend(probability * next.probs[i]);
      }
      tokens.pop_back();
    }
  };
  extend(1.0);
  return expected;
}

// The same for the first two tokens, as pairs.
std::map<std::pair<int32_t, int32_t>, double> first_two_tokens(const Model& model,
                                                               const SamplingParams& sampling,
                                                               const std::vector<int32_t>& prompt) {
  std::map<std::pair<int32_t, int32_t>, double> pairs;
  for (const auto& [tokens, probability] : first_tokens(model, sampling, prompt, 2)) {
    pairs[{tokens[0], tokens[1]}] = probability;
  }
  return pairs;
}

// Sampled first three tokens against their exact distribution: within the support, the joint by
// chi-square, and the third token alone (a bias confined to one branch of the first two is spread
// over the joint's many cells, and stands out among the third token's few).
void expect_follows(const std::map<std::vector<int32_t>, double>& expected,
                    const std::map<std::vector<int32_t>, int>& observed, int samples) {
  for (const auto& [tokens, count] : observed) {
    EXPECT_TRUE(expected.count(tokens)) << "sampled tokens outside the target's support";
  }
  const ChiSquare fit = chi_square(expected, observed, samples);
  EXPECT_LT(fit.statistic, chi_square_critical(fit.cells - 1)) << fit.cells << " cells";
  std::map<int32_t, double> expected_third;
  std::map<int32_t, int> observed_third;
  for (const auto& [tokens, probability] : expected) expected_third[tokens[2]] += probability;
  for (const auto& [tokens, count] : observed) observed_third[tokens[2]] += count;
  const ChiSquare third_fit = chi_square(expected_third, observed_third, samples);
  EXPECT_LT(third_fit.statistic, chi_square_critical(third_fit.cells - 1))
      << third_fit.cells << " cells";
}

// The first three tokens of many sampled generations, and how many drafts they made and left
// unverified.
struct FirstThreeTally {
  std::map<std::vector<int32_t>, int> observed;
  int64_t unverified = 0, drafted = 0;
  int samples = 0;

  void add(const GenerationResult& result, const SpeculativeStats& stats) {
    ASSERT_GE(result.tokens.size(), 3u);
    ++observed[{result.tokens[0], result.tokens[1], result.tokens[2]}];
    unverified += stats.unverified;
    drafted += stats.drafted;
    ++samples;
  }
  // Some drafts were left unverified, more were drafted than there were generations, and the
  // tokens follow `expected`.
  void check(const std::map<std::vector<int32_t>, double>& expected) const {
    EXPECT_GT(unverified, 0);
    EXPECT_GT(drafted, samples);
    expect_follows(expected, observed, samples);
  }
};

// The state of the prompt minus its last token: each sample restores it, so every sample is one
// prompt token, then the rounds under test.
StateSnapshot prompt_prefix(const Model& model, const std::vector<int32_t>& prompt) {
  ModelState base = model.new_state();
  ForwardOutput out;
  model.forward(prompt.data(), prompt.size() - 1, base, {}, {}, out);
  return base.snapshot();
}

// A tiny nemotron_h sampled at T = 0.8, top-k 6 after a fixed prompt, and the exact joint
// distribution of the first two tokens there.
class LosslessSampling : public ::testing::Test {
 protected:
  LosslessSampling()
      : model(load_model(written(checkpoint))),
        vocab(model->vocab_size()),
        sampling(sampling_params()),
        expected(first_two_tokens(*model, sampling, prompt)) {}

  static std::string written(testing::TinyCheckpoint& checkpoint) {
    testing::fill_nemotron(checkpoint, "M*E");
    return checkpoint.write();
  }
  static SamplingParams sampling_params() {
    SamplingParams sampling;
    sampling.temperature = 0.8f;
    sampling.top_k = 6;
    return sampling;
  }

  // One sampled generation on top of `prefix` (prompt_prefix of `from`, the fixture's prompt by
  // default), ended after `count` tokens.
  GenerationResult sample(SpeculativeGenerator& generator, const StateSnapshot& prefix,
                          uint64_t seed, int count,
                          const std::vector<int32_t>* from = nullptr) const {
    LoneSequence run(*model);
    run.state().restore(prefix);
    GenerationConfig config;
    config.sampling = sampling;
    config.sampling.seed = seed;
    config.max_tokens = 8;
    int seen = 0;
    return generator.generate(from != nullptr ? *from : prompt, run.pool, run.id, config,
                              [&](const CommittedToken&) { return ++seen < count; });
  }

  testing::TinyCheckpoint checkpoint{57};
  const std::vector<int32_t> prompt = {3, 14, 15, 92, 65};
  std::unique_ptr<Model> model;
  int64_t vocab;
  SamplingParams sampling;
  std::map<std::pair<int32_t, int32_t>, double> expected;
};

TEST_F(LosslessSampling, FirstTwoTokensFollowTheTargetWithAWrongDrafter) {
  // Speculative samples: one round with up to 3 drafts from the skewed drafter.
  const StateSnapshot prefix = prompt_prefix(*model, prompt);
  SkewedDrafter drafter(vocab);
  FixedCap cap(3);
  SpeculativeGenerator generator(*model, drafter, cap);
  std::map<std::pair<int32_t, int32_t>, int> observed;
  const int samples = 20000;
  for (int s = 0; s < samples; ++s) {
    const GenerationResult result = sample(generator, prefix, 1000 + s, 2);
    ASSERT_GE(result.tokens.size(), 2u);
    ++observed[{result.tokens[0], result.tokens[1]}];
  }
  for (const auto& [pair, count] : observed) {
    EXPECT_TRUE(expected.count(pair)) << "sampled a pair outside the target's support";
  }
  const ChiSquare fit = chi_square(expected, observed, samples);
  EXPECT_LT(fit.statistic, chi_square_critical(fit.cells - 1)) << fit.cells << " cells";
  EXPECT_GT(generator.stats().drafted, 0);
}

// The same under load: four generations at a time stepped together (decode_together), every
// generation's cap from one draft scheduler (the derived cap of make_cap_policy_factory), so each
// round's cap depends on how many generations share the step and on their acceptance. The first
// two tokens still follow the target's distribution.
TEST_F(LosslessSampling, FirstTwoTokensFollowTheTargetUnderScheduledLoad) {
  const StateSnapshot prefix = prompt_prefix(*model, prompt);

  // Rows up to width 10 are free, then each costs a tenth of a step: at the prior the allocation
  // gives 4 members caps 2, 2, 1, 1, three members 3, 2, 2, two members 4 each.
  CostCurves curves;
  for (int w = 1; w <= 24; ++w) curves.verify_ms.push_back(10.0 + 1.0 * std::max(0, w - 10));
  DecodeSetup setup;
  setup.options.mode = DecodeMode::dspark;
  setup.cap_policy = make_cap_policy_factory(curves, 4, false);
  setup.drafter = [vocab = vocab] { return std::make_unique<SkewedDrafter>(vocab); };

  constexpr int kWorkers = 4, kPerWorker = 3000;
  std::vector<std::map<std::pair<int32_t, int32_t>, int>> observed(kWorkers);
  std::vector<int64_t> drafted(kWorkers, 0);
  std::vector<std::map<int64_t, int64_t>> drafts_seen(kWorkers);
  int64_t widest = 0;
  for (int i = 0; i < kPerWorker; ++i) {
    StatePool pool = model->new_pool(kWorkers);
    std::vector<GenerationConfig> configs(kWorkers);
    std::vector<int> seen(kWorkers, 0);
    std::vector<TokenCallback> callbacks;
    std::vector<std::unique_ptr<Decoding>> decodings;
    std::vector<SequenceDecoder*> together;
    for (int w = 0; w < kWorkers; ++w) {
      pool.restore(pool.open(), prefix);
      configs[w].sampling = sampling;
      configs[w].sampling.seed = 50000 + w * kPerWorker + i;
      configs[w].max_tokens = 8;
      callbacks.push_back([&seen, w](const CommittedToken&) { return ++seen[w] < 2; });
    }
    for (int w = 0; w < kWorkers; ++w) {
      decodings.push_back(
          std::make_unique<Decoding>(*model, prompt, pool, w, configs[w], setup, callbacks[w]));
      together.push_back(&decodings.back()->decoder());
    }
    StepCounters counters;
    decode_together(*model, pool, together, &counters);
    widest = std::max(widest, counters.widest);
    for (int w = 0; w < kWorkers; ++w) {
      const GenerationResult& result = together[w]->result();
      const DecodeStats stats = decodings[w]->stats();
      if (result.tokens.size() < 2) continue;
      ++observed[w][{result.tokens[0], result.tokens[1]}];
      drafted[w] += stats.speculative.drafted;
      if (stats.speculative.rounds > 0) ++drafts_seen[w][stats.speculative.drafted];
    }
  }
  std::map<std::pair<int32_t, int32_t>, int> all;
  std::map<int64_t, int64_t> draft_sizes;
  int samples = 0;
  for (int w = 0; w < kWorkers; ++w) {
    for (const auto& [pair, count] : observed[w]) {
      all[pair] += count;
      samples += count;
      EXPECT_TRUE(expected.count(pair)) << "sampled a pair outside the target's support";
    }
    for (const auto& [size, count] : drafts_seen[w]) draft_sizes[size] += count;
    EXPECT_GT(drafted[w], 0) << "worker " << w;
  }
  EXPECT_EQ(samples, kWorkers * kPerWorker);
  EXPECT_GE(draft_sizes.size(), 2u) << "the caps did not vary";
  const ChiSquare fit = chi_square(expected, all, samples);
  EXPECT_LT(fit.statistic, chi_square_critical(fit.cells - 1)) << fit.cells << " cells";
  EXPECT_EQ(widest, kWorkers);
}

// Drafts sampled from the target's own distribution at each position (a drafter as good as a
// drafter can be; the model is tiny), with survival estimates that depend on the drafts as a
// confidence head's do: 0.6 for the first, then times 0.95 after the likeliest token of its
// position and 0.5 after any other.
class SurvivalReportingDrafter : public Drafter {
 public:
  SurvivalReportingDrafter(const Model& model, const SamplingParams& sampling)
      : model_(model), sampling_(sampling) {}
  std::string name() const override { return "survival-reporting"; }
  Draft propose(const DraftRequest& request) override {
    Draft draft;
    ModelState state = model_.new_state();
    ForwardOutput out;
    const auto n = static_cast<int64_t>(request.committed.size());
    model_.forward(request.committed.data(), n, state, {n - 1}, {}, out);
    double survival = 0.6;
    int32_t likeliest = -1;
    for (int i = 0; i < request.cap; ++i) {
      if (i > 0) survival *= draft.tokens.back() == likeliest ? 0.95 : 0.5;
      TokenDistribution p = target_distribution(sampling_, out.logits.data(), model_.vocab_size());
      likeliest = p.ids[std::max_element(p.probs.begin(), p.probs.end()) - p.probs.begin()];
      const int32_t token = sample_from(p, request.rng.uniform());
      draft.tokens.push_back(token);
      draft.proposals.push_back(std::move(p));
      draft.survival.push_back(survival);
      model_.forward(&token, 1, state, {0}, {}, out);
    }
    return draft;
  }

 private:
  const Model& model_;
  SamplingParams sampling_;
};

// Confidence-scheduled verification is lossless when sampling, though which drafts are verified
// depends on the drafts. Verify widths 1, 2 and 3+ cost 10, 11.5 and 15.09 ms and a fresh
// generation offers 3 drafts; the third is verified unless both drafts before it were other than
// their position's likeliest token ((1.9 + .15) / 15.09 < 1.6 / 11.5). Choosing the best budget
// over every draft's actual survival instead would verify the second draft, after an unlikely
// first, exactly when it is the likeliest itself ((1.9 + .285) / 15.09 > 1.6 / 11.5 >
// (1.9 + .15) / 15.09): its own value would decide whether it is verified, which biases the third
// token, and this test catches that.
TEST_F(LosslessSampling, FirstThreeTokensFollowTheTargetUnderTheConfidenceSchedule) {
  const StateSnapshot prefix = prompt_prefix(*model, prompt);
  const std::map<std::vector<int32_t>, double> expected_three =
      first_tokens(*model, sampling, prompt, 3);
  const CostCurves curves =
      testing::curves_of({10, 11.5, 15.09, 15.09, 15.09, 15.09, 15.09, 15.09});
  auto scheduler = std::make_shared<DraftScheduler>(curves, 3);
  SurvivalReportingDrafter drafter(*model, sampling);
  // The auto controller from the same prior and cap, so its first round decides as the derived
  // cap's does; its later rounds follow its own estimate.
  AutoCapController::Params params;
  params.init_cap = 3;
  params.prior_p = kDerivedCapPrior;
  params.allow_parking = false;
  for (bool auto_cap : {false, true}) {
    SCOPED_TRACE(auto_cap ? "auto controller" : "derived cap");
    FirstThreeTally tally;
    // With the best budget over every draft's actual survival, these 6,000 samples gave chi-square
    // 1,106 on the joint against a critical 285, and 395 against 114 on the third token.
    const int samples = 6000;
    for (int s = 0; s < samples; ++s) {
      // A new generation each time: its first round offers the derived cap at the prior, 3.
      std::unique_ptr<CapPolicy> policy;
      if (auto_cap) {
        policy = std::make_unique<AutoCapController>(curves, 3, params);
      } else {
        policy = std::make_unique<DerivedCap>(scheduler);
      }
      SpeculativeGenerator generator(*model, drafter, *policy);
      tally.add(sample(generator, prefix, (auto_cap ? 190000 : 90000) + s, 3), generator.stats());
    }
    tally.check(expected_three);
  }
}

// Lookup drafts priced by their survival (LookupLoadCap over LookupDrafter's estimates), on
// curves where one rejected first draft turns the next proposal into a plain step and a matched
// run lets it verify all three: how many drafts a round verifies depends on the tokens sampled
// before it. The prompt holds every token once, so every sampled token has an earlier occurrence
// to copy after. The first three tokens still follow the target's distribution.
TEST_F(LosslessSampling, FirstThreeTokensFollowTheTargetWithLookupPricedBySurvival) {
  std::vector<int32_t> repeating(vocab);
  std::iota(repeating.begin(), repeating.end(), 0);
  std::shuffle(repeating.begin(), repeating.end(), std::mt19937(5));
  const StateSnapshot prefix = prompt_prefix(*model, repeating);
  const std::map<std::vector<int32_t>, double> expected =
      first_tokens(*model, sampling, repeating, 3);
  const CostCurves curves = testing::curves_of({10, 14, 17, 19});
  ASSERT_EQ(LookupLoadCap(curves, 3).drafts_to_verify(SlotSurvival(0.55, 0.7).survival(3), 3), 3);
  FirstThreeTally tally;
  for (int s = 0; s < 6000; ++s) {
    LookupDrafter drafter(LookupParams{1, 2, 3, 3});
    LookupLoadCap policy(curves, 3);
    SpeculativeGenerator generator(*model, drafter, policy);
    tally.add(sample(generator, prefix, 290000 + s, 3, &repeating), generator.stats());
  }
  tally.check(expected);
}

// Reasoning budget (docs/speculative.md §8): with the prompt opening the block, each case spells
// some plain-decoding tokens as markers; the budget fires where ReasoningBudget says, plain
// decoding then continues greedily after the forced ids, and every drafter and cap reproduces it
// exactly.
TEST(ReasoningBudgetDecoding, SpeculativeEqualsPlainWithTheBudget) {
  testing::TinyCheckpoint checkpoint(31);
  testing::fill_nemotron(checkpoint, "M*EMEM-");
  const std::string dir = testing::write_stored(checkpoint, Storage::bf16, "budget");
  auto model = load_model(dir);
  const int64_t vocab = model->vocab_size();
  const std::vector<int32_t> forced = {3, 4, 5, 6, 7};
  const int64_t max_tokens = 18;
  int fired_cases = 0, quiet_cases = 0;
  const auto prompts = test_prompts(vocab);
  for (size_t p = 0; p < 2; ++p) {
    const std::vector<int32_t>& prompt = prompts[p];
    const PlainRun plain = plain_run(*model, prompt, max_tokens);
    struct Case {
      int64_t budget;
      std::map<int32_t, std::string> spelled;  // tokens spelled otherwise than "x"
    };
    const std::vector<Case> cases = {
        {1, {}},
        {4, {}},
        {2, {{plain.tokens[1], "</"}}},        // holds off a token past the budget
        {5, {{plain.tokens[2], "</think>"}}},  // the model closes the block first
    };
    for (const Case& c : cases) {
      GenerationConfig config;
      config.max_tokens = max_tokens;
      config.reasoning_budget.budget = c.budget;
      config.reasoning_budget.forced_ids = forced;
      config.reasoning_budget.starts_in_reasoning = true;
      config.reasoning_budget.token_text = [spelled = c.spelled](int32_t id) {
        auto found = spelled.find(id);
        return found != spelled.end() ? found->second : std::string("x");
      };
      // Where the budget fires on plain decoding's tokens, if it does.
      ReasoningBudget walk(config.reasoning_budget);
      int64_t fire_at = -1;
      for (int64_t i = 0; i < max_tokens && fire_at < 0; ++i) {
        walk.on_token(plain.tokens[i]);
        if (walk.due(max_tokens - i - 1)) fire_at = i + 1;
      }
      std::vector<int32_t> expected = plain.tokens;
      if (fire_at >= 0) {
        ++fired_cases;
        // Plain budgets fire at the count; the "</" case holds off past it.
        if (c.spelled.empty()) {
          EXPECT_EQ(fire_at, c.budget);
        } else {
          EXPECT_GT(fire_at, c.budget);
        }
        std::vector<int32_t> context = prompt;
        context.insert(context.end(), plain.tokens.begin(), plain.tokens.begin() + fire_at);
        context.insert(context.end(), forced.begin(), forced.end());
        expected.assign(plain.tokens.begin(), plain.tokens.begin() + fire_at);
        expected.insert(expected.end(), forced.begin(), forced.end());
        const int64_t rest = max_tokens - static_cast<int64_t>(expected.size());
        if (rest > 0) {
          const PlainRun after = plain_run(*model, context, rest);
          expected.insert(expected.end(), after.tokens.begin(), after.tokens.end());
        }
      } else {
        ++quiet_cases;
      }
      LoneSequence plain_state(*model);
      const GenerationResult reference =
          generate_plain(*model, prompt, plain_state.pool, plain_state.id, config,
                         [](const CommittedToken&) { return true; });
      ASSERT_EQ(reference.tokens, expected) << "budget " << c.budget;
      EXPECT_EQ(reference.budget_forced, fire_at >= 0);

      std::vector<int32_t> full = prompt;
      full.insert(full.end(), expected.begin(), expected.end());
      // Adversarial: the continuation without a budget, which the target accepts past the point
      // where the budget fires.
      std::vector<int32_t> unbudgeted = prompt;
      unbudgeted.insert(unbudgeted.end(), plain.tokens.begin(), plain.tokens.end());
      for (int kind = 0; kind < 5; ++kind) {
        for (int cap : {1, 2, 3, 5, 8}) {
          std::unique_ptr<Drafter> drafter =
              kind == 4 ? std::make_unique<OracleDrafter>(unbudgeted, false, vocab)
                        : make_drafter(kind, full, vocab, 200 + cap, cap);
          FixedCap fixed(cap);
          SpeculativeGenerator generator(*model, *drafter, fixed);
          LoneSequence state(*model);
          const GenerationResult result = generator.generate(
              prompt, state.pool, state.id, config, [](const CommittedToken&) { return true; });
          EXPECT_EQ(result.tokens, expected)
              << drafter->name() << " cap " << cap << " budget " << c.budget;
          EXPECT_EQ(result.budget_forced, reference.budget_forced);
          EXPECT_EQ(generator.stats().forced_forwards, fire_at >= 0 ? 1 : 0);
        }
      }
    }
  }
  EXPECT_GT(fired_cases, 0);
  EXPECT_GT(quiet_cases, 0);
  std::filesystem::remove_all(dir);
}

// Logprobs are reported only when asked, and then agree between plain and speculative decoding
// (forced tokens included: they come from the rows of the forced forward).
TEST(ReasoningBudgetDecoding, LogprobsOnlyWhenAskedAndEqualAcrossDecoders) {
  testing::TinyCheckpoint checkpoint(31);
  testing::fill_nemotron(checkpoint, "M*EMEM-");
  auto model = load_model(checkpoint.write());
  const std::vector<int32_t> prompt = test_prompts(model->vocab_size())[0];
  GenerationConfig config;
  config.max_tokens = 12;
  config.reasoning_budget.budget = 3;
  config.reasoning_budget.forced_ids = {3, 4, 5};
  config.reasoning_budget.starts_in_reasoning = true;
  config.reasoning_budget.token_text = [](int32_t) { return std::string("x"); };
  auto collect = [&](auto&& generate) {
    std::vector<float> logprobs;
    generate([&](const CommittedToken& token) {
      logprobs.push_back(token.logprob);
      return true;
    });
    return logprobs;
  };
  auto plain = [&](const TokenCallback& on_token) {
    LoneSequence state(*model);
    generate_plain(*model, prompt, state.pool, state.id, config, on_token);
  };
  EXPECT_EQ(collect(plain), std::vector<float>(config.max_tokens, 0.0f));
  config.logprobs = true;
  const std::vector<float> reported = collect(plain);
  ASSERT_EQ(reported.size(), static_cast<size_t>(config.max_tokens));
  for (float logprob : reported) EXPECT_LT(logprob, 0.0f);
  RandomDrafter drafter(model->vocab_size(), 5);
  FixedCap cap(3);
  SpeculativeGenerator generator(*model, drafter, cap);
  const std::vector<float> speculative = collect([&](const TokenCallback& on_token) {
    LoneSequence state(*model);
    generator.generate(prompt, state.pool, state.id, config, on_token);
  });
  ASSERT_EQ(speculative.size(), reported.size());
  for (size_t i = 0; i < reported.size(); ++i) EXPECT_NEAR(speculative[i], reported[i], 1e-5);
}

// run_generation reports the starting cap without spending a round of the policy: every
// cap_for_round call is a drafted round.
TEST(RunGeneration, ReportsTheStartingCapWithoutAdvancingThePolicy) {
  class CountingCap : public CapPolicy {
   public:
    explicit CountingCap(int* calls) : calls_(calls) {}
    int cap_for_round() override {
      ++*calls_;
      return 2;
    }
    int current_cap() const override { return 2; }

   private:
    int* calls_;
  };
  testing::TinyCheckpoint checkpoint(31);
  testing::fill_nemotron(checkpoint, "M*E");
  auto model = load_model(checkpoint.write());
  int calls = 0;
  DecodeSetup setup;
  setup.options.mode = DecodeMode::dspark;
  setup.drafter = [&] { return std::make_unique<RandomDrafter>(model->vocab_size(), 9); };
  setup.cap_policy = [&](const DecodeOptions&) { return std::make_unique<CountingCap>(&calls); };
  GenerationConfig config;
  config.max_tokens = 10;
  LoneSequence state(*model);
  DecodeStats stats;
  run_generation(
      *model, test_prompts(model->vocab_size())[0], state.pool, state.id, config, setup,
      [](const CommittedToken&) { return true; }, &stats);
  EXPECT_EQ(stats.cap, 2);
  EXPECT_GT(stats.speculative.rounds, 0);
  EXPECT_EQ(calls, stats.speculative.rounds);
}

// Speculative generation of `config` with every drafter kind at caps 1, 3 and 6, each drafting
// from `plain` (the plain output), must give `plain`. Returns how many of the runs with the first
// kind (the right drafter) accepted drafts.
int expect_every_drafter_equals_plain(const Model& model, const std::vector<int32_t>& prompt,
                                      const GenerationConfig& config,
                                      const std::vector<int32_t>& plain, uint64_t seed) {
  std::vector<int32_t> full = prompt;
  full.insert(full.end(), plain.begin(), plain.end());
  auto keep_going = [](const CommittedToken&) { return true; };
  int with_drafts = 0;
  for (int kind = 0; kind < 4; ++kind) {
    for (int cap : {1, 3, 6}) {
      std::unique_ptr<Drafter> drafter =
          make_drafter(kind, full, model.vocab_size(), seed + cap, cap);
      FixedCap fixed(cap);
      SpeculativeGenerator generator(model, *drafter, fixed, {});
      LoneSequence state(model);
      const auto result = generator.generate(prompt, state.pool, state.id, config, keep_going);
      EXPECT_EQ(result.tokens, plain) << drafter->name() << " cap " << cap;
      if (kind == 0) with_drafts += generator.stats().accepted > 0;
    }
  }
  return with_drafts;
}

// Penalties and logit bias change every verify row with the counts of the tokens before it: greedy
// speculative output still equals plain output for every drafter kind, and a strong bias takes
// over the argmax.
TEST(LosslessGreedy, PenaltiesAndLogitBiasEqualPlain) {
  testing::TinyCheckpoint checkpoint(31);
  testing::fill_nemotron(checkpoint, "M*EM");
  auto model = load_model(checkpoint.write());
  const int64_t vocab = model->vocab_size();
  GenerationConfig config;
  config.max_tokens = 24;
  config.sampling.repetition_penalty = 1.3f;
  config.sampling.presence_penalty = 0.4f;
  config.sampling.frequency_penalty = 0.2f;
  config.sampling.logit_bias = {{3, 2.5f}, {7, -1.5f}, {11, 1.0f}};
  auto keep_going = [](const CommittedToken&) { return true; };
  int with_drafts = 0;
  for (const auto& prompt : test_prompts(vocab)) {
    LoneSequence plain_state(*model);
    const auto plain =
        generate_plain(*model, prompt, plain_state.pool, plain_state.id, config, keep_going);
    EXPECT_NE(plain.tokens, plain_run(*model, prompt, config.max_tokens).tokens)
        << "the adjustments should change the output";
    with_drafts += expect_every_drafter_equals_plain(*model, prompt, config, plain.tokens, 200);
  }
  EXPECT_EQ(with_drafts, 4 * 3);

  GenerationConfig forced;
  forced.max_tokens = 5;
  forced.sampling.logit_bias = {{9, 1000.0f}};
  LoneSequence state(*model);
  EXPECT_EQ(generate_plain(*model, test_prompts(vocab)[0], state.pool, state.id, forced, keep_going)
                .tokens,
            std::vector<int32_t>(5, 9));
}

// min_tokens bans the end ids in every verify row whose position comes before the minimum, from
// the same counts plain decoding keeps: speculative output equals plain output for every drafter
// kind and cap, and the end comes no earlier than the minimum.
TEST(LosslessGreedy, MinTokensEqualsPlain) {
  testing::TinyCheckpoint checkpoint(31);
  testing::fill_nemotron(checkpoint, "M*EM");
  auto model = load_model(checkpoint.write());
  const int64_t vocab = model->vocab_size();
  auto keep_going = [](const CommittedToken&) { return true; };
  int ended_after_the_minimum = 0;
  for (const auto& prompt : test_prompts(vocab)) {
    // The plain run's third token ends the generation, as an end of turn, once 9 tokens exist.
    const PlainRun free_run = plain_run(*model, prompt, 24);
    GenerationConfig config;
    config.max_tokens = 24;
    config.eos_ids = {free_run.tokens[2]};
    config.sampling.min_tokens = 9;
    config.sampling.end_ids = config.eos_ids;
    LoneSequence plain_state(*model);
    const auto plain =
        generate_plain(*model, prompt, plain_state.pool, plain_state.id, config, keep_going);
    const auto end = std::find(plain.tokens.begin(), plain.tokens.end(), config.eos_ids[0]);
    EXPECT_GE(end - plain.tokens.begin(), 9);
    ended_after_the_minimum += end != plain.tokens.end();
    expect_every_drafter_equals_plain(*model, prompt, config, plain.tokens, 300);
  }
  EXPECT_GT(ended_after_the_minimum, 0) << "no prompt tested the end after the minimum";
}

// tool_choice's forced call opening: forced at the first token, after a closer the model writes,
// and after the reasoning budget's own closer; speculative decoding forces the same ids at the same
// place as plain decoding, for every drafter kind and cap.
TEST(AnswerPrefixDecoding, SpeculativeEqualsPlainWithAForcedPrefix) {
  testing::TinyCheckpoint checkpoint(31);
  testing::fill_nemotron(checkpoint, "M*EMEM-");
  auto model = load_model(checkpoint.write());
  const int64_t vocab = model->vocab_size();
  const std::vector<int32_t> prefix = {3, 4, 5};
  const int64_t max_tokens = 16;
  const std::vector<int32_t> prompt = test_prompts(vocab)[1];
  const PlainRun plain = plain_run(*model, prompt, max_tokens);
  // What plain greedy decoding gives once `head` is committed: head, then the model's own tokens.
  auto continued = [&](std::vector<int32_t> head) {
    std::vector<int32_t> context = prompt;
    context.insert(context.end(), head.begin(), head.end());
    const PlainRun after = plain_run(*model, context, max_tokens - head.size());
    head.insert(head.end(), after.tokens.begin(), after.tokens.end());
    return head;
  };
  auto spelled = [](std::map<int32_t, std::string> names) {
    return [names](int32_t id) {
      auto found = names.find(id);
      return found != names.end() ? found->second : std::string("x");
    };
  };
  struct Case {
    const char* name;
    GenerationConfig config;
    std::vector<int32_t> expected;
  };
  std::vector<Case> cases(3);
  cases[0].name = "at the start";
  cases[0].config.answer_prefix.ids = prefix;
  cases[0].expected = continued(prefix);
  cases[1].name = "after the model's closer";
  cases[1].config.answer_prefix = {prefix, true, "</think>",
                                   spelled({{plain.tokens[2], "</think>"}})};
  std::vector<int32_t> head(plain.tokens.begin(), plain.tokens.begin() + 3);
  head.insert(head.end(), prefix.begin(), prefix.end());
  cases[1].expected = continued(head);
  cases[2].name = "after the budget's closer";
  const auto text = spelled({{7, "</think>"}});
  cases[2].config.answer_prefix = {prefix, true, "</think>", text};
  cases[2].config.reasoning_budget.budget = 1;
  cases[2].config.reasoning_budget.forced_ids = {6, 7, 8};
  cases[2].config.reasoning_budget.starts_in_reasoning = true;
  cases[2].config.reasoning_budget.token_text = text;
  head = {plain.tokens[0], 6, 7, 8};
  head.insert(head.end(), prefix.begin(), prefix.end());
  cases[2].expected = continued(head);
  for (Case& c : cases) {
    c.config.max_tokens = max_tokens;
    LoneSequence plain_state(*model);
    const GenerationResult reference =
        generate_plain(*model, prompt, plain_state.pool, plain_state.id, c.config,
                       [](const CommittedToken&) { return true; });
    ASSERT_EQ(reference.tokens, c.expected) << c.name;
    std::vector<int32_t> full = prompt;
    full.insert(full.end(), c.expected.begin(), c.expected.end());
    for (int kind = 0; kind < 4; ++kind) {
      for (int cap : {1, 3, 6}) {
        std::unique_ptr<Drafter> drafter = make_drafter(kind, full, vocab, 300 + cap, cap);
        FixedCap fixed(cap);
        SpeculativeGenerator generator(*model, *drafter, fixed);
        LoneSequence state(*model);
        const GenerationResult result = generator.generate(
            prompt, state.pool, state.id, c.config, [](const CommittedToken&) { return true; });
        EXPECT_EQ(result.tokens, c.expected) << c.name << ", " << drafter->name() << " cap " << cap;
        EXPECT_EQ(result.budget_forced, c.config.reasoning_budget.budget > 0) << c.name;
      }
    }
  }
}

// A byte string for each id of the tiny models' vocabulary: '!'..'y' and a space as single bytes,
// JSON pieces spanning several bytes (so masks come from a real trie walk), and the end id last.
constexpr int32_t kTinyEndId = 95;
std::shared_ptr<const constrain::TokenVocabulary> tiny_json_vocabulary(int64_t vocab) {
  std::vector<std::optional<std::string>> bytes(vocab);
  const char* pieces[] = {" ", "{", "}", "\": ", ", \"", "{\""};
  for (int64_t id = 0; id < vocab && id < kTinyEndId; ++id) {
    bytes[id] = id < 89 ? std::string(1, static_cast<char>('!' + id)) : pieces[id - 89];
  }
  return std::make_shared<constrain::TokenVocabulary>(std::move(bytes));
}

std::string spell(const constrain::TokenVocabulary& vocabulary, const std::vector<int32_t>& ids) {
  std::string text;
  for (int32_t id : ids) text += vocabulary.bytes(id).value_or("");
  return text;
}

// response_format: plain decoding restricted to the grammar, and speculative decoding equal to it
// for every drafter kind and cap, whether the answer starts at once or after a thinking block,
// and whether the grammar ends the answer itself (an enum) or max_tokens does.
TEST(ConstrainedDecoding, SpeculativeEqualsPlainUnderAGrammar) {
  testing::TinyCheckpoint checkpoint(31);
  testing::fill_nemotron(checkpoint, "M*EMEM-");
  auto model = load_model(checkpoint.write());
  const int64_t vocab = model->vocab_size();
  const auto vocabulary = tiny_json_vocabulary(vocab);
  const std::vector<int32_t> end_ids = {kTinyEndId};
  struct Case {
    const char* name;
    std::shared_ptr<const constrain::Grammar> grammar;
    bool after_thinking;
  };
  const nlohmann::json schema = nlohmann::json::parse(
      R"({"type": "object", "properties": {"k": {"enum": [12, "x"]}, "b": {"type": "boolean"}},
          "required": ["k", "b"]})");
  const std::vector<Case> cases = {
      {"json_object", constrain::json_object_grammar(), false},
      {"json_object after </think>", constrain::json_object_grammar(), true},
      {"schema with an enum", constrain::json_schema_grammar(schema), false}};
  auto keep_going = [](const CommittedToken&) { return true; };
  int finished_by_grammar = 0;
  for (const Case& c : cases) {
    for (const auto& prompt : test_prompts(vocab)) {
      GenerationConfig config;
      config.max_tokens = 20;
      config.eos_ids = end_ids;
      config.answer_constraint.grammar.emplace(c.grammar, vocabulary, end_ids);
      std::vector<int32_t> head;
      if (c.after_thinking) {
        // The model's own first two tokens stay free; the second one is spelled as the closer.
        const PlainRun free_run = plain_run(*model, prompt, 2);
        head = free_run.tokens;
        const int32_t closer = head[1];
        config.answer_constraint.starts_in_reasoning = true;
        config.answer_constraint.token_text = [closer](int32_t id) {
          return id == closer ? std::string("</think>") : std::string("x");
        };
      }
      LoneSequence plain_state(*model);
      const GenerationResult plain =
          generate_plain(*model, prompt, plain_state.pool, plain_state.id, config, keep_going);
      ASSERT_GE(plain.tokens.size(), head.size());
      EXPECT_TRUE(std::equal(head.begin(), head.end(), plain.tokens.begin())) << c.name;
      // Every constrained token was allowed, and the grammar changed the output.
      constrain::TokenConstraint check(c.grammar, vocabulary, end_ids);
      for (size_t i = head.size(); i < plain.tokens.size(); ++i) {
        ASSERT_TRUE(check.allows(plain.tokens[i]))
            << c.name << ": " << spell(*vocabulary, plain.tokens) << " at " << i;
        check.accept(plain.tokens[i]);
      }
      EXPECT_NE(plain.tokens, plain_run(*model, prompt, config.max_tokens).tokens) << c.name;
      if (plain.finish_reason == FinishReason::stop) {
        EXPECT_TRUE(check.finished()) << c.name << ": " << spell(*vocabulary, plain.tokens);
        ++finished_by_grammar;
      }
      std::vector<int32_t> full = prompt;
      full.insert(full.end(), plain.tokens.begin(), plain.tokens.end());
      for (int kind = 0; kind < 4; ++kind) {
        for (int cap : {1, 3, 6}) {
          std::unique_ptr<Drafter> drafter = make_drafter(kind, full, vocab, 400 + cap, cap);
          FixedCap fixed(cap);
          SpeculativeGenerator generator(*model, *drafter, fixed);
          LoneSequence state(*model);
          const GenerationResult result =
              generator.generate(prompt, state.pool, state.id, config, keep_going);
          EXPECT_EQ(result.tokens, plain.tokens)
              << c.name << ", " << drafter->name() << " cap " << cap;
          EXPECT_EQ(result.finish_reason, plain.finish_reason) << c.name;
        }
      }
    }
  }
  EXPECT_GT(finished_by_grammar, 0) << "the enum schema should end some answers by itself";
}

// At T > 0 the first two constrained tokens follow the target distribution restricted to the
// grammar, with a drafter that proposes tokens the grammar mostly rejects.
TEST(ConstrainedDecoding, SampledTokensFollowTheRestrictedDistribution) {
  testing::TinyCheckpoint checkpoint(57);
  testing::fill_nemotron(checkpoint, "M*E");
  auto model = load_model(checkpoint.write());
  const int64_t vocab = model->vocab_size();
  const auto vocabulary = tiny_json_vocabulary(vocab);
  const auto grammar = constrain::json_object_grammar();
  SamplingParams sampling;
  sampling.temperature = 1.5f;
  const std::vector<int32_t> prompt = {3, 14, 15, 92, 65};

  auto restricted = [&](const float* logits, const constrain::TokenConstraint& constraint) {
    std::vector<float> row(logits, logits + vocab);
    constraint.mask_logits(row.data(), vocab);
    return target_distribution(sampling, row.data(), vocab);
  };
  ModelState state = model->new_state();
  ForwardOutput out;
  model->forward(prompt.data(), prompt.size(), state, {4}, {}, out);
  const constrain::TokenConstraint start(grammar, vocabulary, {});
  const TokenDistribution first = restricted(out.logits.data(), start);
  ASSERT_GT(first.ids.size(), 1u);
  const StateSnapshot after_prompt = state.snapshot();
  std::map<std::pair<int32_t, int32_t>, double> expected;
  for (size_t a = 0; a < first.ids.size(); ++a) {
    state.restore(after_prompt);
    model->forward(&first.ids[a], 1, state, {0}, {}, out);
    constrain::TokenConstraint next = start;
    next.accept(first.ids[a]);
    const TokenDistribution second = restricted(out.logits.data(), next);
    for (size_t b = 0; b < second.ids.size(); ++b) {
      expected[{first.ids[a], second.ids[b]}] = double(first.probs[a]) * second.probs[b];
    }
  }

  const StateSnapshot prefix = prompt_prefix(*model, prompt);
  RandomDrafter drafter(vocab, 5);
  FixedCap cap(3);
  SpeculativeGenerator generator(*model, drafter, cap);
  std::map<std::pair<int32_t, int32_t>, int> observed;
  const int samples = 6000;
  for (int s = 0; s < samples; ++s) {
    LoneSequence run(*model);
    run.state().restore(prefix);
    GenerationConfig config;
    config.sampling = sampling;
    config.sampling.seed = 5000 + s;
    config.max_tokens = 6;
    config.answer_constraint.grammar.emplace(grammar, vocabulary, std::vector<int32_t>{});
    int seen = 0;
    auto result = generator.generate(prompt, run.pool, run.id, config,
                                     [&](const CommittedToken&) { return ++seen < 2; });
    ASSERT_GE(result.tokens.size(), 2u);
    ++observed[{result.tokens[0], result.tokens[1]}];
  }
  for (const auto& [pair, count] : observed) {
    EXPECT_TRUE(expected.count(pair)) << "sampled a pair outside the restricted support";
  }
  const ChiSquare fit = chi_square(expected, observed, samples);
  ASSERT_GT(fit.cells, 2);
  EXPECT_LT(fit.statistic, chi_square_critical(fit.cells - 1)) << fit.cells << " cells";
  EXPECT_GT(generator.stats().drafted, 0);
}

}  // namespace
}  // namespace dspark
