// The memory estimate made before a model's weights are read, the fit decision on it, and the
// routing counts that show how widely a router spreads tokens over its experts.
#include "model/memory_fit.h"

#include <gtest/gtest.h>

#include <numeric>

#include "tiny_checkpoint.h"

namespace dspark {
namespace {

constexpr int64_t kGB = 1000 * 1000 * 1000;

// Nemotron 30B-A3B's state layout (docs/model-math.md §6.1).
StateLayout nano_layout() {
  StateLayout layout;
  layout.attention_layers = 6;
  layout.kv_heads = 2;
  layout.head_dim = 128;
  layout.mamba_layers = 23;
  layout.conv_channels = 6144;
  layout.conv_kernel = 4;
  layout.ssm = {64, 64, 8, 128};
  layout.max_context = 262144;
  return layout;
}

TEST(MemoryFit, StateIsFp32KvPerTokenPlusFixedMambaState) {
  const StateLayout layout = nano_layout();
  // 23 × (3 × 6144 conv rows + 64 × 64 × 128 SSM) fp32 = 2.07 MiB per Mamba layer.
  const int64_t mamba = 23 * (3 * 6144 + 64 * 64 * 128) * 4;
  EXPECT_EQ(state_bytes(layout, 0), mamba);
  // 12 KiB of K and V per token: 6 layers × 2 × 2 heads × 128 × 4 bytes.
  EXPECT_EQ(state_bytes(layout, 4096) - mamba, 4096 * 12288);
  EXPECT_EQ(state_bytes(layout, 262144) - mamba, int64_t{3} << 30);
}

TEST(MemoryFit, EstimateComesFromTheOpenedCheckpoint) {
  testing::TinyCheckpoint checkpoint(3);
  testing::fill_nemotron(checkpoint, "M*EM-E");
  const auto model = load_model(checkpoint.write());
  const MemoryEstimate estimate = estimate_memory(*model, 100);
  int64_t tensor_bytes = 0;
  for (const auto& [name, tensor] : checkpoint.tensors) {
    tensor_bytes += static_cast<int64_t>(tensor.data.size() * sizeof(float));
  }
  EXPECT_EQ(estimate.mapped_bytes, tensor_bytes);
  EXPECT_EQ(estimate.per_token_bytes, model->decode_weight_bytes());
  // Two of eight experts per MoE layer and one embedding row: a token reads less than the file.
  EXPECT_LT(estimate.per_token_bytes, estimate.mapped_bytes);
  EXPECT_EQ(estimate.state_bytes, state_bytes(model->state_layout(), 100));
  EXPECT_EQ(estimate.context, 100);
  EXPECT_GT(estimate.scratch_bytes, 0);
  EXPECT_EQ(estimate.working_set(),
            estimate.mapped_bytes + estimate.state_bytes + estimate.scratch_bytes);
}

// The two checkpoints of docs/full-size.md on a 24 GiB machine.
MemoryEstimate nano_estimate(int64_t mapped, int64_t per_token) {
  MemoryEstimate estimate;
  estimate.mapped_bytes = mapped;
  estimate.per_token_bytes = per_token;
  estimate.state_bytes = state_bytes(nano_layout(), 4096);
  estimate.scratch_bytes = int64_t{512} << 20;
  estimate.context = 4096;
  return estimate;
}

TEST(MemoryFit, FourBitFitsSixBitStreamsFromThePageCache) {
  const int64_t total = int64_t{24} << 30, available = 23 * kGB;
  const MemoryVerdict four =
      judge_memory(nano_estimate(17'775'342'336, 1'830'000'000), total, available);
  EXPECT_EQ(four.fit, MemoryFit::fits);
  const MemoryVerdict six =
      judge_memory(nano_estimate(25'680'000'000, 2'630'000'000), total, available);
  EXPECT_EQ(six.fit, MemoryFit::page_cache);
  EXPECT_NE(six.summary.find("needs 26.3 GB (25.7 GB of weights, 2.63 GB read per token"),
            std::string::npos)
      << six.summary;
  EXPECT_NE(six.summary.find("at 4096 tokens"), std::string::npos) << six.summary;
  EXPECT_NE(six.summary.find("23.0 GB available of 25.8 GB"), std::string::npos) << six.summary;
}

TEST(MemoryFit, BoundariesAreInclusive) {
  const MemoryEstimate estimate = nano_estimate(10 * kGB, 2 * kGB);
  const int64_t total = 64 * kGB;
  EXPECT_EQ(judge_memory(estimate, total, estimate.working_set()).fit, MemoryFit::fits);
  EXPECT_EQ(judge_memory(estimate, total, estimate.working_set() - 1).fit, MemoryFit::page_cache);
  EXPECT_EQ(judge_memory(estimate, total, estimate.token_working_set()).fit, MemoryFit::page_cache);
  EXPECT_EQ(judge_memory(estimate, total, estimate.token_working_set() - 1).fit,
            MemoryFit::too_small);
}

TEST(RoutingCounts, CountsChoicesAndRowsPerLayer) {
  RoutingCounts counts;
  const int32_t first[] = {0, 3, 3, 5};  // two rows, top 2
  counts.record(2, 8, first, 2, 2);
  const int32_t second[] = {7, 0};
  counts.record(2, 8, second, 1, 2);
  counts.record(0, 8, second, 1, 2);
  ASSERT_EQ(counts.chosen.size(), 3u);
  EXPECT_TRUE(counts.chosen[1].empty());
  EXPECT_EQ(counts.chosen[2], (std::vector<int64_t>{2, 0, 0, 2, 0, 1, 0, 1}));
  EXPECT_EQ(counts.rows[2], 3);
  EXPECT_EQ(counts.rows[0], 1);
  EXPECT_EQ(counts.distinct_per_layer(), (std::vector<int64_t>{2, 4}));
}

TEST(RoutingCounts, AForwardRecordsEveryRowOfEveryMoeLayer) {
  testing::TinyCheckpoint checkpoint(5);
  testing::fill_nemotron(checkpoint, "M*EM-E");
  const auto model = load_model(checkpoint.write());
  RoutingCounts counts;
  model->set_routing_counts(&counts);
  ModelState state = model->new_state();
  std::vector<int32_t> tokens(40);
  std::iota(tokens.begin(), tokens.end(), 3);
  ForwardOutput out;
  model->forward(tokens.data(), 40, state, {39}, {}, out);
  model->forward(tokens.data(), 1, state, {0}, {}, out);
  model->set_routing_counts(nullptr);
  model->forward(tokens.data(), 1, state, {0}, {}, out);
  ASSERT_EQ(counts.chosen.size(), 6u);  // up to the last MoE layer, 5
  for (int64_t layer = 0; layer < 6; ++layer) {
    if (layer != 2 && layer != 5) {
      EXPECT_TRUE(counts.chosen[layer].empty()) << layer;
      continue;
    }
    EXPECT_EQ(counts.rows[layer], 41) << layer;
    EXPECT_EQ(std::accumulate(counts.chosen[layer].begin(), counts.chosen[layer].end(), int64_t{0}),
              41 * 2)
        << layer;
  }
  // 41 varied tokens over 8 experts: the tiny random router reaches more than its top 2.
  for (int64_t distinct : counts.distinct_per_layer()) EXPECT_GT(distinct, 2);
}

// A verify forward streams the union of the experts its rows route to (docs/performance.md §4).
TEST(RoutingCounts, AForwardStreamsTheUnionOfItsRowsExperts) {
  testing::TinyCheckpoint checkpoint(5);
  testing::fill_nemotron(checkpoint, "M*EM-E");
  const auto model = load_model(checkpoint.write());
  std::vector<int32_t> tokens(40);
  std::iota(tokens.begin(), tokens.end(), 3);
  ForwardOutput out;
  auto bytes_of = [&](int64_t rows) {
    ModelState state = model->new_state();
    RoutingCounts counts;
    model->set_routing_counts(&counts);
    model->forward(tokens.data(), rows, state, {rows - 1}, {}, out);
    model->set_routing_counts(nullptr);
    return std::make_pair(model->forward_weight_bytes(counts, rows), counts.distinct_per_layer());
  };
  const auto [one_row, one_row_experts] = bytes_of(1);
  EXPECT_EQ(one_row, model->decode_weight_bytes());
  EXPECT_EQ(one_row_experts, (std::vector<int64_t>{2, 2}));

  const int64_t expert = model->routed_expert_bytes(2);
  EXPECT_GT(expert, 0);
  EXPECT_EQ(model->routed_expert_bytes(5), expert);
  EXPECT_EQ(model->routed_expert_bytes(0), 0);
  const int64_t embedding_row = model->forward_weight_bytes(RoutingCounts{}, 2) - one_row;
  EXPECT_GT(embedding_row, 0);
  const auto [forty_rows, experts] = bytes_of(40);
  ASSERT_EQ(experts.size(), 2u);
  EXPECT_EQ(forty_rows, one_row + 39 * embedding_row + (experts[0] - 2 + experts[1] - 2) * expert);
}

}  // namespace
}  // namespace dspark
