// CpRecordGather under mpirun: every rank ends with every position's record in position order,
// for prompt lengths that divide evenly, do not, and are shorter than the number of chunks.
#include "comm/cp_record_gather.h"

#include <cstring>

#include <gtest/gtest.h>

#include "comm/process_groups.h"
#include "comm/testing/mpi_test_util.h"

namespace pdserve::comm {
namespace {

using testing::AllRanks;
using testing::WorldSize;

// A 40-byte record that names its position (like a latent + indexer key would, opaque here).
constexpr size_t kRecordBytes = 40;
void FillRecord(int64_t pos, uint8_t* dst) {
  for (size_t b = 0; b < kRecordBytes; ++b) dst[b] = static_cast<uint8_t>((pos * 31 + b * 7) & 0xff);
  std::memcpy(dst, &pos, sizeof(pos));
}

TEST(CpRecordGatherMpTest, RecordsArriveInPositionOrder) {
  auto world = MpiComm::World();
  ASSERT_TRUE(world.ok());
  const int n = WorldSize();
  std::vector<ParallelPlan> plans = {{n, 1, 1, 1}};
  if (n == 4) plans.push_back({2, 2, 1, 1});  // two CP groups of 2
  for (const ParallelPlan& plan : plans) {
    auto g = ProcessGroups::Create(*world, plan, {});
    ASSERT_TRUE(g.ok());
    auto gather = CpRecordGather::Create((*g)->cp(), kRecordBytes);
    ASSERT_TRUE(gather.ok());
    const int cp = plan.cp, me = (*gather)->rank();
    for (int64_t len : {int64_t{0}, int64_t{1}, int64_t{2 * cp - 1}, int64_t{17}, int64_t{1000}, int64_t{1001}}) {
      const CpSplit split(len, cp);
      const std::vector<int64_t> positions = split.RankPositions(me);
      std::vector<uint8_t> local(positions.size() * kRecordBytes);
      for (size_t i = 0; i < positions.size(); ++i) FillRecord(positions[i], &local[i * kRecordBytes]);
      std::vector<uint8_t> all(len * kRecordBytes, 0xee), want(kRecordBytes);
      // The non-blocking path with a few progress calls, as the prefill layer loop will use it.
      ASSERT_TRUE((*gather)->Start(split, local.data(), all.data()).ok());
      for (int i = 0; i < 3; ++i) ASSERT_TRUE((*gather)->Progress().ok());
      ASSERT_TRUE((*gather)->Wait().ok());
      bool ok = true;
      for (int64_t p = 0; p < len; ++p) {
        FillRecord(p, want.data());
        ok &= std::memcmp(&all[p * kRecordBytes], want.data(), kRecordBytes) == 0;
      }
      EXPECT_TRUE(ok) << "len " << len << " " << plan.ToString();
      EXPECT_TRUE(AllRanks(ok, (*g)->cp().get()));
    }
    // A split for the wrong group size is refused before any communication.
    std::vector<uint8_t> dummy(kRecordBytes);
    EXPECT_EQ((*gather)->AllGather(CpSplit(4, cp + 1), dummy.data(), dummy.data()).code(),
              StatusCode::kInvalidArgument);
  }
}

// The balance claim of the zig-zag split, on the real group: each rank's causal work, gathered,
// is within 3% of every other rank's.
TEST(CpRecordGatherMpTest, SplitWorkIsBalancedAcrossRanks) {
  const int n = WorldSize();
  for (int64_t len : {512, 4099}) {
    const CpSplit split(len, n);
    const auto work = testing::AllGather(split.RankCausalWork(testing::WorldRank()));
    const auto [lo, hi] = std::minmax_element(work.begin(), work.end());
    EXPECT_LT(static_cast<double>(*hi - *lo) / *hi, 0.03) << "len " << len;
  }
}

}  // namespace
}  // namespace pdserve::comm
