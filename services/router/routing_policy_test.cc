#include "services/router/routing_policy.h"

#include <map>

#include <gtest/gtest.h>

namespace pdserve::router {
namespace {

TEST(RoutingPolicyTest, Parse) {
  EXPECT_EQ(ParseRoutingPolicy("round_robin").value(), RoutingPolicy::kRoundRobin);
  EXPECT_EQ(ParseRoutingPolicy("kv_capacity_aware").value(), RoutingPolicy::kKvCapacityAware);
  EXPECT_EQ(ParseRoutingPolicy("kv_aware").value(), RoutingPolicy::kKvAware);
  EXPECT_STREQ(RoutingPolicyName(RoutingPolicy::kKvAware), "kv_aware");
  EXPECT_FALSE(ParseRoutingPolicy("random").ok());
}

TEST(RoutingPolicyTest, RoundRobinRotates) {
  std::vector<RoutingCandidate> c(3);
  uint64_t cursor = 0;
  std::vector<int> picks;
  for (int i = 0; i < 6; ++i) picks.push_back(ChooseWorker(RoutingPolicy::kRoundRobin, c, &cursor));
  EXPECT_EQ(picks, (std::vector<int>{0, 1, 2, 0, 1, 2}));
  EXPECT_EQ(ChooseWorker(RoutingPolicy::kRoundRobin, {}, &cursor), -1);
}

TEST(RoutingPolicyTest, LeastOutstandingTokensWithRotatingTies) {
  std::vector<RoutingCandidate> c(3);
  c[0].outstanding_tokens = 50;
  c[1].outstanding_tokens = 10;
  c[2].outstanding_tokens = 30;
  uint64_t cursor = 0;
  EXPECT_EQ(ChooseWorker(RoutingPolicy::kLeastOutstandingTokens, c, &cursor), 1);
  c[0].outstanding_tokens = c[1].outstanding_tokens = c[2].outstanding_tokens = 0;
  std::map<int, int> counts;
  for (int i = 0; i < 9; ++i) ++counts[ChooseWorker(RoutingPolicy::kLeastOutstandingTokens, c, &cursor)];
  EXPECT_EQ(counts, (std::map<int, int>{{0, 3}, {1, 3}, {2, 3}}));
}

TEST(RoutingPolicyTest, KvAwareScoresTheTokensLeftToComputePlusTheQueue) {
  std::vector<RoutingCandidate> c(3);
  for (auto& x : c) x.prompt_tokens = 1000;
  c[0].predicted_hit_tokens = 0;
  c[1].predicted_hit_tokens = 768;  // computes 232
  c[2].predicted_hit_tokens = 512;  // computes 488
  uint64_t cursor = 0;
  for (int i = 0; i < 4; ++i) EXPECT_EQ(ChooseWorker(RoutingPolicy::kKvAware, c, &cursor), 1);
  // The holder's queue counts: 232 + 300 > 488 + 0.
  c[1].outstanding_tokens = 300;
  EXPECT_EQ(ChooseWorker(RoutingPolicy::kKvAware, c, &cursor), 2);
  // Equal scores (232 + 256 = 488 + 0): the rotation decides, so both get requests.
  c[1].outstanding_tokens = 256;
  std::map<int, int> counts;
  for (int i = 0; i < 6; ++i) ++counts[ChooseWorker(RoutingPolicy::kKvAware, c, &cursor)];
  EXPECT_EQ(counts.count(0), 0u);
  EXPECT_GT(counts[1], 0);
  EXPECT_GT(counts[2], 0);
  // No prediction anywhere: the least outstanding tokens, as least_outstanding_tokens.
  for (auto& x : c) x.predicted_hit_tokens = 0;
  c[0].outstanding_tokens = 5;
  c[1].outstanding_tokens = 1;
  c[2].outstanding_tokens = 9;
  EXPECT_EQ(ChooseWorker(RoutingPolicy::kKvAware, c, &cursor), 1);
  // A prediction above the prompt (a stale or odd index) never scores below zero work.
  c[2].predicted_hit_tokens = 5000;
  c[2].outstanding_tokens = 2;
  EXPECT_EQ(ChooseWorker(RoutingPolicy::kKvAware, c, &cursor), 2);
}

TEST(RoutingPolicyTest, KvAwareChargesAPulledPrefixASixteenth) {
  // Both reach a 960-token hit: worker 0 holds it, worker 1 would pull all of it.
  std::vector<RoutingCandidate> c(2);
  for (auto& x : c) {
    x.prompt_tokens = 1000;
    x.predicted_hit_tokens = 960;
  }
  c[1].pulled_tokens = 960;  // costs 60
  uint64_t cursor = 0;
  for (int i = 0; i < 4; ++i) EXPECT_EQ(ChooseWorker(RoutingPolicy::kKvAware, c, &cursor), 0);
  // The holder's queue is longer than the pull's cost: the puller takes it.
  c[0].outstanding_tokens = 61;
  EXPECT_EQ(ChooseWorker(RoutingPolicy::kKvAware, c, &cursor), 1);
}

TEST(RoutingPolicyTest, KvAwareWaitsForAHolderThatIsNearlyDoneRatherThanComputeItAllAgain) {
  // Worker 0 is computing a 2304-token prompt whose 2048-token prefix this request shares
  // (pending in the index); worker 1 is idle and would compute the whole prompt.
  std::vector<RoutingCandidate> c(2);
  for (auto& x : c) x.prompt_tokens = 2304;
  c[0].predicted_hit_tokens = 2048;
  c[0].outstanding_tokens = 2304;
  uint64_t cursor = 0;
  // Just placed: 256 + 2304 > 2304.
  EXPECT_EQ(ChooseWorker(RoutingPolicy::kKvAware, c, &cursor), 1);
  // Half of it computed by now: 256 + 1152 < 2304, waiting for the holder is sooner.
  c[0].computed_estimate_tokens = 1152;
  EXPECT_EQ(ChooseWorker(RoutingPolicy::kKvAware, c, &cursor), 0);
  // An estimate above the charge (a stale pace) never scores below zero work.
  c[0].computed_estimate_tokens = 9999;
  c[1].outstanding_tokens = 0;
  c[1].predicted_hit_tokens = 2100;
  EXPECT_EQ(ChooseWorker(RoutingPolicy::kKvAware, c, &cursor), 1) << "204 < 256 + 0";
  // least_outstanding_tokens keeps the router's plain accounting.
  c[1].outstanding_tokens = 1;
  EXPECT_EQ(ChooseWorker(RoutingPolicy::kLeastOutstandingTokens, c, &cursor), 1);
}

TEST(RoutingPolicyTest, KvCapacityAware) {
  std::vector<RoutingCandidate> c(3);
  for (auto& x : c) {
    x.blocks_for_request = 10;
    x.blocks_for_prompt = 2;
  }
  c[0].kv_blocks_free = 12;
  c[1].kv_blocks_free = 40;
  c[2].kv_blocks_free = 9;  // only the prompt fits
  uint64_t cursor = 0;
  EXPECT_EQ(ChooseWorker(RoutingPolicy::kKvCapacityAware, c, &cursor), 1);
  c[1].kv_blocks_free = 5;
  c[0].kv_blocks_free = 5;
  // Nowhere does the whole request fit: the most free blocks that hold the prompt.
  EXPECT_EQ(ChooseWorker(RoutingPolicy::kKvCapacityAware, c, &cursor), 2);
  for (auto& x : c) x.kv_blocks_free = 1;
  EXPECT_EQ(ChooseWorker(RoutingPolicy::kKvCapacityAware, c, &cursor), -1);
  // Ties on headroom go to fewer outstanding tokens.
  for (auto& x : c) x.kv_blocks_free = 20;
  c[0].outstanding_tokens = 5;
  c[1].outstanding_tokens = 1;
  c[2].outstanding_tokens = 9;
  EXPECT_EQ(ChooseWorker(RoutingPolicy::kKvCapacityAware, c, &cursor), 1);
}

TEST(RoutingPolicyTest, KvCapacityAwareBalancesWorkWhileEveryCacheHasRoom) {
  std::vector<RoutingCandidate> c(2);
  for (auto& x : c) {
    x.kv_blocks_total = 1000;
    x.blocks_for_request = 10;
    x.blocks_for_prompt = 2;
  }
  // Headroom 49% vs 47%: within the band, so the lighter worker wins despite fewer free blocks.
  c[0].kv_blocks_free = 500;
  c[0].outstanding_tokens = 900;
  c[1].kv_blocks_free = 480;
  c[1].outstanding_tokens = 100;
  uint64_t cursor = 0;
  EXPECT_EQ(ChooseWorker(RoutingPolicy::kKvCapacityAware, c, &cursor), 1);
  // 49% vs 29%: the cache running short no longer gets the request.
  c[1].kv_blocks_free = 300;
  EXPECT_EQ(ChooseWorker(RoutingPolicy::kKvCapacityAware, c, &cursor), 0);
  // Headroom is a share of each pool: 100 of 200 left beats 300 of 1000.
  c[0].kv_blocks_total = 200;
  c[0].kv_blocks_free = 110;
  EXPECT_EQ(ChooseWorker(RoutingPolicy::kKvCapacityAware, c, &cursor), 0);
}

}  // namespace
}  // namespace pdserve::router
