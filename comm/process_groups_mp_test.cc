// ProcessGroups under mpirun: group membership for every plan that fits the world, and bad or
// inconsistent plans failing on every rank without leaving any rank blocked.
#include "comm/process_groups.h"

#include <gtest/gtest.h>

#include "comm/testing/mpi_test_util.h"

namespace pdserve::comm {
namespace {

using testing::AllGather;
using testing::AllRanks;
using testing::WorldRank;
using testing::WorldSize;

// Model dims every plan of the world fits: ep and tp divide the world size.
PlanModelDims Dims() {
  return {.n_routed_experts = 4 * WorldSize(), .num_attention_heads = 2 * WorldSize(), .vocab_size = 100};
}

std::vector<ParallelPlan> PlansFor(int world) {
  std::vector<ParallelPlan> plans;
  for (int cp = 1; cp <= world; ++cp)
    for (int dp = 1; dp <= world; ++dp)
      for (int tp = 1; tp <= world; ++tp)
        for (int ep = 1; ep <= world; ++ep)
          if (cp * dp * tp == world && world % ep == 0) plans.push_back({cp, dp, ep, tp});
  return plans;
}

// The world ranks of a group, in group-rank order.
std::vector<int64_t> Members(const MpiComm& c) { return AllGather(WorldRank(), c.get()); }

TEST(ProcessGroupsMpTest, GroupsMatchTheGridForEveryPlan) {
  auto world = MpiComm::World();
  ASSERT_TRUE(world.ok());
  for (const ParallelPlan& plan : PlansFor(WorldSize())) {
    auto g = ProcessGroups::Create(*world, plan, Dims());
    ASSERT_TRUE(g.ok()) << plan.ToString() << ": " << g.status().ToString();
    const RankCoords c = (*g)->coords();
    EXPECT_EQ(c.world, WorldRank());
    std::vector<int64_t> tp, cp, dp, ep;
    for (int i = 0; i < plan.tp; ++i) tp.push_back(ProcessGroups::WorldRankOf(plan, c.cp, c.dp, i));
    for (int i = 0; i < plan.cp; ++i) cp.push_back(ProcessGroups::WorldRankOf(plan, i, c.dp, c.tp));
    for (int i = 0; i < plan.dp; ++i) dp.push_back(ProcessGroups::WorldRankOf(plan, c.cp, i, c.tp));
    for (int i = 0; i < plan.ep; ++i) ep.push_back(c.ep_group * plan.ep + i);
    EXPECT_EQ(Members((*g)->tp()), tp) << plan.ToString();
    EXPECT_EQ(Members((*g)->cp()), cp) << plan.ToString();
    EXPECT_EQ(Members((*g)->dp()), dp) << plan.ToString();
    EXPECT_EQ(Members((*g)->ep()), ep) << plan.ToString();
    EXPECT_EQ((*g)->world().size(), WorldSize());
  }
}

// Each of these is wrong the same way on every rank: every rank must get the same
// kInvalidArgument naming the problem, and the world must still be usable afterwards (no rank
// stuck in a split the others skipped).
TEST(ProcessGroupsMpTest, MisconfiguredPlanFailsOnEveryRank) {
  if (WorldSize() < 2) GTEST_SKIP() << "needs 2+ ranks";
  auto world = MpiComm::World();
  ASSERT_TRUE(world.ok());
  const int n = WorldSize();
  struct Case {
    ParallelPlan plan;
    PlanModelDims dims;
    std::string needle;
  };
  const std::vector<Case> cases = {
      {{1, 2 * n, 1, 1}, Dims(), "the MPI world has " + std::to_string(n)},
      {{1, n, n + 1, 1}, Dims(), "ep=" + std::to_string(n + 1) + " does not divide the world size"},
      {{1, n, n, 1}, {.n_routed_experts = n + 1}, "does not divide the model's " + std::to_string(n + 1) + " routed experts"},
      {{1, 1, 1, n}, {.num_attention_heads = n + 1}, "attention heads"},
  };
  for (const Case& c : cases) {
    auto g = ProcessGroups::Create(*world, c.plan, c.dims);
    const bool as_expected = !g.ok() && g.status().code() == StatusCode::kInvalidArgument &&
                             g.status().message().find(c.needle) != std::string::npos;
    EXPECT_TRUE(as_expected) << c.plan.ToString() << ": " << (g.ok() ? "accepted" : g.status().ToString());
    EXPECT_TRUE(AllRanks(as_expected)) << "some rank did not reject " << c.plan.ToString();
  }
  EXPECT_TRUE(world->Barrier().ok());
}

// Ranks started with different plans (each valid on its own) or different model configs.
TEST(ProcessGroupsMpTest, InconsistentPlansFailOnEveryRank) {
  if (WorldSize() < 2) GTEST_SKIP() << "needs 2+ ranks";
  auto world = MpiComm::World();
  ASSERT_TRUE(world.ok());
  const int n = WorldSize();
  const bool first = WorldRank() == 0;

  // Rank 0 thinks dp=n, the others tp=n: both pass local validation.
  const ParallelPlan plan = first ? ParallelPlan{1, n, 1, 1} : ParallelPlan{1, 1, 1, n};
  auto g = ProcessGroups::Create(*world, plan, Dims());
  const bool disagree = !g.ok() && g.status().message().find("ranks disagree on the parallel plan: dp") != std::string::npos;
  EXPECT_TRUE(disagree) << (g.ok() ? "accepted" : g.status().ToString());
  EXPECT_TRUE(AllRanks(disagree));

  // Rank 1 has a model whose expert count ep does not divide: it reports its own reason, the
  // others name rank 1.
  PlanModelDims dims = Dims();
  if (WorldRank() == 1) dims.n_routed_experts = 4 * n + 1;
  auto h = ProcessGroups::Create(*world, ParallelPlan{1, n, n, 1}, dims);
  const std::string expected = WorldRank() == 1 ? "routed experts" : "was rejected by rank 1";
  const bool named = !h.ok() && h.status().message().find(expected) != std::string::npos;
  EXPECT_TRUE(named) << (h.ok() ? "accepted" : h.status().ToString());
  EXPECT_TRUE(AllRanks(named));
  EXPECT_TRUE(world->Barrier().ok());
}

}  // namespace
}  // namespace pdserve::comm
