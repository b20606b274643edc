#include "base/thread_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <utility>
#include <vector>

namespace dspark {
namespace {

TEST(ThreadPool, CoversEveryIndexOnceWithGrainAlignedRanges) {
  ThreadPool pool(3);
  for (int64_t n : {1, 7, 64, 1000, 4099}) {
    std::vector<std::atomic<int>> hits(n);
    pool.parallel_for(n, 4, [&](int64_t begin, int64_t end, int thread) {
      EXPECT_EQ(begin % 4, 0);
      EXPECT_GE(thread, 0);
      EXPECT_LT(thread, 3);
      for (int64_t i = begin; i < end; ++i) hits[i].fetch_add(1);
    });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "n " << n << " index " << i;
  }
}

// Guided ranges: the first is a share of the whole loop, the last ones a single grain, so a thread
// that finishes first waits for at most a grain of another's work.
TEST(ThreadPool, RangesShrinkToSingleGrains) {
  ThreadPool pool(2);
  std::mutex mutex;
  std::vector<std::pair<int64_t, int64_t>> ranges;
  pool.parallel_for(1000, 10, [&](int64_t begin, int64_t end, int) {
    std::lock_guard<std::mutex> lock(mutex);
    ranges.emplace_back(begin, end);
  });
  std::sort(ranges.begin(), ranges.end());
  ASSERT_GE(ranges.size(), 2u);
  EXPECT_EQ(ranges.front(), std::make_pair(int64_t{0}, int64_t{250}));
  EXPECT_EQ(ranges.back().second, 1000);
  EXPECT_EQ(ranges.back().second - ranges.back().first, 10);
  for (size_t i = 1; i < ranges.size(); ++i) {
    EXPECT_EQ(ranges[i].first, ranges[i - 1].second);
    EXPECT_LE(ranges[i].second - ranges[i].first, ranges[i - 1].second - ranges[i - 1].first);
  }
}

TEST(ThreadPool, ShortLivedPoolsShutDown) {
  // A pool destroyed before its workers first ran must still join them.
  for (int i = 0; i < 200; ++i) {
    ThreadPool pool(2 + i % 3);
    if (i % 2) pool.parallel_for(10, 1, [](int64_t, int64_t, int) {});
  }
}

TEST(ThreadPool, ManySmallLoops) {
  ThreadPool pool(2);
  std::atomic<int64_t> total{0};
  for (int loop = 0; loop < 20000; ++loop) {
    pool.parallel_for(8, 1, [&](int64_t begin, int64_t end, int) { total += end - begin; });
  }
  EXPECT_EQ(total.load(), 20000 * 8);
}

}  // namespace
}  // namespace dspark
