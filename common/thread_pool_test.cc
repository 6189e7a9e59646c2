#include "common/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <vector>

namespace pdserve {
namespace {

TEST(ThreadPoolTest, CoversEveryIndexOnce) {
  ThreadPool pool(3);
  for (int64_t n : {0, 1, 7, 33, 4097}) {
    std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
    pool.ParallelFor(n, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)]++;
    });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << n;
  }
}

TEST(ThreadPoolTest, ManySmallJobsAndNesting) {
  ThreadPool pool(2);
  std::atomic<int64_t> sum{0};
  for (int rep = 0; rep < 2000; ++rep) {
    pool.ParallelFor(16, [&](int64_t b, int64_t e) {
      pool.ParallelFor(e - b, [&](int64_t b2, int64_t e2) { sum += e2 - b2; });
    });
  }
  EXPECT_EQ(sum.load(), 2000 * 16);
}

}  // namespace
}  // namespace pdserve
