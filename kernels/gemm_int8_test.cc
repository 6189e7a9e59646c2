// Tests for kernels/gemm_int8.h against the int64 reference kernels/ref/gemm_int8_ref.h: the
// int32 accumulators must be exactly equal (no tolerance), and the dequantized fp32 outputs
// bitwise equal (same epilogue formula), on odd sizes, strides, both paths, 1-3 threads, the
// extreme codes (-128 x -128 at the largest n_in), and grouped calls with zero-token groups.
#include "kernels/gemm_int8.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "kernels/gemm_int8_internal.h"
#include "kernels/isa_test_util.h"
#include "kernels/kernel_table.h"
#include "kernels/ref/gemm_int8_ref.h"

namespace pdserve::kernels {
namespace {

constexpr float kSentinel = -12345.5f;

ThreadPool& Pool(int n) {
  static ThreadPool p1(1), p2(2), p3(3);
  return n == 1 ? p1 : n == 2 ? p2 : p3;
}

struct Problem {
  int64_t m, n_in, n_out, ldx, ldw, ldy;
  std::vector<int8_t> x, w;
  std::vector<float> xs, ws;
  Int8WeightView view() const { return {w.data(), ws.data(), n_out, n_in, ldw}; }
};

Problem MakeProblem(int64_t m, int64_t n_in, int64_t n_out, bool strided, uint32_t seed) {
  Problem p{m, n_in, n_out, n_in + (strided ? 3 : 0), n_in + (strided ? 5 : 0), n_out + (strided ? 2 : 0),
            {}, {}, {}, {}};
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> code(-128, 127);
  std::uniform_real_distribution<float> scale(1e-4f, 2e-2f);
  // Padding holds 77: a kernel reading past n_in would change the sums.
  p.x.assign(static_cast<size_t>(std::max<int64_t>(m, 1) * p.ldx), 77);
  p.w.assign(static_cast<size_t>(std::max<int64_t>(n_out, 1) * p.ldw), 77);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t k = 0; k < n_in; ++k) p.x[i * p.ldx + k] = static_cast<int8_t>(code(rng));
  for (int64_t j = 0; j < n_out; ++j)
    for (int64_t k = 0; k < n_in; ++k) p.w[j * p.ldw + k] = static_cast<int8_t>(code(rng));
  for (int64_t i = 0; i < m; ++i) p.xs.push_back(scale(rng));
  for (int64_t j = 0; j < n_out; ++j) p.ws.push_back(scale(rng));
  return p;
}

// Every level's int32 sums equal the int64 reference exactly, so all levels agree bit for bit.
void ExpectExact(const Problem& p, int threads, Isa isa) {
  std::vector<int64_t> ref(static_cast<size_t>(p.m * p.n_out));
  GemmInt8AccRef(p.x.data(), p.m, p.ldx, p.view(), ref.data(), p.n_out);
  std::vector<int32_t> acc(static_cast<size_t>(std::max<int64_t>(p.m, 1) * p.ldy), 0x5a5a5a5a);
  internal::GemmInt8WithIsa(isa, p.x.data(), nullptr, p.m, p.ldx, p.view(), acc.data(), p.ldy,
                            &Pool(threads));
  std::vector<float> y(static_cast<size_t>(std::max<int64_t>(p.m, 1) * p.ldy), kSentinel);
  internal::GemmInt8WithIsa(isa, p.x.data(), p.xs.data(), p.m, p.ldx, p.view(), y.data(), p.ldy,
                            &Pool(threads));
  std::vector<float> yref(static_cast<size_t>(std::max<int64_t>(p.m, 1) * p.ldy), kSentinel);
  GemmInt8Ref(p.x.data(), p.xs.data(), p.m, p.ldx, p.view(), yref.data(), p.ldy);
  int bad = 0;
  for (int64_t i = 0; i < p.m; ++i) {
    for (int64_t j = 0; j < p.ldy; ++j) {
      const size_t at = static_cast<size_t>(i * p.ldy + j);
      if (j >= p.n_out) {
        EXPECT_EQ(acc[at], 0x5a5a5a5a) << "stray int32 store at " << i << "," << j;
        EXPECT_EQ(y[at], kSentinel) << "stray store at " << i << "," << j;
        continue;
      }
      if (acc[at] != ref[static_cast<size_t>(i * p.n_out + j)] || std::memcmp(&y[at], &yref[at], 4) != 0) {
        if (++bad < 5)
          ADD_FAILURE() << "m=" << p.m << " n_in=" << p.n_in << " n_out=" << p.n_out << " at (" << i << ","
                        << j << ") isa " << IsaName(isa) << ": acc " << acc[at] << " ref " << ref[static_cast<size_t>(i * p.n_out + j)]
                        << ", y " << y[at] << " ref " << yref[at];
      }
    }
  }
  EXPECT_EQ(bad, 0);
}

class GemmInt8ShapeTest : public ::testing::TestWithParam<std::tuple<int64_t, int64_t, int64_t>> {};

TEST_P(GemmInt8ShapeTest, ExactlyEqualsInt64Reference) {
  const auto [m, n_in, n_out] = GetParam();
  uint32_t seed = static_cast<uint32_t>(m * 7919 + n_in * 31 + n_out);
  for (bool strided : {false, true})
    for (int threads : {1, 2, 3}) {
      const Problem p = MakeProblem(m, n_in, n_out, strided, seed++);
      ForEachIsa([&](Isa isa) { ExpectExact(p, threads, isa); });
      // The public entry points run the active level.
      std::vector<int32_t> a(static_cast<size_t>(std::max<int64_t>(m, 1) * p.ldy), 0x5a5a5a5a), b(a);
      GemmInt8Acc(p.x.data(), p.m, p.ldx, p.view(), a.data(), p.ldy, &Pool(threads));
      internal::GemmInt8WithIsa(ActiveIsa(), p.x.data(), nullptr, p.m, p.ldx, p.view(), b.data(), p.ldy,
                                nullptr);
      EXPECT_EQ(a, b);
    }
}

// m spans both paths (<= kGemmInt8SmallMMax and above, partial microkernel rows); n_in spans the
// 16-wide vector body, the scalar tail, odd k (a padded k-pair) and several k blocks of 512;
// n_out spans partial 8/16-column panels.
INSTANTIATE_TEST_SUITE_P(
    Shapes, GemmInt8ShapeTest,
    ::testing::Values(std::make_tuple(1, 1, 1), std::make_tuple(1, 17, 9), std::make_tuple(1, 1024, 100),
                      std::make_tuple(2, 33, 31), std::make_tuple(3, 100, 7), std::make_tuple(4, 513, 16),
                      std::make_tuple(5, 64, 40), std::make_tuple(8, 255, 33), std::make_tuple(9, 15, 17),
                      std::make_tuple(13, 1031, 50), std::make_tuple(64, 512, 64), std::make_tuple(70, 1537, 129),
                      std::make_tuple(7, 3, 300), std::make_tuple(37, 1, 5)));

TEST(GemmInt8Test, ExtremeCodesAtLargestK) {
  // -128 * -128 over kGemmInt8MaxK terms: the largest sum the contract allows (< 2^31).
  for (int64_t m : {1, 9}) {
    const int64_t n = kGemmInt8MaxK;
    std::vector<int8_t> x(static_cast<size_t>(m * n), -128), w(static_cast<size_t>(3 * n), -128);
    for (int64_t k = 0; k < n; k += 2) w[static_cast<size_t>(2 * n + k)] = 127;  // row 2 mixes signs
    const Int8WeightView v{w.data(), nullptr, 3, n, n};
    std::vector<int32_t> acc(static_cast<size_t>(m * 3));
    std::vector<int64_t> ref(acc.size());
    GemmInt8AccRef(x.data(), m, n, v, ref.data(), 3);
    ASSERT_GT(ref[0], int64_t{2147000000});
    ForEachIsa([&](Isa isa) {
      internal::GemmInt8WithIsa(isa, x.data(), nullptr, m, n, v, acc.data(), 3, &Pool(2));
      for (size_t i = 0; i < acc.size(); ++i) EXPECT_EQ(acc[i], ref[i]) << i;
    });
  }
}

TEST(GemmInt8Test, EmptyShapes) {
  Problem p = MakeProblem(3, 0, 5, true, 1);
  std::vector<float> y(static_cast<size_t>(3 * p.ldy), kSentinel);
  GemmInt8(p.x.data(), p.xs.data(), 3, p.ldx, p.view(), y.data(), p.ldy, &Pool(2));
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < p.ldy; ++j) EXPECT_EQ(y[i * p.ldy + j], j < 5 ? 0.0f : kSentinel);
  Problem q = MakeProblem(0, 16, 5, false, 2);
  std::vector<float> yq(8, kSentinel);
  GemmInt8(q.x.data(), q.xs.data(), 0, q.ldx, q.view(), yq.data(), q.ldy, &Pool(2));
  for (float v : yq) EXPECT_EQ(v, kSentinel);
}

