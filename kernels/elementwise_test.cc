// Tests of kernels/elementwise.h, rope.h and fp8_quant.h against straightforward scalar
// versions written out here. To add a case: compute the expected values with the plainest loop
// you can write (double precision where it helps) and compare with a named tolerance.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "common/dtype.h"
#include "kernels/elementwise.h"
#include "kernels/fp8_quant.h"
#include "kernels/isa_test_util.h"
#include "kernels/kernel_table.h"
#include "kernels/rope.h"

namespace pdserve::kernels {
namespace {

constexpr int64_t kOddSizes[] = {1, 7, 9, 33, 128, 4097};

std::vector<float> RandomVec(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}

TEST(ElementwiseTest, RmsNormMatchesDouble) {
  for (int64_t n : kOddSizes) {
    auto x = RandomVec(n, 1), w = RandomVec(n, 2);
    std::vector<float> out(static_cast<size_t>(n));
    RmsNorm(x.data(), w.data(), n, 1e-6f, out.data());
    double ss = 0;
    for (float v : x) ss += double(v) * v;
    const double inv = 1.0 / std::sqrt(ss / n + 1e-6);
    for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(out[i], w[i] * x[i] * inv, 1e-5 * (1 + std::fabs(w[i] * x[i] * inv))) << n;
  }
}

TEST(ElementwiseTest, LayerNormMatchesDouble) {
  for (int64_t n : kOddSizes) {
    auto x = RandomVec(n, 3), w = RandomVec(n, 4), b = RandomVec(n, 5);
    std::vector<float> out(static_cast<size_t>(n));
    LayerNorm(x.data(), w.data(), b.data(), n, 1e-6f, out.data());
    double mean = std::accumulate(x.begin(), x.end(), 0.0) / n, var = 0;
    for (float v : x) var += (v - mean) * (v - mean);
    var /= n;
    for (int64_t i = 0; i < n; ++i) {
      const double want = (x[i] - mean) / std::sqrt(var + 1e-6) * w[i] + b[i];
      EXPECT_NEAR(out[i], want, 1e-4 * (1 + std::fabs(want))) << n;
    }
  }
}

TEST(ElementwiseTest, RoundToBf16MatchesScalar) {
  for (int64_t n : kOddSizes) {
    auto x = RandomVec(n, 6, 100.0f);
    if (n > 3) x[2] = NAN, x[3] = -INFINITY;
    auto y = x;
    RoundToBf16InPlace(y.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      if (std::isnan(x[i])) EXPECT_TRUE(std::isnan(y[i]));
      else EXPECT_EQ(y[i], RoundToBf16(x[i])) << i;
    }
  }
}

TEST(ElementwiseTest, DotAxpyAndAxpyRow) {
  for (int64_t n : kOddSizes) {
    auto a = RandomVec(n, 7), b = RandomVec(n, 8);
    double want = 0;
    for (int64_t i = 0; i < n; ++i) want += double(a[i]) * b[i];
    EXPECT_NEAR(DotF32(a.data(), b.data(), n), want, 1e-4 * std::sqrt(double(n)));
    std::vector<uint16_t> bbf(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) bbf[i] = F32ToBf16Bits(b[i]);
    auto y1 = a, y2 = a, y3 = a;
    Axpy(0.5f, b.data(), n, y1.data());
    AxpyRow(0.5f, b.data(), false, n, y2.data());
    AxpyRow(0.5f, bbf.data(), true, n, y3.data());
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_FLOAT_EQ(y1[i], a[i] + 0.5f * b[i]);
      EXPECT_FLOAT_EQ(y2[i], y1[i]);
      EXPECT_FLOAT_EQ(y3[i], a[i] + 0.5f * Bf16ToF32(bbf[i]));
    }
  }
}

TEST(ElementwiseTest, SoftmaxWithMaskedEntries) {
  std::vector<float> x = {1.0f, -INFINITY, 3.0f, 0.5f};
  Softmax(x.data(), 4);
  const double z = std::exp(1.0) + std::exp(3.0) + std::exp(0.5);
  EXPECT_NEAR(x[0], std::exp(1.0) / z, 1e-6);
  EXPECT_EQ(x[1], 0.0f);
  EXPECT_NEAR(x[2], std::exp(3.0) / z, 1e-6);
}

TEST(ElementwiseTest, HadamardMatchesSylvesterMatrix) {
  for (int64_t n : {1, 2, 8, 128}) {
    auto x = RandomVec(n, 9);
    auto y = x;
    HadamardTransform(y.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      double want = 0;
      for (int64_t j = 0; j < n; ++j) want += (__builtin_popcountll(i & j) % 2 ? -1.0 : 1.0) * x[j];
      EXPECT_NEAR(y[i], want, 1e-4) << n;
    }
  }
}

// The vector butterflies are the scalar ones, element for element: the same bits for every
// power of two (the in-register stages and the whole-register ones), with signed zeros,
// infinities and values far apart in magnitude.
TEST(ElementwiseTest, HadamardVectorEqualsScalarBitwise) {
  std::mt19937 rng(33);
  std::normal_distribution<float> nd;
  for (int64_t n : {1, 2, 4, 8, 16, 32, 128, 1024}) {
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<float> x(static_cast<size_t>(n));
      for (auto& v : x) v = nd(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 40) - 20);
      if (trial == 1) x[0] = -0.0f;
      if (trial == 2 && n > 1) x[1] = INFINITY;
      std::vector<float> want = x, got = x;
      internal::TEST_HadamardScalar(want.data(), n);
      HadamardTransform(got.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        uint32_t a, b;
        std::memcpy(&a, &want[static_cast<size_t>(i)], 4);
        std::memcpy(&b, &got[static_cast<size_t>(i)], 4);
        ASSERT_EQ(a, b) << "n " << n << " trial " << trial << " element " << i;
      }
    }
  }
}

