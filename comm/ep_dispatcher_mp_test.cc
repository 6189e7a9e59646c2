// EpDispatcher under mpirun: dispatch + expert compute + combine must equal a single-process
// MoE with expert e(x) = (e + 1) * x, out[t] = sum_j w[t,j] * (id[t,j] + 1) * x[t], including
// ranks that send nothing, ranks that receive nothing and experts that receive nothing.
#include "comm/ep_dispatcher.h"

#include <cmath>
#include <random>

#include <gtest/gtest.h>

#include "comm/testing/mpi_test_util.h"

namespace pdserve::comm {
namespace {

using testing::AllRanks;
using testing::WorldRank;
using testing::WorldSize;

struct Tokens {
  int64_t n = 0;
  std::vector<float> x;        // [n x hidden]
  std::vector<int32_t> ids;    // [n x top_k]
  std::vector<float> weights;  // [n x top_k]
};

std::vector<float> Reference(const Tokens& t, int top_k, int64_t hidden) {
  std::vector<float> out(t.n * hidden, 0.0f);
  for (int64_t i = 0; i < t.n; ++i)
    for (int j = 0; j < top_k; ++j) {
      const int32_t e = t.ids[i * top_k + j];
      if (e < 0) continue;
      for (int64_t h = 0; h < hidden; ++h) out[i * hidden + h] += t.weights[i * top_k + j] * (e + 1) * t.x[i * hidden + h];
    }
  return out;
}

// The expert side, via the per-expert grouping the model's grouped GEMM will use.
template <typename In>
std::vector<float> ComputeExperts(const EpReceived& in, int64_t hidden, float (*load)(In)) {
  std::vector<float> out(in.rows * hidden, 0.0f);
  for (int e = 0; e < in.n_local_experts; ++e) {
    const auto rows = in.ExpertRows(e);
    const auto w = in.ExpertWeights(e);
    for (size_t k = 0; k < rows.size(); ++k) {
      const In* x = in.Row<In>(rows[k]);
      for (int64_t h = 0; h < hidden; ++h) out[rows[k] * hidden + h] += w[k] * (in.first_expert + e + 1) * load(x[h]);
    }
  }
  return out;
}

float LoadF32(float v) { return v; }
float LoadBf16(uint16_t v) { return Bf16ToF32(v); }

double MaxRelError(const std::vector<float>& got, const std::vector<float>& want) {
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    worst = std::max(worst, std::abs(got[i] - want[i]) / std::max(1.0, std::abs(static_cast<double>(want[i]))));
  }
  return got.size() == want.size() ? worst : 1e9;
}

// Routing forced onto the experts of the lower half of the ranks, never expert 1: the upper
// ranks receive nothing, rank 0's expert 1 receives nothing, and the last rank sends nothing.
TEST(EpDispatcherMpTest, ForcedRoutingWithEmptyRanksAndExperts) {
  auto world = MpiComm::World();
  ASSERT_TRUE(world.ok());
  const int p = WorldSize(), me = WorldRank();
  const int n_experts = 2 * p, top_k = 2;
  const int64_t hidden = 16;
  auto d = EpDispatcher::Create(*world, {.n_experts = n_experts, .top_k = top_k, .hidden = hidden});
  ASSERT_TRUE(d.ok()) << d.status().ToString();

  const int receiving_ranks = std::max(1, p / 2);
  std::vector<int32_t> allowed;  // experts of the receiving ranks, minus expert 1
  for (int e = 0; e < 2 * receiving_ranks; ++e)
    if (e != 1) allowed.push_back(e);
  Tokens t;
  t.n = me == p - 1 ? 0 : 5 + 3 * me;
  for (int64_t i = 0; i < t.n; ++i) {
    for (int64_t h = 0; h < hidden; ++h) t.x.push_back(static_cast<float>((i + h + me) % 7 - 3));
    const int32_t a = allowed[i % allowed.size()], b = allowed[(i + 1) % allowed.size()];
    t.ids.push_back(a);
    t.ids.push_back(b == a ? -1 : b);
    t.weights.push_back(0.75f);
    t.weights.push_back(0.25f);
  }

  auto in = (*d)->Dispatch(t.x.data(), t.n, t.ids, t.weights);
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  if (me >= receiving_ranks) {
    EXPECT_EQ((*in)->rows, 0) << "rank " << me << " should receive nothing";
  }
  if (me == 0) {
    EXPECT_TRUE((*in)->ExpertRows(1).empty());
  }
  if (me < receiving_ranks && p > 1) {
    EXPECT_GT((*in)->rows, 0);
  }
  EXPECT_EQ((*in)->rows_from[p - 1], 0);  // the last rank sent nothing
  const std::vector<float> expert_out = ComputeExperts<float>(**in, hidden, LoadF32);
  std::vector<float> out(t.n * hidden, 123.0f);
  ASSERT_TRUE((*d)->Combine(expert_out.data(), out, /*accumulate=*/false).ok());
  EXPECT_LT(MaxRelError(out, Reference(t, top_k, hidden)), 1e-6);
  EXPECT_EQ((*d)->rounds(), 1);
}

// Random routing over all experts, random token counts (zero included), many rounds reusing
// the buffers, the non-blocking path with a "shared expert" computed while the exchange is in
// flight, and combine accumulating onto it.
TEST(EpDispatcherMpTest, RandomRoutingOverlappedRoundsMatchReference) {
  auto world = MpiComm::World();
  ASSERT_TRUE(world.ok());
  const int p = WorldSize(), me = WorldRank();
  const int n_experts = 4 * p, top_k = std::min(4, n_experts);
  const int64_t hidden = 64;
  auto d = EpDispatcher::Create(*world, {.n_experts = n_experts, .top_k = top_k, .hidden = hidden});
  ASSERT_TRUE(d.ok());
  std::mt19937 rng(1234 + me);
  double worst = 0;
  for (int round = 0; round < 20; ++round) {
    Tokens t;
    t.n = std::uniform_int_distribution<int>(0, 40)(rng);
    if (round == 3) t.n = 0;  // every rank empty in one round
    std::uniform_real_distribution<float> val(-1, 1);
    for (int64_t i = 0; i < t.n * hidden; ++i) t.x.push_back(val(rng));
    for (int64_t i = 0; i < t.n; ++i) {
      std::vector<int32_t> e(n_experts);
      for (int k = 0; k < n_experts; ++k) e[k] = k;
      std::shuffle(e.begin(), e.end(), rng);
      for (int j = 0; j < top_k; ++j) {
        t.ids.push_back(e[j]);
        t.weights.push_back(std::uniform_real_distribution<float>(0, 1)(rng));
      }
    }
    ASSERT_TRUE((*d)->StartDispatch(t.x.data(), t.n, t.ids, t.weights).ok());
    // Shared expert: 0.5 * x, in chunks, driving the exchange between chunks.
    std::vector<float> out(t.n * hidden);
    for (int64_t i = 0; i < t.n; ++i) {
      for (int64_t h = 0; h < hidden; ++h) out[i * hidden + h] = 0.5f * t.x[i * hidden + h];
      if (i % 8 == 0) {
        ASSERT_TRUE((*d)->Progress().ok());
      }
    }
    auto in = (*d)->WaitDispatch();
    ASSERT_TRUE(in.ok());
    const std::vector<float> expert_out = ComputeExperts<float>(**in, hidden, LoadF32);
    ASSERT_TRUE((*d)->StartCombine(expert_out.data()).ok());
    ASSERT_TRUE((*d)->WaitCombine(out, /*accumulate=*/true).ok());
    std::vector<float> want = Reference(t, top_k, hidden);
    for (size_t i = 0; i < want.size(); ++i) want[i] += 0.5f * t.x[i];
    worst = std::max(worst, MaxRelError(out, want));
  }
  EXPECT_LT(worst, 1e-5);
  EXPECT_EQ((*d)->rounds(), 20);
}

// bf16 hidden states out, bf16 expert outputs back (the bandwidth-saving configuration).
TEST(EpDispatcherMpTest, Bf16DispatchAndCombine) {
  auto world = MpiComm::World();
  ASSERT_TRUE(world.ok());
  const int p = WorldSize(), me = WorldRank();
  const int n_experts = 2 * p, top_k = 2;
  const int64_t hidden = 32;
  auto d = EpDispatcher::Create(*world, {.n_experts = n_experts, .top_k = top_k, .hidden = hidden,
                                         .dispatch_dtype = DType::kBF16, .combine_dtype = DType::kBF16});
  ASSERT_TRUE(d.ok());
  std::mt19937 rng(99 + me);
  Tokens t;
  t.n = 17 + me;
  std::vector<uint16_t> x_bf16;
  for (int64_t i = 0; i < t.n * hidden; ++i) {
    x_bf16.push_back(F32ToBf16Bits(std::uniform_real_distribution<float>(-2, 2)(rng)));
    t.x.push_back(Bf16ToF32(x_bf16.back()));
  }
  for (int64_t i = 0; i < t.n; ++i) {
    const int32_t a = static_cast<int32_t>(rng() % n_experts);
    t.ids.push_back(a);
    t.ids.push_back((a + 1 + static_cast<int32_t>(rng() % (n_experts - 1))) % n_experts);
    t.weights.push_back(0.6f);
    t.weights.push_back(0.4f);
  }
  auto in = (*d)->Dispatch(x_bf16.data(), t.n, t.ids, t.weights);
  ASSERT_TRUE(in.ok());
  const std::vector<float> f32 = ComputeExperts<uint16_t>(**in, hidden, LoadBf16);
  std::vector<uint16_t> expert_out(f32.size());
  for (size_t i = 0; i < f32.size(); ++i) expert_out[i] = F32ToBf16Bits(f32[i]);
  std::vector<float> out(t.n * hidden);
  ASSERT_TRUE((*d)->Combine(expert_out.data(), out, false).ok());
  EXPECT_LT(MaxRelError(out, Reference(t, top_k, hidden)), 2e-2);
}

// Calls out of order are refused locally (no communication), so they cannot desynchronize ranks.
TEST(EpDispatcherMpTest, CallsOutOfOrderAreRefused) {
  auto world = MpiComm::World();
  ASSERT_TRUE(world.ok());
  auto d = EpDispatcher::Create(*world, {.n_experts = 2 * WorldSize(), .top_k = 1, .hidden = 4});
  ASSERT_TRUE(d.ok());
  std::vector<float> out;
  EXPECT_EQ((*d)->WaitDispatch().status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ((*d)->StartCombine(nullptr).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ((*d)->WaitCombine(out, false).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE((*d)->StartDispatch(nullptr, 0, {}, {}).ok());
  EXPECT_EQ((*d)->StartDispatch(nullptr, 0, {}, {}).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE((*d)->WaitDispatch().ok());
  ASSERT_TRUE((*d)->Combine(nullptr, out, false).ok());
  EXPECT_FALSE(EpDispatcher::Create(*world, {.n_experts = 2 * WorldSize(), .top_k = 2 * WorldSize() + 1, .hidden = 4}).ok());
  if (WorldSize() > 1) {
    EXPECT_FALSE(EpDispatcher::Create(*world, {.n_experts = 2 * WorldSize() + 1, .top_k = 1, .hidden = 4}).ok());
  }
  EXPECT_TRUE(AllRanks(true));
}

}  // namespace
}  // namespace pdserve::comm
