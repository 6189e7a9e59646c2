#include "common/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <thread>
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

// ParallelForChunks hands out ranges of exactly `chunk` indices (the last one shorter), each
// index once, and spreads them over the threads.
TEST(ThreadPoolTest, ChunksOfTheAskedSize) {
  ThreadPool pool(3);
  for (int64_t chunk : {1, 3, 64}) {
    for (int64_t n : {0, 1, 7, 130}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      std::atomic<int64_t> bad_ranges{0};
      pool.ParallelForChunks(n, chunk, [&](int64_t b, int64_t e) {
        if (b % chunk != 0 || (e - b != chunk && e != n)) ++bad_ranges;
        for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)]++;
      });
      EXPECT_EQ(bad_ranges.load(), 0) << "n " << n << " chunk " << chunk;
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << n;
    }
  }
  // 64 one-index chunks that each take a while: the caller cannot run them all alone, so the
  // workers must have claimed some.
  std::mutex mu;
  std::set<std::thread::id> ran_on;
  pool.ParallelForChunks(64, 1, [&](int64_t, int64_t) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::lock_guard<std::mutex> lock(mu);
    ran_on.insert(std::this_thread::get_id());
  });
  EXPECT_GE(ran_on.size(), 2u);
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