// The vectorized exponential against double exp over its whole range, lanes and tails alike.
// The attention's fused softmax-and-round is bitwise Softmax then RoundToBf16InPlace, for
// lengths that hit every step (16, 8, scalar tail), scores far below the maximum (exponentials
// that underflow to zero), ties and repeated values, on every ISA level.
TEST(ElementwiseTest, SoftmaxToBf16EqualsSoftmaxThenRound) {
  std::mt19937 rng(21);
  std::normal_distribution<float> nd;
  ForEachIsa([&](Isa isa) {
    const Isa previous = internal::TEST_SetActiveIsa(isa);
    // A changed summation order moves the sum by an ulp or so, which the rounding to bf16 then
    // hides for most values: many long rows make sure some land next to a rounding boundary.
    std::vector<int64_t> lengths = {1, 2, 7, 8, 9, 15, 16, 17, 23, 24, 25, 31, 33, 100, 512, 1001};
    for (int rep = 0; rep < 300; ++rep) lengths.push_back(1001);
    for (int64_t n : lengths) {
      for (float spread : {0.5f, 8.0f, 60.0f}) {
        std::vector<float> x(static_cast<size_t>(n));
        for (auto& v : x) v = RoundToBf16(nd(rng) * spread);
        if (n > 3) x[1] = x[3] = x[0];  // ties
        if (n > 5) x[5] = x[0] - 200.0f;  // an exponential below the cutoff
        std::vector<float> want = x, got = x;
        Softmax(want.data(), n);
        RoundToBf16InPlace(want.data(), n);
        SoftmaxToBf16(got.data(), n);
        EXPECT_EQ(0, std::memcmp(got.data(), want.data(), static_cast<size_t>(n) * 4))
            << IsaName(isa) << " n " << n << " spread " << spread;
      }
    }
    internal::TEST_SetActiveIsa(previous);
  });
}

TEST(ElementwiseTest, SoftmaxCloseToDoubleReference) {
  std::mt19937 rng(4);
  std::uniform_real_distribution<float> ud(-95.0f, 5.0f);
  for (int64_t n : {1, 7, 8, 33, 513}) {
    std::vector<float> x(static_cast<size_t>(n));
    for (auto& v : x) v = ud(rng);
    std::vector<float> y = x;
    Softmax(y.data(), n);
    const double mx = *std::max_element(x.begin(), x.end());
    double z = 0;
    for (float v : x) z += v - mx >= -87.0 ? std::exp(static_cast<double>(v) - mx) : 0.0;
    for (int64_t i = 0; i < n; ++i) {
      const double want = x[i] - mx >= -87.0 ? std::exp(static_cast<double>(x[i]) - mx) / z : 0.0;
      // fp32 x - max carries a rounding of |x - max| 2^-24, which exp turns into a relative error.
      const double t = std::fabs(static_cast<double>(x[i]) - mx);
      EXPECT_NEAR(y[i], want, (4e-7 + t * 1.2e-7) * want + 1e-38) << n << " " << i;
    }
    // The same values in another position give the same probabilities (no lane dependence).
    std::vector<float> shifted(x.begin() + 1, x.end());
    shifted.push_back(x[0]);
    Softmax(shifted.data(), n);
    EXPECT_EQ(shifted[n - 1], y[0]);
  }
}

