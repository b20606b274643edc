// propose_together on drafters whose group passes are recorded: drafters of one group are fed and
// draft in one pass each, the others alone, every call gets its own drafter's draft, and a failure
// stays with the call or group it came from.
#include <gtest/gtest.h>

#include <stdexcept>

#include "speculative/drafter.h"

namespace dspark {
namespace {

// What the group passes of one key did.
struct GroupLog {
  int feed_passes = 0;
  int propose_passes = 0;
  std::vector<int64_t> fed;  // rows fed per member, in the pass's order
  bool fail = false;
};

// Drafts `id` repeated `cap` times; members of one log form a group.
class RecordingDrafter : public Drafter {
 public:
  RecordingDrafter(int32_t id, GroupLog* log) : id_(id), log_(log) {}
  std::string name() const override { return "recording"; }
  void on_target_rows(const int32_t*, int64_t n, const float*) override { rows_ += n; }
  int64_t context_rows() const override { return rows_; }
  Draft propose(const DraftRequest& request) override {
    if (id_ < 0) throw std::runtime_error("a lone drafter failed");
    Draft draft;
    draft.tokens.assign(request.cap, id_);
    return draft;
  }
  Drafter* grouped() override { return log_ != nullptr ? this : nullptr; }
  const void* group() const override { return log_; }
  void feed_group(std::span<Drafter* const> members, std::span<const DrafterRows> rows) override {
    ++log_->feed_passes;
    for (size_t i = 0; i < members.size(); ++i) {
      log_->fed.push_back(rows[i].n);
      static_cast<RecordingDrafter*>(members[i])->rows_ += rows[i].n;
    }
  }
  void propose_group(std::span<Drafter* const> members,
                     std::span<const DraftRequest* const> requests,
                     std::span<Draft> drafts) override {
    ++log_->propose_passes;
    if (log_->fail) throw std::runtime_error("a group failed");
    for (size_t i = 0; i < members.size(); ++i) drafts[i] = members[i]->propose(*requests[i]);
  }

 private:
  int32_t id_;
  GroupLog* log_;
  int64_t rows_ = 0;
};

// Lends a drafter, as the server's slots do: the group is the lent drafter's.
class Lender : public Drafter {
 public:
  explicit Lender(Drafter& drafter) : drafter_(drafter) {}
  std::string name() const override { return drafter_.name(); }
  Draft propose(const DraftRequest& request) override { return drafter_.propose(request); }
  Drafter* grouped() override { return drafter_.grouped(); }

 private:
  Drafter& drafter_;
};

struct Calls {
  std::vector<int32_t> committed{1, 2, 3};
  SamplingParams greedy;
  Rng rng{0};
  std::vector<int32_t> tokens{7, 7, 7, 7};
  std::vector<float> taps = std::vector<float>(4, 0.0f);

  DraftCall call(Drafter& drafter, int cap, int64_t unfed) {
    return DraftCall{&drafter, DraftRequest{committed, cap, greedy, rng},
                     DrafterRows{tokens.data(), unfed, taps.data()}};
  }
};

TEST(ProposeTogether, GroupsDraftInOnePassAndEveryCallGetsItsOwnDraft) {
  GroupLog first, second;
  RecordingDrafter a(10, &first), b(11, &first), c(20, &second), alone(30, nullptr);
  Lender lent_b(b);
  Calls make;
  const std::vector<DraftCall> calls = {make.call(a, 1, 2), make.call(alone, 2, 1),
                                        make.call(lent_b, 3, 0), make.call(c, 2, 4)};
  const std::vector<DraftOutcome> outcomes = propose_together(calls);
  ASSERT_EQ(outcomes.size(), 4u);
  const std::vector<std::vector<int32_t>> expected = {{10}, {30, 30}, {11, 11, 11}, {20, 20}};
  for (size_t i = 0; i < outcomes.size(); ++i) {
    EXPECT_FALSE(outcomes[i].error) << i;
    EXPECT_EQ(outcomes[i].draft.tokens, expected[i]) << i;
  }
  EXPECT_EQ(first.feed_passes, 1);
  EXPECT_EQ(first.propose_passes, 1);
  EXPECT_EQ(first.fed, (std::vector<int64_t>{2, 0}));
  EXPECT_EQ(second.propose_passes, 1);
  // Every drafter holds the rows its call carried, the lone one fed by on_target_rows.
  EXPECT_EQ(a.context_rows(), 2);
  EXPECT_EQ(b.context_rows(), 0);
  EXPECT_EQ(c.context_rows(), 4);
  EXPECT_EQ(alone.context_rows(), 1);
}

TEST(ProposeTogether, AFailureStaysWithItsCallOrItsGroup) {
  GroupLog failing, healthy;
  failing.fail = true;
  RecordingDrafter a(10, &failing), b(11, &failing), c(20, &healthy), broken(-1, nullptr),
      alone(30, nullptr);
  Calls make;
  const std::vector<DraftCall> calls = {make.call(a, 1, 0), make.call(broken, 1, 0),
                                        make.call(c, 2, 0), make.call(b, 1, 0),
                                        make.call(alone, 1, 0)};
  const std::vector<DraftOutcome> outcomes = propose_together(calls);
  ASSERT_EQ(outcomes.size(), 5u);
  for (size_t i : {0u, 1u, 3u}) {
    ASSERT_TRUE(outcomes[i].error) << i;
    EXPECT_TRUE(outcomes[i].draft.tokens.empty()) << i;
  }
  EXPECT_THROW(std::rethrow_exception(outcomes[0].error), std::runtime_error);
  try {
    std::rethrow_exception(outcomes[1].error);
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "a lone drafter failed");
  }
  EXPECT_FALSE(outcomes[2].error);
  EXPECT_EQ(outcomes[2].draft.tokens, (std::vector<int32_t>{20, 20}));
  EXPECT_FALSE(outcomes[4].error);
  EXPECT_EQ(outcomes[4].draft.tokens, (std::vector<int32_t>{30}));
}

}  // namespace
}  // namespace dspark
