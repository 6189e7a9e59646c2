// Tests for kernels/quantize.h: bitwise agreement with the scalar reference, the round-trip
// error bound, edge rows (zeros, a single spike, exact ties) and the end-to-end W8A8 product
// error against an fp32 GEMM.
#include "kernels/quantize.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/gemm_int8.h"
#include "kernels/ref/gemm_int8_ref.h"

namespace pdserve::kernels {
namespace {

TEST(QuantizeTest, MatchesReferenceBitwise) {
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  for (int64_t n : {1, 7, 31, 32, 33, 100, 1024, 1031}) {
    const int64_t m = 5, ldx = n + 3, ldq = n + 1;
    std::vector<float> x(static_cast<size_t>(m * ldx));
    for (auto& v : x) v = dist(rng);
    std::vector<int8_t> q(static_cast<size_t>(m * ldq), 99), qr(q.size(), 99);
    std::vector<float> s(static_cast<size_t>(m)), sr(s.size());
    QuantizeRowsInt8(x.data(), m, n, ldx, q.data(), ldq, s.data());
    QuantizeRowsInt8Ref(x.data(), m, n, ldx, qr.data(), ldq, sr.data());
    EXPECT_EQ(q, qr) << n;  // includes the untouched padding
    EXPECT_EQ(s, sr) << n;
  }
}

TEST(QuantizeTest, RoundTripWithinHalfAStep) {
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> dist(-50.0f, 50.0f);
  const int64_t m = 8, n = 4099;
  std::vector<float> x(static_cast<size_t>(m * n)), back(x.size());
  for (auto& v : x) v = dist(rng);
  x[17] = 1e-30f;  // tiny values quantize to 0
  std::vector<int8_t> q(x.size());
  std::vector<float> s(m);
  QuantizeRowsInt8(x.data(), m, n, n, q.data(), n, s.data());
  DequantizeRowsInt8(q.data(), s.data(), m, n, n, back.data(), n);
  for (int64_t i = 0; i < m; ++i) {
    float amax = 0;
    for (int64_t k = 0; k < n; ++k) amax = std::max(amax, std::fabs(x[i * n + k]));
    EXPECT_FLOAT_EQ(s[i], amax / 127.0f);
    for (int64_t k = 0; k < n; ++k) {
      const size_t at = static_cast<size_t>(i * n + k);
      ASSERT_GE(q[at], -127);
      ASSERT_LE(std::fabs(back[at] - x[at]), 0.5f * s[i] * (1 + 1e-5f) + 1e-6f * std::fabs(x[at])) << i << "," << k;
      if (std::fabs(x[at]) == amax) {
        EXPECT_EQ(std::abs(q[at]), 127);
      }
    }
  }
}

TEST(QuantizeTest, EdgeRows) {
  // zeros -> scale 0, codes 0; a spike row; ties round half to even (scale 1 when amax = 127).
  std::vector<float> x = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                          -3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                          127, 0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -2.5f, 126.5f, 3, 4, 5, 6, 7, 8, 9, -127};
  std::vector<int8_t> q(x.size());
  std::vector<float> s(3);
  QuantizeRowsInt8(x.data(), 3, 16, 16, q.data(), 16, s.data());
  EXPECT_EQ(s[0], 0.0f);
  for (int k = 0; k < 16; ++k) EXPECT_EQ(q[k], 0);
  EXPECT_EQ(q[16], -127);
  EXPECT_EQ(s[2], 1.0f);
  const int8_t want[] = {127, 0, 2, 2, 0, -2, -2, 126, 3, 4, 5, 6, 7, 8, 9, -127};
  for (int k = 0; k < 16; ++k) EXPECT_EQ(q[32 + k], want[k]) << k;
}

TEST(QuantizeTest, W8A8ProductCloseToFp32) {
  // Per-token activations x per-channel weights, both quantized: the product keeps cos >= 0.999
  // and a small relative error against the fp32 product, on data with outlier channels.
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const int64_t m = 16, n_in = 512, n_out = 96;
  std::vector<float> x(static_cast<size_t>(m * n_in)), w(static_cast<size_t>(n_out * n_in));
  for (auto& v : x) v = dist(rng);
  for (int64_t i = 0; i < m; ++i) x[i * n_in + 7] *= 8.0f;  // an outlier channel
  for (auto& v : w) v = dist(rng) * 0.05f;
  std::vector<int8_t> xq(x.size()), wq(w.size());
  std::vector<float> xs(m), ws(n_out);
  QuantizeRowsInt8(x.data(), m, n_in, n_in, xq.data(), n_in, xs.data());
  QuantizeRowsInt8(w.data(), n_out, n_in, n_in, wq.data(), n_in, ws.data());
  std::vector<float> y(static_cast<size_t>(m * n_out));
  GemmInt8(xq.data(), xs.data(), m, n_in, {wq.data(), ws.data(), n_out, n_in, n_in}, y.data(), n_out, nullptr);
  double ab = 0, aa = 0, bb = 0, err2 = 0;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n_out; ++j) {
      double ref = 0;
      for (int64_t k = 0; k < n_in; ++k) ref += double(x[i * n_in + k]) * w[j * n_in + k];
      const double v = y[i * n_out + j];
      ab += v * ref, aa += v * v, bb += ref * ref, err2 += (v - ref) * (v - ref);
    }
  EXPECT_GE(ab / std::sqrt(aa * bb), 0.999);
  EXPECT_LE(std::sqrt(err2 / bb), 0.03);
}

}  // namespace
}  // namespace pdserve::kernels