TEST(GemmInt8Test, GroupedEqualsSeparateCallsWithZeroTokenGroups) {
  // Experts of one MoE layer: gate and up of an expert share x; some experts get no token; the
  // last expert is large enough for the tiled path.
  const int64_t D = 200, I = 72;
  const std::vector<int64_t> rows = {3, 0, 1, 0, 0, 12, 2, 40};
  std::vector<Problem> gate, up;
  for (size_t e = 0; e < rows.size(); ++e) {
    gate.push_back(MakeProblem(rows[e], D, I, e % 2 == 1, static_cast<uint32_t>(100 + e)));
    up.push_back(MakeProblem(rows[e], D, I + 8, false, static_cast<uint32_t>(200 + e)));
    up.back().x = gate.back().x;  // same input rows and scales as gate
    up.back().ldx = gate.back().ldx;
    up.back().xs = gate.back().xs;
  }
  for (int threads : {1, 2, 3}) ForEachIsa([&](Isa isa) {
    const Isa previous = internal::TEST_SetActiveIsa(isa);
    std::vector<Int8GemmGroup> groups;
    std::vector<std::vector<float>> y(2 * rows.size());
    for (size_t e = 0; e < rows.size(); ++e)
      for (int which = 0; which < 2; ++which) {
        const Problem& p = which == 0 ? gate[e] : up[e];
        auto& out = y[2 * e + static_cast<size_t>(which)];
        out.assign(static_cast<size_t>(std::max<int64_t>(p.m, 1) * p.ldy), kSentinel);
        groups.push_back({p.view(), p.x.data(), p.xs.data(), p.m, p.ldx, out.data(), p.ldy});
      }
    GroupedGemmInt8(groups.data(), static_cast<int64_t>(groups.size()), &Pool(threads));
    for (size_t g = 0; g < groups.size(); ++g) {
      const Problem& p = g % 2 == 0 ? gate[g / 2] : up[g / 2];
      std::vector<float> ref(static_cast<size_t>(std::max<int64_t>(p.m, 1) * p.ldy), kSentinel);
      GemmInt8Ref(p.x.data(), p.xs.data(), p.m, p.ldx, p.view(), ref.data(), p.ldy);
      for (size_t i = 0; i < ref.size(); ++i)
        ASSERT_EQ(std::memcmp(&y[g][i], &ref[i], 4), 0) << "group " << g << " elem " << i << " threads " << threads;
    }
    internal::TEST_SetActiveIsa(previous);
  });
  // A call where every group is empty touches nothing.
  std::vector<float> untouched(4, kSentinel);
  Int8GemmGroup empty{gate[1].view(), gate[1].x.data(), gate[1].xs.data(), 0, gate[1].ldx, untouched.data(), 4};
  GroupedGemmInt8(&empty, 1, &Pool(2));
  GroupedGemmInt8(nullptr, 0, &Pool(2));
  for (float v : untouched) EXPECT_EQ(v, kSentinel);
}

