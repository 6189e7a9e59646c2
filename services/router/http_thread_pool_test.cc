// HttpThreadPool: tasks that block (as streams hold their connection's thread) make the pool
// start threads up to its bound; at the bound a task waits for a free thread; shutdown runs
// what is queued and joins every thread.
#include "services/router/http_thread_pool.h"

#include <atomic>
#include <chrono>
#include <future>

#include <gtest/gtest.h>

namespace pdserve::router {
namespace {

using namespace std::chrono_literals;

TEST(HttpThreadPoolTest, GrowsPastWarmThreadsWhileTasksHoldThemAndStopsAtTheBound) {
  HttpThreadPool pool(2, 5);
  EXPECT_EQ(pool.threads(), 2u);
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<int> running{0}, done{0};
  auto hold = [&] {
    ++running;
    released.wait();
    ++done;
  };
  for (int i = 0; i < 4; ++i) pool.enqueue(hold);  // four "streams"
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (running < 4 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(running, 4) << "a task waited behind held threads";
  EXPECT_EQ(pool.threads(), 4u);
  // A fifth task (a scrape) runs at once on a fifth thread.
  std::promise<void> scraped;
  pool.enqueue([&] { scraped.set_value(); });
  EXPECT_EQ(scraped.get_future().wait_for(5s), std::future_status::ready);
  EXPECT_EQ(pool.threads(), 5u);
  // At the bound: with every thread held, a task waits for the next free one.
  pool.enqueue(hold);
  pool.enqueue(hold);
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(pool.threads(), 5u);
  EXPECT_EQ(running, 5);
  std::promise<void> late;
  pool.enqueue([&] { late.set_value(); });
  auto late_done = late.get_future();
  EXPECT_EQ(late_done.wait_for(50ms), std::future_status::timeout);
  release.set_value();
  EXPECT_EQ(late_done.wait_for(5s), std::future_status::ready);
  pool.shutdown();
  EXPECT_EQ(done, 6);
  EXPECT_EQ(pool.threads(), 0u);
}

TEST(HttpThreadPoolTest, ShutdownRunsWhatIsQueued) {
  std::atomic<int> ran{0};
  {
    HttpThreadPool pool(1, 1);
    for (int i = 0; i < 20; ++i) pool.enqueue([&] { ++ran; });
    pool.shutdown();
    EXPECT_EQ(ran, 20);
    pool.enqueue([&] { ++ran; });  // after shutdown: dropped (httplib enqueues nothing then)
  }
  EXPECT_EQ(ran, 20);
}

}  // namespace
}  // namespace pdserve::router
