// The prefix cache hands back a sequence with its attachments (a model drafter's context, kept in
// the pool) cut to the reused prefix, so that a hit gives the drafter the context a fresh prefill
// would have.
#include "server/prefix_cache.h"

#include <gtest/gtest.h>

#include "../model/tiny_checkpoint.h"
#include "../sealed_backend.h"

namespace dspark::server {
namespace {

// Records the tokens of the rows it was fed, the way a model drafter's context holds one row per
// target token, attached to the sequence as a drafter's context is.
class RowRecorder final : public SequenceAttachment {
 public:
  int64_t rows() const override { return static_cast<int64_t>(tokens.size()); }
  void truncate(int64_t count) override {
    if (count < rows()) tokens.resize(static_cast<size_t>(count));
  }
  int64_t bytes() const override { return static_cast<int64_t>(tokens.size() * sizeof(int32_t)); }
  std::vector<int32_t> tokens;
};
const int kRecorderOwner = 0;  // the attachment's identity

int64_t length(const CacheLease& lease) {
  return lease.sequence.pool().length(lease.sequence.id());
}

RowRecorder* recorder(const CacheLease& lease) {
  return static_cast<RowRecorder*>(
      lease.sequence.pool().attachment(lease.sequence.id(), &kRecorderOwner));
}

// Runs `tokens[length ..]` through the model, recording `fed` of those rows (none attached when
// `record` is off).
void prefill(const Model& model, const std::vector<int32_t>& tokens, CacheLease& lease, int64_t fed,
             bool record = true) {
  ForwardOutput output;
  const int64_t start = length(lease);
  model.forward_batch({{tokens.data() + start,
                        static_cast<int64_t>(tokens.size()) - start,
                        lease.sequence.id(),
                        {},
                        {},
                        &output}},
                      lease.sequence.pool());
  if (!record) return;
  if (recorder(lease) == nullptr) {
    lease.sequence.pool().attach(lease.sequence.id(), &kRecorderOwner,
                                 std::make_unique<RowRecorder>());
  }
  recorder(lease)->tokens.insert(recorder(lease)->tokens.end(), tokens.begin() + start,
                                 tokens.begin() + start + fed);
}

std::vector<int32_t> sequence(int32_t first, int n) {
  std::vector<int32_t> tokens;
  for (int i = 0; i < n; ++i) tokens.push_back((first + 7 * i) % 90);
  return tokens;
}

TEST(PrefixCacheDrafter, TrimModeCutsTheDrafterToTheSharedPrefix) {
  testing::TinyCheckpoint checkpoint(3);
  testing::fill_llama(checkpoint);
  auto model = load_model(checkpoint.write());
  StatePool pool = model->new_pool(3);
  PrefixCache cache(*model, pool, {});
  const std::vector<int32_t> first = sequence(1, 12);
  CacheLease lease = cache.acquire(first);
  EXPECT_EQ(lease.cached_tokens, 0);
  EXPECT_EQ(recorder(lease), nullptr);
  prefill(*model, first, lease, 12);
  cache.release(std::move(lease), first);

  std::vector<int32_t> second(first.begin(), first.begin() + 7);
  second.push_back(89);
  second.push_back(88);
  CacheLease hit = cache.acquire(second);
  EXPECT_EQ(hit.cached_tokens, 7);
  EXPECT_EQ(length(hit), 7);
  ASSERT_NE(recorder(hit), nullptr);
  EXPECT_EQ(recorder(hit)->tokens, std::vector<int32_t>(first.begin(), first.begin() + 7));
}

TEST(PrefixCacheDrafter, ADrafterShorterThanTheStateLimitsReuse) {
  testing::TinyCheckpoint checkpoint(4);
  testing::fill_llama(checkpoint);
  auto model = load_model(checkpoint.write());
  StatePool pool = model->new_pool(3);
  PrefixCache cache(*model, pool, {});
  const std::vector<int32_t> first = sequence(2, 12);
  CacheLease lease = cache.acquire(first);
  prefill(*model, first, lease, 5);
  cache.release(std::move(lease), first);

  CacheLease hit = cache.acquire(first);
  EXPECT_EQ(hit.cached_tokens, 5);
  EXPECT_EQ(length(hit), 5);
  EXPECT_EQ(recorder(hit)->tokens.size(), 5u);
}

// The pool's states live in a backend whose memory faults outside its compute sections, so the
// cache's checkpoints, restores and byte counts go through the backend alone; the restored state is
// the one a fresh prefill of the reused prefix reaches.
TEST(PrefixCacheDrafter, CheckpointModeCutsTheDrafterToTheRestoredSnapshot) {
  testing::TinyCheckpoint checkpoint(5);
  testing::fill_nemotron(checkpoint, "M*M-");
  auto model = load_model(checkpoint.write());
  testing::SealedBackend sealed;
  StatePool pool = model->new_pool(3, sealed);
  PrefixCache cache(*model, pool, {});
  ASSERT_TRUE(cache.checkpointed());
  const std::vector<int32_t> first = sequence(3, 12);
  CacheLease lease = cache.acquire(first);
  prefill(*model, std::vector<int32_t>(first.begin(), first.begin() + 4), lease, 4);
  lease.checkpoints.push_back(pool.snapshot(lease.sequence.id()));
  prefill(*model, first, lease, 8);
  lease.checkpoints.push_back(pool.snapshot(lease.sequence.id()));
  cache.release(std::move(lease), first);
  EXPECT_GT(cache.counters().bytes, 0);

  std::vector<int32_t> second(first.begin(), first.begin() + 9);
  second.push_back(80);
  CacheLease hit = cache.acquire(second);
  EXPECT_EQ(hit.cached_tokens, 4);
  EXPECT_EQ(length(hit), 4);
  EXPECT_EQ(recorder(hit)->tokens, std::vector<int32_t>(first.begin(), first.begin() + 4));
  ModelState fresh = model->new_state();
  ForwardOutput output;
  model->forward(first.data(), 4, fresh, {}, {}, output);
  EXPECT_TRUE(pool.contents(hit.sequence.id()) == fresh.contents());
}

TEST(PrefixCacheDrafter, WithoutADrafterTheWholeStateIsReused) {
  testing::TinyCheckpoint checkpoint(6);
  testing::fill_llama(checkpoint);
  auto model = load_model(checkpoint.write());
  StatePool pool = model->new_pool(3);
  PrefixCache cache(*model, pool, {});
  const std::vector<int32_t> first = sequence(4, 10);
  CacheLease lease = cache.acquire(first);
  prefill(*model, first, lease, 0, /*record=*/false);
  cache.release(std::move(lease), first);
  CacheLease hit = cache.acquire(first);
  EXPECT_EQ(hit.cached_tokens, 9);
  EXPECT_EQ(recorder(hit), nullptr);
}

// Cached states are pool sequences: a hit hands out the cached sequence itself, a miss opens one,
// and every path that drops one (eviction, an unreleased lease, clear) closes it, so the pool never
// runs out of ids however many generations come and go.
TEST(PrefixCachePool, LeasesAreSequencesThatEveryDropCloses) {
  testing::TinyCheckpoint checkpoint(7);
  testing::fill_llama(checkpoint);
  auto model = load_model(checkpoint.write());
  StatePool pool = model->new_pool(3);
  PrefixCacheOptions options;
  options.slots = 2;
  PrefixCache cache(*model, pool, options);
  for (int round = 0; round < 5; ++round) {
    const std::vector<int32_t> prompt = sequence(10 + round, 8);
    CacheLease lease = cache.acquire(prompt);
    prefill(*model, prompt, lease, 8);
    cache.release(std::move(lease), prompt);
    EXPECT_LE(pool.open_count(), 2) << "round " << round;
  }
  const std::vector<int32_t> last = sequence(14, 8);
  CacheLease hit = cache.acquire(last);
  ASSERT_EQ(hit.cached_tokens, 7);
  const SequenceId reused = hit.sequence.id();
  cache.release(std::move(hit), last);
  EXPECT_EQ(cache.acquire(last).sequence.id(), reused);  // dropped unreleased: closed
  EXPECT_EQ(pool.open_count(), 1);
  {
    // Running leases fill the pool: a miss evicts the cached sequence to open its own.
    CacheLease a = cache.acquire(sequence(40, 6));
    CacheLease b = cache.acquire(sequence(41, 6));
    EXPECT_EQ(pool.open_count(), 3);
    CacheLease c = cache.acquire(sequence(42, 6));
    EXPECT_EQ(pool.open_count(), 3);
    EXPECT_EQ(cache.counters().entries, 0);
    cache.release(std::move(a), sequence(40, 6));
  }
  EXPECT_EQ(pool.open_count(), 1);
  cache.clear();
  EXPECT_EQ(pool.open_count(), 0);
}

}  // namespace
}  // namespace dspark::server
