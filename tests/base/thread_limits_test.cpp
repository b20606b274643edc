// Thread counts are bounded by the CPUs this process may use, with an error instead of an abort.
#include <gtest/gtest.h>

#include "base/error.h"
#include "base/thread_pool.h"

namespace dspark {
namespace {

std::string error_of(int threads) {
  try {
    set_default_threads(threads);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(ThreadLimits, CountsBeyondFourTimesTheCpusAreRefused) {
  const int cpus = available_cpus();
  EXPECT_GE(cpus, 1);
  EXPECT_EQ(max_threads(), 4 * cpus);
  EXPECT_EQ(error_of(100000), fmt::format("100000 threads: the count must be in [1, {}] (4 x the "
                                          "{} CPUs this process may use)",
                                          4 * cpus, cpus));
  EXPECT_EQ(error_of(0), fmt::format("0 threads: the count must be in [1, {}] (4 x the {} CPUs "
                                     "this process may use)",
                                     4 * cpus, cpus));
  EXPECT_EQ(error_of(max_threads()), "(no error)");
  EXPECT_EQ(default_pool().num_threads(), max_threads());
  EXPECT_EQ(error_of(1), "(no error)");
}

}  // namespace
}  // namespace dspark