TEST(ElementwiseTest, TopKIsSortedAndBreaksTiesLow) {
  std::vector<float> s = {0.5f, 2.0f, 2.0f, -1.0f, 3.0f, 2.0f, 0.0f};
  std::vector<int32_t> out(7), scratch(7);
  ASSERT_EQ(TopKIndices(s.data(), 7, 3, out.data(), scratch.data()), 3);
  EXPECT_EQ(std::vector<int32_t>(out.begin(), out.begin() + 3), (std::vector<int32_t>{1, 2, 4}));
  ASSERT_EQ(TopKIndices(s.data(), 7, 10, out.data(), scratch.data()), 7);  // fewer keys than k
  EXPECT_EQ(out, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(TopKIndices(s.data(), 0, 3, out.data(), scratch.data()), 0);  // empty
  // Against a full sort on random data (odd sizes).
  for (int64_t n : kOddSizes) {
    auto r = RandomVec(n, 10);
    std::vector<int32_t> o(static_cast<size_t>(n)), sc(static_cast<size_t>(n)), idx(static_cast<size_t>(n));
    const int64_t k = std::min<int64_t>(n, 5);
    TopKIndices(r.data(), n, k, o.data(), sc.data());
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return r[a] > r[b]; });
    std::vector<int32_t> want(idx.begin(), idx.begin() + k);
    std::sort(want.begin(), want.end());
    EXPECT_EQ(std::vector<int32_t>(o.begin(), o.begin() + k), want);
  }
}

TEST(RopeTest, LayoutsRotatePairsByAngle) {
  const int64_t dr = 8;
  auto freqs = RopeFrequencies(dr, 10000.0, {});
  for (int64_t j = 0; j < dr / 2; ++j) EXPECT_FLOAT_EQ(freqs[j], 1.0f / std::pow(10000.0f, 2.0f * j / dr));
  std::vector<float> x = {1, 2, 3, 4, 5, 6, 7, 8};
  auto inter = x, half = x;
  ApplyRopeInterleaved(inter.data(), dr, 3, freqs.data());
  ApplyRopeHalfSplit(half.data(), dr, 3, freqs.data());
  for (int64_t j = 0; j < dr / 2; ++j) {
    const double a = 3.0f * freqs[j];
    EXPECT_NEAR(inter[2 * j], x[2 * j] * std::cos(a) - x[2 * j + 1] * std::sin(a), 1e-5);
    EXPECT_NEAR(inter[2 * j + 1], x[2 * j] * std::sin(a) + x[2 * j + 1] * std::cos(a), 1e-5);
    EXPECT_NEAR(half[j], x[j] * std::cos(a) - x[j + 4] * std::sin(a), 1e-5);
    EXPECT_NEAR(half[j + 4], x[j] * std::sin(a) + x[j + 4] * std::cos(a), 1e-5);
  }
}

