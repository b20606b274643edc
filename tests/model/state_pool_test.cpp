// The state pool: sequence ids, their reuse, the errors for ids it does not hold, what the
// sequences' states hold, and OwnedSequence closing its sequence on every path.
#include "model/state_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <memory>
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
  ModelState& state = pool.state(id);
  state.reserve(40);
  state.begin_forward(3);
  {
    const backend::ComputeSection section(state.backend());
    std::fill_n(state.ssm(0), hybrid_layout().ssm_size(), 1.0f);
  }
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
  const StateContents reopened = pool.contents(id);
  for (float v : reopened.ssm[0]) ASSERT_EQ(v, 0.0f);
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

// A drafter's context kept with a sequence (SequenceAttachment): one row per target token.
class RowsAttachment final : public SequenceAttachment {
 public:
  explicit RowsAttachment(int64_t rows) : rows_(rows) {}
  int64_t rows() const override { return rows_; }
  void truncate(int64_t rows) override { rows_ = std::min(rows_, rows); }
  int64_t bytes() const override { return 100 * rows_; }

 private:
  int64_t rows_;
};

// Attachments live and die with their sequence: found by owner, replaced, cut by trims and
// restores to the state's rows (never grown), counted in bytes, limiting attached_rows, and gone
// when the id is closed and reopened.
TEST(StatePool, AttachmentsFollowTheirSequence) {
  const StateLayout layout = [] {
    StateLayout attention_only = hybrid_layout();
    attention_only.mamba_layers = 0;  // trims without a recording
    return attention_only;
  }();
  StatePool pool(layout, 2);
  const SequenceId id = pool.open(), other = pool.open();
  const int owner = 0, second_owner = 0;
  EXPECT_EQ(pool.attachment(id, &owner), nullptr);
  ModelState& state = pool.state(id);
  state.reserve(10);
  state.begin_forward(8);
  state.advance(8);
  state.end_forward();
  const StateSnapshot at_eight = pool.snapshot(id);
  const int64_t bare = pool.bytes(id);
  EXPECT_EQ(pool.attached_rows(id), 8);

  pool.attach(id, &owner, std::make_unique<RowsAttachment>(8));
  pool.attach(id, &second_owner, std::make_unique<RowsAttachment>(6));
  EXPECT_EQ(pool.attachment(id, &owner)->rows(), 8);
  EXPECT_EQ(pool.attachment(other, &owner), nullptr);
  EXPECT_EQ(pool.attached_rows(id), 6);
  EXPECT_EQ(pool.bytes(id), bare + 1400);
  EXPECT_EQ(pool.bytes(), pool.bytes(id) + pool.bytes(other));

  pool.trim(id, 7);
  EXPECT_EQ(pool.attachment(id, &owner)->rows(), 7);
  EXPECT_EQ(pool.attachment(id, &second_owner)->rows(), 6);
  pool.restore(id, at_eight);  // restoring more rows grows no attachment
  EXPECT_EQ(pool.attachment(id, &owner)->rows(), 7);
  pool.trim(id, 3);
  EXPECT_EQ(pool.attached_rows(id), 3);

  pool.attach(id, &owner, std::make_unique<RowsAttachment>(1));
  EXPECT_EQ(pool.attachment(id, &owner)->rows(), 1);
  pool.close(id);
  EXPECT_NE(error_of([&] { pool.attachment(id, &owner); }).find("is not open"), std::string::npos);
  ASSERT_EQ(pool.open(), id);
  EXPECT_EQ(pool.attachment(id, &owner), nullptr);
  EXPECT_EQ(pool.attachment(id, &second_owner), nullptr);
}

}  // namespace
}  // namespace dspark
