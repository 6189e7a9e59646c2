// FP8 block dequantization (model/fp8_blocks.h) against a straightforward scalar reference: the
// e4m3fn code decoded bit by bit (not through common/dtype's table) times its block's scale, over
// random matrices whose sizes leave ragged edge blocks, with NaN, subnormal, zero and max codes
// and non-finite / subnormal scales. Exact: both sides are one IEEE multiply per value. To add a
// case: add a shape to kShapes or a code / scale to the special lists.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "model/fp8_blocks.h"

namespace pdserve::model {
namespace {

// e4m3fn: sign, 4 exponent bits (bias 7), 3 mantissa bits; exponent 0 is subnormal; S.1111.111
// is NaN; no infinity.
float RefDecode(uint8_t code) {
  const int sign = code >> 7, exp = (code >> 3) & 0xf, man = code & 0x7;
  if (exp == 0xf && man == 0x7) return std::nanf("");
  const float mag = exp == 0 ? std::ldexp(static_cast<float>(man), -9)  // man / 8 * 2^-6
                             : std::ldexp(1.0f + static_cast<float>(man) / 8.0f, exp - 7);
  return sign ? -mag : mag;
}

// w[r][k] = fp8(codes[r][k]) * scale_inv[r / 128][k / 128], rows [r0, r1).
std::vector<float> RefDequant(const std::vector<uint8_t>& codes, const std::vector<float>& scale_inv, int64_t n_in,
                              int64_t r0, int64_t r1) {
  const int64_t cb = (n_in + 127) / 128;
  std::vector<float> out;
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t k = 0; k < n_in; ++k)
      out.push_back(RefDecode(codes[static_cast<size_t>(r * n_in + k)]) * scale_inv[static_cast<size_t>((r / 128) * cb + k / 128)]);
  return out;
}

bool SameBits(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  uint32_t x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  return x == y;
}

TEST(Fp8BlocksTest, ReferenceDecoderKnowsTheFormat) {
  EXPECT_EQ(RefDecode(0x38), 1.0f);
  EXPECT_EQ(RefDecode(0xb8), -1.0f);
  EXPECT_EQ(RefDecode(0x7e), 448.0f);
  EXPECT_EQ(RefDecode(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(RefDecode(0x07), 7 * std::ldexp(1.0f, -9));
  EXPECT_EQ(RefDecode(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_TRUE(std::signbit(RefDecode(0x80)) && RefDecode(0x80) == 0.0f);
  EXPECT_TRUE(std::isnan(RefDecode(0x7f)) && std::isnan(RefDecode(0xff)));
}

TEST(Fp8BlocksTest, DequantMatchesScalarReferenceExactly) {
  struct Shape { int64_t n_out, n_in; };
  const Shape kShapes[] = {{1, 1}, {1, 7}, {7, 9}, {33, 33}, {128, 128}, {129, 130}, {130, 257}, {300, 140}, {2, 4097}};
  const uint8_t kSpecialCodes[] = {0x00, 0x80, 0x01, 0x81, 0x07, 0x08, 0x7e, 0xfe, 0x7f, 0xff, 0x38};
  const float kSpecialScales[] = {INFINITY, -INFINITY, NAN, 0.0f, -0.0f, 1e-40f /* subnormal */, 3.4e38f};
  std::mt19937 rng(17);
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(std::to_string(s.n_out) + "x" + std::to_string(s.n_in));
    std::vector<uint8_t> codes(static_cast<size_t>(s.n_out * s.n_in));
    for (auto& c : codes) c = static_cast<uint8_t>(rng());
    for (size_t i = 0; i < codes.size(); i += 1 + rng() % 13) codes[i] = kSpecialCodes[rng() % std::size(kSpecialCodes)];
    const int64_t rb = (s.n_out + 127) / 128, cb = (s.n_in + 127) / 128;
    std::vector<float> scales(static_cast<size_t>(rb * cb));
    std::uniform_real_distribution<float> u(-4.0f, 4.0f);
    for (auto& x : scales) x = std::ldexp(u(rng), static_cast<int>(rng() % 40) - 20);
    if (scales.size() > 1) scales[rng() % scales.size()] = kSpecialScales[rng() % std::size(kSpecialScales)];
    // Whole matrix, then a sub-range of rows crossing a block boundary where there is one.
    const int64_t r0 = s.n_out > 1 ? s.n_out / 3 : 0, r1 = s.n_out;
    for (auto [a, b] : {std::pair<int64_t, int64_t>{0, s.n_out}, {r0, r1}, {r1, r1}}) {
      std::vector<float> got(static_cast<size_t>((b - a) * s.n_in), 12345.0f);
      DequantFp8Rows(codes.data(), scales.data(), s.n_in, a, b, got.data());
      const std::vector<float> want = RefDequant(codes, scales, s.n_in, a, b);
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_TRUE(SameBits(got[i], want[i])) << "rows [" << a << ", " << b << ") value " << i << ": " << got[i]
                                               << " vs " << want[i];
    }
  }
}

TEST(Fp8BlocksTest, EveryCodeEveryScale) {
  const float kScales[] = {1.0f, -0.5f, INFINITY, -INFINITY, NAN, 0.0f, -0.0f, 1e-40f, 3.4e38f};
  std::vector<uint8_t> row(128);
  for (int c = 0; c < 128; ++c) row[static_cast<size_t>(c)] = static_cast<uint8_t>(c);
  for (int half = 0; half < 2; ++half) {
    std::vector<uint8_t> codes(row);
    for (auto& c : codes) c = static_cast<uint8_t>(c | (half << 7));
    for (float sc : kScales) {
      std::vector<float> got(128);
      DequantFp8Rows(codes.data(), &sc, 128, 0, 1, got.data());
      for (int c = 0; c < 128; ++c)
        ASSERT_TRUE(SameBits(got[static_cast<size_t>(c)], RefDecode(codes[static_cast<size_t>(c)]) * sc))
            << "code " << int{codes[static_cast<size_t>(c)]} << " scale " << sc;
    }
  }
}

TEST(Fp8BlocksTest, HasFp8NanFindsNanCodesAnywhere) {
  for (int64_t n : {0, 1, 31, 32, 33, 100}) {
    std::vector<uint8_t> codes(static_cast<size_t>(n), 0x7e);
    EXPECT_FALSE(HasFp8Nan(codes.data(), n)) << n;
    for (int64_t at = 0; at < n; ++at)
      for (uint8_t nan : {uint8_t{0x7f}, uint8_t{0xff}}) {
        codes[static_cast<size_t>(at)] = nan;
        EXPECT_TRUE(HasFp8Nan(codes.data(), n)) << n << " at " << at;
        codes[static_cast<size_t>(at)] = 0xfe;  // -448: not NaN
      }
    EXPECT_FALSE(HasFp8Nan(codes.data(), n)) << n;
  }
}

TensorInfo Info(const std::string& name, DType dtype, std::vector<int64_t> shape) {
  TensorInfo t;
  t.name = name;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.file = "shard.safetensors";
  return t;
}

TEST(Fp8BlocksTest, ScaleTensorIsChecked) {
  const std::string w = "model.layers.0.self_attn.o_proj.weight";
  const TensorInfo weight = Info(w, DType::kF8E4M3, {130, 257});
  const TensorInfo good = Info(w + "_scale_inv", DType::kF32, {2, 3});
  EXPECT_TRUE(CheckFp8BlockScales(w, weight, &good).ok());
  EXPECT_EQ(Fp8ScaleName(w), w + "_scale_inv");
  auto expect = [&](const Status& s, const std::string& text) {
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.ToString().find(text), std::string::npos) << s.ToString();
  };
  expect(CheckFp8BlockScales(w, weight, nullptr), "F8_E4M3 tensor '" + w + "' has no '" + w + "_scale_inv'");
  const TensorInfo wrong_shape = Info(w + "_scale_inv", DType::kF32, {2, 2});
  expect(CheckFp8BlockScales(w, weight, &wrong_shape), "must be F32 [2, 3], got F32 [2, 2]");
  const TensorInfo wrong_dtype = Info(w + "_scale_inv", DType::kBF16, {2, 3});
  expect(CheckFp8BlockScales(w, weight, &wrong_dtype), "must be F32 [2, 3], got BF16 [2, 3]");
  const TensorInfo vec = Info(w, DType::kF8E4M3, {130});
  expect(CheckFp8BlockScales(w, vec, &good), "is not a matrix");
}

}  // namespace
}  // namespace pdserve::model
