#include "comm/parallel_plan.h"

#include <cstdio>
#include <fstream>

#include <gtest/gtest.h>

#include "comm/process_groups.h"

namespace pdserve::comm {
namespace {

const PlanModelDims kDims{/*n_routed_experts=*/256, /*num_attention_heads=*/128, /*vocab_size=*/129280};

TEST(ParallelPlanTest, DefaultIsOneRank) {
  EXPECT_TRUE(ParallelPlan{}.Validate(1, kDims).ok());
  EXPECT_EQ(ParallelPlan{}.ToString(), "cp=1 dp=1 ep=1 tp=1");
}

TEST(ParallelPlanTest, AcceptsTypicalPrefillAndDecodePlans) {
  EXPECT_TRUE((ParallelPlan{.cp = 8, .dp = 1, .ep = 8, .tp = 1}).Validate(8, kDims).ok());
  EXPECT_TRUE((ParallelPlan{.cp = 1, .dp = 4, .ep = 8, .tp = 2}).Validate(8, kDims).ok());
  EXPECT_TRUE((ParallelPlan{.cp = 1, .dp = 2, .ep = 2, .tp = 2}).Validate(4, kDims).ok());
}

void ExpectRejected(const ParallelPlan& plan, int world, const PlanModelDims& dims, const std::string& needle) {
  const Status s = plan.Validate(world, dims);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << plan.ToString();
  EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
}

TEST(ParallelPlanTest, RejectsWithMessagesNamingTheProblem) {
  ExpectRejected({.cp = 1, .dp = 2, .ep = 1, .tp = 1}, 4, kDims, "cp*dp*tp = 2 ranks, but the MPI world has 4");
  ExpectRejected({.cp = 1, .dp = 4, .ep = 3, .tp = 1}, 4, kDims, "ep=3 does not divide the world size 4");
  ExpectRejected({.cp = 1, .dp = 4, .ep = 4, .tp = 1}, 4, {.n_routed_experts = 10}, "ep=4 does not divide the model's 10 routed experts");
  ExpectRejected({.cp = 1, .dp = 1, .ep = 1, .tp = 4}, 4, {.num_attention_heads = 6}, "tp=4 does not divide the model's 6 attention heads");
  ExpectRejected({.cp = 1, .dp = 1, .ep = 1, .tp = 4}, 4, {.vocab_size = 3}, "exceeds the vocabulary size 3");
  ExpectRejected({.cp = 0, .dp = 1, .ep = 1, .tp = 1}, 0, kDims, "cp=0 is out of range");
  // Unknown model dims (0) are not checked.
  EXPECT_TRUE((ParallelPlan{.cp = 1, .dp = 4, .ep = 4, .tp = 1}).Validate(4, PlanModelDims{}).ok());
}

TEST(ParallelPlanTest, JsonAndYamlForms) {
  auto j = ParallelPlan::FromJson(nlohmann::json::parse(R"({"parallel": {"dp": 2, "tp": 2, "ep": 4}})"));
  ASSERT_TRUE(j.ok()) << j.status().ToString();
  EXPECT_EQ(*j, (ParallelPlan{.cp = 1, .dp = 2, .ep = 4, .tp = 2}));
  auto flat = ParallelPlan::FromJson(nlohmann::json::parse(R"({"cp": 4, "ep": 4})"));
  ASSERT_TRUE(flat.ok());
  EXPECT_EQ(flat->cp, 4);
  EXPECT_EQ(ParallelPlan::FromJson(flat->ToJson()).value(), *flat);

  auto y = ParallelPlan::FromYaml("parallel:\n  cp: 1\n  dp: 4\n  ep: 4\n");
  ASSERT_TRUE(y.ok()) << y.status().ToString();
  EXPECT_EQ(*y, (ParallelPlan{.cp = 1, .dp = 4, .ep = 4, .tp = 1}));
  EXPECT_EQ(ParallelPlan::FromYaml("{tp: 2}").value().tp, 2);

  EXPECT_NE(ParallelPlan::FromYaml("parallel: {dpp: 2}").status().message().find("unknown parallel plan key 'dpp'"),
            std::string::npos);
  EXPECT_FALSE(ParallelPlan::FromYaml("parallel: {dp: two}").ok());
  EXPECT_FALSE(ParallelPlan::FromYaml("parallel: [1, 2").ok());
  EXPECT_FALSE(ParallelPlan::FromJson(nlohmann::json::parse(R"({"dp": 1.5})")).ok());
  EXPECT_FALSE(ParallelPlan::FromJson(nlohmann::json::parse(R"({"ep": 0})")).ok());
}

TEST(ParallelPlanTest, LoadFileByExtension) {
  const std::string dir = ::testing::TempDir();
  const std::string yaml = dir + "/plan-" + std::to_string(::getpid()) + ".yaml";
  const std::string json = dir + "/plan-" + std::to_string(::getpid()) + ".json";
  std::ofstream(yaml) << "parallel: {dp: 2, ep: 2}\n";
  std::ofstream(json) << R"({"cp": 2})";
  EXPECT_EQ(ParallelPlan::LoadFile(yaml).value().dp, 2);
  EXPECT_EQ(ParallelPlan::LoadFile(json).value().cp, 2);
  EXPECT_EQ(ParallelPlan::LoadFile(dir + "/missing.json").status().code(), StatusCode::kNotFound);
  std::remove(yaml.c_str());
  std::remove(json.c_str());
}

TEST(ProcessGroupsGridTest, CoordsRoundTripAndTpIsAdjacent) {
  const ParallelPlan plan{.cp = 2, .dp = 2, .ep = 4, .tp = 2};
  for (int r = 0; r < 8; ++r) {
    const RankCoords c = ProcessGroups::CoordsOf(plan, r);
    EXPECT_EQ(ProcessGroups::WorldRankOf(plan, c.cp, c.dp, c.tp), r);
    EXPECT_EQ(c.tp, r % 2);  // TP peers are neighbours
    EXPECT_EQ(c.ep_group, r / 4);
    EXPECT_EQ(c.ep, r % 4);
  }
}

TEST(ParallelPlanTest, FromStringFormsAndErrors) {
  auto p = ParallelPlan::FromString("cp=2,ep=4");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(*p, (comm::ParallelPlan{.cp = 2, .dp = 1, .ep = 4, .tp = 1}));
  EXPECT_EQ(ParallelPlan::FromString("dp=2,tp=2,ep=4")->tp, 2);
  EXPECT_FALSE(ParallelPlan::FromString("cp").ok());
  EXPECT_FALSE(ParallelPlan::FromString("cp=two").ok());
  EXPECT_FALSE(ParallelPlan::FromString("xp=2").ok());  // unknown keys are rejected
}

}  // namespace
}  // namespace pdserve::comm
