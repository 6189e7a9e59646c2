#include "comm/cp_split.h"

#include <algorithm>
#include <set>

#include <gtest/gtest.h>

namespace pdserve::comm {
namespace {

TEST(CpSplitTest, ZigZagChunksPerRank) {
  const CpSplit s(16, 2);  // 4 chunks of 4: rank 0 takes chunks 0 and 3, rank 1 chunks 1 and 2
  EXPECT_EQ(s.RankPositions(0), (std::vector<int64_t>{0, 1, 2, 3, 12, 13, 14, 15}));
  EXPECT_EQ(s.RankPositions(1), (std::vector<int64_t>{4, 5, 6, 7, 8, 9, 10, 11}));
  EXPECT_EQ(s.OwnerOf(15), 0);  // the last position (first sampled token) is on rank 0
}

TEST(CpSplitTest, EveryPositionOwnedOnceAndLocalIndexMatches) {
  for (int cp : {1, 2, 3, 4, 8}) {
    for (int64_t len : {0, 1, 3, 7, 64, 1001, 4097}) {
      const CpSplit s(len, cp);
      std::set<int64_t> seen;
      for (int r = 0; r < cp; ++r) {
        const auto pos = s.RankPositions(r);
        EXPECT_EQ(static_cast<int64_t>(pos.size()), s.RankTokens(r));
        for (size_t i = 0; i < pos.size(); ++i) {
          EXPECT_TRUE(seen.insert(pos[i]).second);
          EXPECT_EQ(s.OwnerOf(pos[i]), r);
          EXPECT_EQ(s.LocalIndexOf(pos[i]), static_cast<int64_t>(i));
        }
      }
      EXPECT_EQ(static_cast<int64_t>(seen.size()), len);
    }
  }
}

// The point of the zig-zag split: causal-attention work (sum of p+1 over a rank's positions)
// within a few percent across ranks, where contiguous chunks would differ by ~(2cp-1)x.
TEST(CpSplitTest, CausalWorkIsBalanced) {
  for (int cp : {2, 4, 8}) {
    for (int64_t len : {256, 1000, 1001, 4096, 5003, 32768}) {
      const CpSplit s(len, cp);
      int64_t lo = INT64_MAX, hi = 0, total = 0;
      for (int r = 0; r < cp; ++r) {
        lo = std::min(lo, s.RankCausalWork(r));
        hi = std::max(hi, s.RankCausalWork(r));
        total += s.RankCausalWork(r);
      }
      EXPECT_EQ(total, len * (len + 1) / 2);
      EXPECT_LT(static_cast<double>(hi - lo) / hi, 0.03) << "cp=" << cp << " len=" << len;
    }
  }
  // Divisible lengths balance exactly.
  const CpSplit exact(4096, 4);
  EXPECT_EQ(exact.RankCausalWork(0), exact.RankCausalWork(3));
}

}  // namespace
}  // namespace pdserve::comm
