// DpCoordinator under mpirun: DP decode ranks with uneven (and for a long stretch zero) work run
// an EP dispatch/combine per MoE layer every step without hanging, every rank takes the same
// number of coordinated steps and EP rounds, and a failing rank stops the whole group.
#include "comm/dp_coordinator.h"

#include <random>

#include <gtest/gtest.h>

#include "comm/ep_dispatcher.h"
#include "comm/process_groups.h"
#include "comm/testing/mpi_test_util.h"

namespace pdserve::comm {
namespace {

using testing::AllGather;
using testing::AllRanks;
using testing::WorldRank;
using testing::WorldSize;

constexpr int kMoeLayers = 2;
constexpr int64_t kHidden = 8;

// One decode "forward": kMoeLayers MoE layers, each a dispatch/combine of `n` tokens with
// expert e(x) = (e+1) x. Returns false if a combined output is wrong.
Status MoeForward(EpDispatcher& ep, int64_t n, std::mt19937& rng, bool* correct) {
  const int n_experts = ep.layout().n_experts;
  for (int layer = 0; layer < kMoeLayers; ++layer) {
    std::vector<float> x(n * kHidden, 1.0f);
    std::vector<int32_t> ids(n);
    std::vector<float> w(n, 1.0f);
    for (int64_t i = 0; i < n; ++i) ids[i] = static_cast<int32_t>(rng() % n_experts);
    PDSERVE_ASSIGN_OR_RETURN(const EpReceived* in, ep.Dispatch(x.data(), n, ids, w));
    std::vector<float> y(in->rows * kHidden);
    for (int64_t r = 0; r < in->rows; ++r)
      for (int64_t h = 0; h < kHidden; ++h) y[r * kHidden + h] = (in->first_expert + in->local_expert[r] + 1) * in->Row<float>(r)[h];
    std::vector<float> out(n * kHidden);
    PDSERVE_RETURN_IF_ERROR(ep.Combine(y.data(), out, false));
    for (int64_t i = 0; i < n; ++i) *correct &= out[i * kHidden] == static_cast<float>(ids[i] + 1);
  }
  return Status::Ok();
}

// Rank 1 is idle for the first 60 steps (its requests arrive late); rank 0 always has work,
// the others random loads, sometimes zero; for the first 5 steps nobody has work. Ranks vote to stop at
// different steps; the loop ends when all have.
TEST(DpCoordinatorMpTest, IdleRankRunsDummyStepsAndNobodyHangs) {
  auto world = MpiComm::World();
  ASSERT_TRUE(world.ok());
  const int p = WorldSize(), me = WorldRank();
  auto g = ProcessGroups::Create(*world, {1, p, p, 1}, {.n_routed_experts = 2 * p});
  ASSERT_TRUE(g.ok());
  auto coord = DpCoordinator::Create((*g)->world());
  auto ep = EpDispatcher::Create((*g)->ep(), {.n_experts = 2 * p, .top_k = 1, .hidden = kHidden});
  ASSERT_TRUE(coord.ok() && ep.ok());

  std::mt19937 rng(7 + me);
  int64_t real = 0, dummy = 0, skipped = 0, local_steps = 0;
  bool correct = true;
  const int64_t stop_after = 80 + 10 * me;
  for (;;) {
    const int64_t step = local_steps++;
    // Rank 0 always has work (until it drains), so rank 1's idle stretch is all dummy steps.
    int64_t tokens = static_cast<int64_t>(rng() % 4) + (me == 0 ? 1 : 0);
    if (step < 5 || (me == 1 && step < 60)) tokens = 0;
    if (step >= stop_after) tokens = 0;
    auto d = (*coord)->Step({.tokens = tokens, .stop = step >= stop_after},
                            [&](const DpDecision& dd) { ++real; return MoeForward(**ep, dd.my_tokens, rng, &correct); },
                            [&](const DpDecision&) { ++dummy; return MoeForward(**ep, 0, rng, &correct); });
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    if (d->stop) break;
    if (!d->run_forward()) ++skipped;
    ASSERT_LT(step, 1000) << "never stopped";
  }
  EXPECT_TRUE(correct);
  if (me == 1) {
    EXPECT_GE(dummy, 55);
  }
  EXPECT_GE(skipped, 5);
  // Every rank took the same coordinated steps and entered the same number of EP rounds.
  const auto steps = AllGather((*coord)->steps());
  const auto rounds = AllGather((*ep)->rounds());
  const auto forwards = AllGather(real + dummy);
  for (int r = 0; r < p; ++r) {
    EXPECT_EQ(steps[r], steps[0]);
    EXPECT_EQ(rounds[r], rounds[0]);
    EXPECT_EQ(forwards[r], forwards[0]);
  }
  EXPECT_EQ(rounds[0], forwards[0] * kMoeLayers);
  EXPECT_EQ(steps[0], 80 + 10 * (p - 1) + 1);  // the last rank to vote stop decides
}

// A forward that fails on rank 0 at step 3: every rank leaves the loop with kAborted at step 4.
TEST(DpCoordinatorMpTest, FailedForwardAbortsEveryRank) {
  auto world = MpiComm::World();
  ASSERT_TRUE(world.ok());
  auto coord = DpCoordinator::Create(*world);
  ASSERT_TRUE(coord.ok());
  const int me = WorldRank();
  int64_t aborted_at = -1;
  for (int64_t step = 0; step < 20; ++step) {
    auto d = (*coord)->Step({.tokens = 1},
                            [&](const DpDecision& dd) {
                              return me == 0 && dd.step == 3 ? Status::Internal("injected") : Status::Ok();
                            },
                            [](const DpDecision&) { return Status::Ok(); });
    if (!d.ok() && d.status().code() == StatusCode::kAborted) {
      aborted_at = step;
      EXPECT_NE(d.status().message().find("rank 0 reported a failed forward"), std::string::npos);
      break;
    }
    if (!d.ok()) {
      EXPECT_TRUE(me == 0 && step == 3) << d.status().ToString();
    }
  }
  EXPECT_EQ(aborted_at, 4);
  EXPECT_TRUE(AllRanks(aborted_at == 4));
}

}  // namespace
}  // namespace pdserve::comm
