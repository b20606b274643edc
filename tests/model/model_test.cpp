// Model forward properties on tiny random checkpoints: chunked prefill, verify rows equal to
// one-token decoding, exact Mamba rollback, snapshots, taps, Hugging Face layout, load errors.
#include "model/model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <numeric>

#include "../error_of.h"
#include "../sealed_backend.h"
#include "base/error.h"
#include "formats/model_store.h"
#include "kernels/ops.h"
#include "tiny_checkpoint.h"

namespace dspark {
namespace {

using testing::TinyCheckpoint;

std::vector<int32_t> token_run(int64_t n, int32_t seed) {
  std::vector<int32_t> tokens(n);
  for (int64_t i = 0; i < n; ++i) tokens[i] = static_cast<int32_t>((seed + 37 * i + i * i) % 96);
  return tokens;
}

std::vector<float> logits_of(const Model& model, ModelState& state,
                             const std::vector<int32_t>& tokens, bool all_rows = true) {
  std::vector<int64_t> rows;
  if (all_rows) {
    rows.resize(tokens.size());
    std::iota(rows.begin(), rows.end(), 0);
  } else {
    rows = {static_cast<int64_t>(tokens.size()) - 1};
  }
  ForwardOutput out;
  model.forward(tokens.data(), static_cast<int64_t>(tokens.size()), state, rows, {}, out);
  return out.logits;
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float m = 0.0f;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

using testing::error_of;

// Three sequences at different depths run one batched forward (a 1-token decode, a recorded
// 6-token verify, a 23-token prefill, with taps and logits of every row) in steps of `chunk` rows;
// every output, and every state after it (the next token's logits, the verify's rollback), equals
// the sequence's own forward bit for bit.
void expect_batch_equals_lone_forwards(Model& model, int64_t chunk,
                                       backend::Backend& pool_backend = backend::cpu_backend()) {
  const int last = static_cast<int>(model.num_layers()) - 1;
  const std::vector<int> taps = {last, -1, 0};
  const std::vector<std::vector<int32_t>> prompts = {token_run(7, 1), token_run(12, 2),
                                                     token_run(3, 3)};
  const std::vector<std::vector<int32_t>> runs = {token_run(1, 4), token_run(6, 5),
                                                  token_run(23, 6)};
  auto all_rows = [](size_t n) {
    std::vector<int64_t> rows(n);
    std::iota(rows.begin(), rows.end(), 0);
    return rows;
  };
  std::vector<ModelState> lone;
  StatePool pool = model.new_pool(3, pool_backend);
  std::vector<SequenceId> batched;
  std::vector<ForwardOutput> lone_out(3), batched_out(3);
  std::vector<SequenceRun> batch;
  for (size_t i = 0; i < 3; ++i) {
    lone.push_back(model.new_state());
    batched.push_back(pool.open());
    lone[i].set_recording(true);
    pool.set_recording(batched[i], true);
    logits_of(model, lone[i], prompts[i], false);
    logits_of(model, pool.state(batched[i]), prompts[i], false);
  }
  for (size_t i = 0; i < 3; ++i) {
    model.forward(runs[i].data(), static_cast<int64_t>(runs[i].size()), lone[i],
                  all_rows(runs[i].size()), taps, lone_out[i]);
    batch.push_back({runs[i].data(), static_cast<int64_t>(runs[i].size()), batched[i],
                     all_rows(runs[i].size()), taps, &batched_out[i]});
  }
  model.set_prefill_chunk(chunk);
  model.forward_batch(batch, pool);
  model.set_prefill_chunk(2048);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(pool.length(batched[i]), lone[i].length()) << "sequence " << i;
    EXPECT_TRUE(batched_out[i].logits == lone_out[i].logits) << "sequence " << i;
    EXPECT_TRUE(batched_out[i].taps == lone_out[i].taps) << "sequence " << i;
  }
  lone[1].trim(lone[1].length() - 4);
  pool.trim(batched[1], pool.length(batched[1]) - 4);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(logits_of(model, pool.state(batched[i]), {9}), logits_of(model, lone[i], {9}))
        << "after, " << i;
  }
}

class NemotronTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    testing::fill_nemotron(checkpoint_, GetParam());
    model_ = load_model(checkpoint_.write());
  }
  TinyCheckpoint checkpoint_{7};
  std::unique_ptr<Model> model_;
};

