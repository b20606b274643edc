// The state pool: sequence ids, their reuse, the errors for ids it does not hold, what the
// sequences' states hold, and OwnedSequence closing its sequence on every path.
#include "model/state_pool.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "../error_of.h"
#include "base/error.h"

namespace dspark {
namespace {

StateLayout hybrid_layout() {
  StateLayout layout;
  layout.attention_layers = 2;
  layout.kv_heads = 2;
  layout.head_dim = 4;
  layout.mamba_layers = 1;
  layout.conv_channels = 6;
  layout.conv_kernel = 4;
  layout.ssm = {2, 3, 1, 4};
  layout.max_context = 64;
  return layout;
}

using testing::error_of;

TEST(StatePool, OpensClosesAndReusesIds) {
  StatePool pool(hybrid_layout(), 2);
  const SequenceId a = pool.open(), b = pool.open();
  EXPECT_NE(a, b);
  EXPECT_EQ(pool.open_count(), 2);
  EXPECT_NE(error_of([&] { pool.open(); }).find("all 2 sequences are in use"), std::string::npos);
  pool.close(a);
  EXPECT_FALSE(pool.is_open(a));
  EXPECT_EQ(pool.open(), a);
  EXPECT_EQ(pool.length(a), 0);
  for (SequenceId bad : {-1, 2, 1000}) {
    EXPECT_NE(error_of([&] { pool.length(bad); }).find("is not open"), std::string::npos) << bad;
  }
  pool.close(b);
  EXPECT_NE(error_of([&] { pool.trim(b, 0); }).find("sequence 1 is not open"), std::string::npos);
  EXPECT_NE(error_of([] { StatePool(hybrid_layout(), 0); }).find("capacity 0"), std::string::npos);
}

// A reopened id starts empty: no KV, zero conv windows and SSM states, whatever it held before.
TEST(StatePool, AReopenedSequenceStartsEmpty) {
  StatePool pool(hybrid_layout(), 1);
  const SequenceId id = pool.open();
  const int64_t empty_bytes = pool.bytes(id);
  ModelState& state = pool.host_state(id);
  state.reserve(40);
  state.begin_forward(3);
  state.mamba(0).ssm.assign(state.mamba(0).ssm.size(), 1.0f);
  state.advance(3);
  state.end_forward();
  EXPECT_EQ(pool.length(id), 3);
  EXPECT_GE(pool.bytes(id), empty_bytes + 2 * 2 * 40 * 8 * static_cast<int64_t>(sizeof(float)));
  EXPECT_EQ(pool.bytes(), pool.bytes(id));
  pool.close(id);
  EXPECT_EQ(pool.bytes(), 0);
  ASSERT_EQ(pool.open(), id);
  EXPECT_EQ(pool.length(id), 0);
  EXPECT_EQ(pool.bytes(id), empty_bytes);
  const StateSnapshot reopened = pool.snapshot(id);
  for (float v : reopened.mamba[0].ssm) ASSERT_EQ(v, 0.0f);
}

TEST(StatePool, OwnedSequencesCloseWhenDroppedAndMoveTheirId) {
  StatePool pool(hybrid_layout(), 2);
  {
    OwnedSequence first(pool);
    EXPECT_EQ(pool.open_count(), 1);
    OwnedSequence moved = std::move(first);
    EXPECT_FALSE(first);
    EXPECT_TRUE(moved);
    EXPECT_EQ(pool.open_count(), 1);
    OwnedSequence second(pool);
    second = std::move(moved);  // closes what `second` held
    EXPECT_EQ(pool.open_count(), 1);
    EXPECT_TRUE(pool.is_open(second.id()));
  }
  EXPECT_EQ(pool.open_count(), 0);
  OwnedSequence kept(pool);
  kept.reset();
  EXPECT_EQ(pool.open_count(), 0);
}

}  // namespace
}  // namespace dspark
