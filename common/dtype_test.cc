#include "common/dtype.h"

#include <gtest/gtest.h>

#include <cmath>

namespace pdserve {
namespace {

TEST(DTypeTest, Bf16RoundsToNearestEven) {
  EXPECT_EQ(RoundToBf16(1.0f), 1.0f);
  // 1 + 2^-8 is exactly halfway between bf16 1.0 and 1 + 2^-7: ties to even (1.0).
  EXPECT_EQ(RoundToBf16(1.0f + std::ldexp(1.0f, -8)), 1.0f);
  EXPECT_EQ(RoundToBf16(1.0f + 3 * std::ldexp(1.0f, -8)), 1.0f + std::ldexp(1.0f, -6));
  EXPECT_TRUE(std::isnan(RoundToBf16(NAN)));
  EXPECT_EQ(RoundToBf16(-2.5f), -2.5f);
}

TEST(DTypeTest, Fp8TableKnownValues) {
  EXPECT_EQ(Fp8E4M3ToF32(0x00), 0.0f);
  EXPECT_EQ(Fp8E4M3ToF32(0x38), 1.0f);
  EXPECT_EQ(Fp8E4M3ToF32(0x7e), 448.0f);
  EXPECT_EQ(Fp8E4M3ToF32(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(Fp8E4M3ToF32(0x08), std::ldexp(1.0f, -6));
  EXPECT_EQ(Fp8E4M3ToF32(0xb8), -1.0f);
  EXPECT_TRUE(std::isnan(Fp8E4M3ToF32(0x7f)));
  EXPECT_TRUE(std::isnan(Fp8E4M3ToF32(0xff)));
}

// Every finite code round-trips, and every midpoint between neighbouring codes rounds to the
// neighbour with the even mantissa (round-to-nearest-even), as the reference encoder does.
TEST(DTypeTest, Fp8EncoderAllCodesAndMidpoints) {
  for (int sign = 0; sign < 2; ++sign) {
    for (int c = 0; c < 0x7e; ++c) {
      const uint8_t code = static_cast<uint8_t>(c | (sign << 7));
      const uint8_t next = static_cast<uint8_t>((c + 1) | (sign << 7));
      const float v = Fp8E4M3ToF32(code);
      const float w = Fp8E4M3ToF32(next);
      EXPECT_EQ(F32ToFp8E4M3(v), sign && c == 0 ? 0x80 : code) << "code " << c;
      const float mid = 0.5f * (v + w);
      const uint8_t even = (c % 2 == 0) ? code : next;
      EXPECT_EQ(F32ToFp8E4M3(mid), even) << "midpoint after code " << c;
      EXPECT_EQ(F32ToFp8E4M3(std::nextafter(mid, 0.0f)), code) << "below midpoint " << c;
      EXPECT_EQ(F32ToFp8E4M3(std::nextafter(mid, sign ? -1e9f : 1e9f)), next) << "above mid " << c;
    }
  }
  EXPECT_EQ(F32ToFp8E4M3(448.0f), 0x7e);
  EXPECT_EQ(F32ToFp8E4M3(1e6f), 0x7e);      // saturates
  EXPECT_EQ(F32ToFp8E4M3(-1e6f), 0xfe);
  EXPECT_EQ(F32ToFp8E4M3(460.0f), 0x7e);
  EXPECT_EQ(F32ToFp8E4M3(std::ldexp(1.0f, -11)), 0x00);  // below half the smallest subnormal
}

TEST(DTypeTest, ParseNames) {
  DType d;
  ASSERT_TRUE(ParseDType("F8_E4M3", &d));
  EXPECT_EQ(d, DType::kF8E4M3);
  EXPECT_FALSE(ParseDType("F64x", &d));
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
}

}  // namespace
}  // namespace pdserve