// Every op is row invariant and the SSM scans token by token, so the chunking of a prefill does
// not change a single bit.
TEST_P(NemotronTest, ChunkedPrefillIsBitIdenticalToOneRun) {
  const std::vector<int32_t> tokens = token_run(70, 3);
  ModelState whole = model_->new_state();
  const std::vector<float> reference = logits_of(*model_, whole, tokens);
  for (int64_t chunk : {1, 9, 40}) {
    model_->set_prefill_chunk(chunk);
    ModelState state = model_->new_state();
    EXPECT_EQ(logits_of(*model_, state, tokens), reference) << "chunk " << chunk;
    EXPECT_EQ(state.length(), 70);
  }
}

// Long prompts report progress after each chunk; a forward of one chunk or less says nothing.
TEST_P(NemotronTest, PrefillProgressAfterEveryChunk) {
  std::vector<std::pair<int64_t, int64_t>> calls;
  const Model::PrefillProgress progress = [&](int64_t done, int64_t rows) {
    calls.emplace_back(done, rows);
  };
  model_->set_prefill_chunk(30);
  model_->set_prefill_progress(&progress);
  ModelState state = model_->new_state();
  logits_of(*model_, state, token_run(70, 3), false);
  EXPECT_EQ(calls, (std::vector<std::pair<int64_t, int64_t>>{{30, 70}, {60, 70}, {70, 70}}));
  calls.clear();
  logits_of(*model_, state, token_run(30, 4), false);
  EXPECT_TRUE(calls.empty());
  model_->set_prefill_progress(nullptr);
  logits_of(*model_, state, token_run(40, 5), false);
  EXPECT_TRUE(calls.empty());
}

TEST_P(NemotronTest, VerifyRowsAreBitIdenticalToOneTokenDecoding) {
  const std::vector<int32_t> prompt = token_run(20, 5), run = token_run(9, 11);
  ModelState batched = model_->new_state(), single = model_->new_state();
  logits_of(*model_, batched, prompt, false);
  logits_of(*model_, single, prompt, false);
  const std::vector<float> together = logits_of(*model_, batched, run);
  std::vector<float> one_by_one;
  for (int32_t token : run) {
    const std::vector<float> row = logits_of(*model_, single, {token});
    one_by_one.insert(one_by_one.end(), row.begin(), row.end());
  }
  EXPECT_EQ(together, one_by_one);
}

TEST_P(NemotronTest, RollbackRebuildIsBitIdenticalToPlainDecoding) {
  const std::vector<int32_t> prompt = token_run(45, 2), draft = token_run(8, 17);
  ModelState base = model_->new_state();
  logits_of(*model_, base, prompt, false);
  const StateSnapshot after_prompt = base.snapshot();
  for (int64_t keep = 0; keep <= 8; ++keep) {
    ModelState plain = model_->new_state();
    plain.restore(after_prompt);
    for (int64_t i = 0; i < keep; ++i) logits_of(*model_, plain, {draft[i]});

    ModelState verified = model_->new_state();
    verified.restore(after_prompt);
    verified.set_recording(true);
    logits_of(*model_, verified, draft);
    ASSERT_TRUE(verified.has_record());
    EXPECT_EQ(verified.record_rows(), 8);
    verified.trim(45 + keep);
    EXPECT_EQ(verified.length(), 45 + keep);

    const StateContents a = plain.contents(), b = verified.contents();
    ASSERT_EQ(a.ssm.size(), b.ssm.size());
    for (size_t i = 0; i < a.ssm.size(); ++i) {
      EXPECT_EQ(a.ssm[i], b.ssm[i]) << "keep " << keep << " layer " << i;
      EXPECT_EQ(a.conv[i], b.conv[i]) << "keep " << keep << " layer " << i;
    }
    EXPECT_EQ(a.keys, b.keys) << "keep " << keep;
    EXPECT_EQ(a.values, b.values) << "keep " << keep;
    const std::vector<int32_t> next = {draft[0]};
    EXPECT_EQ(logits_of(*model_, plain, next), logits_of(*model_, verified, next));
  }
}

TEST_P(NemotronTest, SnapshotRestoreRoundTrips) {
  ModelState state = model_->new_state();
  logits_of(*model_, state, token_run(12, 1));
  const StateSnapshot snapshot = state.snapshot();
  const std::vector<int32_t> more = token_run(5, 9);
  const std::vector<float> first = logits_of(*model_, state, more);
  EXPECT_EQ(state.length(), 17);
  state.restore(snapshot);
  EXPECT_EQ(state.length(), 12);
  EXPECT_EQ(logits_of(*model_, state, more), first);
}