TEST(GemmInt8Test, PathsAgreeOnTheSameProblem) {
  // The same rows computed by both internal paths give the same int32 sums.
  Problem p = MakeProblem(11, 777, 45, true, 9);
  std::vector<int16_t> x16(static_cast<size_t>(p.m * internal::WidenedStride(p.n_in)) + 32);
  int16_t* x16a = x16.data();
  while (reinterpret_cast<uintptr_t>(x16a) % 32) ++x16a;
  internal::WidenRows(p.x.data(), p.m, p.n_in, p.ldx, x16a, internal::WidenedStride(p.n_in));
  std::vector<int32_t> a(static_cast<size_t>(p.m * p.n_out)), b(a.size());
  internal::Int8Problem ip;
  ip.xp = x16a;
  ip.m = p.m;
  ip.w = p.view();
  ip.ldy = p.n_out;
  ip.raw = true;
  ip.y = a.data();
  internal::GemmInt8SmallM(ip, 0, p.m, 0, p.n_out);
  ip.y = b.data();
  internal::GemmInt8Tiled(ip, 0, p.m, 0, p.n_out);
  EXPECT_EQ(a, b);
}

// A row's result does not depend on the batch (exact sums; checked here beside the BF16 test):
// rows computed alone equal the same rows inside calls of m = 3, 17, 64, on every level.
TEST(GemmInt8Test, RowResultsDoNotDependOnTheBatch) {
  Problem p = MakeProblem(100, 1100, 70, true, 17);
  ForEachIsa([&](Isa isa) {
    std::vector<int32_t> alone(static_cast<size_t>(p.m * p.ldy), 0x5a5a5a5a), part(alone);
    for (int64_t i = 0; i < p.m; ++i)
      internal::GemmInt8WithIsa(isa, &p.x[i * p.ldx], nullptr, 1, p.ldx, p.view(), &alone[i * p.ldy], p.ldy,
                                &Pool(2));
    for (int64_t m : {3, 17, 64, 100}) {
      internal::GemmInt8WithIsa(isa, p.x.data(), nullptr, m, p.ldx, p.view(), part.data(), p.ldy, &Pool(3));
      EXPECT_EQ(std::memcmp(part.data(), alone.data(), m * p.ldy * 4), 0) << "m=" << m;
    }
  });
}

TEST(GemmInt8Test, DotInt8) {
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> code(-128, 127);
  for (int64_t n : {0, 1, 15, 16, 17, 128, 1000}) {
    std::vector<int8_t> a(static_cast<size_t>(n)), b(a.size());
    int64_t ref = 0;
    for (int64_t k = 0; k < n; ++k) {
      a[k] = static_cast<int8_t>(code(rng));
      b[k] = static_cast<int8_t>(code(rng));
      ref += int64_t{a[k]} * b[k];
    }
    EXPECT_EQ(DotInt8(a.data(), b.data(), n), ref) << n;
  }
}

}  // namespace
}  // namespace pdserve::kernels
