#include "comm/shard.h"

#include <gtest/gtest.h>

namespace pdserve::comm {
namespace {

TEST(ShardTest, EvenShardCoversInOrderAndDiffersByAtMostOne) {
  for (int64_t n : {0, 1, 5, 16, 129280, 129281}) {
    for (int parts : {1, 2, 3, 4, 7}) {
      int64_t next = 0, lo = n, hi = 0;
      for (int r = 0; r < parts; ++r) {
        const ShardRange s = EvenShard(n, parts, r);
        EXPECT_EQ(s.begin, next);
        next = s.end;
        lo = std::min(lo, s.size());
        hi = std::max(hi, s.size());
        for (int64_t i = s.begin; i < s.end; i += std::max<int64_t>(1, s.size() / 5)) {
          EXPECT_EQ(EvenShardOwner(n, parts, i), r) << n << " " << parts << " " << i;
        }
        if (!s.empty()) {
          EXPECT_EQ(EvenShardOwner(n, parts, s.end - 1), r);
        }
      }
      EXPECT_EQ(next, n);
      EXPECT_LE(hi - lo, 1);
    }
  }
}

TEST(ShardTest, HeadShardsAreWholeHeads) {
  // 128 heads of v_head_dim 128 over tp=4: 32 heads, 4096 o_proj input columns each.
  EXPECT_EQ(HeadShard(128, 4, 1), (ShardRange{32, 64}));
  EXPECT_EQ(HeadColumnShard(128, 128, 4, 1), (ShardRange{4096, 8192}));
  EXPECT_EQ(HeadColumnShard(16, 8, 2, 1).size(), 64);
}

}  // namespace
}  // namespace pdserve::comm