TEST_P(NemotronTest, TrimWithoutARecordIsRefused) {
  ModelState state = model_->new_state();
  logits_of(*model_, state, token_run(6, 1));
  EXPECT_NE(error_of([&] { state.trim(4); }).find("Mamba"), std::string::npos);
  state.set_recording(true);
  logits_of(*model_, state, token_run(3, 4));
  EXPECT_NE(error_of([&] { state.trim(5); }).find("[6, 9)"), std::string::npos);
  EXPECT_EQ(error_of([&] { state.trim(7); }), "(no error)");
  // The record is used up by the trim.
  EXPECT_NE(error_of([&] { state.trim(6); }).find("no record"), std::string::npos);
}

TEST_P(NemotronTest, TapsAreTheResidualStream) {
  const std::vector<int32_t> tokens = token_run(6, 3);
  const int last = static_cast<int>(model_->num_layers()) - 1;
  ModelState state = model_->new_state();
  ForwardOutput out;
  model_->forward(tokens.data(), 6, state, {5, 2}, {last, -1}, out);
  const int64_t H = model_->hidden_size(), V = model_->vocab_size();
  ASSERT_EQ(out.taps.size(), static_cast<size_t>(6 * 2 * H));
  std::vector<float> embedded(6 * H);
  model_->embed(tokens.data(), 6, embedded.data());
  for (int64_t r = 0; r < 6; ++r) {
    EXPECT_TRUE(std::equal(embedded.begin() + r * H, embedded.begin() + (r + 1) * H,
                           out.taps.begin() + (r * 2 + 1) * H));
  }
  std::vector<float> logits(V);
  model_->compute_logits(out.taps.data() + (5 * 2 + 0) * H, 1, logits.data());
  EXPECT_TRUE(std::equal(logits.begin(), logits.end(), out.logits.begin()));
  model_->compute_logits(out.taps.data() + (2 * 2 + 0) * H, 1, logits.data());
  EXPECT_TRUE(std::equal(logits.begin(), logits.end(), out.logits.begin() + V));
}

TEST_P(NemotronTest, BatchedRunsAreBitIdenticalToLoneForwards) {
  for (int64_t chunk : {2048, 8}) expect_batch_equals_lone_forwards(*model_, chunk);
}

// The same batch with the pool in a backend whose memory faults outside its compute sections:
// the forward, its recording and the rollback reach the states only through the backend, and the
// bits are the CPU backend's.
TEST_P(NemotronTest, BatchedRunsOnSealedStatesEqualLoneForwards) {
  testing::SealedBackend sealed;
  for (int64_t chunk : {2048, 8}) expect_batch_equals_lone_forwards(*model_, chunk, sealed);
  EXPECT_GT(sealed.sections(), 0);
  EXPECT_EQ(sealed.live_buffers(), 0);
}

// A run the model refuses fails the batch before any state moves: a bad token, a sequence in two
// runs of one batch, a sequence the pool has not open, a pool of another model.
TEST_P(NemotronTest, ABadRunFailsTheBatchBeforeAnyStateMoves) {
  StatePool pool = model_->new_pool(3);
  const SequenceId a = pool.open(), b = pool.open();
  const std::vector<int32_t> good = token_run(3, 1), bad = {1, 100000};
  ForwardOutput out_a, out_b;
  std::vector<SequenceRun> batch = {{good.data(), 3, a, {2}, {}, &out_a},
                                    {bad.data(), 2, b, {1}, {}, &out_b}};
  auto error = [&](StatePool& in) { return error_of([&] { model_->forward_batch(batch, in); }); };
  EXPECT_NE(error(pool).find("token id 100000 at row 1"), std::string::npos);
  EXPECT_EQ(pool.length(a), 0);
  batch[1] = {good.data(), 3, a, {0}, {}, &out_b};
  EXPECT_NE(error(pool).find("two runs of one batch continue sequence"), std::string::npos);
  batch[1] = {good.data(), 3, 2, {0}, {}, &out_b};
  EXPECT_NE(error(pool).find("sequence 2 is not open"), std::string::npos);
  EXPECT_EQ(pool.length(a), 0);
  StateLayout other = pool.layout();
  other.kv_heads += 1;
  StatePool foreign(other, 3);
  foreign.open();
  batch.resize(1);
  EXPECT_NE(error(foreign).find("state pool was not made by this"), std::string::npos);
  EXPECT_EQ(foreign.length(0), 0);
}