// The angles computed once per position (RopeAngles) and shared by every head rotate each
// vector exactly as the per-vector form did: fp32 angle, std::cos / std::sin of it, the
// same products; positions from 0 to past 100k, both layouts.
TEST(RopeTest, SharedAnglesRotateAsThePerVectorForm) {
  const int64_t dr = 64;
  const auto freqs = RopeFrequencies(dr, 10000.0, {true, 40.0, 4096, 32.0, 1.0});
  std::mt19937 rng(17);
  std::normal_distribution<float> nd;
  for (int64_t pos : {int64_t{0}, int64_t{1}, int64_t{4095}, int64_t{65535}, int64_t{163839}}) {
    float c[dr / 2], s[dr / 2];
    RopeAngles(dr, pos, freqs.data(), c, s);
    for (int head = 0; head < 4; ++head) {
      std::vector<float> x(dr);
      for (auto& v : x) v = nd(rng);
      std::vector<float> inter = x, half = x, want_inter = x, want_half = x;
      ApplyRopeInterleaved(inter.data(), dr, c, s);
      ApplyRopeHalfSplit(half.data(), dr, c, s);
      for (int64_t j = 0; j < dr / 2; ++j) {  // the per-vector form, written out
        const float angle = static_cast<float>(pos) * freqs[j];
        const float cj = std::cos(angle), sj = std::sin(angle);
        want_inter[2 * j] = x[2 * j] * cj - x[2 * j + 1] * sj;
        want_inter[2 * j + 1] = x[2 * j] * sj + x[2 * j + 1] * cj;
        want_half[j] = x[j] * cj - x[j + dr / 2] * sj;
        want_half[j + dr / 2] = x[j] * sj + x[j + dr / 2] * cj;
      }
      for (int64_t j = 0; j < dr; ++j) {
        EXPECT_NEAR(inter[j], want_inter[j], 1e-6f * (1.0f + std::fabs(want_inter[j]))) << pos << " " << j;
        EXPECT_NEAR(half[j], want_half[j], 1e-6f * (1.0f + std::fabs(want_half[j]))) << pos << " " << j;
      }
      std::vector<float> by_pos_inter = x, by_pos_half = x;
      ApplyRopeInterleaved(by_pos_inter.data(), dr, pos, freqs.data());
      ApplyRopeHalfSplit(by_pos_half.data(), dr, pos, freqs.data());
      EXPECT_EQ(by_pos_inter, inter) << pos;
      EXPECT_EQ(by_pos_half, half) << pos;
    }
  }
}

// YaRN on the real model's numbers: dr 64, theta 10000, factor 40, original 4096, beta 32/1.
// c(b) = 64 ln(4096/(2 pi b)) / (2 ln 10000): c(32) = 10.47 -> low 10; c(1) = 22.51 -> high 23.
TEST(RopeTest, YarnRampMatchesHandComputation) {
  YarnParams y{true, 40.0, 4096, 32.0, 1.0};
  auto f = RopeFrequencies(64, 10000.0, y);
  auto base = RopeFrequencies(64, 10000.0, {});
  for (int64_t j = 0; j < 32; ++j) {
    const double ramp = std::clamp((j - 10.0) / (23.0 - 10.0), 0.0, 1.0);
    const double want = base[j] / 40.0 * ramp + base[j] * (1 - ramp);
    EXPECT_NEAR(f[j], want, 1e-6 * base[j]) << j;
  }
  EXPECT_FLOAT_EQ(f[3], base[3]);             // below the ramp: unchanged
  EXPECT_NEAR(f[31], base[31] / 40.0, 1e-12);  // above: divided by factor
}

TEST(Fp8QuantTest, ScalesArePowersOfTwoAndRoundTripIsExactAndIdempotent) {
  EXPECT_EQ(Fp8BlockScale(448.0f), 1.0f);
  EXPECT_EQ(Fp8BlockScale(449.0f), 2.0f);
  EXPECT_EQ(Fp8BlockScale(0.0f), Fp8BlockScale(1e-4f));  // amax floored at 1e-4
  auto x = RandomVec(256, 11, 3.0f);
  std::vector<uint8_t> codes(256);
  float scales[2];
  ActQuantFp8(x.data(), 256, codes.data(), scales);
  for (int b = 0; b < 2; ++b) {
    float amax = 0;
    for (int i = 0; i < 128; ++i) amax = std::max(amax, std::fabs(x[b * 128 + i]));
    const float s = scales[b];
    int e;
    EXPECT_EQ(std::frexp(s, &e), 0.5f);  // a power of two
    EXPECT_GE(s, amax / 448.0f);
    EXPECT_LT(s / 2, amax / 448.0f);
    for (int i = 0; i < 128; ++i) {
      const float want = Fp8E4M3ToF32(F32ToFp8E4M3(x[b * 128 + i] / s)) * s;
      EXPECT_EQ(Fp8E4M3ToF32(codes[b * 128 + i]) * s, want);
    }
  }
  auto y = x;
  Fp8RoundTripInPlace(y.data(), 256);
  auto z = y;
  Fp8RoundTripInPlace(z.data(), 256);
  EXPECT_EQ(y, z);  // values already on the grid stay put
  for (float v : y) EXPECT_EQ(v, RoundToBf16(v));  // and are exact in bf16
}

