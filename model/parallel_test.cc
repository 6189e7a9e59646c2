// Single-process parts of the parallel model: the replica row split.
#include <gtest/gtest.h>

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

// Checks that the ranges tile [0, R) in order; returns the sizes.
std::vector<int64_t> Split(const BatchPlan& plan, int n) {
  std::vector<int64_t> sizes;
  int64_t expect_begin = 0;
  for (int k = 0; k < n; ++k) {
    const auto [b, e] = ReplicaRowRange(plan, n, k);
    EXPECT_EQ(b, expect_begin) << "piece " << k;
    EXPECT_LE(b, e);
    expect_begin = e;
    sizes.push_back(e - b);
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

TEST(ReplicaRowRangeTest, ChunksSplitEvenlyWhateverTheirSize) {
  // Every GEMM's per-row result is independent of the rows beside it, so a chunk may be cut
  // anywhere: the pieces are as even as the row count allows.
  std::vector<BatchSequence> s;
  const BatchPlan big = PlanOf({{40, RowGrouping::kChunk}}, &s);
  EXPECT_EQ(Split(big, 2), (std::vector<int64_t>{20, 20}));
  EXPECT_EQ(Split(big, 8), (std::vector<int64_t>{5, 5, 5, 5, 5, 5, 5, 5}));
  const BatchPlan twelve = PlanOf({{12, RowGrouping::kChunk}}, &s);
  EXPECT_EQ(Split(twelve, 2), (std::vector<int64_t>{6, 6}));
  const BatchPlan mixed = PlanOf({{5, RowGrouping::kChunk}, {30, RowGrouping::kChunk}, {1, RowGrouping::kPerRow},
                                  {1, RowGrouping::kPerRow}, {1, RowGrouping::kPerRow}},
                                 &s);
  EXPECT_EQ(Split(mixed, 3), (std::vector<int64_t>{12, 13, 13}));
}

}  // namespace
}  // namespace pdserve::model