INSTANTIATE_TEST_SUITE_P(Patterns, NemotronTest, ::testing::Values("M*EM-E", "*ME-EM", "EM*M"));

TEST(NemotronLayout, HuggingFaceLayoutMatchesMlxLayout) {
  TinyCheckpoint mlx(3), hf(3);
  testing::fill_nemotron(mlx, "ME*E");
  testing::fill_nemotron(hf, "ME*E");
  for (int layer : {1, 3}) {
    const std::string m = "backbone.layers." + std::to_string(layer) + ".mixer";
    for (auto [stacked, each] : {std::pair{"fc1", "up_proj"}, std::pair{"fc2", "down_proj"}}) {
      const testing::TinyTensor whole = hf.tensors.at(m + ".switch_mlp." + stacked + ".weight");
      hf.tensors.erase(m + ".switch_mlp." + stacked + ".weight");
      const int64_t per = whole.shape[1] * whole.shape[2];
      for (int64_t e = 0; e < whole.shape[0]; ++e) {
        hf.tensors[m + ".experts." + std::to_string(e) + "." + each + ".weight"] = {
            {whole.shape[1], whole.shape[2]},
            std::vector<float>(whole.data.begin() + e * per, whole.data.begin() + (e + 1) * per)};
      }
    }
  }
  auto& conv = hf.tensors.at("backbone.layers.0.mixer.conv1d.weight");
  conv.shape = {conv.shape[0], 1, conv.shape[1]};
  hf.tensors["backbone.embedding.weight"] = hf.tensors.at("backbone.embeddings.weight");
  hf.tensors.erase("backbone.embeddings.weight");
  hf.add("mtp.layers.0.norm.weight", {64}, 1.0f);  // dropped, as mlx-lm does

  auto mlx_model = load_model(mlx.write());
  auto hf_model = load_model(hf.write());
  const std::vector<int32_t> tokens = token_run(11, 4);
  ModelState a = mlx_model->new_state(), b = hf_model->new_state();
  EXPECT_LT(max_abs_diff(logits_of(*mlx_model, a, tokens), logits_of(*hf_model, b, tokens)), 1e-5f);
  EXPECT_EQ(hf_model->decode_weight_bytes(), mlx_model->decode_weight_bytes());
}

TEST(NemotronLoad, ClearErrorsNameTheFault) {
  auto load_error = [](const std::function<void(TinyCheckpoint&)>& damage) {
    TinyCheckpoint ck(5);
    testing::fill_nemotron(ck, "M*E-");
    damage(ck);
    const std::string dir = ck.write();
    return error_of([&] { load_model(dir); });
  };
  EXPECT_NE(load_error([](TinyCheckpoint& ck) {
              ck.config["num_hidden_layers"] = 5;
            }).find("has 4 layers but num_hidden_layers is 5"),
            std::string::npos);
  EXPECT_NE(load_error([](TinyCheckpoint& ck) {
              ck.tensors.erase("backbone.layers.0.mixer.dt_bias");
            }).find("backbone.layers.0.mixer.dt_bias"),
            std::string::npos);
  EXPECT_NE(load_error([](TinyCheckpoint& ck) {
              ck.add("backbone.layers.1.mixer.q_proj.weight", {60, 64}, 1.0f);
            }).find("backbone.layers.1.mixer.q_proj.weight"),
            std::string::npos);
  EXPECT_NE(load_error([](TinyCheckpoint& ck) {
              ck.add("backbone.layers.0.mixer.conv1d.weight", {128, 3, 1}, 1.0f);
            }).find("backbone.layers.0.mixer.conv1d.weight"),
            std::string::npos);
  EXPECT_NE(load_error([](TinyCheckpoint& ck) {
              ck.add("backbone.layers.2.mixer.extra.weight", {4}, 1.0f);
            }).find("unexpected tensor 'backbone.layers.2.mixer.extra.weight'"),
            std::string::npos);
  EXPECT_NE(load_error([](TinyCheckpoint& ck) {
              ck.config["hybrid_override_pattern"] = "M*X-";
            }).find("'X' at layer 2"),
            std::string::npos);
  EXPECT_NE(load_error([](TinyCheckpoint& ck) {
              ck.config["layers_block_type"] = {"mamba", "attention", "moe", "moe"};
            }).find("disagrees"),
            std::string::npos);
  EXPECT_NE(load_error([](TinyCheckpoint& ck) {
              ck.config.erase("ssm_state_size");
            }).find("'ssm_state_size'"),
            std::string::npos);
  EXPECT_NE(load_error([](TinyCheckpoint& ck) {
              ck.config["model_type"] = "mamba9";
            }).find("unsupported model_type 'mamba9'"),
            std::string::npos);
}

