// TensorParallel under mpirun: sums and gathers against values every rank can compute alone,
// on a TP group of the whole world and (with 4 ranks) on two TP groups of 2.
#include "comm/tensor_parallel.h"

#include <gtest/gtest.h>

#include "comm/process_groups.h"
#include "comm/shard.h"
#include "comm/testing/mpi_test_util.h"

namespace pdserve::comm {
namespace {

using testing::WorldSize;

std::vector<ParallelPlan> TpPlans() {
  const int n = WorldSize();
  std::vector<ParallelPlan> plans = {{1, 1, 1, n}};
  if (n % 2 == 0 && n > 2) plans.push_back({1, n / 2, 1, 2});
  return plans;
}

// Small integers: every summation order gives the exact same float.
float Value(int rank, int64_t i) { return static_cast<float>(rank * 1000 + i % 97); }

TEST(TensorParallelMpTest, AllReduceSumAndAllGather) {
  auto world = MpiComm::World();
  ASSERT_TRUE(world.ok());
  for (const ParallelPlan& plan : TpPlans()) {
    auto g = ProcessGroups::Create(*world, plan, {});
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    auto tp = TensorParallel::Create((*g)->tp());
    ASSERT_TRUE(tp.ok());
    const int p = (*tp)->size(), me = (*tp)->rank();
    ASSERT_EQ(p, plan.tp);

    std::vector<float> data(1000);
    for (size_t i = 0; i < data.size(); ++i) data[i] = Value(me, i);
    ASSERT_TRUE((*tp)->AllReduceSum(data).ok());
    bool ok = true;
    for (size_t i = 0; i < data.size(); ++i) {
      float want = 0;
      for (int r = 0; r < p; ++r) want += Value(r, i);
      ok &= data[i] == want;
    }
    EXPECT_TRUE(ok) << plan.ToString();

    std::vector<float> local(7), all(7 * p);
    for (int i = 0; i < 7; ++i) local[i] = Value(me, i);
    ASSERT_TRUE((*tp)->AllGather(local, all).ok());
    for (int r = 0; r < p; ++r)
      for (int i = 0; i < 7; ++i) EXPECT_EQ(all[r * 7 + i], Value(r, i));
    EXPECT_EQ((*tp)->AllGather(local, std::span<float>(all).first(3)).code(), StatusCode::kInvalidArgument);
  }
}

// lm_head logits sharded by vocabulary (columns), vocab not a multiple of tp: the gathered
// matrix equals the full one for 1 row (decode) and several rows (prefill / batched decode).
TEST(TensorParallelMpTest, GatherColumnsOfVocabShardedLogits) {
  auto world = MpiComm::World();
  ASSERT_TRUE(world.ok());
  for (const ParallelPlan& plan : TpPlans()) {
    auto g = ProcessGroups::Create(*world, plan, {});
    ASSERT_TRUE(g.ok());
    auto tp = TensorParallel::Create((*g)->tp());
    ASSERT_TRUE(tp.ok());
    const int p = (*tp)->size(), me = (*tp)->rank();
    for (int64_t rows : {0, 1, 3}) {
      for (int64_t vocab : {int64_t{p}, int64_t{11}, int64_t{1001}}) {
        const ShardRange s = EvenShard(vocab, p, me);
        std::vector<float> local(rows * s.size());
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t c = 0; c < s.size(); ++c) local[r * s.size() + c] = static_cast<float>(r * 10000 + s.begin + c);
        std::vector<float> out(rows * vocab, -1.0f);
        ASSERT_TRUE((*tp)->GatherColumns(local, rows, vocab, out).ok());
        bool ok = true;
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t c = 0; c < vocab; ++c) ok &= out[r * vocab + c] == static_cast<float>(r * 10000 + c);
        EXPECT_TRUE(ok) << "rows " << rows << " vocab " << vocab << " " << plan.ToString();
      }
    }
  }
}

// Vocabulary-sharded embedding: each rank looks up only its rows; the sum gives every row.
TEST(TensorParallelMpTest, EmbedShardedAndSumPartials) {
  auto world = MpiComm::World();
  ASSERT_TRUE(world.ok());
  for (const ParallelPlan& plan : TpPlans()) {
    auto g = ProcessGroups::Create(*world, plan, {});
    ASSERT_TRUE(g.ok());
    auto tp = TensorParallel::Create((*g)->tp());
    ASSERT_TRUE(tp.ok());
    const int p = (*tp)->size(), me = (*tp)->rank();
    const int64_t vocab = 37, hidden = 5;
    const ShardRange mine = EvenShard(vocab, p, me);
    const std::vector<int32_t> ids = {0, 36, 5, 5, 20, 17};
    std::vector<float> out(ids.size() * hidden);
    int lookups = 0;
    ASSERT_TRUE((*tp)->EmbedSharded(ids, vocab, hidden,
                                    [&](int64_t local_row, float* dst) {
                                      ++lookups;
                                      for (int64_t h = 0; h < hidden; ++h) dst[h] = static_cast<float>((mine.begin + local_row) * 10 + h);
                                    },
                                    out)
                    .ok());
    for (size_t i = 0; i < ids.size(); ++i)
      for (int64_t h = 0; h < hidden; ++h) EXPECT_EQ(out[i * hidden + h], static_cast<float>(ids[i] * 10 + h));
    int own = 0;
    for (int32_t id : ids) own += mine.Contains(id);
    EXPECT_EQ(lookups, own);

    // Row-sharded o_proj: x [1 x p heads * dv 4] times W [3 x 4p]; each rank multiplies its head
    // columns, SumPartials gives the full product.
    const int64_t in = 4 * p, out_dim = 3;
    auto w = [](int64_t o, int64_t i) { return static_cast<float>((o + 1) * (i % 4)); };
    auto x = [](int64_t i) { return static_cast<float>(i + 1); };
    const ShardRange cols = HeadColumnShard(/*n_heads=*/p, /*head_dim=*/in / p, p, me);
    std::vector<float> partial(out_dim, 0.0f), full(out_dim, 0.0f);
    for (int64_t o = 0; o < out_dim; ++o) {
      for (int64_t i = cols.begin; i < cols.end; ++i) partial[o] += w(o, i) * x(i);
      for (int64_t i = 0; i < in; ++i) full[o] += w(o, i) * x(i);
    }
    ASSERT_TRUE((*tp)->SumPartials(partial).ok());
    EXPECT_EQ(partial, full);
  }
}

}  // namespace
}  // namespace pdserve::comm