// The vectorized e4m3 encoder against the scalar definition (common/dtype.h), bit for bit:
// every e4m3 value, the midpoints between neighbours and one ulp either side (the ties), the
// subnormal/normal seam, saturation, signed zeros, infinities, NaN, and a sweep over the fp32
// bit patterns.
TEST(Fp8QuantTest, VectorEncoderEqualsTheScalarOneOnEveryKindOfInput) {
  std::vector<float> x;
  auto near = [&](float v) {
    x.push_back(v);
    x.push_back(std::nextafter(v, INFINITY));
    x.push_back(std::nextafter(v, -INFINITY));
  };
  std::vector<float> grid;
  for (int c = 0; c < 0x7f; ++c) grid.push_back(Fp8E4M3ToF32(static_cast<uint8_t>(c)));
  for (size_t i = 0; i < grid.size(); ++i) {
    near(grid[i]);
    if (i + 1 < grid.size()) near((grid[i] + grid[i + 1]) / 2);  // exact: both on a finer grid
  }
  for (float v : {448.0f, 456.0f, 464.0f, 472.0f, 480.0f, 1e6f, 0.015625f, 0.0146484375f, 1e-30f, 1e-40f}) near(v);
  x.push_back(INFINITY);
  x.push_back(std::numeric_limits<float>::quiet_NaN());
  const size_t signed_count = x.size();
  for (size_t i = 0; i < signed_count; ++i) x.push_back(-x[i]);
  for (uint64_t u = 0; u < (uint64_t{1} << 32); u += 40961) {
    float v;
    const uint32_t b = static_cast<uint32_t>(u);
    std::memcpy(&v, &b, 4);
    x.push_back(v);
  }
  std::vector<uint8_t> got(x.size());
  F32ToFp8E4M3Rows(x.data(), static_cast<int64_t>(x.size()), got.data());
  int64_t bad = 0;
  for (size_t i = 0; i < x.size(); ++i)
    if (got[i] != F32ToFp8E4M3(x[i]) && ++bad <= 10)
      ADD_FAILURE() << "x=" << x[i] << " got 0x" << std::hex << int{got[i]} << " want 0x" << int{F32ToFp8E4M3(x[i])};
  EXPECT_EQ(bad, 0) << "of " << x.size();
}

// ActQuantFp8 against its scalar definition (fp8_quant.h), including blocks with a NaN, a huge
// outlier (most codes subnormal) and all zeros.
TEST(Fp8QuantTest, ActQuantEqualsItsScalarDefinition) {
  auto x = RandomVec(128 * 6, 5, 3.0f);
  x[128 + 7] = std::numeric_limits<float>::quiet_NaN();
  x[256 + 3] = 1e5f;
  std::fill(x.begin() + 384, x.begin() + 512, 0.0f);
  for (int i = 512; i < 640; ++i) x[i] = x[i] * 1e-6f;
  std::vector<uint8_t> codes(x.size()), want(x.size());
  std::vector<float> scales(6);
  ActQuantFp8(x.data(), static_cast<int64_t>(x.size()), codes.data(), scales.data());
  for (int b = 0; b < 6; ++b) {
    float amax = 0.0f;
    for (int i = 0; i < 128; ++i) amax = std::max(amax, std::fabs(x[b * 128 + i]));
    const float s = Fp8BlockScale(amax);
    EXPECT_EQ(scales[b], s) << "block " << b;
    for (int i = 0; i < 128; ++i)
      want[b * 128 + i] = F32ToFp8E4M3(std::clamp(x[b * 128 + i] / s, -kFp8E4M3Max, kFp8E4M3Max));
  }
  EXPECT_EQ(codes, want);
}

TEST(Fp8QuantTest, DotIsExact) {
  std::mt19937 rng(12);
  for (int64_t n : {1, 7, 9, 33, 128}) {
    std::vector<uint8_t> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
    for (auto& v : a) { v = static_cast<uint8_t>(rng() & 0xff); if ((v & 0x7f) == 0x7f) v = 0; }
    for (auto& v : b) { v = static_cast<uint8_t>(rng() & 0xff); if ((v & 0x7f) == 0x7f) v = 0; }
    long double want = 0;
    for (int64_t i = 0; i < n; ++i) want += static_cast<long double>(Fp8E4M3ToF32(a[i])) * Fp8E4M3ToF32(b[i]);
    EXPECT_EQ(Fp8DotExact(a.data(), b.data(), n), static_cast<float>(want)) << n;
    std::vector<double> ad(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) ad[i] = Fp8E4M3ToF32(a[i]);
    EXPECT_EQ(Fp8DotExactDecodedA(ad.data(), b.data(), n), static_cast<float>(want)) << n;
  }
}

}  // namespace
}  // namespace pdserve::kernels