TEST(NemotronLoad, LayersBlockTypeIsAnAlternativeSpelling) {
  TinyCheckpoint ck(5);
  testing::fill_nemotron(ck, "M*E-");
  ck.config.erase("hybrid_override_pattern");
  ck.config["layers_block_type"] = {"linear_attention", "full_attention", "moe", "mlp"};
  EXPECT_EQ(load_model(ck.write())->config().layer_kinds, "M*E-");
}

TEST(ForwardArguments, BadRowsTapsAndTokensAreRefused) {
  TinyCheckpoint ck(1);
  testing::fill_nemotron(ck, "M*");
  auto model = load_model(ck.write());
  ModelState state = model->new_state();
  ForwardOutput out;
  const std::vector<int32_t> tokens = {1, 2, 3};
  EXPECT_NE(
      error_of([&] { model->forward(tokens.data(), 3, state, {3}, {}, out); }).find("logit row 3"),
      std::string::npos);
  EXPECT_NE(
      error_of([&] { model->forward(tokens.data(), 3, state, {}, {2}, out); }).find("tap layer 2"),
      std::string::npos);
  const std::vector<int32_t> bad = {1, 96};
  EXPECT_NE(
      error_of([&] { model->forward(bad.data(), 2, state, {}, {}, out); }).find("token id 96"),
      std::string::npos);
  EXPECT_EQ(state.length(), 0);
  std::vector<int32_t> long_run(513, 1);
  EXPECT_NE(error_of([&] {
              model->forward(long_run.data(), 513, state, {}, {}, out);
            }).find("exceeds the model's maximum of 512"),
            std::string::npos);
}

TEST(Dense, TrimNeedsNoRecordAndMatchesFreshDecoding) {
  TinyCheckpoint ck(2);
  testing::fill_llama(ck);
  auto model = load_model(ck.write());
  EXPECT_EQ(model->architecture(), "llama");
  const std::vector<int32_t> prompt = token_run(10, 1), extra = token_run(4, 8);
  ModelState state = model->new_state();
  logits_of(*model, state, prompt);
  logits_of(*model, state, extra);
  state.trim(12);
  ModelState fresh = model->new_state();
  logits_of(*model, fresh, prompt);
  logits_of(*model, fresh, {extra[0], extra[1]});
  const std::vector<int32_t> next = {5};
  EXPECT_EQ(logits_of(*model, state, next), logits_of(*model, fresh, next));
}

TEST(Dense, BatchedRunsAreBitIdenticalToLoneForwards) {
  TinyCheckpoint ck(2);
  testing::fill_llama(ck);
  auto model = load_model(ck.write());
  for (int64_t chunk : {2048, 5}) expect_batch_equals_lone_forwards(*model, chunk);
  testing::SealedBackend sealed;
  expect_batch_equals_lone_forwards(*model, 5, sealed);
}

TEST(Dense, VerifyRowsAreBitIdenticalToOneTokenDecoding) {
  TinyCheckpoint ck(2);
  testing::fill_llama(ck);
  auto model = load_model(ck.write());
  ModelState batched = model->new_state(), single = model->new_state();
  const std::vector<int32_t> run = token_run(7, 3);
  const std::vector<float> together = logits_of(*model, batched, run);
  std::vector<float> one_by_one;
  for (int32_t token : run) {
    const std::vector<float> row = logits_of(*model, single, {token});
    one_by_one.insert(one_by_one.end(), row.begin(), row.end());
  }
  EXPECT_EQ(together, one_by_one);
}

