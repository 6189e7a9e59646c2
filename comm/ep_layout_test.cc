#include "comm/ep_layout.h"

#include <gtest/gtest.h>

namespace pdserve::comm {
namespace {

TEST(EpLayoutTest, ContiguousPlacement) {
  const EpLayout l{256, 8};
  ASSERT_TRUE(l.Validate().ok());
  EXPECT_EQ(l.experts_per_rank(), 32);
  EXPECT_EQ(l.OwnerOf(31), 0);
  EXPECT_EQ(l.OwnerOf(32), 1);
  EXPECT_EQ(l.FirstExpert(7), 224);
  EXPECT_FALSE((EpLayout{10, 4}).Validate().ok());
}

TEST(EpSendPlanTest, OneRowPerTokenAndDestinationGroupedByDestination) {
  const EpLayout l{8, 4};  // 2 experts per rank
  // token 0 -> experts 0,1 (both rank 0: one row with two entries); token 1 -> 7, 2;
  // token 2 -> -1 (masked), 6; token 3 -> nothing.
  const std::vector<int32_t> ids = {0, 1, 7, 2, -1, 6, -1, -1};
  const std::vector<float> w = {0.5f, 0.25f, 1.0f, 2.0f, 9.0f, 3.0f, 0.0f, 0.0f};
  EpSendPlan p;
  ASSERT_TRUE(p.Build(l, 2, 4, ids, w).ok());
  EXPECT_EQ(p.counts(), (std::vector<int>{1, 1, 0, 2}));
  EXPECT_EQ(p.displs(), (std::vector<int>{0, 1, 2, 2}));
  EXPECT_EQ(p.row_token(), (std::vector<int32_t>{0, 1, 1, 2}));
  EXPECT_EQ(p.Id(0, 0), 0);
  EXPECT_EQ(p.Id(0, 1), 1);
  EXPECT_EQ(p.Weight(0, 1), 0.25f);
  EXPECT_EQ(p.Id(1, 0), 2);  // token 1's rank-1 row carries only expert 2
  EXPECT_EQ(p.Id(1, 1), -1);
  EXPECT_EQ(p.Weight(1, 0), 2.0f);
  EXPECT_EQ(p.Id(2, 0), 7);
  EXPECT_EQ(p.Id(3, 0), 6);
  EXPECT_EQ(p.Weight(3, 0), 3.0f);
  EXPECT_EQ(p.Weight(3, 1), 0.0f);
}

TEST(EpSendPlanTest, RejectsBadRouting) {
  EpSendPlan p;
  const std::vector<float> w(2, 1.0f);
  EXPECT_FALSE(p.Build({8, 4}, 2, 1, std::vector<int32_t>{0, 8}, w).ok());
  EXPECT_FALSE(p.Build({8, 4}, 2, 1, std::vector<int32_t>{0, -2}, w).ok());
  EXPECT_FALSE(p.Build({8, 4}, 2, 2, std::vector<int32_t>{0, 1}, w).ok());  // size mismatch
  EXPECT_TRUE(p.Build({8, 4}, 2, 0, {}, {}).ok());
  EXPECT_EQ(p.rows(), 0);
}

TEST(ExpertIndexTest, GroupsRowsByExpertWithEmptyExperts) {
  // 3 rows x top_k 2 over 3 local experts; expert 1 receives nothing.
  const std::vector<int32_t> ids = {0, 2, 2, -1, 0, -1};
  const std::vector<float> w = {0.1f, 0.2f, 0.3f, 0.0f, 0.4f, 0.0f};
  ExpertIndex x;
  x.Build(3, 2, 3, ids, w);
  EXPECT_EQ(x.offsets, (std::vector<int64_t>{0, 2, 2, 4}));
  EXPECT_EQ(x.rows, (std::vector<int32_t>{0, 2, 0, 1}));
  EXPECT_EQ(x.weights, (std::vector<float>{0.1f, 0.4f, 0.2f, 0.3f}));
}

}  // namespace
}  // namespace pdserve::comm
