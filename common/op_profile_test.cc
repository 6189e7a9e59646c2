#include "common/op_profile.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "common/thread_pool.h"

namespace pdserve {
namespace {

void BusyFor(std::chrono::microseconds us) {
  const auto end = std::chrono::steady_clock::now() + us;
  while (std::chrono::steady_clock::now() < end) {
  }
}

OpProfile MakeProfile() { return OpProfile({"other", "pool wait", "a", "b"}, {"prefill", "decode"}); }

TEST(OpProfileTest, NestedScopesAreExclusiveAndSumToTheStep) {
  OpProfile p = MakeProfile();
  const auto t0 = std::chrono::steady_clock::now();
  {
    OpProfileStep step(&p, 1);
    BusyFor(std::chrono::microseconds(2000));  // other
    {
      OpScope a(2);
      BusyFor(std::chrono::microseconds(3000));
      {
        OpScope b(3);
        BusyFor(std::chrono::microseconds(4000));
      }
      BusyFor(std::chrono::microseconds(1000));  // a again
    }
  }
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(p.steps(1), 1);
  EXPECT_EQ(p.steps(0), 0);
  EXPECT_EQ(p.total_seconds(0), 0.0);
  // Busy waits only get longer on a loaded machine: lower bounds per op; and exclusive
  // attribution means the ops add up to at most the wall time (counting b inside a as well
  // would exceed it by b's 4 ms).
  EXPECT_GE(p.seconds(1, 0), 2e-3);
  EXPECT_GE(p.seconds(1, 2), 4e-3);
  EXPECT_GE(p.seconds(1, 3), 4e-3);
  EXPECT_LE(p.total_seconds(1), wall);
  EXPECT_NEAR(p.seconds(1, 0) + p.seconds(1, 1) + p.seconds(1, 2) + p.seconds(1, 3), p.total_seconds(1), 1e-9);
  EXPECT_NE(p.Table().find("| a |"), std::string::npos);
}

TEST(OpProfileTest, OffRecordsNothing) {
  OpProfile p = MakeProfile();
  {
    OpProfileStep step(nullptr, 0);
    OpScope a(2);
    BusyFor(std::chrono::microseconds(500));
  }
  OpScope outside(3);  // no step open: a no-op
  for (int op = 0; op < p.n_ops(); ++op) EXPECT_EQ(p.seconds(0, op), 0.0);
  EXPECT_EQ(p.steps(0), 0);
}

TEST(OpProfileTest, PoolWaitAndRegionsAreCounted) {
  OpProfile p = MakeProfile();
  ThreadPool pool(2);
  {
    OpProfileStep step(&p, 0);
    OpScope a(2);
    // Two chunks; whichever thread gets the long one, the caller ends up waiting for the
    // worker or working itself: either way the regions are counted and the step time adds up.
    for (int rep = 0; rep < 5; ++rep)
      pool.ParallelFor(2, [&](int64_t b, int64_t) { BusyFor(std::chrono::microseconds(b == 0 ? 200 : 3000)); });
  }
  EXPECT_GE(p.parallel_regions(0), 1);
  EXPECT_LE(p.parallel_regions(0), 5);
  EXPECT_NEAR(p.seconds(0, 0) + p.seconds(0, 2) + p.seconds(0, OpProfile::kPoolWait), p.total_seconds(0), 1e-9);
  EXPECT_GE(p.total_seconds(0), 5 * 3e-3);
  p.Reset();
  EXPECT_EQ(p.total_seconds(0), 0.0);
  EXPECT_EQ(p.parallel_regions(0), 0);
}

TEST(OpProfileTest, PoolWaitIsChargedToTheOpItInterrupted) {
  OpProfile p = MakeProfile();
  ThreadPool pool(2);
  const std::thread::id caller = std::this_thread::get_id();
  std::atomic<bool> worker_started{false}, caller_done{false};
  auto spin_until = [](const std::atomic<bool>& flag) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    while (!flag && std::chrono::steady_clock::now() < deadline) {
    }
  };
  {
    OpProfileStep step(&p, 0);
    {
      OpScope a(2);
      // The caller's chunk returns once a worker holds the other chunk (a worker must take it:
      // the caller is busy in its own); the worker's chunk then runs 30 ms past the caller's
      // return, which the caller spends waiting inside op 2's region.
      pool.ParallelFor(2, [&](int64_t, int64_t) {
        if (std::this_thread::get_id() != caller) {
          worker_started = true;
          spin_until(caller_done);
          BusyFor(std::chrono::microseconds(30000));
          return;
        }
        spin_until(worker_started);
        caller_done = true;
      });
    }
    OpScope b(3);
    BusyFor(std::chrono::microseconds(500));
  }
  ASSERT_TRUE(worker_started) << "no pool worker ran a chunk";
  EXPECT_GT(p.wait_seconds(0, 2), 10e-3);
  EXPECT_EQ(p.wait_seconds(0, 3), 0.0);
  double waits = 0;
  for (int op = 0; op < p.n_ops(); ++op) waits += p.wait_seconds(0, op);
  EXPECT_NEAR(waits, p.seconds(0, OpProfile::kPoolWait), 1e-9);
  EXPECT_NE(p.Table().find("pool wait ms/step"), std::string::npos);
  p.Reset();
  EXPECT_EQ(p.wait_seconds(0, 2), 0.0);
}

}  // namespace
}  // namespace pdserve