// The default model (4-bit group-32 weights, 8-bit tied head, 3 q heads per kv head) through
// every verify width up to 9: each row's logits equal one-token decoding of the same tokens bit
// for bit (lossless speculative decoding relies on it). Skipped when the model is not installed
// (scripts/install_default_model.sh).
TEST(Dense, DefaultModelVerifyRowsOfEveryWidthEqualOneTokenDecoding) {
  const std::string dir = models_dir() + "/SmolLM2-135M-Instruct";
  if (!std::filesystem::exists(dir + "/config.json")) GTEST_SKIP() << "no default model at " << dir;
  auto model = load_model(dir);
  constexpr int64_t kContext = 5, kMaxWidth = 9;
  std::vector<int32_t> tokens(kContext + kMaxWidth);
  for (int64_t i = 0; i < kContext + kMaxWidth; ++i) {
    tokens[i] = static_cast<int32_t>((1000 + 7919 * i) % model->vocab_size());
  }
  ModelState single = model->new_state();
  logits_of(*model, single, {tokens.begin(), tokens.begin() + kContext}, false);
  std::vector<float> one_by_one;
  for (int64_t i = kContext; i < kContext + kMaxWidth; ++i) {
    const std::vector<float> row = logits_of(*model, single, {tokens[i]});
    one_by_one.insert(one_by_one.end(), row.begin(), row.end());
  }
  ModelState batched = model->new_state();
  logits_of(*model, batched, {tokens.begin(), tokens.begin() + kContext}, false);
  for (int64_t width = 1; width <= kMaxWidth; ++width) {
    const std::vector<float> rows =
        logits_of(*model, batched, {tokens.begin() + kContext, tokens.begin() + kContext + width});
    batched.trim(kContext);
    const std::vector<float> expected(one_by_one.begin(),
                                      one_by_one.begin() + width * model->vocab_size());
    EXPECT_TRUE(rows == expected) << "width " << width;
  }
}

TEST(State, RestoreRefusesAnotherLayout) {
  TinyCheckpoint a(1), b(1);
  testing::fill_nemotron(a, "M*");
  testing::fill_llama(b);
  auto nemotron = load_model(a.write());
  auto llama = load_model(b.write());
  ModelState state = nemotron->new_state();
  const StateSnapshot foreign = llama->new_state().snapshot();
  EXPECT_NE(error_of([&] { state.restore(foreign); }).find("layout"), std::string::npos);
  ForwardOutput out;
  const int32_t token = 1;
  EXPECT_NE(
      error_of([&] { llama->forward(&token, 1, state, {}, {}, out); }).find("not made by this"),
      std::string::npos);
}

// A model runs states of either KV cache type: an f16 state holds half the KV bytes, gives logits
// close to an fp32 state's, keeps its type in snapshots and refuses the other type's.
TEST(State, EitherKvCacheTypeRunsAndSnapshotsKeepTheirType) {
  TinyCheckpoint checkpoint(1);
  testing::fill_llama(checkpoint);
  auto model = load_model(checkpoint.write());
  kernels::set_kv_cache_type(kernels::KvType::f32);
  ModelState wide = model->new_state();
  kernels::set_kv_cache_type(kernels::KvType::f16);
  ModelState half = model->new_state();
  kernels::set_kv_cache_type(std::nullopt);
  if (const char* chosen = std::getenv("DSPARK_KV_CACHE")) {
    kernels::set_kv_cache_type(kernels::parse_kv_type(chosen, "DSPARK_KV_CACHE"));
  }
  ASSERT_EQ(wide.layout().kv_type, kernels::KvType::f32);
  ASSERT_EQ(half.layout().kv_type, kernels::KvType::f16);
  const std::vector<int32_t> tokens = token_run(40, 3);
  const std::vector<float> wide_logits = logits_of(*model, wide, tokens);
  const std::vector<float> half_logits = logits_of(*model, half, tokens);
  ASSERT_EQ(wide_logits.size(), half_logits.size());
  float largest = 0.0f, furthest = 0.0f;
  for (size_t i = 0; i < wide_logits.size(); ++i) {
    largest = std::max(largest, std::abs(wide_logits[i]));
    furthest = std::max(furthest, std::abs(wide_logits[i] - half_logits[i]));
  }
  EXPECT_GT(furthest, 0.0f) << "the f16 state gave the fp32 state's logits: is it f16?";
  EXPECT_LT(furthest, 0.01f * largest);
  EXPECT_EQ(2 * half.bytes(), wide.bytes());
  const StateSnapshot snapshot = half.snapshot();
  EXPECT_EQ(snapshot.kv_type, kernels::KvType::f16);
  EXPECT_NE(error_of([&] { half.restore(wide.snapshot()); }).find("KV type"), std::string::npos);
  ModelState again = model->new_state();
  if (again.layout().kv_type == kernels::KvType::f16) {
    again.restore(snapshot);
    EXPECT_EQ(logits_of(*model, again, {5}), logits_of(*model, half, {5}));
  }
}

}  // namespace
}  // namespace dspark
