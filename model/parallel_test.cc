// Single-process parts of the parallel model: the replica row split (never a piece of <= 8
// rows of a tiled row group) and the --plan string form.
#include <gtest/gtest.h>

#include <map>

#include "kernels/gemm.h"
#include "model/batch_plan.h"
#include "model/parallel.h"
#include "model/model.h"

namespace pdserve::model {
namespace {

// A plan with the given (n_tokens, grouping) sequences (no KV: only the row bookkeeping).
BatchPlan PlanOf(const std::vector<std::pair<int64_t, RowGrouping>>& seqs, std::vector<BatchSequence>* storage) {
  storage->clear();
  for (const auto& [n, g] : seqs) {
    BatchSequence q;
    q.n_tokens = n;
    q.grouping = g;
    storage->push_back(q);
  }
  return BatchPlan::Build(*storage);
}

// Checks that the ranges tile [0, R) in order and respect tiled groups; returns the sizes.
std::vector<int64_t> Split(const BatchPlan& plan, int n) {
  std::vector<int64_t> sizes;
  int64_t expect_begin = 0;
  for (int k = 0; k < n; ++k) {
    const auto [b, e] = ReplicaRowRange(plan, n, k);
    EXPECT_EQ(b, expect_begin) << "piece " << k;
    EXPECT_LE(b, e);
    expect_begin = e;
    sizes.push_back(e - b);
    // Rows of a tiled group inside [b, e): more than 8 of them, or none.
    std::map<int32_t, int64_t> per_group;
    for (int64_t r = b; r < e; ++r)
      if (plan.row_tiled[r]) ++per_group[plan.row_group[r]];
    for (const auto& [g, count] : per_group) EXPECT_GT(count, kernels::kGemmSmallMMax) << "group " << g;
  }
  EXPECT_EQ(expect_begin, plan.n_rows);
  return sizes;
}

TEST(ReplicaRowRangeTest, DecodeRowsSplitEvenly) {
  std::vector<BatchSequence> s;
  const BatchPlan plan = PlanOf({{1, RowGrouping::kPerRow}, {1, RowGrouping::kPerRow}, {1, RowGrouping::kPerRow},
                                 {1, RowGrouping::kPerRow}, {1, RowGrouping::kPerRow}},
                                &s);
  EXPECT_EQ(Split(plan, 2), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(Split(plan, 4), (std::vector<int64_t>{1, 1, 1, 2}));
  EXPECT_EQ(Split(plan, 8), (std::vector<int64_t>{0, 1, 0, 1, 1, 0, 1, 1}));
}

TEST(ReplicaRowRangeTest, TiledGroupsAreNeverCutIntoSmallPieces) {
  std::vector<BatchSequence> s;
  const BatchPlan big = PlanOf({{40, RowGrouping::kChunk}}, &s);
  EXPECT_EQ(Split(big, 2), (std::vector<int64_t>{20, 20}));
  EXPECT_EQ(Split(big, 4), (std::vector<int64_t>{10, 10, 10, 10}));
  EXPECT_EQ(Split(big, 8), (std::vector<int64_t>{0, 10, 0, 10, 0, 10, 0, 10}));
  const BatchPlan twelve = PlanOf({{12, RowGrouping::kChunk}}, &s);  // halves of 6: not allowed
  EXPECT_EQ(Split(twelve, 2), (std::vector<int64_t>{0, 12}));
  // A small chunk (streaming path at any size) and decode rows around a tiled chunk.
  const BatchPlan mixed = PlanOf({{5, RowGrouping::kChunk}, {30, RowGrouping::kChunk}, {1, RowGrouping::kPerRow},
                                  {1, RowGrouping::kPerRow}, {1, RowGrouping::kPerRow}},
                                 &s);
  for (int n : {2, 3, 4, 5, 7}) Split(mixed, n);
}


}  // namespace
}  // namespace pdserve::model
